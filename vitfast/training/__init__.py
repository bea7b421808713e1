"""Training: the `Trainer` loop (trainer.py), LR schedule and weight-decay groups (schedules.py), RNG seeding and
state (rng.py), data-parallel helpers (distributed.py) and the data loaders (data.py).

Nothing here knows a method: methods plug in through the Trainer's hooks (`set_step`, `extra_loss`, callbacks,
`compute_loss` overrides), so method trainers (`vitfast.methods.distill.DistillTrainer`, ...) sit above it.
"""
from .._lazy import lazy_attributes
from .rng import seed_everything
from .schedules import param_groups, warmup_cosine
from .trainer import AMP_DTYPES, Callback, Trainer

__all__ = ["Trainer", "Callback", "AMP_DTYPES", "param_groups", "warmup_cosine", "seed_everything", "data",
           "distributed"]


# `vitfast.training.data` / `.distributed` on first use: the data loaders import torchvision.
__getattr__ = lazy_attributes(__name__, {"data": (".data", None), "distributed": (".distributed", None)})
