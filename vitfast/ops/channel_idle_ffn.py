"""`torch.ops.vitfast.channel_idle_ffn`: the fused RePaViT FFN (see `vitfast.reference.channel_idle_ffn`).

CPU: csrc/ops/channel_idle_ffn.cpp.  CUDA: the Triton kernel (kernels/channel_idle_ffn.py) where it beats the cuBLAS
composition (`use_triton_channel_idle_ffn`), else that composition (`channel_idle_ffn_composed`).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .._env import get_cuda_kernels
from ..reference.channel_idle_ffn import check_channel_idle_ffn_args
from ._policy import HALF_DTYPES, TRITON_FFN_MIN_ROWS, TRITON_FFN_MIN_WIDTH, forced
from ._spec import define_op


def use_triton_channel_idle_ffn(dtype: torch.dtype, rows: int, policy: str = "auto", *,
                                width: Optional[int] = None) -> bool:
    """The best measured CUDA path for channel_idle_ffn (table: vitfast/ops/_policy.py,
    docs/performance.md#cuda-policy): the Triton kernel in fp16/bf16 from TRITON_FFN_MIN_ROWS rows and, when
    `width` is given, from TRITON_FFN_MIN_WIDTH channels; the cuBLAS composition otherwise (fp32's ieee tl.dot runs
    on CUDA cores; small batches are launch-bound).  `policy` "triton"/"torch" (VITFAST_CUDA_KERNELS) forces one."""
    if (choice := forced(policy)) is not None:
        return choice
    return dtype in HALF_DTYPES and rows >= TRITON_FFN_MIN_ROWS and (width is None or width >= TRITON_FFN_MIN_WIDTH)


def channel_idle_ffn_composed(x, w_in, b_in, w_out, b_out=None, residual=None):
    """RePaViT eq. 6 as cuBLAS GEMMs and torch element-wise kernels, in fewer launches than the reference's own
    composition: the terms added to the second product are summed first (the linear path and the shortcut, into a
    fresh tensor) and the product accumulates into them in place (`addmm_`, β = 1: cuBLAS reads them in its
    epilogue); with only one of them the bias rides in the product's epilogue.  With a linear path, b_out and a
    shortcut (RePa-DeiT's blocks) that is five kernels instead of six, one pass over the [rows, C] output fewer, and
    in fp16/bf16 one rounding fewer.  Checked arguments."""
    active = w_out.shape[1]
    h = F.linear(x, w_in, b_in)
    g = F.gelu(h[..., :active])
    linear = h[..., active:] if w_in.shape[0] > active else None
    if linear is None or residual is None:
        z = F.linear(g, w_out, b_out)
        other = linear if linear is not None else residual
        return z if other is None else z.add_(other)
    # `out=`: a contiguous buffer whatever the slice's strides, so the 2-D view below is the same storage.
    z = torch.add(linear, residual, out=torch.empty(residual.shape, dtype=residual.dtype, device=residual.device))
    if active:  # θ = 1: no activated channel, nothing to multiply (a 0-column reshape cannot infer its rows)
        z.view(-1, z.shape[-1]).addmm_(g.reshape(-1, active), w_out.t())
    return z if b_out is None else z.add_(b_out)


def channel_idle_ffn_cuda_unchecked(x, w_in, b_in, w_out, b_out=None, residual=None):
    """The CUDA channel_idle_ffn for checked arguments: the Triton kernel or the cuBLAS composition, by the policy."""
    rows = x.numel() // max(x.shape[-1], 1)
    if not use_triton_channel_idle_ffn(x.dtype, rows, get_cuda_kernels(), width=x.shape[-1]):
        return channel_idle_ffn_composed(x, w_in, b_in, w_out, b_out, residual)
    from ..kernels.channel_idle_ffn import channel_idle_ffn_triton

    return channel_idle_ffn_triton(x, w_in, b_in, w_out, b_out, residual)


def _channel_idle_ffn_cuda(*args):
    check_channel_idle_ffn_args(*args)
    return channel_idle_ffn_cuda_unchecked(*args)


def _channel_idle_ffn_fake(x, w_in, b_in, w_out, b_out, residual):
    _, _, c_out = check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, residual)
    return x.new_empty(tuple(x.shape[:-1]) + (c_out,))


channel_idle_ffn = define_op(
    "channel_idle_ffn(Tensor x, Tensor w_in, Tensor? b_in, Tensor w_out, Tensor? b_out=None, Tensor? residual=None)"
    " -> Tensor",
    check=check_channel_idle_ffn_args, fake=_channel_idle_ffn_fake, cuda=_channel_idle_ffn_cuda,
    doc="`torch.ops.vitfast.channel_idle_ffn`, or the reference when VITFAST_BACKEND=reference.",
)
