"""`vitfast.reference.xwx_attention` and its argument check `check_xwx_attention_args`: Collapsed non-deep attention
(eq. 6-9): per head softmax(X W_h Xᵀ + key bias) · V_h · W_O,h, summed over heads."""
from __future__ import annotations

from typing import Optional

import torch

from ._check import check_float_dtype, check_tensor, describe


def check_xwx_attention_args(x, w_q, w_k, key_bias, w_v, w_o, b_o, residual) -> tuple[int, int, int, int]:
    """Validate `xwx_attention` arguments; return (H, R, D, C_out).

    x [B, N, C];  w_q [H, C, R] and w_k [H, C, R] (factored scores W_h = w_q[h] w_k[h]ᵀ), or w_q [H, C, C] with
    w_k None (full W_h);  key_bias [H, C];  w_v [H, C, D];  w_o [H, D, C_out];  b_o [C_out];  residual
    [B, N, C_out].  Every tensor has x's dtype and device.
    """
    for name, t in (("x", x), ("w_q", w_q), ("w_v", w_v), ("w_o", w_o)):
        check_tensor(name, t)
    if x.dim() != 3:
        raise ValueError(f"x: expected a [B, N, C] tensor, got {describe(x)}")
    check_float_dtype("x", x)
    channels = x.shape[-1]
    if w_q.dim() != 3 or w_q.shape[1] != channels:
        raise ValueError(
            f"w_q: expected [H, {channels}, R] (or [H, {channels}, {channels}] with w_k=None), got {describe(w_q)}"
        )
    heads, rank = w_q.shape[0], w_q.shape[2]
    if heads < 1 or rank < 1:
        raise ValueError(f"w_q: expected at least one head and rank >= 1, got {describe(w_q)}")
    if w_k is None:
        if rank != channels:
            raise ValueError(
                f"w_q: expected the full score matrices [H, {channels}, {channels}] when w_k is None, "
                f"got {describe(w_q)}"
            )
    elif not isinstance(w_k, torch.Tensor) or tuple(w_k.shape) != tuple(w_q.shape):
        raise ValueError(f"w_k: expected the same shape as w_q {describe(w_q)}, got {describe(w_k)}")
    if key_bias is not None and (not isinstance(key_bias, torch.Tensor) or tuple(key_bias.shape) != (heads, channels)):
        raise ValueError(f"key_bias: expected [{heads}, {channels}] or None, got {describe(key_bias)}")
    if w_v.dim() != 3 or tuple(w_v.shape[:2]) != (heads, channels):
        raise ValueError(f"w_v: expected [{heads}, {channels}, D], got {describe(w_v)}")
    value_dim = w_v.shape[2]
    if w_o.dim() != 3 or tuple(w_o.shape[:2]) != (heads, value_dim):
        raise ValueError(f"w_o: expected [{heads}, {value_dim}, C_out], got {describe(w_o)}")
    out_channels = w_o.shape[2]
    if b_o is not None and (not isinstance(b_o, torch.Tensor) or tuple(b_o.shape) != (out_channels,)):
        raise ValueError(f"b_o: expected [{out_channels}] or None, got {describe(b_o)}")
    if residual is not None and (
        not isinstance(residual, torch.Tensor) or tuple(residual.shape) != (*x.shape[:2], out_channels)
    ):
        expected = "[" + ", ".join(str(s) for s in (*x.shape[:2], out_channels)) + "]"
        raise ValueError(f"residual: expected {expected} or None, got {describe(residual)}")
    for name, t in (("w_q", w_q), ("w_k", w_k), ("key_bias", key_bias), ("w_v", w_v), ("w_o", w_o), ("b_o", b_o),
                    ("residual", residual)):
        if t is not None and (t.dtype != x.dtype or t.device != x.device):
            raise ValueError(f"{name}: expected dtype {x.dtype} on {x.device} (like x), got {t.dtype} on {t.device}")
    return heads, rank, value_dim, out_channels


def xwx_attention(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_k: Optional[torch.Tensor],
    key_bias: Optional[torch.Tensor],
    w_v: torch.Tensor,
    w_o: torch.Tensor,
    b_o: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Collapsed non-deep attention (non-deep ViT eq. 3, 6-7), heads summed through their own output blocks.

        x         [B, N, C]   the (already normalised) tokens
        w_q, w_k  [H, C, R]   score matrices in factored form, W_h = w_q[h] · w_k[h]ᵀ (R = rank, e.g. the branch
                              factors side by side, R = n·d_h); or w_q [H, C, C] = W_h itself with w_k = None
                              (the full X W_h Xᵀ form).  The softmax scale is already folded in.
        key_bias  [H, C]      or None: per-key score bias, s[h, i, j] += x_j · key_bias[h] — what a q-bias
                              becomes (q_i·k_j ∋ b_q·(x_j W_K)); the k-bias term depends on the query only and
                              cancels in the softmax, so it has no argument.
        w_v       [H, C, D]   value map per head (D = value width: d_h, or n·d_h for concatenated branches)
        w_o       [H, D, C']  that head's block of the output projection
        b_o       [C']        or None: output bias (proj bias plus the value biases pushed through w_o, exact
                              because softmax rows sum to 1)
        residual  [B, N, C']  or None: added to the output (the block's shortcut)

        out = residual + b_o + Σ_h softmax_j(x W_h xᵀ + 1 (x key_bias[h])ᵀ) · (x w_v[h]) · w_o[h]

    The softmax runs in float32 whatever the input dtype; everything else in the input dtype.  The op
    `torch.ops.vitfast.xwx_attention` has this signature; its kernels (C++ on CPU, Triton on CUDA) never form the
    [N, N] matrix beyond a tile and never concatenate heads.
    """
    check_xwx_attention_args(x, w_q, w_k, key_bias, w_v, w_o, b_o, residual)
    left = torch.einsum("bnc,hcr->bhnr", x, w_q)
    right = torch.einsum("bnc,hcr->bhnr", x, w_k) if w_k is not None else x.unsqueeze(1)
    scores = left @ right.transpose(-1, -2)  # [B, H, N, N]
    if key_bias is not None:
        scores = scores + torch.einsum("bnc,hc->bhn", x, key_bias).unsqueeze(-2)
    probs = torch.softmax(scores.float(), dim=-1).to(x.dtype)
    heads = probs @ torch.einsum("bnc,hcd->bhnd", x, w_v)  # [B, H, N, D]
    out = torch.einsum("bhnd,hdc->bnc", heads, w_o)  # eq. 3: Σ_h H_h W_O,h, no concatenation
    if b_o is not None:
        out = out + b_o
    if residual is not None:
        out = out + residual
    return out
