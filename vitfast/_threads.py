"""CPU threads and OpenMP's wait policy.

torch runs its CPU ops on an OpenMP team (GNU libgomp on Linux).  Between two parallel regions libgomp's idle
workers spin: for about 3 ms by default, for minutes with `OMP_WAIT_POLICY=ACTIVE`, not at all with `PASSIVE`
(they sleep on a futex).  On cores shared with other processes the spinning takes time slices those processes
need, and a team whose worker was pre-empted waits for it at every region: 12 steps of the README's tour model at
2 threads took 17-37 s on a loaded 2-core machine (> 90 s beside a competing process), 2.2-4.8 s with `PASSIVE`.
On quiet cores passive waiting costs: those 12 steps took 2.0 s against 1.2 s, and a fused DeiT-Ti forward at
2 threads, batch 1, 7.2 ms against 4.4-4.7 ms (a sleeping worker wakes late for each of the many short regions).
Training takes that trade (a 1.7x cost against stalls of minutes): the `vitfast` commands that train
(TRAINING_COMMANDS; not `demo`, which reports inference latency) set `PASSIVE`.  Inference does not: `import vitfast` alone leaves OpenMP's default
(docs/performance.md#threads has the tables).

libgomp reads its environment once, when the library is loaded, which is when torch is imported: setting
`os.environ` later changes nothing (measured: after `import torch`, a 2-thread loop spun at 1.0 CPU-second per
second whether or not `PASSIVE` was set; before it, 0.05).  So the choice is made at `import vitfast` from the
command line, before vitfast imports torch; a library user's Trainer cannot change it and says so once
(`set_threads(..., training=True)`).
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Optional, Sequence

POLICY_ENV = "OMP_WAIT_POLICY"
# GOMP_SPINCOUNT overrides either policy's spin count in libgomp: a user who set it has chosen too.
SPIN_ENV = "GOMP_SPINCOUNT"
DEFAULT_POLICY = "PASSIVE"

# What libgomp read when it was loaded, as far as vitfast can know: set by `default_wait_policy()`.
_policy_at_load: Optional[str] = None
_set_by_vitfast = False
_warned = False


# `vitfast` subcommands whose time is training: passive waiting helps them on shared cores (module doc).  Not `demo`:
# it reports inference latency, which passive waiting made worse on quiet cores (its fused batch-1 forward 0.94 ms
# against 0.16 ms with spinning workers, and its speed-up over the train-time model 2.4x against 4.2x).
TRAINING_COMMANDS = ("train", "usdc", "distill-demo")


def _runs_training_command(argv: Sequence[str]) -> bool:
    """Whether this process is the `vitfast` command (console script, or `python -m vitfast`, whose argv[0] is '-m'
    while the package is imported) running one of TRAINING_COMMANDS (its first positional argument)."""
    if not argv or os.path.basename(argv[0]) not in ("vitfast", "-m"):
        return False
    command = next((a for a in argv[1:] if not a.startswith("-")), None)
    return command in TRAINING_COMMANDS


def default_wait_policy(argv: Optional[Sequence[str]] = None) -> bool:
    """For a `vitfast` command that trains, make OpenMP's idle workers sleep (`OMP_WAIT_POLICY=PASSIVE`) unless the
    user chose a policy or a spin count; returns whether it set the variable.  Called at `import vitfast`, before
    torch (and with it libgomp) is loaded: afterwards it could not take effect, so it sets nothing.  Child
    processes inherit the variable (DataLoader workers): the same choice applies to them."""
    global _policy_at_load, _set_by_vitfast
    argv = sys.argv if argv is None else argv
    user_chose = POLICY_ENV in os.environ or SPIN_ENV in os.environ
    if not user_chose and "torch" not in sys.modules and _runs_training_command(argv):
        os.environ[POLICY_ENV] = DEFAULT_POLICY
        _set_by_vitfast = True
    # With torch imported already this is a guess: the variable as it is now, which is what libgomp saw unless it
    # was changed after `import torch` (a change libgomp ignores).
    _policy_at_load = os.environ.get(POLICY_ENV)
    return _set_by_vitfast


def wait_policy() -> str:
    """The OpenMP wait policy in effect, for logs: 'PASSIVE', 'ACTIVE' or 'default' (spin ~3 ms, then sleep),
    with ' (set by vitfast)' when vitfast chose it and ' (GOMP_SPINCOUNT=N)' when a spin count overrides it."""
    policy = _policy_at_load.strip().upper() if _policy_at_load and _policy_at_load.strip() else "default"
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


def set_threads(threads: Optional[int], *, name: str = "threads", training: bool = False) -> None:
    """`torch.set_num_threads(threads)` (None: leave torch's count).  For training with more than one thread and
    workers that spin by nobody's choice, warns once how to start the process instead: the policy cannot change
    any more in this process."""
    global _warned
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{name}: expected a positive integer, got {threads!r}")
    import torch

    torch.set_num_threads(threads)
    user_chose = (POLICY_ENV in os.environ and not _set_by_vitfast) or SPIN_ENV in os.environ
    if training and threads > 1 and workers_spin() and not user_chose and not _warned:
        _warned = True
        warnings.warn(
            f"{name}={threads}: OpenMP's idle workers spin between ops (OMP_WAIT_POLICY is not set); on cores "
            f"shared with other processes that can make each step many times slower.  Start Python with "
            f"OMP_WAIT_POLICY=PASSIVE (it cannot change once torch is loaded), or train on 1 thread.",
            RuntimeWarning, stacklevel=3)
