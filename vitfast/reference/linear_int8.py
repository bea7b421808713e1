"""`vitfast.reference.linear_int8` and its argument check `check_linear_int8_args`: the dense layer with int8 weights
and int8 activations (per token, or one static scale), dequantised in the epilogue:

    y = fp32(Σ_k q_x[r, k] · q_w[j, k]) · s_x[r] · s_w[j] + bias[j] + residual[r, j]   (each step rounded to fp32)

with (q_x, s_x) = quantize_rows(x · smooth) (vitfast/reference/_int8.py: the definitions the C++ core shares).
`smooth` [K] is a SmoothQuant migration's 1/s (arXiv 2211.10438): the weight was multiplied by s per input channel
before quantization, so x · diag(1/s) · (W · diag(s))ᵀ = x · Wᵀ while the activation's outlier channels shrink.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._check import as_real, check_float_x, check_like_x, check_shape, check_tensor, fmt_shape, is_finite_non_negative
from ._int8 import int8_matmul, quantize_rows


def check_act_scale(name: str, value) -> float:
    """A static activation scale: a finite number >= 0 (0 = dynamic, per token)."""
    if not is_finite_non_negative(value):
        raise ValueError(f"{name}: expected a finite number >= 0 (0: per-token scales), got {value!r}")
    return as_real(value)


def check_int8_weight(name: str, scale_name: str, w: torch.Tensor, scale: torch.Tensor, k: int, k_name: str,
                      x: torch.Tensor) -> int:
    """An int8 weight [N, k] with its fp32 per-row scales [N] on x's device; returns N."""
    check_tensor(name, w)
    check_tensor(scale_name, scale)
    if w.dtype != torch.int8:
        raise ValueError(f"{name}: expected dtype torch.int8, got {w.dtype}")
    if w.dim() != 2 or w.shape[1] != k:
        raise ValueError(f"{name}: expected shape [N, {k}] ({k_name} = {k}), got {fmt_shape(w)}")
    if scale.dtype != torch.float32:
        raise ValueError(f"{scale_name}: expected dtype torch.float32, got {scale.dtype}")
    check_shape(scale_name, scale, (w.shape[0],))
    for n, t in ((name, w), (scale_name, scale)):
        if t.device != x.device:
            raise ValueError(f"{n}: expected device {x.device} (same as x), got {t.device}")
    return w.shape[0]


def check_smooth(name: str, smooth: Optional[torch.Tensor], k: int, x: torch.Tensor) -> None:
    if smooth is None:
        return
    if not isinstance(smooth, torch.Tensor):
        raise ValueError(f"{name}: expected a Tensor or None, got {type(smooth).__name__}")
    if smooth.dtype != torch.float32:
        raise ValueError(f"{name}: expected dtype torch.float32, got {smooth.dtype}")
    check_shape(name, smooth, (k,))
    if smooth.device != x.device:
        raise ValueError(f"{name}: expected device {x.device} (same as x), got {smooth.device}")


def check_linear_int8_args(x: torch.Tensor, qweight: torch.Tensor, w_scale: torch.Tensor,
                           bias: Optional[torch.Tensor], residual: Optional[torch.Tensor],
                           smooth: Optional[torch.Tensor], act_scale: float) -> int:
    """Validate `linear_int8` arguments; return N (out_features).

    x [..., K] float;  qweight int8 [N, K] in [−127, 127];  w_scale fp32 [N];  bias [N] and residual [..., N] like x;
    smooth fp32 [K] or None;  act_scale >= 0 (0: per-token scales).
    """
    check_float_x(x, "K")
    k = x.shape[-1]
    n = check_int8_weight("qweight", "w_scale", qweight, w_scale, k, "K = x.shape[-1]", x)
    check_like_x(x, (("bias", bias), ("residual", residual)))
    check_shape("bias", bias, (n,))
    check_shape("residual", residual, tuple(x.shape[:-1]) + (n,))
    check_smooth("smooth", smooth, k, x)
    check_act_scale("act_scale", act_scale)
    return n


def linear_int8_unchecked(x, qweight, w_scale, bias=None, residual=None, smooth=None, act_scale=0.0):
    q, s = quantize_rows(x, smooth, act_scale)
    y = int8_matmul(q, s, qweight, w_scale)
    if bias is not None:
        y = y + bias.float()
    if residual is not None:
        y = y + residual.float()
    return y.to(x.dtype)


def linear_int8(
    x: torch.Tensor,
    qweight: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
    smooth: Optional[torch.Tensor] = None,
    act_scale: float = 0.0,
) -> torch.Tensor:
    """x · Wᵀ + bias + residual with W ≈ diag(w_scale) · qweight and x quantized per token (module doc)."""
    check_linear_int8_args(x, qweight, w_scale, bias, residual, smooth, act_scale)
    return linear_int8_unchecked(x, qweight, w_scale, bias, residual, smooth, act_scale)
