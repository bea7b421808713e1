"""`vitfast.reference.channel_idle_ffn` and its argument check `check_channel_idle_ffn_args`: The fused RePaViT FFN (eq.
6): GELU on the first A hidden channels of x·W_inᵀ, the idle rows as a linear path, then the output projection, bias
and optional residual."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._check import check_float_x, check_like_x, check_shape, check_tensor, fmt_shape


def check_channel_idle_ffn_args(x: torch.Tensor, w_in: torch.Tensor, b_in: Optional[torch.Tensor],
                                w_out: torch.Tensor, b_out: Optional[torch.Tensor],
                                residual: Optional[torch.Tensor]) -> tuple[int, int, int]:
    """Validate `channel_idle_ffn` arguments; return (active A, linear L, C_out).

    Layout (nn.Linear convention, weights are [out_features, in_features]):
      x [..., C_in];  w_in [A + L, C_in] with the A active rows first;  b_in [A + L];
      w_out [C_out, A];  b_out [C_out];  residual [..., C_out] like x;  L is 0 or C_out.
    A = L = 0 without b_out is degenerate but well-defined (the output is zero, plus residual): allowed.
    """
    check_float_x(x, "C_in")
    check_tensor("w_in", w_in)
    check_tensor("w_out", w_out)
    if w_in.dim() != 2:
        raise ValueError(f"w_in: expected 2-D [A + L, C_in], got shape {fmt_shape(w_in)}")
    if w_out.dim() != 2:
        raise ValueError(f"w_out: expected 2-D [C_out, A], got shape {fmt_shape(w_out)}")
    c_in = x.shape[-1]
    if w_in.shape[1] != c_in:
        raise ValueError(
            f"w_in: expected shape [A + L, {c_in}] (C_in = x.shape[-1] = {c_in}), got {fmt_shape(w_in)}"
        )
    c_out, active = w_out.shape
    if active > w_in.shape[0]:
        raise ValueError(
            f"w_out: expected at most w_in.shape[0] = {w_in.shape[0]} active columns, got shape {fmt_shape(w_out)}"
        )
    linear = w_in.shape[0] - active
    if linear not in (0, c_out):
        raise ValueError(
            f"w_in: expected {active} (no linear path) or {active + c_out} (A + C_out) rows "
            f"for w_out of shape {fmt_shape(w_out)}, got {w_in.shape[0]}"
        )
    check_like_x(x, (("w_in", w_in), ("b_in", b_in), ("w_out", w_out), ("b_out", b_out), ("residual", residual)))
    check_shape("b_in", b_in, (w_in.shape[0],))
    check_shape("b_out", b_out, (c_out,))
    check_shape("residual", residual, tuple(x.shape[:-1]) + (c_out,))
    return active, linear, c_out


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
    check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, residual)
    return channel_idle_ffn_unchecked(x, w_in, b_in, w_out, b_out, residual)


# The formulas without their argument checks: what the checked functions here run, and what a caller that has
# validated the arguments already runs (vitfast.ops.vit_block_cuda_eager checks a whole block once, then runs these).
def channel_idle_ffn_unchecked(x, w_in, b_in, w_out, b_out=None, residual=None):
    active = w_out.shape[1]
    h = F.linear(x, w_in, b_in)
    z = F.linear(F.gelu(h[..., :active]), w_out)
    if w_in.shape[0] > active:
        z = z + h[..., active:]
    if b_out is not None:
        z = z + b_out
    if residual is not None:
        z = z + residual
    return z
