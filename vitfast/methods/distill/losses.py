"""Logit distillation from a teacher (swin-distillation-compression, sections II-C and IV-B..F).

    from vitfast.methods.distill import DistillTrainer
    trainer = DistillTrainer(student, train_loader, val_loader, teacher=teacher, distill="mse",
                             harmonic=(13.0, 1.0), total_steps=...)          # the paper's best setting
    trainer.fit()

Losses (all scalars, mean over the batch):

* hard-label loss L_s: cross-entropy with the labels (`hard_label_loss`);
* distillation loss L_d: MSE between student and teacher logits, no temperature (`mse_logits_loss`; the paper's
  choice, after Kim et al.: MSE is the τ → ∞ limit of KL and needs no τ), or the usual Hinton KL
  τ²·KL(softmax(z_t/τ) ‖ softmax(z_s/τ)) (`kl_logits_loss`);
* joint loss, eq. 1: L = (1 − α)·L_d + α·L_s (`joint_loss`), α fixed or linearly scheduled from α₀ to α₁ over
  training (`linear_alpha`; section IV-C; Table VI's best interval is [0, 0.5]);
* weighted harmonic-mean joint loss, eq. 4: L = (w_d + w_s) / (w_d/L_d + w_s/L_s) (`harmonic_mean_loss`;
  section IV-D; best w_d = 13, w_s = 1, Table VII).  With w_d = w_s it is eq. 2.

The teacher runs in eval mode without gradient (its parameters are frozen), under the same autocast as the
student; it is never part of the checkpoint (rebuild it from its file when resuming).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "hard_label_loss",
    "mse_logits_loss",
    "kl_logits_loss",
    "joint_loss",
    "harmonic_mean_loss",
    "linear_alpha",
    "DistillTrainer",
    "DISTILL_LOSSES",
]

DISTILL_LOSSES = ("mse", "kl")


def _number(name: str, value, *, low: float = -math.inf, high: float = math.inf, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    if value < low or value > high or (low_open and value == low):
        lo = "(" if low_open else "["
        raise ValueError(f"{name}: expected a number in {lo}{low}, {high}], got {value!r}")
    return float(value)


def _check_logits(student: torch.Tensor, teacher: torch.Tensor) -> None:
    if student.shape != teacher.shape:
        raise ValueError(
            f"teacher_logits: expected the student's shape {list(student.shape)}, got {list(teacher.shape)}"
        )


def hard_label_loss(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """L_s: cross-entropy of the student's logits with the labels."""
    return F.cross_entropy(logits.float(), targets, label_smoothing=label_smoothing)


def mse_logits_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """L_d (the paper's): mean squared error between the logits, no temperature, mean over batch × classes."""
    _check_logits(student_logits, teacher_logits)
    return F.mse_loss(student_logits.float(), teacher_logits.detach().float())


def kl_logits_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, tau: float = 4.0) -> torch.Tensor:
    """L_d (Hinton): τ² · KL(softmax(z_t/τ) ‖ softmax(z_s/τ)), mean over the batch (τ² keeps gradients τ-free)."""
    _check_logits(student_logits, teacher_logits)
    tau = _number("tau", tau, low=0.0, low_open=True)
    log_p_s = F.log_softmax(student_logits.float() / tau, dim=-1)
    log_p_t = F.log_softmax(teacher_logits.detach().float() / tau, dim=-1)
    return F.kl_div(log_p_s, log_p_t, reduction="batchmean", log_target=True) * (tau * tau)


def joint_loss(l_d: torch.Tensor, l_s: torch.Tensor, alpha: float) -> torch.Tensor:
    """Eq. 1: (1 − α)·L_d + α·L_s (α = the weight of the hard-label loss; 1 = no distillation)."""
    alpha = _number("alpha", alpha, low=0.0, high=1.0)
    return (1.0 - alpha) * l_d + alpha * l_s


def harmonic_mean_loss(l_d: torch.Tensor, l_s: torch.Tensor, w_d: float = 13.0, w_s: float = 1.0) -> torch.Tensor:
    """Eq. 4: the weighted harmonic mean (w_d + w_s) / (w_d / L_d + w_s / L_s) of the two losses.

    Its gradient weights each loss by (L/L_i)²·w_i/(w_d+w_s): the smaller loss steers, so a loss of much larger
    magnitude cannot dominate (section IV-D; it is eq. 1 with α taken from the losses' ratio, eq. 3).  Both
    losses must be >= 0; a loss of exactly 0 gives 0 (the limit), never NaN.
    """
    w_d = _number("w_d", w_d, low=0.0, low_open=True)
    w_s = _number("w_s", w_s, low=0.0, low_open=True)
    # Written as (w_d + w_s)·L_d·L_s / (w_d·L_s + w_s·L_d): the form with w/L had a finite value but a NaN/inf
    # gradient for L between ~1e-38 and ~1e-20 (w/L² overflows).  `tiny` only keeps 0/0 (both losses 0) at 0.
    tiny = torch.finfo(torch.float32).tiny
    l_d32, l_s32 = l_d.float(), l_s.float()
    return (w_d + w_s) * l_d32 * l_s32 / (w_d * l_s32 + w_s * l_d32).clamp_min(tiny)


def linear_alpha(step: int, total_steps: int, start: float, end: float) -> float:
    """α(t) linear from `start` at step 0 to `end` at `total_steps` (section IV-C: α grows like L_d/(L_s+L_d))."""
    start = _number("start", start, low=0.0, high=1.0)
    end = _number("end", end, low=0.0, high=1.0)
    if total_steps < 1:
        raise ValueError(f"total_steps: expected >= 1, got {total_steps!r}")
    t = min(max(step / total_steps, 0.0), 1.0)
    return start + (end - start) * t


