"""`vitfast.reference.dwconv_heads` and its argument check `check_dwconv_heads_args`: the drop-in DW-conv heads (eq. 11)
between their value and output projections — `dwconv_attention` without its two GEMMs, so that a quantized model can
run those on int8 (`vitfast.nn.dwconv.FusedDWConvBlock` with `Int8Linear` value / out_proj layers)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._check import check_tensor, check_token_grid, fmt_shape


def check_dwconv_heads_args(v, kernel, grid_h, grid_w) -> tuple[int, int, int]:
    """Validate `dwconv_heads` arguments; return (prefix tokens P, value width D, kernel size k).

    v [B, N, D] (the value projection of every token: N = P + grid_h·grid_w, P ≥ 0 prefix tokens first, then the
    grid row-major); kernel [D, k, k] with k odd, v's dtype and device.
    """
    check_tensor("v", v)
    check_tensor("kernel", kernel)
    if v.dim() != 3:
        raise ValueError(f"v: expected 3-D [B, N, D], got shape {fmt_shape(v)}")
    if v.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"v: expected dtype float32, float16 or bfloat16, got {v.dtype}")
    _, _, prefix = check_token_grid("v", v, grid_h, grid_w)
    width = v.shape[2]
    if kernel.dim() != 3 or kernel.shape[0] != width or kernel.shape[1] != kernel.shape[2] or kernel.shape[1] % 2 == 0:
        raise ValueError(f"kernel: expected [{width}, k, k] with k odd (one k×k filter per value channel), got shape "
                         f"{fmt_shape(kernel)}")
    if kernel.dtype != v.dtype or kernel.device != v.device:
        raise ValueError(f"kernel: expected dtype {v.dtype} on {v.device} (like v), got {kernel.dtype} on "
                         f"{kernel.device}")
    return prefix, width, kernel.shape[1]


def dwconv_heads(v: torch.Tensor, kernel: torch.Tensor, grid_h: int, grid_w: int) -> torch.Tensor:
    """The drop-in DW-conv heads on their values: U [B, N, D] from V [B, N, D].

        U_grid   = Conv_DW(V_grid, kernel)         k×k per channel, "same" size, zero padding (eq. 6, 11)
        U_prefix = mean over the grid tokens of V  (each prefix token: vitfast's rule, see dwconv_attention)

    `dwconv_attention(x, w_v, b_v, kernel, w_o, b_o, ...)` = linear(dwconv_heads(linear(x, w_v, b_v), kernel, ...),
    w_o, b_o, residual), up to rounding (the fused op takes the prefix tokens' mean of x before projecting it).
    """
    prefix, width, ksize = check_dwconv_heads_args(v, kernel, grid_h, grid_w)
    batch = v.shape[0]
    if width:
        grid = v[:, prefix:].transpose(1, 2).reshape(batch, width, grid_h, grid_w)
        u = F.conv2d(grid, kernel.unsqueeze(1), padding=ksize // 2, groups=width)  # cross-correlation = eq. 6
        u = u.flatten(2).transpose(1, 2)  # [B, HW, D]
    else:  # no channel (conv2d refuses 0 groups)
        u = v[:, prefix:]
    if prefix:
        u = torch.cat([v[:, prefix:].mean(dim=1, keepdim=True).expand(batch, prefix, width), u], dim=1)
    return u
