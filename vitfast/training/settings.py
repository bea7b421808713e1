"""The Trainer's run settings: a recipe merged with the explicit arguments, checked, and turned into the values the
loop uses (optimizer settings, LR schedule kind and lengths, the loss with timm's Mixup).

Kept apart from the loop so that what a run trains with is decided in one place, before any model is wrapped or
optimizer built; `Trainer.settings` / `Trainer.unapplied` report it.  Precedence (explicit > recipe > default) and
the recipe's lr scaling are `vitfast.recipes.resolve`'s.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import torch.nn as nn
import torch.nn.functional as F

from . import distributed as _dist

__all__ = ["TrainSettings", "resolve_train_settings", "resolve_total_steps"]


@dataclass
class TrainSettings:
    """What `resolve_train_settings` decided; the Trainer assigns its attributes of the same names from it."""

    settings: Dict[str, Any]  # {name: vitfast.recipes.resolve.Setting}: each value and where it came from
    unapplied: Dict[str, Any]  # the recipe's settings a built loader / model cannot take (`vitfast train` applies them)
    recipe: Optional[str]  # the recipe's name (stored in checkpoints), None without one
    optimizer: Any  # a timm optimizer name or a factory `param_groups -> Optimizer`
    betas: Any
    lr_schedule: str  # "timm" or "legacy"
    total_steps: int
    warmup_steps: int
    lr: float
    min_lr: float
    weight_decay: float
    warmup_lr: float
    layer_decay: Optional[float]
    mixup_fn: Optional[Callable]  # timm's Mixup, None when mixup and cutmix are off
    loss_fn: Callable  # the training loss
    eval_loss_fn: Callable  # evaluation's: hard labels, also when training mixes targets


def resolve_total_steps(total_steps, epochs, train_loader, grad_accum: int = 1) -> int:
    """The run's optimizer steps: `total_steps`, or `epochs` × the steps in one epoch (len(train_loader) //
    grad_accum: with accumulation an epoch has fewer steps; counting batches trained grad_accum× the epochs)."""
    if (total_steps is None) == (epochs is None):
        raise ValueError(
            f"total_steps/epochs: expected exactly one of them, got total_steps={total_steps!r}, epochs={epochs!r}"
        )
    if total_steps is not None:
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"total_steps: expected a positive integer, got {total_steps!r}")
        return total_steps
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs: expected a positive integer, got {epochs!r}")
    try:
        per_epoch = len(train_loader)
    except TypeError as exc:
        raise ValueError("epochs: needs a train_loader with a length; give total_steps instead") from exc
    if per_epoch < 1:
        raise ValueError(f"train_loader: expected at least one batch per epoch, got {per_epoch}")
    return epochs * (per_epoch // max(int(grad_accum), 1))


def resolve_train_settings(
    model: nn.Module, train_loader, *, recipe, grad_accum: int, total_steps, epochs, optimizer, lr, weight_decay,
    betas, warmup_steps, warmup_fraction, min_lr, warmup_lr, layer_decay, lr_schedule, mixup, cutmix, num_classes,
    loss_fn, label_smoothing, grad_clip, eval_every, checkpoint_every,
) -> TrainSettings:
    """Resolve and check the Trainer's settings (its arguments of the same names; None: the recipe's or the
    default).  Raises ValueError naming the argument for any value out of range."""
    if isinstance(grad_accum, bool) or not isinstance(grad_accum, int) or grad_accum < 1:
        raise ValueError(f"grad_accum: expected a positive integer, got {grad_accum!r}")
    try:
        batches = len(train_loader)
    except TypeError:
        batches = None  # no length: accumulation may straddle epochs
    if batches is not None and grad_accum > 1 and batches < grad_accum:
        # An epoch must hold one optimizer step: fewer batches than grad_accum trained nothing and failed mid-run
        raise ValueError(f"train_loader: expected at least grad_accum = {grad_accum} batches per epoch (one "
                         f"optimizer step), got {batches}")
    from ..recipes.resolve import resolve

    loader_batch = getattr(train_loader, "batch_size", None)
    global_batch = loader_batch * grad_accum * _dist.world_size() if isinstance(loader_batch, int) else None
    settings = resolve(recipe, {
        "optimizer": optimizer, "lr": lr, "weight_decay": weight_decay, "betas": betas, "min_lr": min_lr,
        "warmup_lr": warmup_lr, "warmup": warmup_fraction, "layer_decay": layer_decay,
        "label_smoothing": label_smoothing, "mixup": mixup, "cutmix": cutmix}, batch_size=global_batch)
    if warmup_steps is not None:
        settings["warmup"].origin, settings["warmup"].note = "explicit", f"{warmup_steps} steps"
    from ..recipes.registry import KEYS

    # what a Trainer cannot apply (the loaders and the model are built): `vitfast train --recipe` does
    unapplied = {k: s for k, s in settings.items()
                 if s.origin == "recipe" and KEYS.get(k) in ("data", "model", "method")}
    value = {k: s.value for k, s in settings.items()}
    optimizer, lr, weight_decay, betas = value["optimizer"], value["lr"], value["weight_decay"], value["betas"]
    min_lr, warmup_lr, layer_decay = value["min_lr"], value["warmup_lr"], value["layer_decay"]
    label_smoothing, warmup_fraction = value["label_smoothing"], value["warmup"]
    mixup, cutmix = float(value["mixup"] or 0.0), float(value["cutmix"] or 0.0)
    if total_steps is None and epochs is None and value.get("epochs"):
        epochs = int(value["epochs"])  # the recipe's length, when the caller gives none
    recipe_name = recipe if recipe is None or isinstance(recipe, str) else recipe.get("name", "custom")
    if lr_schedule is None:
        lr_schedule = "timm" if recipe is not None or layer_decay or warmup_lr is not None else "legacy"
    if lr_schedule not in ("timm", "legacy"):
        raise ValueError(f"lr_schedule: expected 'timm' or 'legacy', got {lr_schedule!r}")
    if layer_decay and lr_schedule != "timm":
        raise ValueError("layer_decay: needs lr_schedule='timm' (its groups' lr_scale is applied by timm's "
                         "scheduler), got lr_schedule='legacy'")
    if layer_decay is not None and not 0 < layer_decay <= 1:
        raise ValueError(f"layer_decay: expected in (0, 1], got {layer_decay!r}")
    for name, v in (("mixup", mixup), ("cutmix", cutmix)):
        if not v >= 0:
            raise ValueError(f"{name}: expected an alpha >= 0 (0: off), got {v!r}")
    total_steps = resolve_total_steps(total_steps, epochs, train_loader, grad_accum)
    if not lr > 0:
        raise ValueError(f"lr: expected > 0, got {lr!r}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay: expected >= 0, got {weight_decay!r}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing: expected in [0, 1), got {label_smoothing!r}")
    if grad_clip is not None and not grad_clip > 0:
        raise ValueError(f"grad_clip: expected > 0 or None, got {grad_clip!r}")
    if not 0 <= min_lr <= lr:
        raise ValueError(f"min_lr: expected 0 <= min_lr <= lr ({lr}), got {min_lr!r}")
    for name, every in (("eval_every", eval_every), ("checkpoint_every", checkpoint_every)):
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ValueError(f"{name}: expected a positive integer or None, got {every!r}")
    if warmup_steps is None:
        if not 0.0 <= warmup_fraction < 1.0:
            raise ValueError(f"warmup_fraction: expected in [0, 1), got {warmup_fraction!r}")
        warmup_steps = int(round(warmup_fraction * total_steps))
    elif not 0 <= warmup_steps < total_steps:
        raise ValueError(f"warmup_steps: expected 0 <= warmup_steps < total_steps ({total_steps}), "
                         f"got {warmup_steps!r}")
    warmup_steps = int(warmup_steps)
    lr, min_lr, weight_decay = float(lr), float(min_lr), float(weight_decay)
    warmup_lr = float(warmup_lr) if warmup_lr is not None else lr / max(1, warmup_steps)
    mixup_fn = None
    if mixup > 0 or cutmix > 0:
        from timm.data import Mixup
        from timm.loss import SoftTargetCrossEntropy

        if num_classes is None:
            num_classes = getattr(model, "num_classes", None)
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes: mixup/cutmix need the class count (the model has no num_classes), "
                             f"got {num_classes!r}")
        # Mixup draws from NumPy's global RNG, which the checkpoint stores: a resumed run mixes the same pairs
        mixup_fn = Mixup(mixup_alpha=mixup, cutmix_alpha=cutmix, label_smoothing=label_smoothing,
                         num_classes=num_classes)
        if loss_fn is None:
            loss_fn = SoftTargetCrossEntropy()
    loss_fn = loss_fn or (lambda logits, t: F.cross_entropy(logits, t, label_smoothing=label_smoothing))
    return TrainSettings(
        settings=settings, unapplied=unapplied, recipe=recipe_name, optimizer=optimizer, betas=betas,
        lr_schedule=lr_schedule, total_steps=total_steps, warmup_steps=warmup_steps, lr=lr, min_lr=min_lr,
        weight_decay=weight_decay, warmup_lr=warmup_lr, layer_decay=layer_decay, mixup_fn=mixup_fn, loss_fn=loss_fn,
        # evaluation compares with hard labels: with mixup the training loss wants one-hot targets
        eval_loss_fn=F.cross_entropy if mixup_fn is not None else loss_fn)
