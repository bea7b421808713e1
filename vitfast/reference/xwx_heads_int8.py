"""`vitfast.reference.xwx_heads_int8`: the heads of collapsed non-deep attention (`xwx_heads`) with the score and
value products on int8 — `attention_int8`'s products (vitfast/reference/attention_int8.py: per-token A and B rows,
per-row softmax codes normalised by their integer sum, per-channel V) on the operands `xwx_heads` reads from the
projection, with the softmax scale 1 (it is already folded into A).  The kernel: `attention_int8`'s head on strided
operands (csrc/kernels/attention_int8.h, `HeadOperands`).

Per head h: A_h [N × dk] and B_h [N × dk] as in `xwx_heads` (B_h = [x | key bias column] in the full form), V_h
[N × D]; dk = R (+1 with a key bias) differs from D, unlike multi-head attention's.
"""
from __future__ import annotations

from typing import Optional

import torch

from .attention_int8 import int8_heads
from .xwx_heads import check_xwx_heads_args, head_operands, merge_heads


def check_xwx_heads_int8_args(proj, x, num_heads, value_dim) -> tuple[int, int, int, int]:
    """Validate `xwx_heads_int8` arguments (those of `xwx_heads`); return (H, left width, right width, D)."""
    return check_xwx_heads_args(proj, x, num_heads, value_dim)


def xwx_heads_int8(proj: torch.Tensor, x: Optional[torch.Tensor], num_heads: int, value_dim: int) -> torch.Tensor:
    """`xwx_heads` with int8 score/value products (module doc): [B, N, H·D] in proj's dtype, computed from its fp32
    values."""
    check_xwx_heads_int8_args(proj, x, num_heads, value_dim)  # before the conversion: an int proj is refused
    a, b, v = head_operands(proj.float(), None if x is None else x.float(), num_heads, value_dim)
    return merge_heads(int8_heads(a, b, v, 1.0)).to(proj.dtype)
