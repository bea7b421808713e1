"""`vitfast.ops.warmup(model, batch_sizes=...)`: run a CUDA model once per batch size before serving it.

    model = vitfast.load("fused.safetensors").cuda().to(torch.bfloat16)
    vitfast.ops.warmup(model, batch_sizes=(1, 8, 64))      # a progress bar; returns {batch: seconds}

Why: the first forward at a new shape compiles and autotunes every Triton kernel it reaches (the block path's GEMMs,
kernels/ln_linear.py, autotune on (M bucket, N, K); the policy's FFN and attention kernels on their own keys) and
picks cuDNN/cuBLAS algorithms.  That takes seconds per shape, so it belongs before the first request rather than
inside it.  Triton keeps the autotune choices on disk (`cache_results`, triton >= 3.2), so the next process re-reads
them instead of timing every config again; compiled kernels go to Triton's own cache as well.

What runs: `model(x)` under `torch.no_grad()`, with the process's kernel policy (`VITFAST_CUDA_KERNELS`: with
`blocks`, the five-launch block path), once per batch size, on random images of the model's input shape
(`input_shape`, else read from its timm patch embedding).  A `vitfast.cuda_graph` wrapper captures its graph for each
batch size here as well.  The output is discarded.

CPU models: ValueError.  The CPU kernels neither compile nor autotune at run time, so a CPU model needs no warm-up,
and a model that was meant to be on the GPU but is not is the usual reason to reach this call with one: saying so
beats a silent no-op that leaves the first request to find out.
"""
from __future__ import annotations

import time
from typing import Dict, Optional, Sequence

import torch
import torch.nn as nn

__all__ = ["warmup"]

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _model_tensor(model: nn.Module) -> torch.Tensor:
    first = next(model.parameters(), None)
    if first is None:
        first = next(model.buffers(), None)
    if first is None:
        raise ValueError(f"model: expected a module with parameters (to read its device and dtype), got "
                         f"{type(model).__name__} with none")
    return first


def _input_shape(model: nn.Module) -> tuple:
    """(C, H, W) from a timm patch embedding (as vitfast.export.model_input_shape reads it; that module sits above the
    ops layer)."""
    while getattr(model, "patch_embed", None) is None:  # through vitfast.cuda_graph / torch.compile wrappers
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
    patch_embed = getattr(model, "patch_embed", None)
    size, proj = getattr(patch_embed, "img_size", None), getattr(patch_embed, "proj", None)
    if size is None or not hasattr(proj, "in_channels"):
        raise ValueError(f"input_shape: could not read the input size from {type(model).__name__} (no timm "
                         f"patch_embed with img_size and proj); pass input_shape=(C, H, W)")
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    return int(proj.in_channels), int(h), int(w)


def _require_cuda(device: torch.device) -> None:
    if device.type != "cuda":
        raise ValueError(f"model: expected a model on a CUDA device (warmup pre-tunes the GPU kernels; the CPU "
                         f"kernels need no warm-up), got device {device}")


def warmup(model: nn.Module, batch_sizes: Sequence[int] = (1,), dtype: Optional[torch.dtype] = None, *,
           input_shape: Optional[Sequence[int]] = None, progress: bool = True) -> Dict[int, float]:
    """Run `model` once per batch size so its kernels compile and autotune now (module docstring).

    batch_sizes: the batch sizes that will be served (each is its own autotune key for M = batch · tokens, bucketed
    to powers of two by the block path).  dtype: the input dtype, float32, float16 or bfloat16; None takes the
    model's own parameter dtype, and any other must equal it (cast the model first: `model.to(dtype)`).
    input_shape: (C, H, W) of one image (default: the timm patch embedding's).  progress: a tqdm bar over the
    batch sizes.  Returns {batch size: seconds its call took} (compile and autotune included)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    sizes = list(batch_sizes) if isinstance(batch_sizes, (list, tuple)) else None
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"batch_sizes: expected a non-empty list of positive ints, got {batch_sizes!r}")
    if dtype is not None and dtype not in _DTYPES:
        raise ValueError(f"dtype: expected torch.float32, torch.float16 or torch.bfloat16, got {dtype}")
    first = _model_tensor(model)
    _require_cuda(first.device)
    if dtype is not None and first.is_floating_point() and dtype != first.dtype:
        raise ValueError(f"dtype: expected the model's parameter dtype {first.dtype} (cast the model first: "
                         f"model.to({dtype})), got {dtype}")
    dtype = dtype or (first.dtype if first.dtype in _DTYPES else torch.float32)
    shape = tuple(int(s) for s in input_shape) if input_shape is not None else _input_shape(model)
    from tqdm.auto import tqdm

    seconds: Dict[int, float] = {}
    with torch.no_grad(), tqdm(sizes, desc="vitfast warm-up", unit="batch size", disable=not progress) as bar:
        for b in bar:
            bar.set_postfix_str(f"batch {b}")
            x = torch.randn((b,) + shape, device=first.device, dtype=dtype)
            start = time.perf_counter()
            model(x)
            if first.device.type == "cuda":
                torch.cuda.synchronize(first.device)
            seconds[b] = time.perf_counter() - start
    return seconds
