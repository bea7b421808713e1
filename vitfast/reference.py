"""Reference implementations: the ground truth for every `torch.ops.vitfast.*` op.

Same signature as the op; plain PyTorch (autograd works), computed in the input dtype.  Tests compare every
kernel against these, benchmarks use them as the eager baseline, and `VITFAST_BACKEND=reference` routes fused
modules through them.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._validate import check_channel_idle_ffn_args, check_linear_args

__all__ = ["channel_idle_ffn", "linear"]


def channel_idle_ffn(
    x: torch.Tensor,
    w_in: torch.Tensor,
    b_in: Optional[torch.Tensor],
    w_out: torch.Tensor,
    b_out: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Fused RePaViT FFN at inference (RePaViT eq. 6, plus optional bias/residual).

        h = x · w_inᵀ + b_in                 # [..., A + L]: A active columns, then L linear ones
        z = GELU(h[..., :A]) · w_outᵀ        # erf GELU on the active channels only
        z += h[..., A:]                      # the folded idle path  Y·W̃  (only when L = C_out)
        z += b_out;  z += residual           # both optional

    `A = w_out.shape[1]`.  θ = 0 (vanilla FFN) is L = 0 with `b_out` = fc2's bias; θ = 1 is A = 0 (one linear).
    The LayerNorm variant passes its un-foldable shortcut as `residual`.
    """
    active, linear, _ = check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, residual)
    h = F.linear(x, w_in, b_in)
    z = F.linear(F.gelu(h[..., :active]), w_out)
    if linear:
        z = z + h[..., active:]
    if b_out is not None:
        z = z + b_out
    if residual is not None:
        z = z + residual
    return z


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
    y = F.linear(x, weight, bias)
    if residual is not None:
        y = y + residual
    return y
