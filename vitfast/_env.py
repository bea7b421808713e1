"""Process-wide settings read once from the environment.

`VITFAST_BACKEND=reference` forces every fused module onto `vitfast.reference` (A/B benchmarks, debugging);
`VITFAST_BACKEND=auto` (default) dispatches through `torch.ops.vitfast.*`, i.e. the C++ kernel on CPU and the
Triton kernel on CUDA.
"""
from __future__ import annotations

import os

_VALID_BACKENDS = ("auto", "reference")


def _read_backend() -> str:
    value = os.environ.get("VITFAST_BACKEND", "auto").strip().lower() or "auto"
    if value not in _VALID_BACKENDS:
        raise ValueError(f"VITFAST_BACKEND: expected one of {_VALID_BACKENDS}, got {value!r}")
    return value


_backend = _read_backend()


def get_backend() -> str:
    """The backend fused modules use: 'auto' (kernels by device) or 'reference'."""
    return _backend


def set_backend(name: str) -> None:
    """Switch the backend at run time (overrides VITFAST_BACKEND)."""
    global _backend
    if name not in _VALID_BACKENDS:
        raise ValueError(f"backend: expected one of {_VALID_BACKENDS}, got {name!r}")
    _backend = name


# ---------------------------------------------------------------------------------------------- CUDA paths
_VALID_CUDA_KERNELS = ("auto", "triton", "torch", "blocks")


def _read_cuda_kernels() -> str:
    value = os.environ.get("VITFAST_CUDA_KERNELS", "auto").strip().lower() or "auto"
    if value not in _VALID_CUDA_KERNELS:
        raise ValueError(f"VITFAST_CUDA_KERNELS: expected one of {_VALID_CUDA_KERNELS}, got {value!r}")
    return value


_cuda_kernels = _read_cuda_kernels()


def get_cuda_kernels() -> str:
    """How CUDA impls choose: 'auto' (the measured policy in vitfast.ops), 'triton' (always the Triton kernels),
    'torch' (always the cuBLAS/SDPA composition) or 'blocks' (whole fused ViT blocks on the five-launch Triton block
    path, kernels/vit_block.py, not yet measured on a GPU; every other op as under 'auto')."""
    return _cuda_kernels


def set_cuda_kernels(name: str) -> None:
    """Switch the CUDA path at run time (overrides VITFAST_CUDA_KERNELS)."""
    global _cuda_kernels
    if name not in _VALID_CUDA_KERNELS:
        raise ValueError(f"cuda_kernels: expected one of {_VALID_CUDA_KERNELS}, got {name!r}")
    _cuda_kernels = name


def host_cpu_flags() -> list:
    """The kernel's CPU flags (/proc/cpuinfo's first "flags" line; empty where there is none).  What the CPU is, not
    what a process is shown: benchmarks/cpuid_mask.py's masked CPUID does not change it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
