"""`vitfast.fuse(model) -> model`: replace every train-time vitfast module by its exact fused counterpart.

(This module is `vitfast.fusion`, not `vitfast.fuse`, so that importing it never shadows the function.)

Any module with a `to_fused()` method is a train-time module (the RePaViT ones: `ChannelIdleBlock`,
`ChannelIdleSwinBlock`, a stand-alone `ChannelIdleMlp`; other methods plug in the same way).  The walk is
top-down: a module that fuses is replaced whole and its children are not visited again.

Fusing always folds the *eval-mode* function: BatchNorms contribute their running statistics (RePaViT eq. 3),
never batch statistics, and dropout / drop-path are identities.  A model passed in training mode is therefore
accepted — the copy is switched to eval mode first — and the result equals `model.eval()(x)`.  The input
model is never modified.  NaN/Inf (or negative variances) in anything that is folded raise ValueError naming
the tensor, before any output exists.
"""
from __future__ import annotations

import copy
import inspect

import torch
import torch.nn as nn

__all__ = ["fuse"]


def _call_to_fused(to_fused, path: str) -> nn.Module:
    # `name` (the module's path) only makes error messages point at the right block; it is optional.
    accepts_name = "name" in inspect.signature(to_fused).parameters
    fused = to_fused(name=path) if accepts_name else to_fused()
    if not isinstance(fused, nn.Module):
        raise TypeError(f"{path}.to_fused(): expected an nn.Module, got {type(fused).__name__}")
    return fused.eval()


def _fuse_children(module: nn.Module, prefix: str) -> int:
    count = 0
    for name, child in list(module.named_children()):
        path = f"{prefix}.{name}" if prefix else name
        to_fused = getattr(child, "to_fused", None)
        if callable(to_fused):
            fused = _call_to_fused(to_fused, path)
            setattr(module, name, fused)
            count += 1
        else:
            count += _fuse_children(child, path)
    return count


def fuse(model: nn.Module, *, prepack: bool = True) -> nn.Module:
    """Deep copy of `model` in eval mode with every train-time vitfast module fused (see the module doc).

    The fused model's outputs equal the train-time model's in eval mode, up to float rounding (the folding
    itself is done in float64).  A model with nothing to fuse is returned as an eval-mode copy.
    `prepack=True` packs the fused weights for the CPU kernels before returning (`vitfast.ops.prepack`), so the
    first inference is as fast as the next ones.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    fused = copy.deepcopy(model).eval()
    with torch.no_grad():
        to_fused = getattr(fused, "to_fused", None)
        if callable(to_fused):
            return _prepacked(_call_to_fused(to_fused, "model"), prepack)
        _fuse_children(fused, "")
    return _prepacked(fused, prepack)


def _prepacked(model: nn.Module, prepack: bool) -> nn.Module:
    if prepack:
        from .ops import prepack as prepack_weights

        prepack_weights(model)
    return model
