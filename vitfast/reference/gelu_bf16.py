"""`gelu_for_bf16`: the GELU of the bf16 GEMMs' epilogue (csrc/kernels/erf_poly.h, kGeluBf16), in torch with the
kernels' float32 steps, for references and emulations of bf16 ops (no op of its own: the bf16 `channel_idle_ffn`
and `vit_block` apply it to the first GEMM's active columns before rounding them to bf16).

    GELU(x) = x/2 + a · G(t),   a = |x|,   t = min(a, 3.6·√2) · (2 / (3.6·√2)) − 1,   G ≈ erf(a/√2) / 2

G of degree 12 (Horner, one rounding a step as the kernels' FMAs).  Relative error <= 2.2e-6 for x >= 0 (1/1800 of a
bf16 ulp), absolute <= 1.2e-6·|x| everywhere: its bf16 rounding is the exact GELU's but at ~0.01% of values, one ulp
off.  17 vector operations per 16 values where the fp32 GELU's piecewise erf takes ~33.
"""
from __future__ import annotations

import torch

from ._fma32 import f32, fma32, horner32

# erf_poly.h: kGeluBf16Max, kGeluBf16Scale and kGeluBf16, the same float32 values.
_MAX = 5.091169
_SCALE = 0.3928371
_G = (4.9454426765e-01, 3.9776571095e-02, -1.2880460918e-01, 2.3525092006e-01, -2.4312391877e-01,
      8.6470976472e-02, 1.2334156781e-01, -1.8098860979e-01, 4.2117994279e-02, 8.3795741200e-02,
      -5.1181364805e-02, -1.4305712655e-02, 1.3106187806e-02)


def gelu_for_bf16(x: torch.Tensor) -> torch.Tensor:
    """The bf16 GEMMs' GELU of float32 values (module doc), float32 → float32, with the kernels' steps (fused ones as
    in _fma32)."""
    x = f32(x)
    a = x.abs()
    m = torch.minimum(a, f32(_MAX))  # NaN stays NaN (the kernels' min gives t = 1; a keeps it NaN)
    t = fma32(m, f32(_SCALE), f32(-1.0))
    return fma32(a, horner32(t, _G), x * 0.5)
