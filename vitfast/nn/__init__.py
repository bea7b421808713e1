"""Fused inference modules: what `vitfast.fuse` produces and `vitfast.load` rebuilds; they call torch.ops.vitfast.*.

Every class here is registered (`registry.py`) under the "kind" its checkpoint config names:
`FusedChannelIdleFFN` ("channel_idle_ffn"), `Block` ("block", a drop-in for timm's ViT `Block`), `SwinBlock`
("swin_block"), the timm-compatible `Attention`, `XWXBlock` ("xwx_block", non-deep ViTs), `FusedDWConvBlock`
("dwconv_block", drop-in depthwise-convolution heads), `GatedBlock` ("gated_block") with `FusedBatchGate`
("batch_gate", USDC), `GemmPatchProjection` (timm's patch Conv2d as one GEMM) and `PackedLinear` (the classifier
head on the packed-weight GEMM).  Train-time modules live with their method in `vitfast.methods.<method>`; each
has `to_fused()`, which `vitfast.fuse` calls.
"""
from .block import Attention, Block, FusedChannelIdleFFN, SwinBlock, active_channels
from .dwconv import FusedDWConvBlock, follow_patch_grid, set_grid_size
from .gated import FusedBatchGate, GatedBlock, set_gate_force
from .linear_head import PackedLinear, use_gemm_stem_and_head, use_packed_linear_head
from .patch_embed import GemmPatchProjection, use_gemm_patch_projection
from .registry import fused_kinds, fused_module_from_config, is_fused_module, register_fused
from .xwx import FoldedXWXAttention, XWXAttention, XWXBlock

__all__ = [
    "register_fused", "fused_kinds", "fused_module_from_config", "is_fused_module",
    "FusedChannelIdleFFN", "Attention", "Block", "SwinBlock", "active_channels",
    "XWXAttention", "XWXBlock", "FoldedXWXAttention",
    "FusedDWConvBlock", "follow_patch_grid", "set_grid_size",
    "FusedBatchGate", "GatedBlock", "set_gate_force",
    "GemmPatchProjection", "use_gemm_patch_projection", "PackedLinear", "use_packed_linear_head",
    "use_gemm_stem_and_head",
]
