"""`vitfast.reference.xwx_heads` and its argument check `check_xwx_heads_args`: the heads of collapsed non-deep
attention (non-deep ViT eq. 6-7) read from one projection of the tokens — `xwx_attention` without its projection and
output GEMMs, so that a quantized model can run those two on int8 (`vitfast.nn.xwx.ProjectedXWXAttention`)."""
from __future__ import annotations

from typing import Optional

import torch

from ._check import as_integer, check_float_dtype, check_num_heads, check_tensor, fmt_shape


def check_xwx_heads_args(proj, x, num_heads, value_dim) -> tuple[int, int, int, int]:
    """Validate `xwx_heads` arguments; return (H, left width, right width, D).

    proj [B, N, H·P]: per head h, P columns [left | right | value (value_dim)] starting at h·P.  Factored form (x
    None): left and right have the same width (P − D) / 2 >= 1.  Full form (x [B, N, C] given): the right operand is
    [x | right] with right 0 or 1 columns wide (a key bias), and left is C + that wide.
    """
    check_tensor("proj", proj)
    if proj.dim() != 3:
        raise ValueError(f"proj: expected 3-D [B, N, H·P], got shape {fmt_shape(proj)}")
    check_float_dtype("proj", proj)
    heads = check_num_heads(num_heads)
    d = as_integer(value_dim)
    if d is None or d < 1:
        raise ValueError(f"value_dim: expected an int >= 1, got {value_dim!r}")
    width = proj.shape[-1]
    if width <= 0 or width % heads:
        raise ValueError(f"proj: expected last dimension a positive multiple of num_heads = {heads}, got shape "
                         f"{fmt_shape(proj)}")
    per_head = width // heads
    if x is None:
        rest = per_head - d
        if rest < 2 or rest % 2:
            raise ValueError(f"proj: expected 2·R + value_dim columns per head (R >= 1: the left and right score "
                             f"factors, then {d} value columns), got {per_head} columns per head, shape "
                             f"{fmt_shape(proj)}")
        return heads, rest // 2, rest // 2, d
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x: expected a Tensor or None, got {type(x).__name__}")
    if x.dim() != 3 or tuple(x.shape[:2]) != tuple(proj.shape[:2]):
        raise ValueError(f"x: expected shape [{proj.shape[0]}, {proj.shape[1]}, C] (proj's tokens), got shape "
                         f"{fmt_shape(x)}")
    if x.dtype != proj.dtype or x.device != proj.device:
        raise ValueError(f"x: expected dtype {proj.dtype} on {proj.device} (like proj), got {x.dtype} on {x.device}")
    channels = x.shape[2]
    rest = per_head - d - channels
    if rest not in (0, 2):
        raise ValueError(f"proj: expected C + 2·kb + value_dim columns per head with x given (C = {channels}, kb 0 or "
                         f"1: a key bias column, then {d} value columns), got {per_head} columns per head, shape "
                         f"{fmt_shape(proj)}")
    return heads, channels + rest // 2, rest // 2, d


def xwx_heads(proj: torch.Tensor, x: Optional[torch.Tensor], num_heads: int, value_dim: int) -> torch.Tensor:
    """The heads of collapsed non-deep attention from one projection of the tokens, side by side [B, N, H·D].

        proj  [B, N, H·P]  per head h the columns [A_h | B'_h | V_h] at h·P: what `xwx_attention`'s projection
                           writes — A_h = [x w_q[h] | 1] and B'_h = [x w_k[h] | x key_bias[h]] (factored form;
                           without a key bias no ones / bias columns), V_h = x w_v[h]
        x     [B, N, C]    or None: given, the full form, whose right operand is [x | B'_h] (B'_h the key bias
                           column, or none) and A_h = [x W_h | 1]

        out[..., h·D:(h+1)·D] = softmax_j(A_h B_hᵀ) · V_h       B_h = B'_h, or [x | B'_h] with x given

    The softmax scale is already in A_h (folded into w_q); the softmax runs in float32 whatever the input dtype,
    everything else in the input dtype.  `xwx_attention` = this, then Σ_h out_h · w_o[h] + b_o + residual.
    """
    a, b, v = head_operands(proj, x, num_heads, value_dim)
    probs = torch.softmax((a @ b.transpose(-1, -2)).float(), dim=-1).to(proj.dtype)
    return merge_heads(probs @ v)


def head_operands(proj, x, num_heads, value_dim):
    """The checked arguments' per-head operands (A_h, B_h, V_h), each [B, H, N, ·] in proj's dtype (the doc of
    `xwx_heads`; B_h = [x | B'_h] in the full form)."""
    heads, left, right, _ = check_xwx_heads_args(proj, x, num_heads, value_dim)
    batch, tokens, width = proj.shape
    p = proj.reshape(batch, tokens, heads, width // heads).transpose(1, 2)  # [B, H, N, P]
    b = p[..., left:left + right]
    if x is not None:
        b = torch.cat([x.unsqueeze(1).expand(batch, heads, tokens, x.shape[2]), b], dim=-1)
    return p[..., :left], b, p[..., left + right:]


def merge_heads(out: torch.Tensor) -> torch.Tensor:
    """[B, H, N, D] → [B, N, H·D], head h in columns [h·D, (h+1)·D)."""
    batch, heads, tokens, d = out.shape
    return out.transpose(1, 2).reshape(batch, tokens, heads * d)
