"""The joining schedule λ(t) of progressive branch joining (eq. 10-13): linear, cosine, exponential or square-root in
the training progress t, with an optional warm-up at λ = 0 and a start step; the Trainer calls `set_step` on every
module that has it, and `vitfast.fuse` needs λ = 1."""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional, Union


# ---------------------------------------------------------------------------------------------- λ(t)
def _linear(t: float) -> float:
    return t  # eq. 10


def _cosine(t: float) -> float:
    return 0.5 * (1.0 - math.cos(math.pi * t))  # eq. 11


def _exponential(t: float) -> float:
    return 1.0 - math.exp(-5.0 * t)  # eq. 12 (0.9933 at t = 1; the adjustment phase then holds λ = 1)


def _sqrt(t: float) -> float:
    return math.sqrt(t)  # eq. 13


JOIN_SCHEDULES: Dict[str, Callable[[float], float]] = {
    "linear": _linear,
    "cosine": _cosine,
    "exp": _exponential,
    "sqrt": _sqrt,
}


def join_lambda(kind: str, t: float) -> float:
    """λ at normalised warm-up progress t ∈ [0, 1] (appendix B.2, eq. 10-13); t ≥ 1 is the adjustment phase: 1."""
    if kind not in JOIN_SCHEDULES:
        raise ValueError(f"kind: expected one of {tuple(JOIN_SCHEDULES)}, got {kind!r}")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or math.isnan(t):
        raise ValueError(f"t: expected a number, got {t!r}")
    if t >= 1.0:
        return 1.0
    return JOIN_SCHEDULES[kind](max(0.0, float(t)))


class JoinSchedule:
    """λ as a function of the trainer's global step (appendix B): 0 before `start_step`, then a λ warm-up period of
    `warmup_steps` steps over which t goes 0 → 1 and λ = f(t) (eq. 10-13), then the post-joining adjustment phase
    (λ = 1) for the rest of the run.

    warmup_steps: int, or None for `warmup_fraction` × (total_steps − start_step).  The paper's default is a
    10k-step warm-up then a 50k-step adjustment, i.e. warmup_fraction = 1/6 of the joining run, the default here.
    warmup_steps = 0 is instant joining (λ = 1 from `start_step` on).
    """

    def __init__(
        self,
        kind: str = "linear",
        warmup_steps: Optional[int] = None,
        *,
        warmup_fraction: float = 1.0 / 6.0,
        start_step: int = 0,
    ) -> None:
        if kind not in JOIN_SCHEDULES:
            raise ValueError(f"kind: expected one of {tuple(JOIN_SCHEDULES)}, got {kind!r}")
        if warmup_steps is not None and (isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int)
                                         or warmup_steps < 0):
            raise ValueError(f"warmup_steps: expected an int >= 0 or None, got {warmup_steps!r}")
        if isinstance(warmup_fraction, bool) or not isinstance(warmup_fraction, (int, float)) or not 0.0 <= warmup_fraction <= 1.0:
            raise ValueError(f"warmup_fraction: expected a number in [0, 1], got {warmup_fraction!r}")
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"start_step: expected an int >= 0, got {start_step!r}")
        self.kind = kind
        self.warmup_steps = warmup_steps
        self.warmup_fraction = float(warmup_fraction)
        self.start_step = start_step

    def warmup_length(self, total_steps: int) -> int:
        if self.warmup_steps is not None:
            return self.warmup_steps
        return int(round(self.warmup_fraction * max(0, total_steps - self.start_step)))

    def __call__(self, step: int, total_steps: int) -> float:
        if step < self.start_step:
            return 0.0
        warmup = self.warmup_length(total_steps)
        if warmup == 0:
            return 1.0
        return join_lambda(self.kind, (step - self.start_step) / warmup)

    def __repr__(self) -> str:
        return (f"JoinSchedule(kind={self.kind!r}, warmup_steps={self.warmup_steps!r}, "
                f"warmup_fraction={self.warmup_fraction:.4g}, start_step={self.start_step})")


def _as_schedule(schedule: Union[str, JoinSchedule]) -> JoinSchedule:
    if isinstance(schedule, JoinSchedule):
        return schedule
    if isinstance(schedule, str) and schedule in JOIN_SCHEDULES:
        return JoinSchedule(schedule)
    raise ValueError(f"schedule: expected a JoinSchedule or one of {tuple(JOIN_SCHEDULES)}, got {schedule!r}")
