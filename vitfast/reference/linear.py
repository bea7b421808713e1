"""`vitfast.reference.linear` and its argument check `check_linear_args`: x · weightᵀ + bias (+ residual): the
packed-weight GEMM every fused projection runs."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._check import check_float_x, check_like_x, check_shape, check_tensor, fmt_shape


def check_linear_args(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      residual: Optional[torch.Tensor]) -> int:
    """Validate `linear` arguments; return N (out_features).

    x [..., K];  weight [N, K] (nn.Linear layout);  bias [N];  residual [..., N] like x.
    """
    check_float_x(x, "K")
    check_tensor("weight", weight)
    if weight.dim() != 2:
        raise ValueError(f"weight: expected 2-D [N, K], got shape {fmt_shape(weight)}")
    k, n = x.shape[-1], weight.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f"weight: expected shape [N, {k}] (K = x.shape[-1] = {k}), got {fmt_shape(weight)}")
    check_like_x(x, (("weight", weight), ("bias", bias), ("residual", residual)))
    check_shape("bias", bias, (n,))
    check_shape("residual", residual, tuple(x.shape[:-1]) + (n,))
    return n


def linear_unchecked(x, weight, bias=None, residual=None):
    y = F.linear(x, weight, bias)
    if residual is not None:
        y = y + residual
    return y


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Dense layer with a fused shortcut:  y = x · weightᵀ + bias + residual  (bias, residual optional).

    The fused ViT block runs qkv, proj (residual = the block input: `x + attn(...)`) and the head on it.
    """
    check_linear_args(x, weight, bias, residual)
    return linear_unchecked(x, weight, bias, residual)
