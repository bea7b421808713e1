"""Training recipes: each paper's published settings as data, with their sources (registry.py), and how a recipe,
explicit options and defaults combine (resolve.py).  `vitfast train --recipe NAME` and `Trainer(recipe=NAME)` apply
one; docs/training.md describes them."""
from .registry import KEYS, RECIPES, get_recipe, recipe_names
from .resolve import NOT_APPLIED_YET, TRAINER_DEFAULTS, Setting, format_settings, resolve

__all__ = ["RECIPES", "KEYS", "get_recipe", "recipe_names", "resolve", "format_settings", "Setting",
           "TRAINER_DEFAULTS", "NOT_APPLIED_YET"]
