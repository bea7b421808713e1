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

A `to_fused()` that returns None marks a train-time-only module (USDC's resource-loss module): it is removed.
"""
from __future__ import annotations

import copy
import inspect

import torch
import torch.nn as nn

from .nn.linear_head import use_gemm_stem_and_head
from .nn.vit import use_fused_vit_forward

__all__ = ["fuse"]


def _call_to_fused(to_fused, path: str, options=None, used=None) -> nn.Module:
    # `name` (the module's path) only makes error messages point at the right block; it is optional.
    params = inspect.signature(to_fused).parameters
    accepts_name = "name" in params
    # Method options (e.g. score_form for non-deep blocks) go to the to_fused() that takes them.
    kwargs = {k: v for k, v in (options or {}).items() if k in params}
    if used is not None:
        used.update(kwargs)
    fused = to_fused(name=path, **kwargs) if accepts_name else to_fused(**kwargs)
    if fused is None:  # a train-time-only helper (e.g. the USDC resource loss): dropped from the fused model
        return None
    if not isinstance(fused, nn.Module):
        raise TypeError(f"{path}.to_fused(): expected an nn.Module, got {type(fused).__name__}")
    return fused.eval()


def _fuse_children(module: nn.Module, prefix: str, options=None, used=None) -> int:
    count = 0
    for name, child in list(module.named_children()):
        path = f"{prefix}.{name}" if prefix else name
        to_fused = getattr(child, "to_fused", None)
        if callable(to_fused):
            fused = _call_to_fused(to_fused, path, options, used)
            if fused is None:
                delattr(module, name)
            else:
                setattr(module, name, fused)
            count += 1
        else:
            count += _fuse_children(child, path, options, used)
    return count


def fuse(model: nn.Module, *, prepack: bool = True, **options) -> nn.Module:
    """Deep copy of `model` in eval mode with every train-time vitfast module fused (see the module doc).

    The fused model's outputs equal the train-time model's in eval mode, up to float rounding (the folding
    itself is done in float64).  A model with nothing to fuse is returned as an eval-mode copy.

    options: keyword options of the modules' `to_fused` (passed to those that take them), e.g.
    `score_form="auto" | "factored" | "full"` for non-deep blocks (`NonDeepBlock.to_fused`: "auto" picks the
    low-rank factored form per block when its rank n·d_h ≤ C/2; the choice is stored in the checkpoint config).
    An option no module takes is refused (ValueError naming it).
    `prepack=True` packs the fused weights for the CPU kernels before returning (`vitfast.ops.prepack`), so the
    first inference is as fast as the next ones.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    fused = copy.deepcopy(model).eval()
    used: dict = {}
    with torch.no_grad():
        to_fused = getattr(fused, "to_fused", None)
        if callable(to_fused):
            fused = _call_to_fused(to_fused, "model", options, used)
        else:
            _fuse_children(fused, "", options, used)
    unused = sorted(set(options) - set(used))
    if unused:
        raise ValueError(f"{unused[0]}: expected an option of the model's train-time modules' to_fused(), got "
                         f"{options[unused[0]]!r} and no module takes it")
    use_gemm_stem_and_head(fused)
    use_fused_vit_forward(fused)
    return _prepacked(fused, prepack)


def _prepacked(model: nn.Module, prepack: bool) -> nn.Module:
    if prepack:
        from .ops import prepack as prepack_weights

        prepack_weights(model)
    return model
