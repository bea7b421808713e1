"""CPU threads and OpenMP's wait policy.

torch runs its CPU ops on an OpenMP team (GNU libgomp on Linux).  Between two parallel regions libgomp's idle
workers spin: for about 3 ms by default, for minutes with `OMP_WAIT_POLICY=ACTIVE`, not at all with `PASSIVE`
(they sleep on a futex).  On cores shared with other processes the spinning takes time slices those processes
need, and a team whose worker was pre-empted waits for it at every region: a 2-thread training loop of the README's
tour ranged from 5.6 s to 143.5 s for the same 40 steps.  So vitfast makes the waiting passive unless the user chose.

libgomp reads its environment once, when the library is loaded, which is when torch is imported: setting
`os.environ` later changes nothing (measured: after `import torch`, a 2-thread loop spun at 1.0 CPU-second per
second whether or not `PASSIVE` was set; before it, 0.05).  Hence `default_wait_policy()` runs at `import vitfast`
before vitfast imports torch, and only then helps; a process that imported torch first keeps the policy it started
with, and `set_threads` says so once.
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Optional

POLICY_ENV = "OMP_WAIT_POLICY"
# GOMP_SPINCOUNT overrides either policy's spin count in libgomp: a user who set it has chosen too.
SPIN_ENV = "GOMP_SPINCOUNT"
DEFAULT_POLICY = "PASSIVE"

# What libgomp read when it was loaded, as far as vitfast can know: set by `default_wait_policy()`.
_policy_at_load: Optional[str] = None
_set_by_vitfast = False
_warned = False


def default_wait_policy() -> bool:
    """Make OpenMP's idle workers sleep (`OMP_WAIT_POLICY=PASSIVE`) unless the user chose a policy or a spin count;
    returns whether it set the variable.  Only effective before torch (and with it libgomp) is loaded, so it is
    called at `import vitfast`, first thing; with torch already imported it sets nothing.  Child processes inherit
    the variable (DataLoader workers, `torchrun` ranks started from here): the same choice applies to them."""
    global _policy_at_load, _set_by_vitfast
    user_chose = POLICY_ENV in os.environ or SPIN_ENV in os.environ
    if not user_chose and "torch" not in sys.modules:
        os.environ[POLICY_ENV] = DEFAULT_POLICY
        _set_by_vitfast = True
    # With torch imported already this is a guess: the variable as it is now, which is what libgomp saw unless it
    # was changed after `import torch` (a change libgomp ignores).
    _policy_at_load = os.environ.get(POLICY_ENV)
    return _set_by_vitfast


def wait_policy() -> str:
    """The OpenMP wait policy in effect, for logs: 'PASSIVE', 'ACTIVE' or 'default' (spin ~3 ms, then sleep),
    with ' (set by vitfast)' when vitfast chose it and ' (GOMP_SPINCOUNT=N)' when a spin count overrides it."""
    policy = (_policy_at_load or "default").upper() if _policy_at_load != "" else "default"
    if _set_by_vitfast:
        policy += " (set by vitfast)"
    if SPIN_ENV in os.environ:
        policy += f" ({SPIN_ENV}={os.environ[SPIN_ENV]})"
    return policy


def workers_spin() -> bool:
    """Whether idle OpenMP workers spin between parallel regions (any policy but PASSIVE, unless GOMP_SPINCOUNT=0)."""
    if SPIN_ENV in os.environ:
        return os.environ[SPIN_ENV].strip() not in ("0", "")
    return (_policy_at_load or "").strip().upper() != "PASSIVE"


def set_threads(threads: Optional[int], *, name: str = "threads") -> None:
    """`torch.set_num_threads(threads)` (None: leave torch's count).  With more than one thread and spinning
    workers that nobody chose (torch was imported before vitfast, no OMP_WAIT_POLICY), warns once how to start
    the process instead: the policy cannot change any more in this process."""
    global _warned
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{name}: expected a positive integer, got {threads!r}")
    import torch

    torch.set_num_threads(threads)
    user_chose = POLICY_ENV in os.environ and not _set_by_vitfast or SPIN_ENV in os.environ
    if threads > 1 and workers_spin() and not user_chose and not _warned:
        _warned = True
        warnings.warn(
            f"{threads} threads with spinning OpenMP workers: torch was imported before vitfast, so OMP_WAIT_POLICY "
            f"could not be set to PASSIVE for this process; on cores shared with other processes that can make each "
            f"step several times slower.  Start Python with OMP_WAIT_POLICY=PASSIVE (or import vitfast before torch), "
            f"or use 1 thread.", RuntimeWarning, stacklevel=3)
