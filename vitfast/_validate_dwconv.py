"""Argument checks of `dwconv_attention`, shared by the reference, the fake (meta) impl and the Triton launcher.

Kept in its own module (next to `_validate.py`, reusing its helpers) so the op's checks are one self-contained
piece; the C++ binding (csrc/ops/dwconv_attention.cpp) repeats them with the same wording.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._validate import FLOAT_DTYPES, _fmt_shape, as_integer, check_like_x, check_tensor

__all__ = ["check_dwconv_attention_args"]


def check_dwconv_attention_args(
    x: torch.Tensor,
    w_v: torch.Tensor,
    b_v: Optional[torch.Tensor],
    kernel: torch.Tensor,
    w_o: torch.Tensor,
    b_o: Optional[torch.Tensor],
    grid_h: int,
    grid_w: int,
    residual: Optional[torch.Tensor],
) -> tuple[int, int, int, int]:
    """Validate `dwconv_attention` arguments; return (prefix tokens P, value width D, kernel size k, C_out).

    Layout (nn.Linear convention for the projections):
      x [B, N, C] with N = P + grid_h·grid_w (P ≥ 0 prefix tokens first, then the grid row-major);
      w_v [D, C];  b_v [D];  kernel [D, k, k] (k odd: a symmetric "same" window);  w_o [C_out, D];
      b_o [C_out];  residual [B, N, C_out].
    """
    for name, t in (("x", x), ("w_v", w_v), ("kernel", kernel), ("w_o", w_o)):
        check_tensor(name, t)
    if x.dim() != 3:
        raise ValueError(f"x: expected 3-D [B, N, C], got shape {_fmt_shape(x)}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x: expected dtype float32, float16 or bfloat16, got {x.dtype}")
    grid = []
    for name, v in (("grid_h", grid_h), ("grid_w", grid_w)):
        value = as_integer(v)
        if value is None or value < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        grid.append(value)
    grid_h, grid_w = grid
    tokens, channels = x.shape[1], x.shape[2]
    prefix = tokens - grid_h * grid_w
    if prefix < 0:
        raise ValueError(
            f"x: expected N >= grid_h·grid_w = {grid_h}·{grid_w} = {grid_h * grid_w} tokens (prefix tokens, then "
            f"the grid), got shape {_fmt_shape(x)}"
        )
    if w_v.dim() != 2 or w_v.shape[1] != channels:
        raise ValueError(f"w_v: expected 2-D [D, {channels}] (C = x.shape[-1]), got shape {_fmt_shape(w_v)}")
    width = w_v.shape[0]
    if kernel.dim() != 3 or kernel.shape[0] != width or kernel.shape[1] != kernel.shape[2] or kernel.shape[1] % 2 == 0:
        raise ValueError(
            f"kernel: expected [{width}, k, k] with k odd (one k×k filter per value channel), got shape "
            f"{_fmt_shape(kernel)}"
        )
    if w_o.dim() != 2 or w_o.shape[1] != width:
        raise ValueError(f"w_o: expected 2-D [C_out, {width}] (D = w_v.shape[0]), got shape {_fmt_shape(w_o)}")
    c_out = w_o.shape[0]
    check_like_x(x, (("w_v", w_v), ("b_v", b_v), ("kernel", kernel), ("w_o", w_o), ("b_o", b_o),
                     ("residual", residual)))
    if b_v is not None and tuple(b_v.shape) != (width,):
        raise ValueError(f"b_v: expected shape [{width}], got {_fmt_shape(b_v)}")
    if b_o is not None and tuple(b_o.shape) != (c_out,):
        raise ValueError(f"b_o: expected shape [{c_out}], got {_fmt_shape(b_o)}")
    if residual is not None and tuple(residual.shape) != (x.shape[0], tokens, c_out):
        raise ValueError(f"residual: expected shape [{x.shape[0]}, {tokens}, {c_out}], got {_fmt_shape(residual)}")
    return prefix, width, kernel.shape[1], c_out
