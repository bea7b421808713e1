"""`torch.ops.vitfast.layer_norm`: LayerNorm over the last dimension (= F.layer_norm), the fused blocks' pre-norms.

CPU: csrc/ops/layer_norm.cpp.  CUDA: no Triton kernel, torch's fused CUDA LayerNorm is one launch already.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .. import reference
from ._check import check_float_x, check_like_x, check_shape
from ._spec import define_op


def check_layer_norm_args(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                          eps: float) -> int:
    """Validate `layer_norm` arguments; return C (the normalised last dimension).

    x [..., C];  weight [C], bias [C] (optional, the affine);  eps >= 0 and finite.
    """
    check_float_x(x, "C")
    c = x.shape[-1]
    check_like_x(x, (("weight", weight), ("bias", bias)))
    check_shape("weight", weight, (c,))
    check_shape("bias", bias, (c,))
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps: expected a finite number >= 0, got {eps}")
    return c


def _layer_norm_fake(x, weight, bias, eps):
    check_layer_norm_args(x, weight, bias, eps)
    return x.new_empty(x.shape)


def _layer_norm_cuda(*args):
    return reference.layer_norm(*args)


layer_norm = define_op(
    "layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor",
    fake=_layer_norm_fake, cuda=_layer_norm_cuda,
    doc="`torch.ops.vitfast.layer_norm` (over the last dimension, = F.layer_norm), or the reference when\n"
        "    VITFAST_BACKEND=reference.",
)
