"""`torch.ops.vitfast.xwx_heads_int8`: `xwx_heads` (the heads of collapsed non-deep attention from one projection)
with the score and value products on int8 — see `vitfast.reference.xwx_heads_int8`.  An int8 model's
`ProjectedXWXAttention` runs it when `vitfast.quantize(attention=...)` put its products on int8.

CPU: csrc/ops/xwx_heads.cpp (`attention_int8`'s head on the projection's strided operands).  CUDA: the reference
composition (a quantized model's GPU path is its fp32/bf16 one).
"""
from __future__ import annotations

from .. import reference
from ..reference.xwx_heads_int8 import check_xwx_heads_int8_args
from ._spec import define_op


def _xwx_heads_int8_cuda(proj, x, num_heads, value_dim):
    return reference.xwx_heads_int8(proj, x, num_heads, value_dim)


def _xwx_heads_int8_fake(proj, x, num_heads, value_dim):
    heads, _, _, d = check_xwx_heads_int8_args(proj, x, num_heads, value_dim)
    return proj.new_empty((proj.shape[0], proj.shape[1], heads * d))


xwx_heads_int8 = define_op(
    "xwx_heads_int8(Tensor proj, Tensor? x, int num_heads, int value_dim) -> Tensor",
    check=check_xwx_heads_int8_args, fake=_xwx_heads_int8_fake, cuda=_xwx_heads_int8_cuda,
    doc="`torch.ops.vitfast.xwx_heads_int8` (`xwx_heads` with int8 score/value products → [B, N, H·D], see\n"
        "    `vitfast.reference.xwx_heads_int8`), or the reference when VITFAST_BACKEND=reference.",
)
