"""Checks on values that are not op arguments: loss weights and parameters about to be folded or loaded.

Op argument checks live with each op (`vitfast.ops.<op>`); these serve the model layers (folding, conversion,
losses), and every message names the argument, what was expected and what was given.
"""
from __future__ import annotations

import math

import torch


def check_nonnegative_weight(name: str, value) -> float:
    """A loss weight / regulariser coefficient: a finite number >= 0 (NaN passed `< 0` checks and surfaced later as
    a non-finite loss)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    return float(value)


def check_finite_parameter(name: str, t: torch.Tensor) -> None:
    """Refuse NaN/Inf in a parameter that is about to be folded or loaded (e.g. a BatchNorm scale)."""
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"{name}: expected finite values, got {bad} non-finite of {t.numel()}")
