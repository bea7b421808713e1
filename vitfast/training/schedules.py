"""The LR schedule (linear warm-up, then cosine) and the weight-decay parameter groups of the Trainer.

Kept rather than replaced by timm's parts, because exact resume and existing runs depend on them:
* `timm.scheduler.CosineLRScheduler` warms up from `warmup_lr_init` (t · (lr − init) / warmup_t: step 0 at init),
  where this schedule starts at lr / warmup_steps so the first step is not wasted; every existing recipe would
  train on other LR values.  The schedule here is a `LambdaLR` whose lambda holds plain numbers, so its state dict
  is plain values (the weights_only trainer checkpoint).
* `timm.optim.param_groups_weight_decay` lists the no-decay group first, `param_groups` the decay group first:
  optimizer state is stored by group index, so switching would resume every existing trainer checkpoint into the
  wrong groups.  It also knows name patterns only, not the `_no_weight_decay` marks the methods put on λ, gate
  logits and kernels.  The rules are timm's otherwise (1-D parameters and `no_weight_decay()` names).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List

import torch.nn as nn


def warmup_cosine(step: int, total_steps: int, warmup_steps: int = 0, min_ratio: float = 0.0) -> float:
    """LR multiplier at `step`: linear warm-up to 1 over `warmup_steps`, then cosine down to `min_ratio`.

    Warm-up starts at 1/warmup_steps rather than 0 so the first step is not wasted; the cosine reaches
    `min_ratio` at `step == total_steps`.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class _WarmupCosine:
    """Picklable-free LR lambda: LambdaLR stores its __dict__ (plain numbers) in the scheduler state dict."""

    def __init__(self, total_steps: int, warmup_steps: int, min_ratio: float):
        self.total_steps, self.warmup_steps, self.min_ratio = total_steps, warmup_steps, min_ratio

    def __call__(self, step: int) -> float:
        return warmup_cosine(step, self.total_steps, self.warmup_steps, self.min_ratio)


def param_groups(model: nn.Module, weight_decay: float) -> List[Dict[str, Any]]:
    """Split parameters into a decayed group and a no-decay group.

    No decay (the usual ViT recipe, as in timm) for: 1-D parameters (norm scales and every bias), names
    listed by any module's `no_weight_decay()` (timm: pos_embed, cls_token, ...) or matching its
    `no_weight_decay_keywords()` (Swin's relative position tables), parameters carrying an attribute
    `_no_weight_decay = True`, and parameters of a module whose `_no_weight_decay` is True (all its direct
    parameters) or an iterable of its parameter names.  Gate logits, λ, γ and similar method parameters opt
    out this way.
    """
    skip_names, keywords = set(), set()
    for mname, module in model.named_modules():
        prefix = f"{mname}." if mname else ""
        if callable(getattr(module, "no_weight_decay", None)):
            try:
                skip_names.update(prefix + n for n in module.no_weight_decay())
            except TypeError:
                pass  # a same-named method with another meaning; not timm's convention
        if callable(getattr(module, "no_weight_decay_keywords", None)):
            keywords.update(module.no_weight_decay_keywords())
        mark = getattr(module, "_no_weight_decay", None)
        if mark is True:
            skip_names.update(prefix + n for n, _ in module.named_parameters(recurse=False))
        elif mark and not isinstance(mark, (bool, str)):
            skip_names.update(prefix + n for n in mark)
        elif isinstance(mark, str):
            skip_names.add(prefix + mark)
    decay, no_decay = [], []
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if (
            p.ndim <= 1
            or name in skip_names
            or any(k in name for k in keywords)
            or getattr(p, "_no_weight_decay", False)
        ):
            no_decay.append(p)
        else:
            decay.append(p)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": float(weight_decay)})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups
