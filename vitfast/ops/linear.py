"""`torch.ops.vitfast.linear`: y = x · weightᵀ + bias + residual (the fused blocks' qkv, proj and head).

CPU: csrc/ops/linear.cpp (packed GEMM).  CUDA: no Triton kernel yet, the reference composition (F.linear = cuBLAS
with its bias epilogue, + residual).
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import reference
from ._check import check_float_x, check_like_x, check_shape, check_tensor, fmt_shape
from ._spec import define_op


def check_linear_args(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      residual: Optional[torch.Tensor]) -> int:
    """Validate `linear` arguments; return N (out_features).

    x [..., K];  weight [N, K] (nn.Linear layout);  bias [N];  residual [..., N] like x.
    """
    check_float_x(x, "K")
    check_tensor("weight", weight)
    if weight.dim() != 2:
        raise ValueError(f"weight: expected 2-D [N, K], got shape {fmt_shape(weight)}")
    k, n = x.shape[-1], weight.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f"weight: expected shape [N, {k}] (K = x.shape[-1] = {k}), got {fmt_shape(weight)}")
    check_like_x(x, (("weight", weight), ("bias", bias), ("residual", residual)))
    check_shape("bias", bias, (n,))
    check_shape("residual", residual, tuple(x.shape[:-1]) + (n,))
    return n


def _linear_fake(x, weight, bias, residual):
    n = check_linear_args(x, weight, bias, residual)
    return x.new_empty(tuple(x.shape[:-1]) + (n,))


def _linear_cuda(*args):
    return reference.linear(*args)


linear = define_op(
    "linear(Tensor x, Tensor weight, Tensor? bias=None, Tensor? residual=None) -> Tensor",
    fake=_linear_fake, cuda=_linear_cuda,
    doc="`torch.ops.vitfast.linear` (x · weightᵀ + bias + residual), or the reference when VITFAST_BACKEND=reference.",
)
