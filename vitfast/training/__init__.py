"""Training: the `Trainer` loop (trainer.py) with its settings resolution (settings.py), optimizer and scheduler
construction (optim.py), resumable state (checkpoint_state.py), data order (data_order.py) and progress bar
(progress.py); LR schedules and weight-decay groups (schedules.py: vitfast's and timm's), RNG seeding and state
(rng.py), data-parallel helpers (distributed.py) and the data loaders (data.py).
The papers' recipes it applies (`Trainer(recipe=...)`) are data in `vitfast.recipes`.

Nothing here knows a method: methods plug in through the Trainer's hooks (`set_step`, `extra_loss`, callbacks,
`compute_loss` overrides), so method trainers (`vitfast.methods.distill.DistillTrainer`, ...) sit above it.
"""
from .._lazy import lazy_attributes
from .rng import seed_everything
from .schedules import no_decay_names, param_groups, warmup_cosine
from .trainer import AMP_DTYPES, Callback, Trainer

__all__ = ["Trainer", "Callback", "AMP_DTYPES", "param_groups", "no_decay_names", "warmup_cosine", "seed_everything",
           "data", "distributed"]


# `vitfast.training.data` / `.distributed` on first use: the data loaders import torchvision.
__getattr__ = lazy_attributes(__name__, {"data": (".data", None), "distributed": (".distributed", None)})
