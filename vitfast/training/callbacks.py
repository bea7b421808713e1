"""`Callback`: the hooks a Trainer calls (vitfast/training/trainer.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["Callback"]


class Callback:
    """Base class (optional): override any of these; the Trainer calls those that exist."""

    def on_step(self, trainer: "Trainer", metrics: Dict[str, float]) -> None:  # after every optimizer step
        pass

    def on_eval(self, trainer: "Trainer", metrics: Dict[str, float]) -> None:  # after every evaluation
        pass

    def on_fit_end(self, trainer: "Trainer") -> None:
        pass
