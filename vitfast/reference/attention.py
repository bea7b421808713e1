"""`vitfast.reference.attention` and its argument check `check_attention_args`: Multi-head softmax attention read
straight from a packed qkv [B, N, 3·H·D] (no permute copies), written in the output projection's [B, N, H·D] layout."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._check import check_float_dtype, check_num_heads, check_tensor, fmt_shape, is_finite_number


def check_attention_args(qkv: torch.Tensor, num_heads: int, scale: Optional[float]) -> tuple[int, int]:
    """Validate `attention` arguments; return (H, D).

    qkv [B, N, 3·H·D]: timm's qkv Linear output (q | k | v along the last dimension, H heads of D in each).
    """
    check_tensor("qkv", qkv)
    if qkv.dim() != 3:
        raise ValueError(f"qkv: expected 3-D [B, N, 3·H·D], got shape {fmt_shape(qkv)}")
    check_float_dtype("qkv", qkv)
    num_heads = check_num_heads(num_heads)
    width = qkv.shape[-1]
    if width <= 0 or width % (3 * num_heads):
        raise ValueError(
            f"qkv: expected last dimension a positive multiple of 3·num_heads = {3 * num_heads}, "
            f"got shape {fmt_shape(qkv)}"
        )
    if scale is not None and not is_finite_number(scale):
        raise ValueError(f"scale: expected a finite number, got {scale!r}")
    return num_heads, width // (3 * num_heads)


def attention_unchecked(qkv, num_heads, scale=None):
    batch, tokens, width = qkv.shape
    head_dim = width // (3 * num_heads)
    q, k, v = qkv.reshape(batch, tokens, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    out = F.scaled_dot_product_attention(q, k, v, scale=scale)
    return out.transpose(1, 2).reshape(batch, tokens, num_heads * head_dim)


def attention(qkv: torch.Tensor, num_heads: int, scale: Optional[float] = None) -> torch.Tensor:
    """Multi-head self-attention from timm's packed qkv projection output, in the layout proj reads.

        q, k, v = qkv [B, N, 3, H, D] split;  out_h = softmax(q_h k_hᵀ · scale) v_h   (scale default D^-1/2)
        returns [B, N, H·D] with head h in columns [h·D, (h+1)·D)  (= timm Attention before proj)
    """
    heads, _ = check_attention_args(qkv, num_heads, scale)
    return attention_unchecked(qkv, heads, scale)
