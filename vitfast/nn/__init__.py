"""Modules: train-time (reference paths, autograd) and fused inference modules (call torch.ops.vitfast.*).

Train-time (RePaViT channel-idle FFN): `ChannelIdleMlp`, `ChannelIdleBlock` (ViT), `ChannelIdleSwinBlock`,
`idle_ratios`.  Fused (registered, see `registry.py`): `FusedChannelIdleFFN` ("channel_idle_ffn"), `Block`
("block", drop-in for timm's ViT Block), `SwinBlock` ("swin_block"), plus the timm-compatible `Attention`.
Non-deep ViT (parallel branches, progressive joining): train-time `NonDeepBlock` (`NonDeepAttention`, `NonDeepMlp`,
`JoinSchedule`), fused `XWXBlock` ("xwx_block").
USDC (gates + static compression): decision networks `GateNet` (G0…G6), `GateSearch`, train-time `USDCBlock`,
fused `FusedBatchGate` ("batch_gate") and `GatedBlock` ("gated_block").
Patch embedding: `GemmPatchProjection` (timm's patch Conv2d run as one GEMM on CPU; `vitfast.fuse`/`load` use it).
Classifier head: `PackedLinear` (timm's head nn.Linear on the packed-weight GEMM; `vitfast.fuse`/`load` use it).
Every train-time module has `to_fused()`, which `vitfast.fuse` calls.
"""
from .registry import fused_kinds, fused_module_from_config, is_fused_module, register_fused  # noqa: F401
from .fused import Attention, Block, FusedChannelIdleFFN, SwinBlock, active_channels  # noqa: F401
from .xwx import XWXAttention, XWXBlock  # noqa: F401
from .nondeep import JoinSchedule, NonDeepAttention, NonDeepBlock, NonDeepMlp, join_lambda  # noqa: F401
from .channel_idle import (  # noqa: F401
    ChannelIdleBlock,
    ChannelIdleMlp,
    ChannelIdleSwinBlock,
    idle_ratios,
)
from .gates import FusedBatchGate, GateNet, GateSearch  # noqa: F401
from .usdc import GatedBlock, USDCBlock, set_gate_force  # noqa: F401
from .patch_embed import GemmPatchProjection, use_gemm_patch_projection  # noqa: F401
from .linear_head import PackedLinear, use_gemm_stem_and_head, use_packed_linear_head  # noqa: F401

__all__ = [
    "GemmPatchProjection",
    "use_gemm_patch_projection",
    "PackedLinear",
    "use_packed_linear_head",
    "use_gemm_stem_and_head",
    "register_fused",
    "fused_kinds",
    "fused_module_from_config",
    "is_fused_module",
    "FusedChannelIdleFFN",
    "Attention",
    "Block",
    "SwinBlock",
    "active_channels",
    "ChannelIdleMlp",
    "ChannelIdleBlock",
    "ChannelIdleSwinBlock",
    "idle_ratios",
    "XWXAttention",
    "XWXBlock",
    "JoinSchedule",
    "NonDeepAttention",
    "NonDeepBlock",
    "NonDeepMlp",
    "join_lambda",
    "GateNet",
    "GateSearch",
    "FusedBatchGate",
    "USDCBlock",
    "GatedBlock",
    "set_gate_force",
]

# Drop-in depthwise convolution heads (dropin-depthwise-conv-attention): train-time `DWConvAttention`,
# `DWConvBlock`; fused `FusedDWConvBlock` ("dwconv_block").
from .dwconv import DWConvAttention, DWConvBlock, FusedDWConvBlock, follow_patch_grid, set_grid_size  # noqa: E402,F401

__all__ += ["DWConvAttention", "DWConvBlock", "FusedDWConvBlock", "follow_patch_grid", "set_grid_size"]
