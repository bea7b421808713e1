"""`torch.ops.vitfast.linear`: y = x · weightᵀ + bias + residual (the fused blocks' qkv, proj and head).

CPU: csrc/ops/linear.cpp (packed GEMM).  CUDA: no Triton kernel yet, the reference composition (F.linear = cuBLAS
with its bias epilogue, + residual).
"""
from __future__ import annotations

from .. import reference
from ..reference.linear import check_linear_args
from ._spec import define_op


def _linear_fake(x, weight, bias, residual):
    n = check_linear_args(x, weight, bias, residual)
    return x.new_empty(tuple(x.shape[:-1]) + (n,))


def _linear_cuda(*args):
    return reference.linear(*args)


linear = define_op(
    "linear(Tensor x, Tensor weight, Tensor? bias=None, Tensor? residual=None) -> Tensor",
    check=check_linear_args, fake=_linear_fake, cuda=_linear_cuda,
    doc="`torch.ops.vitfast.linear` (x · weightᵀ + bias + residual), or the reference when VITFAST_BACKEND=reference.",
)
