"""`vitfast.reference.xwx_heads_bf16`: the heads of collapsed non-deep attention (`xwx_heads`) with the score and
value products on bf16 operands and fp32 sums — `attention_bf16`'s products (vitfast/reference/attention_bf16.py: the
bf16-rounded A, B, P, V, the softmax and its sum in fp32) on the operands `xwx_heads` reads from the projection, with
the softmax scale 1 (it is already folded into A).  The kernel: `attention_bf16`'s head on strided operands
(csrc/kernels/attention.h, `HeadOperands`).

Per head h: A_h [N × dk] and B_h [N × dk] as in `xwx_heads` (B_h = [x | key bias column] in the full form), V_h
[N × D].  A bf16 non-deep model's `xwx_attention` runs these heads between its bf16 GEMMs, and an int8 model's
`ProjectedXWXAttention` with `vitfast.quantize(attention="bf16")`.
"""
from __future__ import annotations

from typing import Optional

import torch

from .attention_bf16 import bf16_heads
from .xwx_heads import check_xwx_heads_args, head_operands, merge_heads


def check_xwx_heads_bf16_args(proj, x, num_heads, value_dim) -> tuple[int, int, int, int]:
    """Validate `xwx_heads_bf16` arguments (those of `xwx_heads`); return (H, left width, right width, D)."""
    return check_xwx_heads_args(proj, x, num_heads, value_dim)


def xwx_heads_bf16(proj: torch.Tensor, x: Optional[torch.Tensor], num_heads: int, value_dim: int) -> torch.Tensor:
    """`xwx_heads` with bf16-operand score/value products (module doc): [B, N, H·D] in proj's dtype, computed from its
    fp32 values (in fp64 from the bf16-rounded operands: the kernel's only other roundings are its fp32 sums)."""
    check_xwx_heads_bf16_args(proj, x, num_heads, value_dim)  # before the conversion: an int proj is refused
    a, b, v = head_operands(proj.float(), None if x is None else x.float(), num_heads, value_dim)
    return merge_heads(bf16_heads(a, b, v, 1.0)).to(proj.dtype)
