"""`vitfast.reference.channel_idle_ffn_int8` and its argument check: the fused RePaViT FFN (eq. 6) on int8 weights
and int8 activations, the GELU, the linear path, the biases and the residual in fp32:

    h   = deq(quant(x · smooth_in) · q_inᵀ) + b_in                           [..., A + L]
    out = deq(quant(GELU(h[..., :A]) · smooth_out) · q_outᵀ) + (h[..., A:] + b_out) + residual

(deq/quant as in vitfast/reference/_int8.py).  The order of the fp32 additions is the kernel's: the linear path's
bias is b_in[A:] + b_out added once, the residual after it, and the second GEMM's result last (it accumulates onto
the linear path already in the output).  Without a linear path (L = 0) the second GEMM adds b_out, then the residual.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._check import check_float_x, check_like_x, check_shape, fmt_shape
from ._int8 import int8_matmul, quantize_rows
from .linear_int8 import check_act_scale, check_int8_weight, check_smooth


def check_channel_idle_ffn_int8_args(x, qw_in, s_in, b_in, qw_out, s_out, b_out, residual, smooth_in, smooth_out,
                                     act_scale_in, act_scale_out) -> tuple[int, int, int]:
    """Validate `channel_idle_ffn_int8` arguments; return (active A, linear L, C_out).

    Shapes as `channel_idle_ffn` (qw_in [A + L, C_in] int8 with the A GELU rows first, qw_out [C_out, A] int8), with
    fp32 per-row scales s_in [A + L], s_out [C_out]; smooth_in [C_in] and smooth_out [A] fp32 or None; act scales >= 0.
    """
    check_float_x(x, "C_in")
    c_in = x.shape[-1]
    rows = check_int8_weight("qw_in", "s_in", qw_in, s_in, c_in, "C_in = x.shape[-1]", x)
    if not isinstance(qw_out, torch.Tensor) or qw_out.dim() != 2:
        check_int8_weight("qw_out", "s_out", qw_out, s_out, -1, "A", x)  # raises the type/shape message
    active = qw_out.shape[1]
    c_out = check_int8_weight("qw_out", "s_out", qw_out, s_out, active, "A", x)
    if active > rows:
        raise ValueError(f"qw_out: expected at most qw_in.shape[0] = {rows} active columns, got shape {fmt_shape(qw_out)}")
    linear = rows - active
    if linear not in (0, c_out):
        raise ValueError(f"qw_in: expected {active} (no linear path) or {active + c_out} (A + C_out) rows for qw_out of "
                         f"shape {fmt_shape(qw_out)}, got {rows}")
    check_like_x(x, (("b_in", b_in), ("b_out", b_out), ("residual", residual)))
    check_shape("b_in", b_in, (rows,))
    check_shape("b_out", b_out, (c_out,))
    check_shape("residual", residual, tuple(x.shape[:-1]) + (c_out,))
    check_smooth("smooth_in", smooth_in, c_in, x)
    check_smooth("smooth_out", smooth_out, active, x)
    check_act_scale("act_scale_in", act_scale_in)
    check_act_scale("act_scale_out", act_scale_out)
    return active, linear, c_out


def channel_idle_ffn_int8_unchecked(x, qw_in, s_in, b_in, qw_out, s_out, b_out=None, residual=None, smooth_in=None,
                                    smooth_out=None, act_scale_in=0.0, act_scale_out=0.0):
    active = qw_out.shape[1]
    c_out = qw_out.shape[0]
    q, s = quantize_rows(x, smooth_in, act_scale_in)
    b_in32 = b_in.float() if b_in is not None else None
    out = None
    if qw_in.shape[0] > active:  # the linear path (L = C_out): its bias b_in[A:] + b_out, added once
        out = int8_matmul(q, s, qw_in[active:], s_in[active:])
        bias = b_in32[active:] if b_in32 is not None else None
        if b_out is not None:
            bias = b_out.float() if bias is None else bias + b_out.float()
        if bias is not None:
            out = out + bias
        if residual is not None:
            out = out + residual.float()
    if active > 0:
        h = int8_matmul(q, s, qw_in[:active], s_in[:active])
        act = F.gelu(h + b_in32[:active] if b_in32 is not None else h)
        q2, s2 = quantize_rows(act, smooth_out, act_scale_out)
        if out is not None:  # accumulated onto the linear path in the output (one fused multiply-add)
            out = int8_matmul(q2, s2, qw_out, s_out, accumulate=out)
        else:
            z = int8_matmul(q2, s2, qw_out, s_out)
            if b_out is not None:
                z = z + b_out.float()
            if residual is not None:
                z = z + residual.float()
            out = z
    if out is None:  # A = L = 0: b_out + residual
        out = x.new_zeros(tuple(x.shape[:-1]) + (c_out,), dtype=torch.float32)
        if b_out is not None:
            out = out + b_out.float()
        if residual is not None:
            out = out + residual.float()
    return out.to(x.dtype)


def channel_idle_ffn_int8(
    x: torch.Tensor,
    qw_in: torch.Tensor,
    s_in: torch.Tensor,
    b_in: Optional[torch.Tensor],
    qw_out: torch.Tensor,
    s_out: torch.Tensor,
    b_out: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
    smooth_in: Optional[torch.Tensor] = None,
    smooth_out: Optional[torch.Tensor] = None,
    act_scale_in: float = 0.0,
    act_scale_out: float = 0.0,
) -> torch.Tensor:
    """The channel-idle FFN on int8 weights and activations (module doc)."""
    check_channel_idle_ffn_int8_args(x, qw_in, s_in, b_in, qw_out, s_out, b_out, residual, smooth_in, smooth_out,
                                     act_scale_in, act_scale_out)
    return channel_idle_ffn_int8_unchecked(x, qw_in, s_in, b_in, qw_out, s_out, b_out, residual, smooth_in,
                                           smooth_out, act_scale_in, act_scale_out)
