"""A recipe merged with explicit options and defaults: every setting's value and where it came from.

Precedence: an explicit option (a Trainer argument, a command-line flag) wins, then the recipe, then the default.
Two settings are derived, not copied:
* lr: a recipe's lr belongs to its `batch_size`; for another (global) batch it follows the recipe's `lr_scaling`
  rule — linear: lr × batch / base, sqrt: lr × √(batch / base), none: unchanged.  An explicit lr is never scaled.
  If the scaled lr falls below the recipe's min_lr, min_lr is scaled by the same factor (the cosine never rises).
* warmup: the recipe's warm-up epochs as a fraction of its epochs, so a shorter run (a digits run of a few hundred
  steps) keeps the paper's warm-up share.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Union

from .registry import KEYS, get_recipe

__all__ = ["Setting", "resolve", "format_settings", "TRAINER_DEFAULTS", "NOT_APPLIED_YET", "APPLIED_WHEN",
           "APPLIED_ELSEWHERE"]

# Without a recipe: sensible for small data (a few thousand images, a few hundred to a few thousand steps; the
# digits) — documented in docs/training.md.  `None` means "off".
TRAINER_DEFAULTS: Dict[str, Any] = {
    "optimizer": "adamw", "lr": 1e-3, "min_lr": 0.0, "warmup_lr": None, "warmup": 0.05, "weight_decay": 0.05,
    "layer_decay": None, "betas": (0.9, 0.999), "label_smoothing": 0.0, "mixup": 0.0, "cutmix": 0.0,
    "epochs": None,
}

# Recipe settings whose option is not in vitfast yet: shown by --print, never silently dropped.  (Empty: every
# recipe key is applied; a key a new recipe brings before its option exists goes here.)
NOT_APPLIED_YET: Dict[str, str] = {}

# Method settings `vitfast train --recipe` applies only to the model they belong to (elsewhere a printed note says
# they were not applied), or that another command applies: --print says which.
APPLIED_WHEN: Dict[str, str] = {
    "global_pool": "to a non-deep model built from a timm name (--branches n): --global-pool",
    "join_start_fraction": "to a non-deep model: --join-start as a fraction (JoinSchedule.pretrain_then_join)",
    "join_steps": "to a non-deep model: --join-steps",
    "join_schedule": "to a non-deep model: --join-schedule",
    "diversity_weight": "to a non-deep model: --diversity-weight",
    "remove_cls": "to DW-conv heads built from a timm name: --remove-cls",
    "gamma_weight_decay": "to DW-conv heads with γ (--ensemble): set_gamma_weight_decay; True is their default",
    "freeze_backbone": "to a model with DW-conv heads: freeze_backbone (only the heads train)",
    "arch_lr_scale": "to a USDC model's decision parameters: --arch-lr-scale",
}
APPLIED_ELSEWHERE: Dict[str, str] = {
    "dwconv_cls": "used by `vitfast select-heads --cls exclude`, which writes the Σ_h --ranking train reads "
                  "(train computes no Σ_h)",
}


@dataclass
class Setting:
    """One resolved setting: its value, its origin ("explicit", "recipe" or "default") and a note (the paper
    reference, or how it was derived)."""

    value: Any
    origin: str
    note: str = ""

    def describe(self) -> str:
        if self.origin == "recipe":
            return f"recipe: {self.note}"
        return self.origin + (f" ({self.note})" if self.note else "")


def _scale(rule: str, batch: int, base: int) -> float:
    if rule == "linear":
        return batch / base
    if rule == "sqrt":
        return math.sqrt(batch / base)
    return 1.0


def resolve(recipe: Union[str, Mapping[str, Any], None], explicit: Mapping[str, Any],
            defaults: Optional[Mapping[str, Any]] = None, *, batch_size: Optional[int] = None) -> Dict[str, Setting]:
    """{setting: Setting} for `recipe` (a name, NAME:VARIANT, a `get_recipe` dict, or None), the `explicit` options
    (None values count as not given) and `defaults` (TRAINER_DEFAULTS when None).  `batch_size`: the run's global
    batch, for the lr rule (None: not known, lr unscaled)."""
    defaults = TRAINER_DEFAULTS if defaults is None else defaults
    if isinstance(recipe, str):
        recipe = get_recipe(recipe)
    entries = dict(recipe["settings"]) if recipe else {}
    out: Dict[str, Setting] = {k: Setting(v, "default") for k, v in defaults.items()}
    for key, (value, source) in entries.items():
        if key == "warmup_epochs":
            continue
        out[key] = Setting(value, "recipe", source)
    epochs = entries.get("epochs", (None, ""))[0]
    warm = entries.get("warmup_epochs", (None, ""))
    if warm[0] is not None and epochs:
        out["warmup"] = Setting(warm[0] / epochs, "recipe", f"{warm[0]} of {epochs} epochs; {warm[1]}")
    base = entries.get("batch_size", (None, ""))[0]
    rule = entries.get("lr_scaling", ("none", ""))[0]
    if "lr" in entries and base and batch_size and batch_size != base and explicit.get("lr") is None:
        lr0, source = entries["lr"]
        if rule in ("linear", "sqrt"):
            factor = _scale(rule, batch_size, base)
            out["lr"] = Setting(lr0 * factor, "recipe",
                                f"{lr0:g} at batch {base} ({source}) x {'' if rule == 'linear' else 'sqrt '}"
                                f"({batch_size}/{base}), {rule} rule for batch {batch_size}")
            if "min_lr" in entries and explicit.get("min_lr") is None and entries["min_lr"][0] > out["lr"].value:
                m0, msource = entries["min_lr"]
                out["min_lr"] = Setting(m0 * factor, "recipe", f"{m0:g} ({msource}) scaled with lr")
        else:
            out["lr"] = Setting(lr0, "recipe", f"{lr0:g} at batch {base} ({source}), used as given for batch "
                                               f"{batch_size} (lr_scaling none)")
    for key, value in explicit.items():
        if value is not None:
            out[key] = Setting(value, "explicit")
    return out


def applies(key: str, setting: Setting, *, data: Optional[str] = None,
            built_in: Optional[Mapping[str, Any]] = None) -> str:
    """Whether a resolved setting takes effect: "applied", "applied to ..." (a method setting, for the model it
    belongs to), "not applied by train: ..." (another command applies it), "built in: ..." (`built_in`: {key:
    (where, value)} of the constants a method fixes), "not applied yet: ..." (a recipe setting whose option does not
    exist) or "not applicable: ..." (for this data)."""
    if key in NOT_APPLIED_YET and setting.value not in (None, False):
        return f"not applied yet: {NOT_APPLIED_YET[key]}"
    if key in APPLIED_ELSEWHERE and setting.value is not None:
        return f"not applied by train: {APPLIED_ELSEWHERE[key]}"
    if key in APPLIED_WHEN and setting.value is not None \
            and not (setting.value is False and key in ("freeze_backbone", "remove_cls")):  # False: nothing to do
        return f"applied {APPLIED_WHEN[key]}"
    if built_in and key in built_in:
        where, constant = built_in[key]
        same = "the paper's value" if constant == setting.value else f"NOT the paper's {setting.value}"
        return f"built in: {where} = {constant:g} ({same})"
    if data == "digits" and key in ("auto_augment", "color_jitter", "interpolation") \
            and setting.value not in (None, 0, 0.0):
        return ("not applicable: the digits are rendered tensors (their seeded affine stands in for the geometric "
                "augmentation; colour operations do not apply)")
    if KEYS.get(key) == "info":
        return "applied (weight-decay groups)"
    return "applied"


def format_settings(resolved: Mapping[str, Setting], *, data: Optional[str] = None,
                    order: Optional[List[str]] = None, built_in: Optional[Mapping[str, Any]] = None) -> str:
    """The `vitfast train --print` table: setting, value, source, and a status where it is not simply applied."""
    keys = order or list(resolved)
    rows = []
    for key in keys:
        if key not in resolved:
            continue
        s = resolved[key]
        value = s.value
        text = f"{value:.6g}" if isinstance(value, float) else ("-" if value is None else str(value))
        status = applies(key, s, data=data, built_in=built_in)
        rows.append((key, text, s.describe() + ("" if status == "applied" else f"  [{status}]")))
    width = max((len(r[0]) for r in rows), default=0)
    vwidth = min(22, max((len(r[1]) for r in rows), default=0))  # a long value (a sentence) pushes its row only
    return "\n".join(f"  {k:<{width}}  {v:<{vwidth}}  {d}" for k, v, d in rows)
