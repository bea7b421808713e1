"""A Trainer's resumable state: what goes into a trainer checkpoint and how a Trainer takes it back.

Kept apart from the loop because the state's contents and the checks on resuming (same length, seed and recipe; a
schedule kind the Trainer can rebuild) are the checkpoint format's contract, not the loop's.  The state holds only
state dicts, tensors and plain values, so `vitfast.io.trainer_checkpoint` writes and reads it with
`torch.load(..., weights_only=True)`; the file handling (atomic write, main process only) stays with
`Trainer.save_checkpoint` / `Trainer.load_checkpoint`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

import torch.nn as nn

from ..io.trainer_checkpoint import CHECKPOINT_FORMAT, CHECKPOINT_VERSION
from . import distributed as _dist
from .rng import _rng_state

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["trainer_state", "load_trainer_state"]


def _unwrapped(model: nn.Module) -> nn.Module:
    """The model whose parameter names the checkpoint uses (a wrapper's `.module`, else the model itself)."""
    return model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model


def trainer_state(trainer: "Trainer", extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """`Trainer.state_dict`: everything a resumed run needs, as tensors and plain values (weights_only-loadable).

    Under DDP every process must call it (the RNG states of all ranks are gathered).
    """
    rng = trainer._pending_rng if trainer._pending_rng is not None else _rng_state(trainer.device)
    state = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "step": trainer.step,
        "epoch": trainer.epoch,
        "batch_in_epoch": trainer.batch_in_epoch,
        "total_steps": trainer.total_steps,
        "seed": trainer.seed,
        "model": _unwrapped(trainer.model).state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        # absent in checkpoints from before timm's schedule: those resume on the legacy one
        "lr_schedule": trainer.lr_schedule,
        "recipe": trainer.recipe,
        # a checkpoint taken before the data was positioned still holds the RNG state it must restore
        "rng": rng,
        "last_eval": dict(trainer.last_eval) if trainer.last_eval else None,
        "extra": dict(trainer.checkpoint_extra if extra is None else extra),
        # the data position is stored in micro-batches of this accumulation; load converts it to steps
        "grad_accum": trainer.grad_accum,
        "world_size": trainer.world_size,
    }
    if trainer.world_size > 1:
        state["rng_ranks"] = _dist.gather_objects(rng)
    if trainer.scaler is not None:
        state["scaler"] = trainer.scaler.state_dict()
    return state


def _check_same_run(trainer: "Trainer", state: Dict[str, Any]) -> None:
    """A checkpoint resumes exactly only into a Trainer of the same length, seed and recipe."""
    if state["total_steps"] != trainer.total_steps:
        raise ValueError(
            f"checkpoint: made for total_steps={state['total_steps']}, this Trainer has "
            f"total_steps={trainer.total_steps}; build the Trainer with the same length to resume exactly"
        )
    if state["seed"] != trainer.seed:
        raise ValueError(f"checkpoint: made with seed={state['seed']}, this Trainer has seed={trainer.seed}")
    if state.get("recipe") != trainer.recipe:  # another recipe: another optimizer, schedule and loss
        raise ValueError(f"checkpoint: made with recipe={state.get('recipe')!r}, this Trainer has "
                         f"recipe={trainer.recipe!r}")


def _resume_schedule_kind(trainer: "Trainer", state: Dict[str, Any]) -> None:
    """Switch the Trainer to the LR schedule the checkpoint was trained with, when it can rebuild it."""
    kind = state.get("lr_schedule", "legacy")
    if kind != trainer.lr_schedule:
        if kind not in ("timm", "legacy") or (kind == "legacy" and trainer.layer_decay):
            raise ValueError(f"checkpoint: made with lr_schedule={kind!r}, which this Trainer cannot resume "
                             f"(lr_schedule={trainer.lr_schedule!r}, layer_decay={trainer.layer_decay!r})")
        trainer.lr_schedule = kind  # the run continues on the schedule it was trained with
        trainer.scheduler = trainer._make_scheduler(kind)


def load_trainer_state(trainer: "Trainer", state: Dict[str, Any]) -> None:
    """`Trainer.load_state_dict`: check `state` belongs to this run, then restore the model, optimizer, schedule,
    data position and (at the next batch, after the data is positioned) the RNG streams."""
    _check_same_run(trainer, state)
    _unwrapped(trainer.model).load_state_dict(state["model"])
    _resume_schedule_kind(trainer, state)
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.step = int(state["step"])
    trainer.epoch = int(state["epoch"])
    # checkpoints are taken between steps: convert the position to this run's micro-batches per step
    saved_accum = int(state.get("grad_accum", 1))
    trainer.batch_in_epoch = int(state["batch_in_epoch"]) // saved_accum * trainer.grad_accum
    trainer.last_eval = state.get("last_eval")
    trainer._iter = None
    ranks = state.get("rng_ranks")
    # same process count: each rank continues its own random streams; otherwise rank 0's is the best there is
    trainer._pending_rng = ranks[trainer.rank] if ranks and len(ranks) == trainer.world_size else state["rng"]
    if trainer.scaler is not None and state.get("scaler"):
        trainer.scaler.load_state_dict(state["scaler"])
    trainer._last_saved_step = trainer.step
