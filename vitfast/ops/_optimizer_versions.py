"""Mark every parameter an optimizer step updated as modified, so the packed-weight cache repacks it.

Why: the C++ ops keep each weight packed in a cache that recognises a changed weight by its autograd version
counter (`tensor._version`, csrc/ops/weight_cache.h).  torch's fused optimizers (SGD, Adam, AdamW and Adagrad
with `fused=True`; checked on torch 2.14) write the parameters without bumping that counter, and so does any
optimizer that updates through `p.data`: the next forward ran on the weights as first packed, silently wrong,
fine-tuning through the fused ops included.  One global optimizer step post-hook bumps every parameter of every
stepped optimizer.  Cost: about a microsecond per parameter per step.  A second bump after an optimizer that
bumped already is harmless (torch documents repeated bumps for one in-place update as such); tensors created
under `torch.inference_mode()` have no counter and are skipped (the cache never keeps those).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.optim.optimizer import Optimizer, register_optimizer_step_post_hook

_handle: Optional[torch.utils.hooks.RemovableHandle] = None


def _increment(tensor: torch.Tensor) -> None:
    # One tensor per call: torch 2.4's torch.autograd.graph.increment_version takes no lists yet.
    torch.autograd.graph.increment_version(tensor)


def mark_parameters_modified(optimizer: Optimizer, *_args, **_kwargs) -> None:
    """Bump the version counter of each parameter in `optimizer`'s param groups (the step post-hook)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if isinstance(p, torch.Tensor) and not p.is_inference():
                _increment(p)


def install() -> None:
    """Register the hook once per process (importing vitfast does it)."""
    global _handle
    if _handle is None:
        _handle = register_optimizer_step_post_hook(mark_parameters_modified)
