"""RePaViT channel-idle FFNs ("RePaViT: Scalable Vision Transformer Acceleration via Structural Reparameterization
on Feedforward Network Layers", arXiv 2505.21847).

Train-time `ChannelIdleMlp` / `ChannelIdleBlock` / `ChannelIdleSwinBlock` (modules.py), conversion from timm and
from the official checkpoints (convert.py); `to_fused()` folds both BatchNorms and the shortcut into
`vitfast.nn.FusedChannelIdleFFN`.
"""
from .convert import REPAVIT_HEADS, convert_timm, default_idle_ratio, from_repavit, model_blocks, resolve_ratios
from .modules import (FFN_NORMS, HEURISTICS, ChannelIdleBlock, ChannelIdleMlp, ChannelIdleSwinBlock, idle_ratios,
                      tokens_batchnorm)

__all__ = ["ChannelIdleMlp", "ChannelIdleBlock", "ChannelIdleSwinBlock", "idle_ratios", "tokens_batchnorm", "FFN_NORMS", "HEURISTICS",
           "convert_timm", "from_repavit", "default_idle_ratio", "model_blocks", "resolve_ratios", "REPAVIT_HEADS"]
