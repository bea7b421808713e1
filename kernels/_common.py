"""What every Triton kernel module shares: the interpreter flag, the autotune candidate list, the device check.

`tuned_configs(candidates, interpreter=...)` returns what `@triton.autotune(configs=...)` gets:
- under the Triton interpreter (CPU): the one `interpreter` config — autotuning would only time numpy;
- with `VITFAST_TRITON_AUTOTUNE=0`: the first candidate alone.  Autotuning compiles every candidate for every
  new key; the native GPU parity suites run hundreds of shapes, and with ~9 candidates each they spent minutes
  compiling configs whose speed they never look at (measured: 7% of the channel-idle suite in 300 s on an
  H200).  Tests set it; a deployment leaves it on;
- otherwise every candidate.
Read once at import, like TRITON_INTERPRET (which must be set before triton is imported).
"""
from __future__ import annotations

import os
import re

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_version() -> tuple:
    """(major, minor) of the installed triton (3.0 ships with torch 2.4, 3.6 with 2.11, 3.8 with 2.14)."""
    import triton

    # The leading digits of each piece: '3.1rc1' is (3, 1), '3.8.0+git12ab' is (3, 8).
    return tuple(int(re.match(r"\d*", piece).group() or 0) for piece in triton.__version__.split(".")[:2])


def _autotune_enabled() -> bool:
    value = os.environ.get("VITFAST_TRITON_AUTOTUNE", "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"VITFAST_TRITON_AUTOTUNE: expected 0 or 1, got {value!r}")
    return value == "1"


AUTOTUNE = _autotune_enabled()


def tuned_configs(candidates, interpreter):
    """The autotune list: [interpreter] under the interpreter, candidates[:1] if autotuning is off, else all."""
    if INTERPRET:
        return [interpreter]
    if not candidates:
        raise ValueError("candidates: expected at least one triton.Config, got none")
    return list(candidates) if AUTOTUNE else list(candidates[:1])


def check_device(x: torch.Tensor) -> None:
    """The launchers take CUDA tensors, or CPU tensors under the interpreter (tests on machines without a GPU)."""
    if INTERPRET:
        return
    if x.device.type != "cuda":
        raise ValueError(
            f"x: expected a CUDA tensor for the Triton kernel (or TRITON_INTERPRET=1 set before importing "
            f"triton), got device {x.device}"
        )


def rows(t: torch.Tensor, width: int) -> torch.Tensor:
    """[..., width] -> [M, width]: a view when the strides allow it (the kernels take any 2-D strides), a copy
    otherwise.  M is spelled out: `reshape(-1, 0)` cannot infer it, so a zero-width input (K = 0, C = 0) once
    raised from here instead of giving the reference's result."""
    m = 1
    for size in t.shape[:-1]:
        m *= size
    return t.reshape(m, width)
