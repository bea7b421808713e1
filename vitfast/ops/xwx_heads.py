"""`torch.ops.vitfast.xwx_heads`: the heads of collapsed non-deep attention read from one projection of the tokens
(see `vitfast.reference.xwx_heads`) — `xwx_attention` between its projection and output GEMMs, for models whose
two GEMMs run elsewhere (a quantized non-deep model's int8 ones: `vitfast.nn.xwx.ProjectedXWXAttention`).

CPU: csrc/ops/xwx_heads.cpp (phases 2-3 of the xwx_attention kernel, kernels/xwx_attention.h).  CUDA: the reference
composition (the GPU path of a quantized model is its fp32/bf16 one, which runs `xwx_attention` itself).
"""
from __future__ import annotations

from .. import reference
from ..reference.xwx_heads import check_xwx_heads_args
from ._spec import define_op


def _xwx_heads_cuda(proj, x, num_heads, value_dim):
    return reference.xwx_heads(proj, x, num_heads, value_dim)


def _xwx_heads_fake(proj, x, num_heads, value_dim):
    heads, _, _, d = check_xwx_heads_args(proj, x, num_heads, value_dim)
    return proj.new_empty((proj.shape[0], proj.shape[1], heads * d))


xwx_heads = define_op(
    "xwx_heads(Tensor proj, Tensor? x, int num_heads, int value_dim) -> Tensor",
    check=check_xwx_heads_args, fake=_xwx_heads_fake, cuda=_xwx_heads_cuda,
    doc="`torch.ops.vitfast.xwx_heads` (the heads of collapsed non-deep attention from its projection → [B, N, H·D],\n"
        "    see `vitfast.reference.xwx_heads`), or the reference when VITFAST_BACKEND=reference.",
)
