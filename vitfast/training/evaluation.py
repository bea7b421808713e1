"""Top-1 accuracy and mean loss of a model over a loader: the body of `Trainer.evaluate` (see its docstring for the
RNG fork and the sharded all-reduce under DDP)."""
from __future__ import annotations

from typing import Any, Callable, ContextManager, Dict, Iterable, Tuple

import torch
import torch.nn as nn

from . import distributed as _dist

__all__ = ["evaluate_model"]


def evaluate_model(model: nn.Module, loader: Iterable, *, device: torch.device, world_size: int,
                   to_device: Callable[[Any], Tuple[torch.Tensor, torch.Tensor]],
                   autocast: Callable[[], ContextManager], loss_fn: Callable) -> Dict[str, float]:
    """{"loss", "acc", "n"} of `model` over `loader` in eval mode, under a forked RNG (the model's train/eval mode is
    restored); a loader sharded over the DDP processes is all-reduced, a DistributedSampler refused."""
    sampler = getattr(loader, "sampler", None)
    sharded = _dist.is_distributed() and getattr(sampler, "num_replicas", 1) == world_size
    if sharded and isinstance(sampler, torch.utils.data.DistributedSampler):
        raise ValueError(
            "loader: a DistributedSampler repeats samples to even out shards, which would count them twice; "
            "use vitfast.training.data.ShardSampler for evaluation"
        )
    was_training = model.training
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        model.eval()
        try:
            loss_sum, correct, n = 0.0, 0, 0
            for batch in loader:
                images, targets = to_device(batch)
                with autocast():
                    logits = model(images)
                logits = logits.float()
                loss_sum += float(loss_fn(logits, targets)) * targets.shape[0]
                correct += int((logits.argmax(-1) == targets).sum())
                n += int(targets.shape[0])
        finally:
            model.train(was_training)
    if sharded:
        loss_sum, correct, n = _dist.all_reduce_sum([loss_sum, correct, n], device)
        correct, n = int(correct), int(n)
    if n == 0:
        raise ValueError("loader: produced no batches to evaluate")
    return {"loss": loss_sum / n, "acc": correct / n, "n": n}
