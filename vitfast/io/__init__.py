"""Every file format vitfast reads or writes, and the atomic writer under all of them.

    fused.py               the fused model: one .safetensors, JSON config in its metadata (`vitfast.save/load`);
                           `_rebuild.py` rebuilds a model from that config (load) and compares (save)
    trainable.py           the train-time model (`save_trainable` / `load_trainable`), methods' entries included
    trainer_checkpoint.py  the Trainer's resumable state (torch zip, read with weights_only=True)
    head_ranking.py        Σ_h head scores for drop-in DW-conv heads (JSON)
    atomic.py              temporary file, fsync, rename: nothing is ever written half-way, nothing left behind

Names are resolved on first use: `atomic`, `head_ranking` and `trainer_checkpoint` import no model code, so the
lower layers (training, methods) use them without importing the model formats above them.
"""
from __future__ import annotations

from .._lazy import lazy_attributes

_LAZY = {
    "save": ("fused", "save"), "load": ("fused", "load"), "read_config": ("fused", "read_config"),
    "FUSED_FORMAT": ("fused", "FORMAT"),
    "save_trainable": ("trainable", "save_trainable"), "load_trainable": ("trainable", "load_trainable"),
    "describe_trainable": ("trainable", "describe_trainable"), "build_trainable": ("trainable", "build_trainable"),
    "read_safetensors_metadata": ("trainable", "read_safetensors_metadata"),
    "TRAINABLE_FORMAT": ("trainable", "TRAINABLE_FORMAT"),
    "load_trainer_checkpoint": ("trainer_checkpoint", "load_trainer_checkpoint"),
    "save_trainer_checkpoint": ("trainer_checkpoint", "save_trainer_checkpoint"),
    "HeadRanking": ("head_ranking", "HeadRanking"),
    "atomic_write": ("atomic", "atomic_write"), "atomic_write_text": ("atomic", "atomic_write_text"),
}
__all__ = list(_LAZY)


__getattr__ = lazy_attributes(__name__, {name: (f".{module}", attr) for name, (module, attr) in _LAZY.items()})
