"""The training data's order: an epoch's batches drawn from (seed, epoch) alone, entered at a given batch.

Why its own module: exact resumption rests on it.  A resumed run must read the batches the interrupted one would
have read, but the global RNG state at that moment is not the one the interrupted run had when the epoch began; so
the sampler and the loader's worker seeds are set from (seed, epoch), never drawn from the global RNG, and the
position within the epoch is skipped to (cheaply when the sampler can start part-way).
"""
from __future__ import annotations

from typing import Iterable, Iterator, Optional, Tuple

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from .data import _mix

__all__ = ["epoch_batches"]


def epoch_batches(loader: Optional[Iterable], epoch: int, skip_batches: int, seed: int,
                  grad_accum: int) -> Tuple[Iterator, Optional[int]]:
    """(iterator over `epoch`'s batches from number `skip_batches` on, the epoch's usable batch count or None).

    With grad_accum = A > 1 an epoch is cut to a multiple of A batches (a step never spans two epochs); the count
    is None when no cut applies (A = 1, or a loader without a length).
    """
    if loader is None:
        raise ValueError("train_loader: fit() needs a training loader, got None")
    sampler = getattr(loader, "sampler", None)
    fast_skip = False
    if isinstance(loader, DataLoader):
        # The data order and worker seeds come from (seed, epoch) only, never from the global RNG state,
        # so a resumed run reproduces the interrupted one's batches.
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        elif isinstance(sampler, RandomSampler):
            sampler.generator = torch.Generator().manual_seed(_mix(seed, epoch, 0x5A3))
        loader.generator = torch.Generator().manual_seed(_mix(seed, epoch, 0x3C7))
    elif hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    limit = None
    if grad_accum > 1:
        try:
            limit = len(loader) // grad_accum * grad_accum
        except TypeError:
            pass  # no length: accumulation may straddle epochs
    if skip_batches and limit is not None and skip_batches >= limit:
        # Resumed exactly at the end of an epoch with accumulation: nothing is left of it.  Positioning the
        # sampler here (set_start) was never consumed, since no batch is read, and shifted the *next* epoch.
        return iter(()), limit
    if isinstance(loader, DataLoader):
        batch_sampler = loader.batch_sampler
        if skip_batches and hasattr(sampler, "set_start") and type(batch_sampler) is BatchSampler:
            sampler.set_start(min(skip_batches * loader.batch_size, len(sampler)))
            fast_skip = True
    it = iter(loader)
    if skip_batches and not fast_skip:
        for _ in range(skip_batches):  # no cheaper way for an arbitrary loader: read and drop
            next(it)
    return it, limit
