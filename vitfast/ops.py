"""The `torch.ops.vitfast` namespace: schemas (defined once, here), fake impls, and per-device impls.

CPU impl   = the C++ kernels in `vitfast._C` (registered from C++ with TORCH_LIBRARY_IMPL(vitfast, CPU)).
CUDA impl  = the Triton launchers in `vitfast.kernels` (imported lazily: `import vitfast` never needs a GPU).
Fake impl  = shape/dtype propagation so `torch.compile(fullgraph=True)` and `torch.export` trace the ops.
If the extension is missing we say so once and register the reference as the CPU impl instead.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch

from . import reference
from ._env import get_backend
from ._validate import check_attention_args, check_channel_idle_ffn_args, check_linear_args

__all__ = ["attention", "channel_idle_ffn", "linear", "extension_loaded", "cpu_isa", "prepack"]

SCHEMAS = {
    "channel_idle_ffn": (
        "channel_idle_ffn(Tensor x, Tensor w_in, Tensor? b_in, Tensor w_out, "
        "Tensor? b_out=None, Tensor? residual=None) -> Tensor"
    ),
    "linear": "linear(Tensor x, Tensor weight, Tensor? bias=None, Tensor? residual=None) -> Tensor",
    "attention": "attention(Tensor qkv, int num_heads, float? scale=None) -> Tensor",
}

_lib = torch.library.Library("vitfast", "DEF")
for _schema in SCHEMAS.values():
    _lib.define(_schema)


# ---------------------------------------------------------------------------------------------- fake impls
def _register_fake(name):
    register = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract
    return register(f"vitfast::{name}")


@_register_fake("channel_idle_ffn")
def _channel_idle_ffn_fake(x, w_in, b_in, w_out, b_out=None, residual=None):
    _, _, c_out = check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, residual)
    return x.new_empty(tuple(x.shape[:-1]) + (c_out,))


@_register_fake("linear")
def _linear_fake(x, weight, bias=None, residual=None):
    n = check_linear_args(x, weight, bias, residual)
    return x.new_empty(tuple(x.shape[:-1]) + (n,))


@_register_fake("attention")
def _attention_fake(qkv, num_heads, scale=None):
    heads, head_dim = check_attention_args(qkv, num_heads, scale)
    return qkv.new_empty((qkv.shape[0], qkv.shape[1], heads * head_dim))


# ---------------------------------------------------------------------------------------------- CUDA impls
def _channel_idle_ffn_cuda(x, w_in, b_in, w_out, b_out=None, residual=None):
    from .kernels.channel_idle_ffn import channel_idle_ffn_triton

    return channel_idle_ffn_triton(x, w_in, b_in, w_out, b_out, residual)


_lib.impl("channel_idle_ffn", _channel_idle_ffn_cuda, "CUDA")


def _linear_cuda(x, weight, bias=None, residual=None):
    """No Triton kernel yet: the reference composition (F.linear = cuBLAS with its bias epilogue, + residual)."""
    return reference.linear(x, weight, bias, residual)


_lib.impl("linear", _linear_cuda, "CUDA")


def _attention_cuda(qkv, num_heads, scale=None):
    """No Triton kernel yet: the reference composition (permuted views + SDPA, i.e. flash attention on GPU)."""
    return reference.attention(qkv, num_heads, scale)


_lib.impl("attention", _attention_cuda, "CUDA")


# ---------------------------------------------------------------------------------------------- CPU impls
_EXTENSION_ERROR: Optional[BaseException] = None
try:
    from . import _C  # noqa: F401  (registers the CPU kernels with the dispatcher)
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    _C = None
    _EXTENSION_ERROR = exc
    warnings.warn(
        f"vitfast: the C++ extension vitfast._C did not load ({exc}); CPU ops fall back to "
        "vitfast.reference (correct but slow). Rebuild with `pip install --no-build-isolation -e .`.",
        RuntimeWarning,
        stacklevel=2,
    )

_REFERENCE_CPU_FALLBACKS = []
for _name in SCHEMAS:
    # An op without a C++ CPU kernel (extension missing, or op not ported yet) runs its reference on CPU.
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"vitfast::{_name}", "CPU"):
        _lib.impl(_name, getattr(reference, _name), "CPU")
        _REFERENCE_CPU_FALLBACKS.append(_name)


def extension_loaded() -> bool:
    """True when the C++ CPU kernels are registered (False: CPU falls back to the reference)."""
    return _C is not None


def cpu_isa() -> str:
    """The CPU code path the C++ kernels chose at run time: 'avx512', 'avx2', 'neon' or 'scalar'."""
    if _C is None:
        return "reference"
    return _C.cpu_isa()


# ---------------------------------------------------------------------------------------------- functional API
def channel_idle_ffn(
    x: torch.Tensor,
    w_in: torch.Tensor,
    b_in: Optional[torch.Tensor],
    w_out: torch.Tensor,
    b_out: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """`torch.ops.vitfast.channel_idle_ffn`, or the reference when VITFAST_BACKEND=reference."""
    if get_backend() == "reference":
        return reference.channel_idle_ffn(x, w_in, b_in, w_out, b_out, residual)
    return torch.ops.vitfast.channel_idle_ffn(x, w_in, b_in, w_out, b_out, residual)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """`torch.ops.vitfast.linear` (x · weightᵀ + bias + residual), or the reference when VITFAST_BACKEND=reference."""
    if get_backend() == "reference":
        return reference.linear(x, weight, bias, residual)
    return torch.ops.vitfast.linear(x, weight, bias, residual)


def attention(qkv: torch.Tensor, num_heads: int, scale: Optional[float] = None) -> torch.Tensor:
    """`torch.ops.vitfast.attention` (heads of packed qkv → [B, N, H·D]), or the reference when
    VITFAST_BACKEND=reference."""
    if get_backend() == "reference":
        return reference.attention(qkv, num_heads, scale)
    return torch.ops.vitfast.attention(qkv, num_heads, scale)


# ---------------------------------------------------------------------------------------------- prepacking
def prepack(module: torch.nn.Module) -> int:
    """Pack the CPU kernels' weights of every fused submodule of `module` now, so the first inference packs none.

    The C++ ops keep each weight packed (transposed into 16-column panels, NaN/Inf-checked) in a process-wide
    cache keyed on the weight tensors and their version counters (csrc/ops/weight_cache.h).  Without this the
    first forward pays that cost (about one batch-1 forward's worth of memory traffic); `vitfast.fuse`,
    `vitfast.load` and `vitfast.patch_timm` call it for you.  Each submodule with a `vitfast_prepack()` method
    runs its ops once on a one-row zero input — the same op, the same weight tensors, so the same cache
    entries the real forward hits.  Weights changed later (in place, `.to(...)`, `load_state_dict`) are
    repacked on their next use, as before.

    Returns the number of submodules prepacked: 0 under VITFAST_BACKEND=reference, without the C++
    extension, or when the weights are not on the CPU (the CUDA kernels read weights as they are).
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    if get_backend() == "reference" or _C is None:
        return 0
    count = 0
    with torch.no_grad():
        for sub in module.modules():
            hook = getattr(sub, "vitfast_prepack", None)
            if callable(hook) and hook():
                count += 1
    return count
