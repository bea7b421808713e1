"""`torch.ops.vitfast.linear_int8`: y = x · Wᵀ + bias + residual with int8 weights (per output channel) and int8
activations (per token, or one static scale), dequantised in the GEMM's epilogue (vitfast/reference/linear_int8.py).

CPU: csrc/ops/linear_int8.cpp (the int8 GEMM core, csrc/kernels/gemm_int8.h).  CUDA: the reference composition
(no int8 GPU kernel: the GPU path of a quantized model is its fp32/bf16 one).
"""
from __future__ import annotations

from .. import reference
from ..reference.linear_int8 import check_linear_int8_args
from ..reference._int8_qdq import linear_int8_qdq
from ._spec import define_op, onnx_exporting, standard_entry


def _linear_int8_fake(x, qweight, w_scale, bias, residual, smooth, act_scale):
    n = check_linear_int8_args(x, qweight, w_scale, bias, residual, smooth, act_scale)
    return x.new_empty(tuple(x.shape[:-1]) + (n,))


def _linear_int8_cuda(*args):
    return reference.linear_int8(*args)


_standard = standard_entry("linear_int8")


def _entry(args):
    """Under an ONNX export the QuantizeLinear/DequantizeLinear form (vitfast/reference/_int8_qdq.py), else as
    every op."""
    if onnx_exporting():
        return linear_int8_qdq(*args)
    return _standard(args)


linear_int8 = define_op(
    "linear_int8(Tensor x, Tensor qweight, Tensor w_scale, Tensor? bias=None, Tensor? residual=None, "
    "Tensor? smooth=None, float act_scale=0.0) -> Tensor",
    check=check_linear_int8_args, fake=_linear_int8_fake, cuda=_linear_int8_cuda,
    entry=_entry,
    doc="`torch.ops.vitfast.linear_int8` (int8 x · int8 Wᵀ, dequantised, + bias + residual), or the reference when "
        "VITFAST_BACKEND=reference.",
)
