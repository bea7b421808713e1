"""The int8 ops as an ONNX QDQ graph: what `vitfast.export` traces for an int8 model with static activation scales.

    x → QuantizeLinear(scale, 0) → DequantizeLinear → MatMul ← DequantizeLinear ← int8 weight (per channel, axis 0)

written with torch's fake-quantize ops, which the exporter turns into QuantizeLinear/DequantizeLinear pairs
(ONNX Runtime then runs its int8 kernels on them).  QuantizeLinear saturates at −128 where the kernels clamp at −127,
so each activation is clipped at −127 scales first (a Clip before the QuantizeLinear): without it every value below
−127.5 scales — an input beyond the calibrated range — took another code, which moved a static int8 non-deep model's
output by 1–2% against its kernels (its projection's input is a LayerNorm output with heavy tails).  What remains:
QuantizeLinear divides by the scale where the kernels multiply by its reciprocal (a quantum apart where the two round
differently).  Per-token (dynamic) scales have no ONNX operator: `vitfast.export` refuses such a model
(vitfast/export.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _dequantized_weight(qweight: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """The weight as Q/DQ of its own dequantized values: exactly qweight · scale again after the round trip."""
    w = qweight.float() * w_scale.unsqueeze(1)
    zero = torch.zeros(w_scale.shape[0], dtype=torch.int32)
    return torch.fake_quantize_per_channel_affine(w, w_scale.float(), zero, 0, -128, 127)


def _activation(x: torch.Tensor, smooth, act_scale: float) -> torch.Tensor:
    x = x.float() if smooth is None else x.float() * smooth
    x = x.clamp(min=-127.0 * float(act_scale))  # the kernels' symmetric range (module doc)
    return torch.fake_quantize_per_tensor_affine(x, float(act_scale), 0, -128, 127)


def linear_int8_qdq(x, qweight, w_scale, bias=None, residual=None, smooth=None, act_scale=0.0):
    y = F.linear(_activation(x, smooth, act_scale), _dequantized_weight(qweight, w_scale), bias)
    return y if residual is None else y + residual


def channel_idle_ffn_int8_qdq(x, qw_in, s_in, b_in, qw_out, s_out, b_out=None, residual=None, smooth_in=None,
                              smooth_out=None, act_scale_in=0.0, act_scale_out=0.0):
    active = qw_out.shape[1]
    h = F.linear(_activation(x, smooth_in, act_scale_in), _dequantized_weight(qw_in, s_in), b_in)
    out = h[..., active:] if h.shape[-1] > active else None
    if active > 0:
        z = F.linear(_activation(F.gelu(h[..., :active]), smooth_out, act_scale_out),
                     _dequantized_weight(qw_out, s_out))
        out = z if out is None else out + z
    if out is None:
        out = x.new_zeros(tuple(x.shape[:-1]) + (qw_out.shape[0],))
    if b_out is not None:
        out = out + b_out
    return out if residual is None else out + residual
