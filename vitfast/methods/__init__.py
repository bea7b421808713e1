"""The five methods, one folder each: train-time modules, conversion from timm, fusion rules and the method's entry
in the train-time file format.

    repavit   RePaViT channel-idle FFNs
    nondeep   non-deep ViTs by progressive branch joining (XWXᵀ attention)
    dwconv    drop-in depthwise-convolution heads (head selection, DSP gating)
    usdc      USDC batch-level gated block skipping and static compression
    distill   distillation-based compression (losses, trainer, students)

A method imports only the public names of another (a DW-conv or USDC model is built on RePaViT blocks); what
every method shares sits below, in `vitfast.nn` (fused blocks) and `vitfast.training`.
"""
from .._lazy import lazy_attributes

__all__ = ["repavit", "nondeep", "dwconv", "usdc", "distill"]
# `vitfast.methods.usdc.prune(...)` works without importing the method first, as vitfast's own lazy names do.
__getattr__ = lazy_attributes(__name__, {name: (f".{name}", None) for name in __all__})
