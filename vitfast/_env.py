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
