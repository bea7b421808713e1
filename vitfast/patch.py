"""`vitfast.patch_timm(model)`: swap timm transformer blocks for vitfast's fused blocks, outputs unchanged.

Every timm ViT `Block` becomes `vitfast.nn.FusedBlock.from_timm(block)` (norm affines and LayerScale folded,
attention on scaled_dot_product_attention, FFN through `torch.ops.vitfast.channel_idle_ffn`), every
`SwinTransformerBlock` becomes `vitfast.nn.FusedSwinBlock.from_timm(block)`.  Other modules are untouched.

The fused blocks are inference modules (no dropout, no drop-path, LayerScale folded), so patching a model in
training mode would silently change what it trains: it is refused — call `model.eval()` first.  All blocks are
converted before any is swapped in, so an unsupported block leaves the model exactly as it was.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

__all__ = ["patch_timm"]


def patch_timm(model: nn.Module, inplace: bool = True, *, prepack: bool = True) -> nn.Module:
    """Replace the timm blocks of `model` by fused vitfast blocks, and its patch-embedding Conv2d by a
    `vitfast.nn.GemmPatchProjection` (the same conv run as one GEMM on CPU) and its classifier head by a
    `vitfast.nn.PackedLinear`; return the model (the same object if inplace).

    `prepack=True` packs the fused weights for the CPU kernels before returning (`vitfast.ops.prepack`).

    Raises ValueError if the model is in training mode, contains no timm block, or a block uses a feature the
    fused blocks cannot reproduce exactly (the message names the block and the feature).
    """
    from timm.models.swin_transformer import SwinTransformerBlock
    from timm.models.vision_transformer import Block as TimmBlock

    from .nn.block import FusedBlock

    from .nn.swin import FusedSwinBlock

    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if model.training:
        raise ValueError(
            "model: expected eval mode (fused blocks are inference-only: no dropout or drop-path), got training "
            "mode; call model.eval() first"
        )
    from .arch import remember_source

    target = model if inplace else copy.deepcopy(model)
    remember_source(target, model)  # before any block is replaced: the skeleton still says what the model is
    replacements = []
    with torch.no_grad():
        for path, module in target.named_modules():
            if not path:
                continue
            if type(module) is TimmBlock:
                fused = FusedBlock.from_timm(module, name=path)
            elif type(module) is SwinTransformerBlock:
                fused = FusedSwinBlock.from_timm(module, name=path)
            else:
                continue
            parent_path, _, child = path.rpartition(".")
            replacements.append((target.get_submodule(parent_path) if parent_path else target, child, fused))
    if not replacements:
        raise ValueError(
            "model: expected a timm model containing vision_transformer.Block or SwinTransformerBlock modules, "
            f"found none in {type(model).__name__}"
        )
    for parent, child, fused in replacements:
        setattr(parent, child, fused)
    from .nn.linear_head import use_gemm_stem_and_head

    use_gemm_stem_and_head(target)
    if prepack:
        from .ops import prepack as prepack_weights

        prepack_weights(target)
    return target
