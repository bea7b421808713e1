"""`torch.ops.vitfast.xwx_attention`: collapsed non-deep attention (see `vitfast.reference.xwx_attention`).

CPU: csrc/ops/xwx_attention.cpp.  CUDA: the Triton kernel (kernels/xwx_attention.py) where it beats the eager
composition (`use_triton_xwx_attention`), else the reference.
"""
from __future__ import annotations

import torch

from .. import reference
from .._env import get_cuda_kernels
from ._check import check_float_dtype, check_tensor, describe
from ._policy import HALF_DTYPES, TRITON_XWX_MAX_WIDTH, forced
from ._spec import define_op


def check_xwx_attention_args(x, w_q, w_k, key_bias, w_v, w_o, b_o, residual) -> tuple[int, int, int, int]:
    """Validate `xwx_attention` arguments; return (H, R, D, C_out).

    x [B, N, C];  w_q [H, C, R] and w_k [H, C, R] (factored scores W_h = w_q[h] w_k[h]ᵀ), or w_q [H, C, C] with
    w_k None (full W_h);  key_bias [H, C];  w_v [H, C, D];  w_o [H, D, C_out];  b_o [C_out];  residual
    [B, N, C_out].  Every tensor has x's dtype and device.
    """
    for name, t in (("x", x), ("w_q", w_q), ("w_v", w_v), ("w_o", w_o)):
        check_tensor(name, t)
    if x.dim() != 3:
        raise ValueError(f"x: expected a [B, N, C] tensor, got {describe(x)}")
    check_float_dtype("x", x)
    channels = x.shape[-1]
    if w_q.dim() != 3 or w_q.shape[1] != channels:
        raise ValueError(
            f"w_q: expected [H, {channels}, R] (or [H, {channels}, {channels}] with w_k=None), got {describe(w_q)}"
        )
    heads, rank = w_q.shape[0], w_q.shape[2]
    if heads < 1 or rank < 1:
        raise ValueError(f"w_q: expected at least one head and rank >= 1, got {describe(w_q)}")
    if w_k is None:
        if rank != channels:
            raise ValueError(
                f"w_q: expected the full score matrices [H, {channels}, {channels}] when w_k is None, "
                f"got {describe(w_q)}"
            )
    elif not isinstance(w_k, torch.Tensor) or tuple(w_k.shape) != tuple(w_q.shape):
        raise ValueError(f"w_k: expected the same shape as w_q {describe(w_q)}, got {describe(w_k)}")
    if key_bias is not None and (not isinstance(key_bias, torch.Tensor) or tuple(key_bias.shape) != (heads, channels)):
        raise ValueError(f"key_bias: expected [{heads}, {channels}] or None, got {describe(key_bias)}")
    if w_v.dim() != 3 or tuple(w_v.shape[:2]) != (heads, channels):
        raise ValueError(f"w_v: expected [{heads}, {channels}, D], got {describe(w_v)}")
    value_dim = w_v.shape[2]
    if w_o.dim() != 3 or tuple(w_o.shape[:2]) != (heads, value_dim):
        raise ValueError(f"w_o: expected [{heads}, {value_dim}, C_out], got {describe(w_o)}")
    out_channels = w_o.shape[2]
    if b_o is not None and (not isinstance(b_o, torch.Tensor) or tuple(b_o.shape) != (out_channels,)):
        raise ValueError(f"b_o: expected [{out_channels}] or None, got {describe(b_o)}")
    if residual is not None and (
        not isinstance(residual, torch.Tensor) or tuple(residual.shape) != (*x.shape[:2], out_channels)
    ):
        expected = "[" + ", ".join(str(s) for s in (*x.shape[:2], out_channels)) + "]"
        raise ValueError(f"residual: expected {expected} or None, got {describe(residual)}")
    for name, t in (("w_q", w_q), ("w_k", w_k), ("key_bias", key_bias), ("w_v", w_v), ("w_o", w_o), ("b_o", b_o),
                    ("residual", residual)):
        if t is not None and (t.dtype != x.dtype or t.device != x.device):
            raise ValueError(f"{name}: expected dtype {x.dtype} on {x.device} (like x), got {t.dtype} on {t.device}")
    return heads, rank, value_dim, out_channels


def use_triton_xwx_attention(dtype: torch.dtype, width: int, policy: str = "auto") -> bool:
    """The best measured CUDA path for xwx_attention (table: vitfast/ops/_policy.py,
    docs/performance.md#cuda-policy): the Triton kernel in fp16/bf16 up to TRITON_XWX_MAX_WIDTH channels, the eager
    composition otherwise (fp32's ieee tl.dot runs on CUDA cores; wider models show no consistent win).
    `policy` "triton"/"torch" (VITFAST_CUDA_KERNELS) forces one path."""
    if (choice := forced(policy)) is not None:
        return choice
    return dtype in HALF_DTYPES and width <= TRITON_XWX_MAX_WIDTH


def _xwx_attention_cuda(x, w_q, w_k, key_bias, w_v, w_o, b_o=None, residual=None):
    args = (x, w_q, w_k, key_bias, w_v, w_o, b_o, residual)
    check_xwx_attention_args(*args)  # before reading x.shape[-1]
    if not use_triton_xwx_attention(x.dtype, x.shape[-1], get_cuda_kernels()):
        return reference.xwx_attention(*args)
    from ..kernels.xwx_attention import xwx_attention_triton

    return xwx_attention_triton(*args)


def _xwx_attention_fake(*args):
    _, _, _, c_out = check_xwx_attention_args(*args)
    return args[0].new_empty((args[0].shape[0], args[0].shape[1], c_out))


xwx_attention = define_op(
    "xwx_attention(Tensor x, Tensor w_q, Tensor? w_k, Tensor? key_bias, Tensor w_v, Tensor w_o, "
    "Tensor? b_o=None, Tensor? residual=None) -> Tensor",
    fake=_xwx_attention_fake, cuda=_xwx_attention_cuda,
    doc="`torch.ops.vitfast.xwx_attention` (collapsed non-deep attention, see `vitfast.reference.xwx_attention`),\n"
        "    or the reference when VITFAST_BACKEND=reference.",
)
