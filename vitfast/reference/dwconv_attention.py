"""`vitfast.reference.dwconv_attention` and its argument check `check_dwconv_attention_args`: Drop-in DW-conv heads (eq.
11): value projection, k×k depthwise convolution over the token grid (prefix tokens passed through), head-wise output
projection."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._check import check_like_x, check_shape, check_tensor, check_token_grid, check_tokens, fmt_shape
from .linear import linear


def check_dwconv_attention_args(x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual) -> tuple[int, int, int, int]:
    """Validate `dwconv_attention` arguments; return (prefix tokens P, value width D, kernel size k, C_out).

    Layout (nn.Linear convention for the projections):
      x [B, N, C] with N = P + grid_h·grid_w (P ≥ 0 prefix tokens first, then the grid row-major);
      w_v [D, C];  b_v [D];  kernel [D, k, k] (k odd: a symmetric "same" window);  w_o [C_out, D];
      b_o [C_out];  residual [B, N, C_out].
    """
    for name, t in (("x", x), ("w_v", w_v), ("kernel", kernel), ("w_o", w_o)):
        check_tensor(name, t)
    check_tokens(x)
    grid_h, grid_w, prefix = check_token_grid("x", x, grid_h, grid_w)
    tokens, channels = x.shape[1], x.shape[2]
    if w_v.dim() != 2 or w_v.shape[1] != channels:
        raise ValueError(f"w_v: expected 2-D [D, {channels}] (C = x.shape[-1]), got shape {fmt_shape(w_v)}")
    width = w_v.shape[0]
    if kernel.dim() != 3 or kernel.shape[0] != width or kernel.shape[1] != kernel.shape[2] or kernel.shape[1] % 2 == 0:
        raise ValueError(
            f"kernel: expected [{width}, k, k] with k odd (one k×k filter per value channel), got shape "
            f"{fmt_shape(kernel)}"
        )
    if w_o.dim() != 2 or w_o.shape[1] != width:
        raise ValueError(f"w_o: expected 2-D [C_out, {width}] (D = w_v.shape[0]), got shape {fmt_shape(w_o)}")
    c_out = w_o.shape[0]
    check_like_x(x, (("w_v", w_v), ("b_v", b_v), ("kernel", kernel), ("w_o", w_o), ("b_o", b_o),
                     ("residual", residual)))
    check_shape("b_v", b_v, (width,))
    check_shape("b_o", b_o, (c_out,))
    check_shape("residual", residual, (x.shape[0], tokens, c_out))
    return prefix, width, kernel.shape[1], c_out


def dwconv_attention(
    x: torch.Tensor,
    w_v: torch.Tensor,
    b_v: Optional[torch.Tensor],
    kernel: torch.Tensor,
    w_o: torch.Tensor,
    b_o: Optional[torch.Tensor],
    grid_h: int,
    grid_w: int,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Drop-in depthwise-convolution heads (dropin-depthwise-conv-attention eq. 11, 13), output projection fused.

        x         [B, N, C]     tokens: P = N − grid_h·grid_w prefix tokens (cls, registers) first, then the
                                grid_h × grid_w patch grid in row-major order (timm's layout)
        w_v, b_v  [D, C], [D]   value projection of the replaced heads (their rows of W^V, heads side by side:
                                D = heads·d_h; the ensembled form of eq. 12-13 is one head, D = d_h)
        kernel    [D, k, k]     one k×k filter per value channel (eq. 11's K^h, k odd)
        w_o, b_o  [C_out, D]    those heads' columns of the output projection W^O (and a bias, optional)
        residual  [B, N, C_out] added to the output (the block's shortcut), optional

        V = x · w_vᵀ + b_v;   U_grid = Conv_DW(V_grid, kernel)   ("same" size, zero padding, eq. 6)
        U_prefix = mean over the grid tokens of V                (vitfast's rule for kept prefix tokens)
        out = U · w_oᵀ + b_o + residual

    Prefix tokens have no grid position, so eq. 8 gives them no neighbourhood.  vitfast gives a kept cls/register
    token the average of the head's values over the patch grid: the input-independent attention map that is
    uniform over the patches (what an input-invariant head, Σ_h = 0, can do for a token without position), at
    O(D) cost.  The paper itself removes the cls token (appendix A.3.2; `vitfast.convert` supports both).
    """
    prefix, width, ksize, _ = check_dwconv_attention_args(x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual)
    batch = x.shape[0]
    v = F.linear(x, w_v, b_v)  # [B, N, D]
    if width:
        grid = v[:, prefix:].transpose(1, 2).reshape(batch, width, grid_h, grid_w)
        u = F.conv2d(grid, kernel.unsqueeze(1), padding=ksize // 2, groups=width)  # cross-correlation = eq. 6
        u = u.flatten(2).transpose(1, 2)  # [B, HW, D]
    else:  # no replaced channel (conv2d refuses 0 groups): nothing to convolve
        u = v[:, prefix:]
    if prefix:
        u = torch.cat([v[:, prefix:].mean(dim=1, keepdim=True).expand(batch, prefix, width), u], dim=1)
    return linear(u, w_o, b_o, residual)
