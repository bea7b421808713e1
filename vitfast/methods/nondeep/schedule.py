"""The joining schedule λ(t) of progressive branch joining (eq. 10-13): linear, cosine, exponential or square-root in
the training progress t, with an optional warm-up at λ = 0 and a start step; the Trainer calls `set_step` on every
module that has it, and `vitfast.fuse` needs λ = 1."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Union


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
    """λ as a function of the trainer's global step (appendix B): 0 before the start step, then a λ warm-up period
    of `warmup_steps` steps over which t goes 0 → 1 and λ = f(t) (eq. 10-13), then the post-joining adjustment
    phase (λ = 1) for the rest of the run.

    start: `start_step` (a step count), or `start_fraction` × total_steps (rounded) when given: the steps before
    joining, in which the n branches train apart at λ = 0.
    warmup_steps: int, or None for `warmup_fraction` × (total_steps − start).  The paper's default is a
    10k-step warm-up then a 50k-step adjustment, i.e. warmup_fraction = 1/6 of the joining run, the default here.
    warmup_steps = 0 is instant joining (λ = 1 from the start on).

    The plain default (start 0: joining from the first step) is the paper's joining *phase* alone, for a model
    whose branches were already trained apart.  The paper's whole schedule — the branched model pre-trained first,
    then joined with a warm-up of 1/6 of the joining phase (section 3.4, appendix A.2) — is
    `JoinSchedule.pretrain_then_join(pretrain_fraction)`; the digits study (benchmarks/nondeep_digits.py) trains
    apart for half the steps.
    """

    def __init__(
        self,
        kind: str = "linear",
        warmup_steps: Optional[int] = None,
        *,
        warmup_fraction: float = 1.0 / 6.0,
        start_step: int = 0,
        start_fraction: Optional[float] = None,
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
        if start_fraction is not None:
            if (isinstance(start_fraction, bool) or not isinstance(start_fraction, (int, float))
                    or not 0.0 <= start_fraction < 1.0):
                raise ValueError(f"start_fraction: expected None or a number in [0, 1), got {start_fraction!r}")
            if start_step:
                raise ValueError(f"start_step: expected 0 with start_fraction (one start), got {start_step}")
            start_fraction = float(start_fraction)
        self.kind = kind
        self.warmup_steps = warmup_steps
        self.warmup_fraction = float(warmup_fraction)
        self.start_step = start_step
        self.start_fraction = start_fraction

    @classmethod
    def pretrain_then_join(cls, pretrain_fraction: float = 0.5, kind: str = "linear", *,
                           warmup_fraction: float = 1.0 / 6.0) -> "JoinSchedule":
        """The paper's schedule in one run: the branches train apart (λ = 0) for `pretrain_fraction` of the steps,
        then λ warms up over `warmup_fraction` (1/6: 10k of the 10k + 50k joining steps, appendix A.2) of the
        remaining steps, then λ = 1.  The paper does not give the pre-training share as a fraction of one run (its
        branched model is pre-trained in a run of its own); 0.5 is what the digits study found better than 0."""
        if (isinstance(pretrain_fraction, bool) or not isinstance(pretrain_fraction, (int, float))
                or not 0.0 <= pretrain_fraction < 1.0):
            raise ValueError(f"pretrain_fraction: expected a number in [0, 1), got {pretrain_fraction!r}")
        return cls(kind, None, warmup_fraction=warmup_fraction, start_fraction=pretrain_fraction)

    def start(self, total_steps: int) -> int:
        """The first joining step (λ > 0 from the step after it on, unless the warm-up is instant)."""
        if self.start_fraction is None:
            return self.start_step
        return int(round(self.start_fraction * total_steps))

    def warmup_length(self, total_steps: int) -> int:
        if self.warmup_steps is not None:
            return self.warmup_steps
        return int(round(self.warmup_fraction * max(0, total_steps - self.start(total_steps))))

    def __call__(self, step: int, total_steps: int) -> float:
        start = self.start(total_steps)
        if step < start:
            return 0.0
        warmup = self.warmup_length(total_steps)
        if warmup == 0:
            return 1.0
        return join_lambda(self.kind, (step - start) / warmup)

    def to_dict(self) -> Dict[str, Any]:
        """Plain JSON values (the train-time file's "nondeep" entry); `from_dict` rebuilds the same schedule."""
        out: Dict[str, Any] = {"kind": self.kind, "warmup_steps": self.warmup_steps,
                               "warmup_fraction": self.warmup_fraction, "start_step": self.start_step}
        if self.start_fraction is not None:  # absent in files written before it existed: start_step alone
            out["start_fraction"] = self.start_fraction
        return out

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "JoinSchedule":
        return cls(d["kind"], d["warmup_steps"], warmup_fraction=d["warmup_fraction"], start_step=d["start_step"],
                   start_fraction=d.get("start_fraction"))

    def __repr__(self) -> str:
        start = (f"start_fraction={self.start_fraction:.4g}" if self.start_fraction is not None
                 else f"start_step={self.start_step}")
        return (f"JoinSchedule(kind={self.kind!r}, warmup_steps={self.warmup_steps!r}, "
                f"warmup_fraction={self.warmup_fraction:.4g}, {start})")


def _as_schedule(schedule: Union[str, JoinSchedule]) -> JoinSchedule:
    if isinstance(schedule, JoinSchedule):
        return schedule
    if isinstance(schedule, str) and schedule in JOIN_SCHEDULES:
        return JoinSchedule(schedule)
    raise ValueError(f"schedule: expected a JoinSchedule or one of {tuple(JOIN_SCHEDULES)}, got {schedule!r}")
