"""vitfast/_derived.py: tensors derived from a weight, kept per weight version (the autocast fp32 copies, the patch
projection's re-ordered weight and the block path's colsum(W) all use it)."""
import gc

import torch

import vitfast
from vitfast._derived import DerivedCache, weight_identity


def _made(cache, w, tag=None):
    calls = []

    def make(d):
        calls.append(d)
        return d.sum(dim=1)

    return cache.get(w, tag, make), calls


def test_made_once_per_version_and_tag():
    cache, w = DerivedCache(), torch.nn.Parameter(torch.randn(4, 3))
    first, calls = _made(cache, w)
    again, calls2 = _made(cache, w)
    assert again is first and len(calls) == 1 and not calls2
    assert not calls[0].requires_grad and not first.requires_grad  # made from w.detach(), outside autograd
    other, calls3 = _made(cache, w, tag="hwc")
    assert len(calls3) == 1 and cache.value_of(w) is other and len(cache) == 1  # one value per weight


def test_in_place_updates_and_replaced_data_are_seen():
    cache, w = DerivedCache(), torch.nn.Parameter(torch.ones(2, 2))
    before, _ = _made(cache, w)
    with torch.no_grad():
        w.mul_(3)  # the version counter moves
    after, calls = _made(cache, w)
    assert calls and torch.equal(after, 3 * before)
    identity = weight_identity(w)
    w.data = torch.full((2, 2), 5.0)  # same version, new storage
    assert weight_identity(w) != identity
    replaced, calls = _made(cache, w)
    assert calls and torch.equal(replaced, torch.full((2,), 10.0))


def test_writes_through_data_need_clear_weight_cache():
    cache, w = DerivedCache(), torch.nn.Parameter(torch.ones(2, 2))
    kept, _ = _made(cache, w)
    w.data.mul_(2)  # invisible to the version counter
    assert _made(cache, w)[0] is kept
    vitfast.ops.clear_weight_cache()  # clears every DerivedCache
    assert w not in cache
    fresh, calls = _made(cache, w)
    assert calls and torch.equal(fresh, 2 * kept)


def test_dropped_with_the_weight_and_made_outside_inference_mode():
    cache, w = DerivedCache(), torch.nn.Parameter(torch.randn(3, 3))
    with torch.inference_mode():
        value, _ = _made(cache, w)
    assert not value.is_inference()  # a kept value has a version of its own
    del w
    gc.collect()
    assert len(cache) == 0
