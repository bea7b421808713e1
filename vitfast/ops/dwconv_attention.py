"""`torch.ops.vitfast.dwconv_attention`: drop-in depthwise-conv heads, value and output projections fused (see
`vitfast.reference.dwconv_attention`).

CPU: csrc/ops/dwconv_attention.cpp.  CUDA: the reference composition (cuBLAS GEMMs + cuDNN depthwise conv), which
beat the Triton kernel (kernels/dwconv_attention.py) everywhere measured (`use_triton_dwconv_attention`).
"""
from __future__ import annotations

from .. import reference
from .._env import get_cuda_kernels
from ._check import as_integer, check_like_x, check_shape, check_tensor, check_tokens, fmt_shape
from ._policy import forced
from ._spec import define_op


def check_dwconv_attention_args(x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual) -> tuple[int, int, int, int]:
    """Validate `dwconv_attention` arguments; return (prefix tokens P, value width D, kernel size k, C_out).

    Layout (nn.Linear convention for the projections):
      x [B, N, C] with N = P + grid_h·grid_w (P ≥ 0 prefix tokens first, then the grid row-major);
      w_v [D, C];  b_v [D];  kernel [D, k, k] (k odd: a symmetric "same" window);  w_o [C_out, D];
      b_o [C_out];  residual [B, N, C_out].
    """
    for name, t in (("x", x), ("w_v", w_v), ("kernel", kernel), ("w_o", w_o)):
        check_tensor(name, t)
    check_tokens(x)
    grid = []
    for name, v in (("grid_h", grid_h), ("grid_w", grid_w)):
        value = as_integer(v)
        if value is None or value < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        grid.append(value)
    grid_h, grid_w = grid
    tokens, channels = x.shape[1], x.shape[2]
    prefix = tokens - grid_h * grid_w
    if prefix < 0:
        raise ValueError(
            f"x: expected N >= grid_h·grid_w = {grid_h}·{grid_w} = {grid_h * grid_w} tokens (prefix tokens, then "
            f"the grid), got shape {fmt_shape(x)}"
        )
    if w_v.dim() != 2 or w_v.shape[1] != channels:
        raise ValueError(f"w_v: expected 2-D [D, {channels}] (C = x.shape[-1]), got shape {fmt_shape(w_v)}")
    width = w_v.shape[0]
    if kernel.dim() != 3 or kernel.shape[0] != width or kernel.shape[1] != kernel.shape[2] or kernel.shape[1] % 2 == 0:
        raise ValueError(
            f"kernel: expected [{width}, k, k] with k odd (one k×k filter per value channel), got shape "
            f"{fmt_shape(kernel)}"
        )
    if w_o.dim() != 2 or w_o.shape[1] != width:
        raise ValueError(f"w_o: expected 2-D [C_out, {width}] (D = w_v.shape[0]), got shape {fmt_shape(w_o)}")
    c_out = w_o.shape[0]
    check_like_x(x, (("w_v", w_v), ("b_v", b_v), ("kernel", kernel), ("w_o", w_o), ("b_o", b_o),
                     ("residual", residual)))
    check_shape("b_v", b_v, (width,))
    check_shape("b_o", b_o, (c_out,))
    check_shape("residual", residual, (x.shape[0], tokens, c_out))
    return prefix, width, kernel.shape[1], c_out


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
    fake=_dwconv_attention_fake, cuda=_dwconv_attention_cuda,
    doc="`torch.ops.vitfast.dwconv_attention` (drop-in depthwise-conv heads, see\n"
        "    `vitfast.reference.dwconv_attention`), or the reference when VITFAST_BACKEND=reference.",
)
