"""`torch.ops.vitfast.dwconv_attention`: drop-in depthwise-conv heads, value and output projections fused (see
`vitfast.reference.dwconv_attention`).

CPU: csrc/ops/dwconv_attention.cpp.  CUDA: the reference composition (cuBLAS GEMMs + cuDNN depthwise conv), which
beat the Triton kernel (kernels/dwconv_attention.py) everywhere measured (`use_triton_dwconv_attention`).
"""
from __future__ import annotations

from .. import reference
from .._env import get_cuda_kernels
from ..reference.dwconv_attention import check_dwconv_attention_args
from ._policy import forced
from ._spec import define_op


def use_triton_dwconv_attention(policy: str = "auto") -> bool:
    """The best measured CUDA path for dwconv_attention (table: vitfast/ops/_policy.py,
    docs/performance.md#cuda-policy): the Triton kernel lost to the composition everywhere measured, so "auto"
    takes the composition; VITFAST_CUDA_KERNELS=triton forces the kernel."""
    return forced(policy) is True


def _dwconv_attention_cuda(*args):
    if not use_triton_dwconv_attention(get_cuda_kernels()):
        return reference.dwconv_attention(*args)
    from ..kernels.dwconv_attention import dwconv_attention_triton

    return dwconv_attention_triton(*args)


def _dwconv_attention_fake(*args):
    _, _, _, c_out = check_dwconv_attention_args(*args)
    return args[0].new_empty((args[0].shape[0], args[0].shape[1], c_out))


dwconv_attention = define_op(
    "dwconv_attention(Tensor x, Tensor w_v, Tensor? b_v, Tensor kernel, Tensor w_o, Tensor? b_o, int grid_h, "
    "int grid_w, Tensor? residual=None) -> Tensor",
    check=check_dwconv_attention_args, fake=_dwconv_attention_fake, cuda=_dwconv_attention_cuda,
    doc="`torch.ops.vitfast.dwconv_attention` (drop-in depthwise-conv heads, see\n"
        "    `vitfast.reference.dwconv_attention`), or the reference when VITFAST_BACKEND=reference.",
)
