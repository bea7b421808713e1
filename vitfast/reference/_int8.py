"""Symmetric int8 quantization shared by the int8 ops' references (`linear_int8`, `channel_idle_ffn_int8`).

The definitions are the C++ core's (csrc/kernels/gemm_int8.h), written once in torch:

    activations, per row (dynamic):  amax = max|x|,  inv = 127 / amax (fp32),  q = clamp(rne(x · inv), −127, 127),
                                      s = amax / 127;  an all-zero row (or one whose 127 / amax overflows): s = 0,
                                      q = 0;  a row with NaN/±Inf: s = NaN, q = 0 (its output row is NaN, as in fp32)
    activations, per tensor (static): inv = 1 / act_scale (fp32), q = clamp(rne(x · inv), −127, 127), s = act_scale
    weights, per output channel:      amax_j = max_k |W[j, k]|, s_j = amax_j / 127, q = clamp(rne(W · (127 / amax_j)))
                                      (7-bit weights, quantize(weight_bits=7): 64 in place of 127, codes in [−64, 64])
    product:                          y[r, j] = fma(fp32(Σ_k q_x[r, k] · q_w[j, k]) · s_x[r], s_w[j], 0 or the
                                      output it accumulates onto)

rne = round half to even (torch.round).  The integer sums are exact (|Σ| ≤ K · 127² < 2²⁴ up to K = 1040, and fp32
still holds every such sum's nearest value beyond it, as the kernels' int32 → fp32 conversion does).  −128 is never
produced: the AVX2 kernel's sign trick and the VNNI kernel's u8 offset rely on |q| ≤ 127 (gemm_int8.h).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

QMAX = 127.0
# The weights' largest code per weight width.  7 bits: [−64, 64], what the AVX2 kernel multiplies with no sign trick
# (u8 activations + 128 ≤ 255 times |w| ≤ 64: a vpmaddubsw pair sum ≤ 32640 < 2¹⁵, csrc/kernels/gemm_int8.h).
WEIGHT_QMAX = {8: 127.0, 7: 64.0}


def quantize_rows(x: torch.Tensor, col_scale: Optional[torch.Tensor] = None,
                  act_scale: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [..., K], s fp32 [...]) of x's rows, each multiplied by `col_scale` [K] first when given; per row
    (act_scale = 0) or with one static scale (act_scale > 0)."""
    x = x.float()
    if col_scale is not None:
        x = x * col_scale.float()
    if act_scale > 0.0:
        inv = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(act_scale, dtype=torch.float32)
        q = torch.round(x * inv).clamp_(-QMAX, QMAX)
        s = torch.full(x.shape[:-1], float(torch.tensor(act_scale, dtype=torch.float32)), dtype=torch.float32)
        bad = ~torch.isfinite(x).all(dim=-1)
    else:
        amax = x.abs().amax(dim=-1) if x.shape[-1] > 0 else x.new_zeros(x.shape[:-1])
        bad = ~torch.isfinite(amax)
        inv = QMAX / amax
        zero = ~bad & ~torch.isfinite(inv)  # 127 / amax overflows (all zeros, or amax < 127 / FLT_MAX): a zero row
        inv = torch.where(zero | bad, torch.zeros_like(inv), inv)
        q = torch.round(x * inv.unsqueeze(-1)).clamp_(-QMAX, QMAX)
        s = torch.where(zero, torch.zeros_like(amax), amax / QMAX)
    q = torch.where(bad.unsqueeze(-1), torch.zeros_like(q), q)
    s = torch.where(bad, torch.full_like(s, float("nan")), s)
    return q.to(torch.int8), s


def quantize_weight(w: torch.Tensor, qmax: float = QMAX) -> Tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], s fp32 [N]): symmetric per-output-channel int8 of an nn.Linear weight [N, K] (an all-zero row
    gets scale 0), codes in [−qmax, qmax]: 127, or 64 for 7-bit weights (WEIGHT_QMAX)."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1) if w.shape[1] > 0 else w.new_zeros(w.shape[0])
    inv = torch.where(amax > 0, qmax / amax, torch.zeros_like(amax))
    q = torch.round(w * inv.unsqueeze(1)).clamp_(-qmax, qmax).to(torch.int8)
    return q, amax / qmax


def int8_matmul(q: torch.Tensor, s: torch.Tensor, qw: torch.Tensor, sw: torch.Tensor,
                accumulate: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fma(fp32(Σ_k q[..., k] · qw[j, k]) · s[...], sw[j], accumulate or 0), the kernels' epilogue (gemm_int8_isa.h):
    the exact integer sums (float64 holds them) rounded once to fp32, times the row scale in fp32, then one fused
    multiply-add with the channel scale onto what the output already holds (the FFN's linear path).  The fma is
    evaluated in float64 (the fp32 product is exact there) and rounded once more: it can differ from a true fma only
    where the float64 sum itself rounds, ~2⁻²⁹ of a unit in the last place apart."""
    acc = torch.matmul(q.double(), qw.double().t()).float()
    t = (acc * s.unsqueeze(-1)).double() * sw.double()
    if accumulate is not None:
        t = t + accumulate.double()
    return t.float()
