"""`DistillTrainer`: the Trainer with a frozen teacher, MSE (or KL) on its logits plus hard-label cross-entropy,
α fixed, linearly scheduled, or the weighted harmonic-mean joint loss (eq. 4)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ...training.trainer import Trainer
from .losses import (
    DISTILL_LOSSES,
    _number,
    harmonic_mean_loss,
    joint_loss,
    kl_logits_loss,
    linear_alpha,
    mse_logits_loss,
)


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
