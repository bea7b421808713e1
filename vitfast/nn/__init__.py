"""Fused inference modules: what `vitfast.fuse` produces and `vitfast.load` rebuilds; they call torch.ops.vitfast.*.

Naming: a module that fusion produces from a train-time module is `Fused<What>`, registered (`registry.py`) under
the "kind" its checkpoint config names: `FusedBlock` ("block", a drop-in for timm's ViT `Block`), `FusedSwinBlock`
("swin_block"), `FusedChannelIdleFFN` ("channel_idle_ffn"), `FusedXWXBlock` ("xwx_block", non-deep ViTs),
`FusedDWConvBlock` ("dwconv_block", drop-in depthwise-convolution heads), `FusedGatedBlock` ("gated_block") with
`FusedBatchGate` ("batch_gate", USDC); `FusedAttention` / `FusedXWXAttention` are their attention children.  The
two kernel-backed stand-ins for plain timm layers are named by what they run: `GemmPatchProjection` (the patch
Conv2d as one GEMM) and `PackedLinear` (the classifier head on the packed-weight GEMM).  `FusedVisionTransformer`
is timm's VisionTransformer whose inference forward is one C++ call where the structure allows (`vit.py`).  Train-time modules live
with their method in `vitfast.methods.<method>`; each has `to_fused()`, which `vitfast.fuse` calls.
"""
from .block import FusedAttention, FusedBlock
from .ffn import FusedChannelIdleFFN, active_channels
from .swin import FusedSwinBlock
from .dwconv import FusedDWConvBlock, follow_patch_grid, set_grid_size
from .gated import FusedBatchGate, FusedGatedBlock, set_gate_force
from .linear_head import PackedLinear, use_gemm_stem_and_head, use_packed_linear_head
from .patch_embed import GemmPatchProjection, use_gemm_patch_projection
from .registry import fused_kinds, fused_module_from_config, is_fused_module, register_fused
from .xwx import FoldedXWXAttention, FusedXWXAttention, FusedXWXBlock
from .vit import FusedVisionTransformer, use_fused_vit_forward

__all__ = [
    "register_fused", "fused_kinds", "fused_module_from_config", "is_fused_module",
    "FusedChannelIdleFFN", "FusedAttention", "FusedBlock", "FusedSwinBlock", "active_channels",
    "FusedXWXAttention", "FusedXWXBlock", "FoldedXWXAttention",
    "FusedDWConvBlock", "follow_patch_grid", "set_grid_size",
    "FusedBatchGate", "FusedGatedBlock", "set_gate_force",
    "GemmPatchProjection", "use_gemm_patch_projection", "PackedLinear", "use_packed_linear_head",
    "use_gemm_stem_and_head", "FusedVisionTransformer", "use_fused_vit_forward",
]
