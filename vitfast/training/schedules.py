"""The LR schedules and the weight-decay parameter groups of the Trainer.

Two schedules, chosen by `Trainer(lr_schedule=...)` and stored in its checkpoint:
* "timm" (every recipe run, `vitfast.recipes`): `timm.scheduler.CosineLRScheduler`, linear warm-up from `warmup_lr`
  then cosine to `min_lr`, stepped per optimizer update (`step_update`).  Its state dict is plain values.
* "legacy" (the default without a recipe, and every checkpoint written before the field existed): a `LambdaLR`
  over `warmup_cosine`.  Kept so existing trainer checkpoints resume exactly on the schedule they were trained
  with, and because its warm-up starts at lr / warmup_steps, so the first step is not wasted: timm's starts at
  `warmup_lr_init` (t · (lr − init) / warmup_t: step 0 at init).  The lambda holds plain numbers, so its state
  dict is plain values (the weights_only trainer checkpoint).

Weight-decay groups: `param_groups` (decay group first, the order existing checkpoints' optimizer states were saved
in) or, with layer-wise lr decay, timm's `param_groups_layer_decay`.  Both exclude the same parameters,
`no_decay_names`: timm's rules (1-D parameters and `no_weight_decay()` names) plus the `_no_weight_decay` marks the
methods put on λ, gate logits and kernels, which timm's helpers do not know (they are passed as its
`no_weight_decay_list`), less the 1-D parameters a module marks `_weight_decay` (DW-conv's γ: the paper decays it),
which timm's helper would exclude by its 1-D rule (they are moved to their layer's decay group).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Set

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


def no_decay_names(model: nn.Module) -> Set[str]:
    """Names of the trainable parameters that take no weight decay (the usual ViT recipe, as in timm): 1-D parameters
    (norm scales and every bias), names listed by any module's `no_weight_decay()` (timm: pos_embed, cls_token, ...)
    or matching its `no_weight_decay_keywords()` (Swin's relative position tables), parameters carrying an attribute
    `_no_weight_decay = True`, and parameters of a module whose `_no_weight_decay` is True (all its direct
    parameters), a name, or an iterable of its parameter names.  Gate logits, λ and similar method parameters opt
    out this way.  A module's `_weight_decay` (an iterable of its parameter names) opts back in: those decay although
    1-D — the DW-conv paper's γ (appendix A.2.1 excludes only the kernels; `set_gamma_weight_decay`) — and wins
    over every rule above, being the most specific.  A parameter shared under two names is listed under every name
    it has."""
    skip_names, keywords, force_names = set(), set(), set()
    for mname, module in model.named_modules():
        prefix = f"{mname}." if mname else ""
        force = getattr(module, "_weight_decay", None)
        if force and not isinstance(force, (bool, str)):
            force_names.update(prefix + n for n in force)
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
    names = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if name in force_names:
            continue
        if (p.ndim <= 1 or name in skip_names or any(k in name for k in keywords)
                or getattr(p, "_no_weight_decay", False)):
            names.add(name)
    # a shared parameter decays only if none of its names says otherwise
    by_id: Dict[int, List[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    for aliases in by_id.values():
        if any(a in names for a in aliases):
            names.update(aliases)
    return names


def param_groups(model: nn.Module, weight_decay: float) -> List[Dict[str, Any]]:
    """Split parameters into a decayed group and a no-decay group (`no_decay_names`), in that order."""
    skip = no_decay_names(model)
    decay, no_decay = [], []
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (no_decay if name in skip else decay).append(p)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": float(weight_decay)})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def layer_decay_groups(model: nn.Module, weight_decay: float, layer_decay: float) -> List[Dict[str, Any]]:
    """timm's layer-wise lr decay groups (BEiT's rule: lr_scale = layer_decay ** (depth - layer), by the model's
    `group_matcher`), excluding `no_decay_names` from weight decay.  The groups carry `lr_scale`, which timm's
    schedulers apply."""
    from timm.optim import param_groups_layer_decay

    skip = no_decay_names(model)
    # fnmatch patterns: parameter names hold no wildcard characters, but escape them anyway
    escaped = [n.replace("[", "[[]").replace("*", "[*]").replace("?", "[?]") for n in sorted(skip)]
    groups = param_groups_layer_decay(model, weight_decay, no_weight_decay_list=escaped,
                                      layer_decay=float(layer_decay))
    # timm's helper excludes every 1-D parameter itself; those `no_decay_names` keeps decayed (a module's
    # `_weight_decay`, e.g. DW-conv's γ) move to the decay group of their layer (same lr_scale)
    keep = {id(p) for n, p in model.named_parameters() if p.ndim <= 1 and n not in skip}
    if not keep or not weight_decay:
        return groups
    out = [dict(g, params=[p for p in g["params"] if not (g["weight_decay"] == 0.0 and id(p) in keep)])
           for g in groups]
    for g in groups:
        moved = [p for p in g["params"] if g["weight_decay"] == 0.0 and id(p) in keep]
        if not moved:
            continue
        target = next((t for t in out if t["weight_decay"] != 0.0 and t["lr_scale"] == g["lr_scale"]), None)
        if target is None:
            target = {**{k: v for k, v in g.items() if k != "params"}, "weight_decay": float(weight_decay),
                      "params": []}
            out.append(target)
        target["params"].extend(moved)
    return [g for g in out if g["params"]]


def timm_cosine(optimizer, total_steps: int, warmup_steps: int, min_lr: float, warmup_lr: float):
    """timm's cosine schedule per optimizer update: warm-up from `warmup_lr` over `warmup_steps` updates, then a
    cosine from each group's lr to `min_lr` over the rest (warmup_prefix: the cosine starts after the warm-up)."""
    from timm.scheduler import CosineLRScheduler

    return CosineLRScheduler(optimizer, t_initial=max(1, total_steps - warmup_steps), lr_min=float(min_lr),
                             warmup_t=int(warmup_steps), warmup_lr_init=float(warmup_lr), warmup_prefix=True,
                             t_in_epochs=False, cycle_limit=1)
