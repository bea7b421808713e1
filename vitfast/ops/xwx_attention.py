"""`torch.ops.vitfast.xwx_attention`: collapsed non-deep attention (see `vitfast.reference.xwx_attention`).

CPU: csrc/ops/xwx_attention.cpp.  CUDA: the Triton kernel (kernels/xwx_attention.py) where it beats the eager
composition (`use_triton_xwx_attention`), else the reference.
"""
from __future__ import annotations

import torch

from .. import reference
from .._env import get_cuda_kernels
from ..reference.xwx_attention import check_xwx_attention_args
from ._policy import HALF_DTYPES, TRITON_XWX_MAX_WIDTH, forced
from ._spec import define_op


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
    check=check_xwx_attention_args, fake=_xwx_attention_fake, cuda=_xwx_attention_cuda,
    doc="`torch.ops.vitfast.xwx_attention` (collapsed non-deep attention, see `vitfast.reference.xwx_attention`),\n"
        "    or the reference when VITFAST_BACKEND=reference.",
)
