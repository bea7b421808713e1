"""The C++ CPU kernels (`vitfast._C`): loading them, their fallback, their packed-weight cache.

CPU impl = the C++ kernels, registered from C++ (TORCH_LIBRARY_IMPL(vitfast, CPU) in csrc/ops/*.cpp) when the
extension loads.  If it is missing, or was compiled against another torch than the running one, we say so once
and register the reference as the CPU impl instead; an op the C++ side has no kernel for runs its reference on CPU
too.
"""
from __future__ import annotations

import re
import warnings
from typing import Optional

import torch

from .. import _derived, reference
from .._env import get_backend
from . import _optimizer_versions
from ._spec import LIB, SCHEMAS, below_autograd


def _major_minor(version: str) -> str:
    match = re.match(r"(\d+)\.(\d+)", version)
    return match.group(0) if match else version


def _torch_mismatch() -> Optional[str]:
    """Why the built extension must not be loaded into this torch, or None.

    libtorch has no stable C++ ABI across minor releases: an extension compiled against 2.14 and loaded into 2.13
    fails on a missing symbol at best, and at worst resolves every symbol and then crashes on a changed class
    layout.  So compare before dlopen, with the record setup.py wrote next to the extension (absent: a build
    that predates the record, loaded as before).
    """
    try:
        from . import _torch_build
    except ImportError:
        return None
    built, running = _major_minor(_torch_build.TORCH_VERSION), _major_minor(str(torch.__version__))
    if built != running:
        return f"it was built for torch {built}, this is torch {running}"
    if bool(_torch_build.CXX11_ABI) != bool(torch._C._GLIBCXX_USE_CXX11_ABI):
        return f"it was built with _GLIBCXX_USE_CXX11_ABI={int(_torch_build.CXX11_ABI)}, this torch uses the other ABI"
    return None


_EXTENSION_ERROR: Optional[BaseException] = None
_mismatch = _torch_mismatch()
try:
    if _mismatch is not None:
        raise ImportError(_mismatch)
    from .. import _C  # noqa: F401  (registers the CPU kernels with the dispatcher)
except ImportError as exc:
    _C = None
    _EXTENSION_ERROR = exc
    # One line, once: the package still works (reference on CPU, Triton on CUDA), only slower on CPU.
    warnings.warn(
        f"vitfast: the C++ extension vitfast._C {'was not loaded' if _mismatch else 'did not load'} ({exc}); "
        "CPU ops fall back to vitfast.reference (correct but slow). Rebuild it against this torch, in vitfast's "
        "source tree: `pip install --no-build-isolation --force-reinstall --no-deps .` (or `-e .`).",
        RuntimeWarning,
        stacklevel=2,
    )

_REFERENCE_CPU_FALLBACKS = []
for _name in SCHEMAS:
    # An op without a C++ CPU kernel (extension missing, or op not ported yet) runs its reference on CPU.
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"vitfast::{_name}", "CPU"):
        LIB.impl(_name, below_autograd(getattr(reference, _name)), "CPU")
        _REFERENCE_CPU_FALLBACKS.append(_name)


# Optimizer steps must reach the packed-weight cache's version check (vitfast/ops/_optimizer_versions.py).
_optimizer_versions.install()

def clear_weight_cache() -> None:
    """Drop every packed weight the CPU ops keep (csrc/ops/weight_cache.h); each is repacked on its next use.

    Needed only after writes the cache cannot see: it recognises a changed weight by its autograd version
    counter, which in-place ops on the tensor, `load_state_dict` and optimizer steps (fused ones included, see
    vitfast/ops/_optimizer_versions.py) bump, but writes through `w.data`, numpy views or raw pointers do not (nor
    swapping `.data` with another tensor and back, as some EMA code does).  Also drops the fp32 copies that
    low-precision parameters keep under autocast, the re-ordered weights of patch projections, and the colsum(W)
    vectors of the GPU block path's LayerNorm-folded GEMMs: every `vitfast._derived.DerivedCache`.
    """
    _derived.clear_all()
    if _C is not None:
        _C._weight_cache_clear()


def clear_output_cache() -> None:
    """Give back to malloc the freed op-output blocks the CPU ops keep for their next outputs of the same size
    (csrc/ops/output_pool.h: at most 512 MiB, blocks of 1 MiB and more; `VITFAST_OUTPUT_POOL=0` turns the cache
    off).  Tensors still alive are not affected; the next forward fills the cache again."""
    if _C is not None:
        _C._output_pool_clear()


def extension_loaded() -> bool:
    """True when the C++ CPU kernels are registered (False: CPU falls back to the reference)."""
    return _C is not None


def cpu_isa() -> str:
    """The CPU code path the C++ kernels chose at run time: 'avx512', 'avx2', 'neon' or 'scalar'."""
    if _C is None:
        return "reference"
    return _C.cpu_isa()


def int8_kernel() -> str:
    """The int8 GEMM kernel of that path (csrc/kernels/gemm_int8.h): 'amx_int8', 'avx512_vnni', 'avx_vnni' (the AVX2
    path on a CPU with AVX-VNNI), 'avx2', 'neon_dot' or 'scalar' ('reference' without the extension)."""
    return "reference" if _C is None else _C.int8_kernel()


def bf16_kernel() -> str:
    """The bf16 GEMM kernel of that path (csrc/kernels/gemm_bf16.h): 'amx_bf16', 'avx512_bf16', 'neon_bf16', or 'none' (bf16
    tensors are then computed in fp32 and rounded once: no faster than fp32)."""
    return "none" if _C is None else _C.bf16_kernel()


def cpu_extensions() -> list:
    """The low-precision extensions the kernels of the current CPU path use on this CPU: 'avx512_vnni',
    'avx512_bf16', 'amx_bf16', 'amx_int8' (the avx512 path), 'avx_vnni' (the avx2 path, or avx512 without
    AVX512_VNNI), 'neon_dotprod', 'neon_bf16' (VITFAST_CPU_EXT=none turns them off, VITFAST_CPU_EXT=noamx the AMX
    ones)."""
    return [] if _C is None else list(_C.cpu_extensions())


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
    extension, or when the weights are not on the CPU (the CUDA kernels read weights as they are).  Modules
    whose weights the kernels refuse (float64, NaN/Inf) are skipped with one RuntimeWarning naming them.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    if get_backend() == "reference" or _C is None:
        return 0
    count, refused = 0, []
    with torch.no_grad():
        for name, sub in module.named_modules():
            hook = getattr(sub, "vitfast_prepack", None)
            if not callable(hook):
                continue
            try:
                count += bool(hook())
            except ValueError as e:  # the kernel's own argument check: float64 or non-finite weights
                refused.append(f"{name or type(sub).__name__} ({e})")
    if refused:
        # Not an error here: vitfast.load(allow_nonfinite=True) and float64 files must still load (to inspect,
        # or to run under VITFAST_BACKEND=reference); a CPU-kernel forward of these modules raises the same error.
        more = f"; ... and {len(refused) - 3} more" if len(refused) > 3 else ""
        warnings.warn(
            f"vitfast.ops.prepack: {len(refused)} modules not packed, the CPU kernels refuse their weights: "
            f"{'; '.join(refused[:3])}{more}. Their kernel forward raises the same error; "
            "VITFAST_BACKEND=reference runs them.",
            RuntimeWarning,
            stacklevel=2,
        )
    return count
