"""`torch.ops.vitfast.xwx_heads_bf16`: `xwx_heads` (the heads of collapsed non-deep attention from one projection)
with the score and value products on bf16 operands and fp32 sums — see `vitfast.reference.xwx_heads_bf16`.  An int8
model's `ProjectedXWXAttention` runs it when `vitfast.quantize(attention="bf16")` asked for bf16 products.

CPU: csrc/ops/xwx_heads.cpp (`attention_bf16`'s head on the projection's strided operands; the portable bf16 kernel
on CPUs without a bf16 extension: the same products, slowly).  CUDA: the reference composition.
"""
from __future__ import annotations

from .. import reference
from ..reference.xwx_heads_bf16 import check_xwx_heads_bf16_args
from ._spec import define_op


def _xwx_heads_bf16_cuda(proj, x, num_heads, value_dim):
    return reference.xwx_heads_bf16(proj, x, num_heads, value_dim)


def _xwx_heads_bf16_fake(proj, x, num_heads, value_dim):
    heads, _, _, d = check_xwx_heads_bf16_args(proj, x, num_heads, value_dim)
    return proj.new_empty((proj.shape[0], proj.shape[1], heads * d))


xwx_heads_bf16 = define_op(
    "xwx_heads_bf16(Tensor proj, Tensor? x, int num_heads, int value_dim) -> Tensor",
    check=check_xwx_heads_bf16_args, fake=_xwx_heads_bf16_fake, cuda=_xwx_heads_bf16_cuda,
    doc="`torch.ops.vitfast.xwx_heads_bf16` (`xwx_heads` with bf16-operand score/value products → [B, N, H·D], see\n"
        "    `vitfast.reference.xwx_heads_bf16`), or the reference when VITFAST_BACKEND=reference.",
)
