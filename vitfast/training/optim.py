"""The optimizer and LR scheduler a Trainer builds over its weight-decay groups.

Kept apart from the loop because both are decided by the run's settings alone (settings.py) and rebuilt on resume
when a checkpoint was trained on the other schedule kind (checkpoint_state.py).  The groups carry each parameter's
weight decay (and lr_scale with layer decay), so the optimizer itself gets weight_decay 0 (schedules.py).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Union

import torch

from .schedules import _WarmupCosine, timm_cosine

__all__ = ["make_optimizer", "make_scheduler"]


def make_optimizer(optimizer: Union[str, Callable[[List[Dict[str, Any]]], torch.optim.Optimizer]],
                   groups: List[Dict[str, Any]], lr: float, betas, momentum: float) -> torch.optim.Optimizer:
    """`optimizer` (a timm optimizer name, or a factory `groups -> Optimizer`) over `groups`."""
    if callable(optimizer):
        opt = optimizer(groups)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"optimizer: the factory must return a torch.optim.Optimizer, got {type(opt).__name__}")
        return opt
    name = str(optimizer).lower()
    if name == "sgd" and not momentum > 0:
        return torch.optim.SGD(groups, lr=lr, momentum=0.0)  # timm's "sgd" is Nesterov, which needs momentum
    from timm.optim import create_optimizer_v2, list_optimizers

    if name not in list_optimizers():
        raise ValueError(f"optimizer: expected 'adamw', 'sgd', 'lamb', another timm optimizer name or a callable, "
                         f"got {optimizer!r}")
    extra = {"betas": tuple(betas)} if any(k in name for k in ("adam", "lamb", "lion", "nadam")) else {}
    # the groups carry their own weight decay (and lr_scale with layer decay): timm builds the optimizer only
    return create_optimizer_v2(groups, opt=name, lr=lr, weight_decay=0.0, momentum=momentum, **extra)


def make_scheduler(kind: str, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, lr: float,
                   min_lr: float, warmup_lr: float):
    """The LR schedule of `kind` ("timm" or "legacy"; schedules.py) over `optimizer`."""
    if kind == "timm":
        return timm_cosine(optimizer, total_steps, warmup_steps, min_lr, warmup_lr)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, _WarmupCosine(total_steps, warmup_steps, min_lr / lr))
