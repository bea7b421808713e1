"""`vitfast.reference.attention_bf16` and its argument check `check_attention_bf16_args`: multi-head softmax attention
from timm's packed qkv (as `attention`, fp32 in and out) with both products on bf16 operands (the kernel:
csrc/kernels/attention.h, attention_head_bf16 — the bf16 block's attention, here for an fp32 residual stream).

Per image and head h, with Q_h, K_h, V_h [N × D] the head's slices of qkv and r(·) rounding to bf16 (nearest even):

    S = (r(Q_h) · r(K_h)ᵀ) · scale           the products of bf16 values are exact in fp32; fp32 sums
    E = exp(S − max_j S)                     per row, fp32
    O = (r(E) · r(V_h)) / Σ_j E              E rounded for the product, the sum from the unrounded exps

Why it exists: on CPUs with a bf16 kernel (AVX512_BF16, AMX-BF16, ARM BF16) these products are faster than
attention_int8's and far more accurate (no per-token quantization of Q, K, P or per-channel V): an int8 model's
attention can take them (`vitfast.quantize(..., attention="bf16")`).  Measured in benchmarks/bench_attention_bf16.py.
"""
from __future__ import annotations

from typing import Optional

import torch

from .attention import check_attention_args


def check_attention_bf16_args(qkv: torch.Tensor, num_heads: int, scale: Optional[float]) -> tuple[int, int]:
    """Validate `attention_bf16` arguments (those of `attention`); return (H, D)."""
    return check_attention_args(qkv, num_heads, scale)


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float64)


def bf16_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """The bf16 products of the module doc on given heads: q, k [..., N, dk], v [..., N, dv] (float32) → [..., N, dv]
    in float64."""
    s = (_bf16(q) @ _bf16(k).transpose(-1, -2)) * float(scale)
    e = torch.exp(s - s.amax(dim=-1, keepdim=True))
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
