"""`torch.ops.vitfast.dwconv_heads`: the drop-in DW-conv heads on their values (see `vitfast.reference.dwconv_heads`)
— `dwconv_attention` between its value and output GEMMs, for blocks whose two GEMMs run elsewhere (a quantized
DW-conv block's `Int8Linear` value / out_proj).

CPU: csrc/ops/dwconv_heads.cpp (the dwconv_attention kernel's per-row convolution, kernels/dwconv_attention.h).
CUDA: the reference composition (the GPU path of a quantized model is its fp32/bf16 one, which runs
`dwconv_attention` itself).
"""
from __future__ import annotations

from .. import reference
from ..reference.dwconv_heads import check_dwconv_heads_args
from ._spec import define_op


def _dwconv_heads_cuda(v, kernel, grid_h, grid_w):
    return reference.dwconv_heads(v, kernel, grid_h, grid_w)


def _dwconv_heads_fake(v, kernel, grid_h, grid_w):
    check_dwconv_heads_args(v, kernel, grid_h, grid_w)
    return v.new_empty(v.shape)


dwconv_heads = define_op(
    "dwconv_heads(Tensor v, Tensor kernel, int grid_h, int grid_w) -> Tensor",
    check=check_dwconv_heads_args, fake=_dwconv_heads_fake, cuda=_dwconv_heads_cuda,
    doc="`torch.ops.vitfast.dwconv_heads` (the drop-in DW-conv heads on their values, see\n"
        "    `vitfast.reference.dwconv_heads`), or the reference when VITFAST_BACKEND=reference.",
)
