"""`vitfast.reference.attention_int8` and its argument check `check_attention_int8_args`: multi-head softmax
attention from timm's packed qkv (as `attention`) with both products on int8 (the kernel: csrc/kernels/attention_int8.h).

Per image and head h, with Q_h, K_h, V_h [N × D] the head's slices of qkv and quantize_rows the int8 core's
dynamic symmetric rule (vitfast/reference/_int8.py):

    (q_Q, s_Q) = quantize_rows(Q_h)          per query token
    (q_K, s_K) = quantize_rows(K_h)          per key token (K_h is the B operand: a key is an output column)
    S  = fma(fp32(q_Q · q_Kᵀ) · s_Q[i], s_K[j], 0)                       (the int8 GEMM's epilogue)
    E  = exp(S · scale − max_j(S · scale))   per row, fp32: the row maximum is exp(0) = 1, E ∈ [0, 1]; the exp is
                                             exp_for_bf16 (reference.attention_bf16), the kernels' exp for values
                                             rounded to 8 bits next: its codes have 7
    (q_E, s_E) = quantize_rows(E)            per query row: E's maximum 1 maps to code 127 (the u8 range [0, 127])
    (q_V, s_V) = quantize_rows(V_hᵀ)         per channel d over the tokens (V_h is the B operand: a channel is an
                                             output column)
    O  = fma(fp32(q_E · q_V) · (1 / Σ_j q_E[i, j]), s_V[d], 0)

The softmax is normalised by the sum of the *quantized* row (Σ_j q_E[i, j], an exact integer ≥ 127): the int8
weights of each row then sum to one exactly, so the output is a convex combination of the quantized values and the
probability mass that rounds to code 0 (the many small ones of a flat row) is spread over the rest instead of lost
(measured on a trained model: benchmarks/attention_int8_accuracy.py).  s_E cancels out.
A NaN or ±Inf in a query row makes its output row NaN, in a key row every output of the head, in a channel of V
that output column: as fp32 attention.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._int8 import quantize_rows
from .attention import check_attention_args
from .attention_bf16 import exp_for_bf16


def check_attention_int8_args(qkv: torch.Tensor, num_heads: int, scale: Optional[float]) -> tuple[int, int]:
    """Validate `attention_int8` arguments (those of `attention`); return (H, D)."""
    return check_attention_args(qkv, num_heads, scale)


def _int8_bmm(q: torch.Tensor, s: torch.Tensor, qw: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
    """fma(fp32(Σ_k q[..., i, k] · qw[..., j, k]) · s[..., i], sw[..., j], 0): vitfast.reference._int8.int8_matmul
    batched over the leading dimensions (each (image, head) its own B operand)."""
    acc = torch.matmul(q.double(), qw.double().transpose(-1, -2)).float()
    return ((acc * s.unsqueeze(-1)).double() * sw.unsqueeze(-2).double()).float()


def int8_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, _norm: str = "quantized"
               ) -> torch.Tensor:
    """The int8 products of the module doc on given heads: q, k [..., N, dk], v [..., N, dv] (float32) →
    [..., N, dv].  `scale` multiplies the scores before the softmax (a float32 value)."""
    qq, sq = quantize_rows(q)
    qk, sk = quantize_rows(k)
    s = _int8_bmm(qq, sq, qk, sk) * scale
    e = exp_for_bf16(s - s.amax(dim=-1, keepdim=True))
    qe, se = quantize_rows(e)
    if _norm == "quantized":
        # a row with NaN (from a NaN in its query or in any key) keeps s_E = NaN: its codes and sum are 0
        se = torch.where(se.isnan(), se, 1.0 / qe.sum(dim=-1, dtype=torch.int64).float())
    else:  # "fp32": the fp32 sum of the unquantized row (the kernel's fp32 attention does this)
        se = se * (1.0 / e.sum(dim=-1))
    qv, sv = quantize_rows(v.transpose(-1, -2))
    return _int8_bmm(qe, se, qv, sv)


def attention_int8_unchecked(qkv, num_heads, scale=None, _norm="quantized"):
    batch, tokens, width = qkv.shape
    head_dim = width // (3 * num_heads)
    if scale is None:
        scale = float(1.0 / torch.tensor(float(head_dim), dtype=torch.float32).sqrt())
    scale = float(torch.tensor(float(scale), dtype=torch.float32))
    q, k, v = qkv.float().reshape(batch, tokens, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    out = int8_heads(q, k, v, scale, _norm)
    return out.transpose(1, 2).reshape(batch, tokens, num_heads * head_dim).to(qkv.dtype)


def attention_int8(qkv: torch.Tensor, num_heads: int, scale: Optional[float] = None) -> torch.Tensor:
    """Multi-head self-attention from packed qkv with int8 score and value products (module doc); [B, N, H·D]."""
    heads, _ = check_attention_int8_args(qkv, num_heads, scale)
    return attention_int8_unchecked(qkv, heads, scale)
