"""`vitfast.reference.attention_bf16` and its argument check `check_attention_bf16_args`: multi-head softmax attention
from timm's packed qkv (as `attention`, fp32 in and out) with both products on bf16 operands (the kernel:
csrc/kernels/attention.h, attention_head_bf16 — the bf16 block's attention, here for an fp32 residual stream).

Per image and head h, with Q_h, K_h, V_h [N × D] the head's slices of qkv and r(·) rounding to bf16 (nearest even):

    S = (r(Q_h) · r(K_h)ᵀ) · scale           the products of bf16 values are exact in fp32; fp32 sums
    E = exp_for_bf16(S − max_j S)            per row, fp32: an exp made for values rounded to bf16 next
    O = (r(E) · r(V_h)) / Σ_j E              E rounded for the product, the sum from the unrounded exps

`exp_for_bf16` is the kernels' exp for P (csrc/kernels/exp_poly.h, kExp2Bf16P): relative error at most 4.2e-6,
1/1000 of a bf16 ulp, so r(E) is the exact exp's rounding except at ~0.03% of values (one ulp off); it takes 10
vector operations where an fp32-accurate exp takes 16.

Why it exists: on CPUs with a bf16 kernel (AVX512_BF16, AMX-BF16, ARM BF16) these products are faster than
attention_int8's and far more accurate (no per-token quantization of Q, K, P or per-channel V): an int8 model's
attention can take them (`vitfast.quantize(..., attention="bf16")`).  Measured in benchmarks/bench_attention_bf16.py.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._fma32 import f32, fma32, horner32
from .attention import check_attention_args


def check_attention_bf16_args(qkv: torch.Tensor, num_heads: int, scale: Optional[float]) -> tuple[int, int]:
    """Validate `attention_bf16` arguments (those of `attention`); return (H, D)."""
    return check_attention_args(qkv, num_heads, scale)


# exp_poly.h: kLog2e, kExpMin and kExp2Bf16P (2^f = 1 + f·Q(f) on |f| <= 1/2), the same float32 values.
_LOG2E = 1.44269504088896341
_EXP_MIN = -87.0
_EXP2_BF16_P = (1.0, 6.9312411547e-01, 2.4024105072e-01, 5.5907212198e-02, 9.5827775076e-03)


def exp_for_bf16(x: torch.Tensor) -> torch.Tensor:
    """exp(x) for x <= 0 as the kernels make attention's P (module doc), float32 → float32, with the kernels' steps
    (fused ones as in _fma32): n = round(x·log2e) (the product rounded, ties to even), f = x·log2e − n in one
    rounding, Horner's fused steps on f, 2^n applied exactly; x below −87 gives 0, NaN stays NaN."""
    x = f32(x)
    log2e = f32(_LOG2E)
    n = torch.round(x * log2e)
    e = torch.ldexp(horner32(fma32(x, log2e, -n), _EXP2_BF16_P), n)
    return torch.where(x < _EXP_MIN, torch.zeros_like(e), e)


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float64)


def bf16_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """The bf16 products of the module doc on given heads: q, k [..., N, dk], v [..., N, dv] (float32) → [..., N, dv]
    in float64."""
    # S as the kernel ends it: the exact sum of the bf16 products (exact in fp64) rounded to fp32, times the fp32 scale
    # (the score GEMM's row_scale), t − max in fp32.  Modelling these roundings keeps the reference's exps on the
    # kernel's side of each bf16 rounding boundary wherever the kernel's fp32 accumulation was exact (most sums of
    # bf16 products), instead of flipping P at ~1e-4 of the values.
    s = f32(_bf16(q) @ _bf16(k).transpose(-1, -2)) * f32(float(scale))
    e = exp_for_bf16(s - s.amax(dim=-1, keepdim=True)).double()
    return (_bf16(e) @ _bf16(v)) / e.sum(dim=-1, keepdim=True)


def attention_bf16(qkv: torch.Tensor, num_heads: int, scale: Optional[float] = None) -> torch.Tensor:
    """Multi-head self-attention from packed qkv with bf16 score and value products (module doc); [B, N, H·D] in
    qkv's dtype.  Computed in fp64 from the bf16-rounded operands: the kernel's only other roundings are its fp32
    sums."""
    heads, head_dim = check_attention_bf16_args(qkv, num_heads, scale)
    batch, tokens, _ = qkv.shape
    if scale is None:
        scale = head_dim ** -0.5
    q, k, v = qkv.float().reshape(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    out = bf16_heads(q, k, v, scale)
    return out.transpose(1, 2).reshape(batch, tokens, heads * head_dim).to(qkv.dtype)
