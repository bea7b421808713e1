"""Tensors derived from a weight and kept while the weight lives and is unchanged: one mechanism for every such copy.

    cache = DerivedCache()
    value = cache.get(weight, tag, make)        # make(weight.detach()) once per weight version (and tag)

Users: the fp32 copies of low-precision parameters under autocast (vitfast/ops/_autocast.py), the patch projection's
weight re-ordered to the input's layout (vitfast/nn/patch_embed.py), and colsum(W) of the GPU block path's
LayerNorm-folded GEMMs (kernels/ln_linear.py).

Staleness: an entry is reused only while its weight's identity (`weight_identity`) is what it was when the value
was made: the autograd version counter sees in-place updates (`load_state_dict`, optimizer steps, fused ones
included: vitfast/ops/_optimizer_versions.py), the data pointer, dtype, device, shape and strides see `w.data = new`
(which keeps the version).  Writes through `.data` in place are not seen: `vitfast.ops.clear_weight_cache()` clears
every cache made here (`clear_all`).  An entry is dropped with its weight (a weakref callback), so the caches never
keep a dead module's memory.  Callers decide when not to cache at all: inference tensors have no version counter,
a training step must differentiate through the derivation, a CUDA-graph capture must record it.
"""
from __future__ import annotations

import weakref
from typing import Callable, Hashable

import torch

__all__ = ["DerivedCache", "clear_all", "weight_identity"]

_CACHES: "weakref.WeakSet[DerivedCache]" = weakref.WeakSet()


def weight_identity(w: torch.Tensor) -> tuple:
    """What changes when a weight's values may have changed (module docstring)."""
    return w._version, w.data_ptr(), w.dtype, w.device, tuple(w.shape), tuple(w.stride())


class DerivedCache:
    """id(weight) → (weakref to it, (its identity, tag) when made, the derived tensor): one value per weight."""

    def __init__(self) -> None:
        self._entries: dict = {}
        _CACHES.add(self)

    def get(self, weight: torch.Tensor, tag: Hashable, make: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The kept `make(weight.detach())` for this weight version and `tag` (made now, replacing any other)."""
        key, identity = id(weight), (weight_identity(weight), tag)
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is weight and entry[1] == identity:
            return entry[2]
        # Under inference_mode the value would be an inference tensor (no version of its own), under grad a node.
        with torch.inference_mode(False), torch.no_grad():
            value = make(weight.detach())
        entries = self._entries
        entries[key] = (weakref.ref(weight, lambda _, key=key: entries.pop(key, None)), identity, value)
        return value

    def value_of(self, weight: torch.Tensor):
        """The kept value for `weight` whatever its version (None if none): for tests and debugging."""
        entry = self._entries.get(id(weight))
        return entry[2] if entry is not None and entry[0]() is weight else None

    def __contains__(self, weight: torch.Tensor) -> bool:
        return self.value_of(weight) is not None

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()


def clear_all() -> None:
    """Clear every DerivedCache (what `vitfast.ops.clear_weight_cache()` does besides the packed weights)."""
    for cache in list(_CACHES):
        cache.clear()
