"""float32 fused multiply-adds in torch, for references that reproduce the kernels' polynomial steps bit for bit
(reference.attention_bf16's exp for P, reference.gelu_bf16): each fused step is one float64 operation (the product
of two float32 values is exact there) rounded to float32, which differs from one rounding only when the float64 sum
falls on a float32 tie (no difference in 4·10^5 exps and 4·10^6 GELUs against the C++ scalar forms)."""
from __future__ import annotations

from typing import Sequence

import torch


def f32(t) -> torch.Tensor:
    """t (a tensor or a Python number) as float32."""
    return (t if isinstance(t, torch.Tensor) else torch.tensor(t)).to(torch.float32)


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a·b + c in one float32 rounding (a, b, c float32)."""
    return f32(a.double() * b.double() + c.double())


def horner32(t: torch.Tensor, coeffs: Sequence[float]) -> torch.Tensor:
    """Σ coeffs[i]·t^i by Horner's fused steps from the highest coefficient, coefficients rounded to float32 first —
    the kernels' horner16 / horner (x86/avx512_math.h, arm/neon_math.h) and their scalar loops."""
    c = [f32(v) for v in coeffs]
    p = c[-1].expand_as(t)
    for ci in reversed(c[:-1]):
        p = fma32(p, t, ci)
    return p
