"""Logit distillation from a teacher (swin-distillation-compression, sections II-C and IV-B..F).

    from vitfast.distill import DistillTrainer
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
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .train import Trainer

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


def check_teacher_input(teacher: nn.Module, student: nn.Module, name: str = "teacher") -> None:
    """The teacher must take the student's images: one of another input size failed in its first forward, inside
    timm (an AssertionError), after training had started.  Models with a dynamic input size take any."""
    t_pe, s_pe = getattr(teacher, "patch_embed", None), getattr(student, "patch_embed", None)
    t_size, s_size = getattr(t_pe, "img_size", None), getattr(s_pe, "img_size", None)
    flexible = bool(getattr(teacher, "dynamic_img_size", False)) or not getattr(t_pe, "strict_img_size", True)
    if t_size is None or s_size is None or flexible or tuple(t_size) == tuple(s_size):
        return
    raise ValueError(f"{name}: takes {t_size[0]}x{t_size[1]} images, the student {s_size[0]}x{s_size[1]} (give "
                     f"both the same input size)")


class DistillTrainer(Trainer):
    """`Trainer` whose task loss distils `teacher`'s logits into the model (module doc; Algorithm 1's loop).

    Args (besides the Trainer's):
        teacher: the fine-tuned teacher (any classifier with the student's class count); frozen, eval mode.
        distill: "mse" (paper) or "kl" (with `tau`).
        tau: KL temperature (only with distill="kl").
        alpha: fixed α of eq. 1 (the hard-label weight).  Default 0.25 (Table IV's best fixed value).
        alpha_schedule: (α₀, α₁): α linear from α₀ to α₁ over the run (replaces `alpha`).
        harmonic: (w_d, w_s): use eq. 4 instead of eq. 1 (replaces alpha / alpha_schedule).
    Logged per step: distill/l_d, distill/l_s, distill/alpha (eq. 1 only).
    """

    def __init__(
        self,
        model: nn.Module,
        train_loader=None,
        val_loader=None,
        *,
        teacher: nn.Module,
        distill: str = "mse",
        tau: float = 4.0,
        alpha: Optional[float] = None,
        alpha_schedule: Optional[Sequence[float]] = None,
        harmonic: Optional[Sequence[float]] = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(teacher, nn.Module):
            raise TypeError(f"teacher: expected a torch.nn.Module, got {type(teacher).__name__}")
        if teacher is model:
            raise ValueError("teacher: expected a separate model from the student, got the same object")
        check_teacher_input(teacher, model)
        if distill not in DISTILL_LOSSES:
            raise ValueError(f"distill: expected one of {DISTILL_LOSSES}, got {distill!r}")
        given = [n for n, v in (("alpha", alpha), ("alpha_schedule", alpha_schedule), ("harmonic", harmonic))
                 if v is not None]
        if len(given) > 1:
            raise ValueError(f"alpha/alpha_schedule/harmonic: expected at most one of them, got {', '.join(given)}")
        self.distill_loss = distill
        self.tau = _number("tau", tau, low=0.0, low_open=True)
        self.harmonic: Optional[Tuple[float, float]] = None
        self.alpha_schedule: Optional[Tuple[float, float]] = None
        if harmonic is not None:
            if len(tuple(harmonic)) != 2:
                raise ValueError(f"harmonic: expected (w_d, w_s), got {harmonic!r}")
            w_d, w_s = harmonic
            self.harmonic = (_number("harmonic w_d", w_d, low=0.0, low_open=True),
                             _number("harmonic w_s", w_s, low=0.0, low_open=True))
        elif alpha_schedule is not None:
            if len(tuple(alpha_schedule)) != 2:
                raise ValueError(f"alpha_schedule: expected (alpha_start, alpha_end), got {alpha_schedule!r}")
            a0, a1 = alpha_schedule
            self.alpha_schedule = (_number("alpha_schedule start", a0, low=0.0, high=1.0),
                                   _number("alpha_schedule end", a1, low=0.0, high=1.0))
        self.alpha = _number("alpha", 0.25 if alpha is None else alpha, low=0.0, high=1.0)
        super().__init__(model, train_loader, val_loader, **kwargs)
        device = self.device
        self.teacher = teacher.to(device).eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        if self.alpha_schedule is not None:
            self.add_schedule(self._set_alpha)
            self._set_alpha(self.step, self.total_steps)

    def _set_alpha(self, step: int, total_steps: int) -> None:
        self.alpha = linear_alpha(step, total_steps, *self.alpha_schedule)

    @torch.no_grad()
    def teacher_logits(self, images: torch.Tensor) -> torch.Tensor:
        self.teacher.eval()  # callers may have flipped it (model.train() on a parent that holds it)
        return self.teacher(images)

    def task_loss(self, images: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor):
        teacher = self.teacher_logits(images)
        l_s = self.loss_fn(logits.float(), targets)
        if self.distill_loss == "mse":
            l_d = mse_logits_loss(logits, teacher)
        else:
            l_d = kl_logits_loss(logits, teacher, self.tau)
        parts: Dict[str, float] = {"task_loss": float(l_s.detach()), "distill/l_s": float(l_s.detach()),
                                   "distill/l_d": float(l_d.detach())}
        if self.harmonic is not None:
            loss = harmonic_mean_loss(l_d, l_s, *self.harmonic)
        else:
            loss = joint_loss(l_d, l_s, self.alpha)
            parts["distill/alpha"] = self.alpha
        return loss, parts
