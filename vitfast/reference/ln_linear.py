"""`vitfast.reference.ln_linear`: the oracle of the Triton GEMM with the preceding LayerNorm folded in
(kernels/ln_linear.py) — the same formula as torch ops, in the inputs' dtype:

    out = LN(x) · weightᵀ + bias  [exact GELU on the first `gelu_cols` columns]  + bias2 + add + residual

LN is non-affine (the fused model folds its affine into the next linear) and applied only when `eps` is given.
The kernel's arguments are checked by its launcher (`ln_linear_triton`), which has no CPU implementation to share
them with; the emitted row statistics are checked against `RowStats.mean_var` of the output."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def ln_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
              eps: Optional[float] = None, gelu_cols: int = 0, bias2: Optional[torch.Tensor] = None,
              add: Optional[torch.Tensor] = None, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [..., K], weight [N, K] (nn.Linear layout), bias / bias2 [N], add / residual [..., N]."""
    h = F.layer_norm(x, (x.shape[-1],), eps=eps) if eps is not None else x
    out = F.linear(h, weight, bias)
    if gelu_cols:
        out = torch.cat([F.gelu(out[..., :gelu_cols]), out[..., gelu_cols:]], -1)
    for term in (bias2, add, residual):
        if term is not None:
            out = out + term
    return out
