"""Data-parallel training helpers: process-group set-up from torchrun's environment, collectives that are no-ops
in a single process, and a synchronised BatchNorm that works on every backend (gloo on CPU included).

    from vitfast.training import distributed as dist
    ctx = dist.init_from_env()            # torchrun: NCCL on GPU, gloo on CPU; single process: world_size 1
    ...Trainer(model, loaders_for(ctx.rank, ctx.world_size), device=ctx.device)...   # wraps DDP itself
    dist.cleanup()

`vitfast.training.Trainer` uses `world_size()`, `rank()`, `all_reduce_sum`, `synced_batchnorm` from here, so the
same loop runs single-process or under `torchrun --nproc_per_node N` unchanged.

Why a BatchNorm of our own: torch's `nn.SyncBatchNorm` runs on GPUs only, and it is a different class, so
`isinstance(m, nn.BatchNorm1d)` checks (the channel-idle FFN dispatches on them, `describe_trainable` records
class names) would fail on a converted model.  `synced_batchnorm(model)` instead switches each BatchNorm's
class *in place* to a subclass whose training-mode forward takes its statistics over the global batch (two
differentiable all-reduces: the sum, then the sum of squared deviations — the same two-pass arithmetic as one
process, so N processes with batch b match one process with batch N·b within float rounding).  The modules keep
their parameters, buffers and state-dict keys; the context manager switches them back.
"""
from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import Iterator, List, Optional

import torch
import torch.distributed as tdist
import torch.nn as nn

__all__ = [
    "DistContext",
    "init_from_env",
    "cleanup",
    "is_distributed",
    "world_size",
    "rank",
    "is_main_process",
    "barrier",
    "all_reduce_sum",
    "broadcast_object",
    "gather_objects",
    "synced_batchnorm",
]


@dataclass
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    backend: Optional[str]
    device: torch.device


def is_distributed() -> bool:
    """True inside an initialised process group of more than one process."""
    return tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1


def world_size() -> int:
    return tdist.get_world_size() if tdist.is_available() and tdist.is_initialized() else 1


def rank() -> int:
    return tdist.get_rank() if tdist.is_available() and tdist.is_initialized() else 0


def is_main_process() -> bool:
    return rank() == 0


def barrier() -> None:
    if is_distributed():
        tdist.barrier()


def init_from_env(device: Optional[str] = None, timeout_s: float = 1800.0) -> DistContext:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT).

    Without those variables (or WORLD_SIZE=1) nothing is initialised and a single-process context comes back.
    `device`: "cpu", "cuda" or None (CUDA when available).  Backend: NCCL for CUDA, gloo for CPU; each process
    uses GPU LOCAL_RANK.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    want_cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    if want_cuda and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} asked for, but torch sees no CUDA device here")
    dev = torch.device("cuda", local % max(1, torch.cuda.device_count())) if want_cuda else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world <= 1:
        return DistContext(0, 0, 1, None, dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if not tdist.is_initialized():
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        tdist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return DistContext(tdist.get_rank(), local, tdist.get_world_size(), backend, dev)


def cleanup() -> None:
    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()


def all_reduce_sum(values: List[float], device: torch.device) -> List[float]:
    """Element-wise sum of `values` over all processes (identity in one process), in float64."""
    if not is_distributed():
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    tdist.all_reduce(t)
    return t.tolist()


def broadcast_object(obj, src: int = 0):
    if not is_distributed():
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj) -> List:
    """Every process's `obj`, in rank order, on every process ([obj] in one process)."""
    if not is_distributed():
        return [obj]
    out = [None] * tdist.get_world_size()
    tdist.all_gather_object(out, obj)
    return out


# ---------------------------------------------------------------------------------------------- BatchNorm
class _AllReduceSum(torch.autograd.Function):
    """Sum over processes whose backward sums the incoming gradients too (d(Σ_r x_r)/dx_r = 1 for every r's loss)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        tdist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        tdist.all_reduce(grad)
        return grad


def _global_sum(t: torch.Tensor) -> torch.Tensor:
    return _AllReduceSum.apply(t)


def _synced_forward(self: nn.modules.batchnorm._BatchNorm, x: torch.Tensor) -> torch.Tensor:
    if not (self.training and is_distributed()):
        return self._vitfast_base.forward(self, x)
    self._check_input_dim(x)
    dims = [d for d in range(x.ndim) if d != 1]
    shape = [1, -1] + [1] * (x.ndim - 2)
    xf = x.float()
    count = torch.tensor([x.numel() // x.shape[1]], dtype=torch.float32, device=x.device)
    total = _global_sum(torch.cat([xf.sum(dims), count]))
    n = total[-1]
    mean = total[:-1] / n
    var = _global_sum((xf - mean.reshape(shape)).pow(2).sum(dims)) / n  # biased, as BatchNorm normalises
    y = (xf - mean.reshape(shape)) * torch.rsqrt(var + self.eps).reshape(shape)
    if self.affine:
        y = y * self.weight.float().reshape(shape) + self.bias.float().reshape(shape)
    if self.track_running_stats:
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            m = (1.0 / float(self.num_batches_tracked)) if self.momentum is None else self.momentum
            unbiased = var.detach() * (n.detach() / (n.detach() - 1).clamp_min(1))
            self.running_mean.mul_(1 - m).add_(mean.detach().to(self.running_mean.dtype), alpha=m)
            self.running_var.mul_(1 - m).add_(unbiased.to(self.running_var.dtype), alpha=m)
    return y.to(x.dtype)


_SYNCED_CLASSES = {}


def _synced_class(cls: type) -> type:
    if cls not in _SYNCED_CLASSES:
        _SYNCED_CLASSES[cls] = type(f"Synced{cls.__name__}", (cls,), {"forward": _synced_forward,
                                                                        "_vitfast_base": cls})
    return _SYNCED_CLASSES[cls]


@contextlib.contextmanager
def synced_batchnorm(model: nn.Module) -> Iterator[int]:
    """Within the block, every BatchNorm of `model` normalises over the global batch in training mode.

    Yields how many modules were switched.  Outside a process group the switched modules behave exactly as
    before.  Classes are restored on exit, so saving/describing the model afterwards sees plain BatchNorms.
    """
    switched = []
    for m in model.modules():
        cls = type(m)
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and "_vitfast_base" not in vars(cls):
            m.__class__ = _synced_class(cls)
            switched.append((m, cls))
    try:
        yield len(switched)
    finally:
        for m, cls in switched:
            m.__class__ = cls
