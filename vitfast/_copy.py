"""A deep copy of a model that keeps what torch's copy drops: attributes set on its parameters."""
from __future__ import annotations

import copy

import torch.nn as nn


def deepcopy_model(model: nn.Module) -> nn.Module:
    """`copy.deepcopy(model)`, with each parameter's own attributes (e.g. `p._no_weight_decay = True`, the
    mark `vitfast.training.param_groups` reads) copied onto its copy: `nn.Parameter.__deepcopy__` builds a new
    Parameter from the data alone, so a conversion that copies the model silently lost such marks."""
    memo: dict = {}
    copied = copy.deepcopy(model, memo)
    for p in model.parameters():
        twin = memo.get(id(p))
        if twin is not None and p.__dict__:
            for name, value in p.__dict__.items():
                if name not in twin.__dict__:
                    setattr(twin, name, copy.deepcopy(value, memo))
    return copied
