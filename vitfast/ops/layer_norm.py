"""`torch.ops.vitfast.layer_norm`: LayerNorm over the last dimension (= F.layer_norm), the fused blocks' pre-norms.

CPU: csrc/ops/layer_norm.cpp.  CUDA: no Triton kernel, torch's fused CUDA LayerNorm is one launch already.
"""
from __future__ import annotations

from .. import reference
from ..reference.layer_norm import check_layer_norm_args
from ._spec import define_op


def _layer_norm_fake(x, weight, bias, eps):
    check_layer_norm_args(x, weight, bias, eps)
    return x.new_empty(x.shape)


def _layer_norm_cuda(*args):
    return reference.layer_norm(*args)


layer_norm = define_op(
    "layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor",
    check=check_layer_norm_args, fake=_layer_norm_fake, cuda=_layer_norm_cuda,
    doc="`torch.ops.vitfast.layer_norm` (over the last dimension, = F.layer_norm), or the reference when\n"
        "    VITFAST_BACKEND=reference.",
)
