"""Registry of fused (inference) module classes: the contract between `vitfast.fuse` and the checkpoint format.

A fused model is a timm model skeleton (VisionTransformer, SwinTransformer, ...) in which some submodules were
replaced by vitfast fused modules.  The checkpoint stores, for every replaced submodule, its path and its
`vitfast_config()`; loading rebuilds the skeleton, then each submodule with `from_vitfast_config(cfg)`
(parameters allocated with the right shapes, values come from the safetensors file).

Every fused module class:
  * is decorated with `@register_fused("<kind>")` (kind is a stable string stored in files; never rename);
  * implements `vitfast_config(self) -> dict` (JSON-serialisable; must include "kind") and
    `from_vitfast_config(cls, cfg: dict) -> nn.Module`.
"""
from __future__ import annotations

from typing import Callable, Dict, Type

import torch.nn as nn

_FUSED: Dict[str, Type[nn.Module]] = {}


def register_fused(kind: str) -> Callable[[Type[nn.Module]], Type[nn.Module]]:
    def decorate(cls: Type[nn.Module]) -> Type[nn.Module]:
        if kind in _FUSED and _FUSED[kind] is not cls:
            raise ValueError(f"kind: {kind!r} is already registered to {_FUSED[kind].__qualname__}")
        for method in ("vitfast_config", "from_vitfast_config"):
            if not hasattr(cls, method):
                raise TypeError(f"{cls.__qualname__}: a fused module must define {method}()")
        cls.vitfast_kind = kind
        _FUSED[kind] = cls
        return cls

    return decorate


def fused_kinds() -> tuple:
    return tuple(sorted(_FUSED))


def is_fused_module(module: nn.Module) -> bool:
    return type(module) in _FUSED.values()


def fused_module_from_config(cfg: dict) -> nn.Module:
    if not isinstance(cfg, dict) or "kind" not in cfg:
        raise ValueError(f"cfg: expected a dict with a 'kind' key, got {cfg!r:.200}")
    kind = cfg["kind"]
    if kind not in _FUSED:
        raise ValueError(f"cfg['kind']: expected one of {fused_kinds()}, got {kind!r}")
    return _FUSED[kind].from_vitfast_config(cfg)
