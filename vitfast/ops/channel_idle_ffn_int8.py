"""`torch.ops.vitfast.channel_idle_ffn_int8`: the fused RePaViT FFN (eq. 6) with int8 weights and int8 activations
(both GEMMs), GELU, linear path, biases and residual in fp32 (vitfast/reference/channel_idle_ffn_int8.py).

CPU: csrc/ops/channel_idle_ffn_int8.cpp (the int8 GEMM core).  CUDA: the reference composition.
"""
from __future__ import annotations

from .. import reference
from ..reference.channel_idle_ffn_int8 import check_channel_idle_ffn_int8_args
from ..reference._int8_qdq import channel_idle_ffn_int8_qdq
from ._spec import define_op, onnx_exporting, standard_entry


def _channel_idle_ffn_int8_fake(x, qw_in, s_in, b_in, qw_out, s_out, b_out, residual, smooth_in, smooth_out,
                                act_scale_in, act_scale_out):
    _, _, c_out = check_channel_idle_ffn_int8_args(x, qw_in, s_in, b_in, qw_out, s_out, b_out, residual, smooth_in,
                                                   smooth_out, act_scale_in, act_scale_out)
    return x.new_empty(tuple(x.shape[:-1]) + (c_out,))


def _channel_idle_ffn_int8_cuda(*args):
    return reference.channel_idle_ffn_int8(*args)


_standard = standard_entry("channel_idle_ffn_int8")


def _entry(args):
    """Under an ONNX export the QuantizeLinear/DequantizeLinear form (vitfast/reference/_int8_qdq.py), else as
    every op."""
    if onnx_exporting():
        return channel_idle_ffn_int8_qdq(*args)
    return _standard(args)


channel_idle_ffn_int8 = define_op(
    "channel_idle_ffn_int8(Tensor x, Tensor qw_in, Tensor s_in, Tensor? b_in, Tensor qw_out, Tensor s_out, "
    "Tensor? b_out=None, Tensor? residual=None, Tensor? smooth_in=None, Tensor? smooth_out=None, "
    "float act_scale_in=0.0, float act_scale_out=0.0) -> Tensor",
    check=check_channel_idle_ffn_int8_args, fake=_channel_idle_ffn_int8_fake, cuda=_channel_idle_ffn_int8_cuda,
    entry=_entry,
    doc="`torch.ops.vitfast.channel_idle_ffn_int8` (the channel-idle FFN on int8 GEMMs), or the reference when "
        "VITFAST_BACKEND=reference.",
)
