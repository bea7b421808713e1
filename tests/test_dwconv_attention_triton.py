"""Parity of the Triton `dwconv_attention` kernel with `vitfast.reference.dwconv_attention`.

Runs natively on CUDA tensors when a GPU is present, otherwise through the Triton interpreter on CPU tensors
(conftest.py sets TRITON_INTERPRET=1 before triton is imported): interpreter shapes stay small.  Covers square
and non-square grids whose size breaks the 32-token tile and its halo, a cls token / several prefix tokens,
k = 3 and 5, batch 1 and 2, every optional input absent or present, the ensembled form (D = d_h, one head), and
fp16/bf16 against 2× torch's own low-precision error.
"""

import pytest
import torch
from helpers import assert_low_precision_no_worse, triton_test_device

from vitfast.kernels.dwconv_attention import dwconv_attention_triton
from vitfast.reference import dwconv_attention as reference

pytestmark = pytest.mark.triton

DEVICE, INTERPRET = triton_test_device()


@pytest.fixture(autouse=True)
def _fp32_exact_reference():
    """cuDNN may run the reference's fp32 convolution in TF32 (torch.backends.cudnn.allow_tf32 defaults to True);
    the oracle must be fp32-exact, as the kernel is (input_precision="ieee" unless TF32 matmuls are enabled)."""
    previous = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = previous


def _low_precision_dtypes():
    if DEVICE == "cpu":
        return [torch.float16, torch.bfloat16]
    return [torch.float16] + ([torch.bfloat16] if torch.cuda.is_bf16_supported() else [])


def make_args(batch, prefix, gh, gw, c, d, c_out, k=3, *, dtype=torch.float32, b_v=True, b_o=True, residual=True):
    """Op arguments at nn.Linear-like scales; kernels ~ N(0, 1/k²) (the Gaussian init of the paper's appendix)."""
    n = prefix + gh * gw

    def uni(*shape, fan_in):
        return (torch.rand(*shape, device=DEVICE) * 2 - 1) / max(fan_in, 1) ** 0.5

    args = [
        torch.randn(batch, n, c, device=DEVICE),
        uni(d, c, fan_in=c),
        uni(d, fan_in=c) if b_v else None,
        torch.randn(d, k, k, device=DEVICE) / k,
        uni(c_out, d, fan_in=d),
        uni(c_out, fan_in=d) if b_o else None,
        gh,
        gw,
        torch.randn(batch, n, c_out, device=DEVICE) if residual else None,
    ]
    return [a.to(dtype) if isinstance(a, torch.Tensor) else a for a in args]


# (batch, prefix, grid_h, grid_w): square/non-square grids (odd sizes, 1×1, one row, one column), with and without
# cls / register tokens.
GRIDS = [(1, 0, 4, 4), (2, 1, 5, 7), (1, 1, 7, 5), (2, 0, 1, 9), (1, 0, 9, 1), (2, 3, 3, 3), (1, 1, 1, 1),
         (1, 1, 6, 8)]


PATHS = ["fused", "split"]  # one program per token tile does everything / U written, then the output GEMM


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("batch,prefix,gh,gw", GRIDS)
def test_fp32_parity_grids(batch, prefix, gh, gw, path, tol):
    args = make_args(batch, prefix, gh, gw, 24, 20, 28)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(dwconv_attention_triton(*args, path=path), reference(*args), atol=atol, rtol=rtol)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("c,d,c_out", [(48, 48, 48), (40, 16, 33), (17, 40, 9)])
def test_fp32_parity_widths_and_kernel_sizes(c, d, c_out, k, path, tol):
    args = make_args(2, 1, 5, 6, c, d, c_out, k)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(dwconv_attention_triton(*args, path=path), reference(*args), atol=atol, rtol=rtol)


@pytest.mark.parametrize("optional", [(False, False, False), (True, False, True), (False, True, False)],
                         ids=["none", "b_v+res", "b_o"])
def test_fp32_parity_optionals(optional, tol):
    b_v, b_o, residual = optional
    args = make_args(2, 1, 4, 6, 24, 16, 24, b_v=b_v, b_o=b_o, residual=residual)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(dwconv_attention_triton(*args), reference(*args), atol=atol, rtol=rtol)


@pytest.mark.parametrize("path", PATHS)
def test_fp32_parity_multi_tile_grid(path, tol):
    # 12×11 = 132 grid tokens: five 32-token tiles with halos that cross tiles and rows, plus a partial last tile;
    # 48 channels: a full and a partial channel chunk.
    args = make_args(1, 1, 12, 11, 32, 48, 32)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(dwconv_attention_triton(*args, path=path), reference(*args), atol=atol, rtol=rtol)


@pytest.mark.parametrize("path", PATHS)
def test_non_contiguous_inputs(path, tol):
    args = make_args(2, 1, 4, 5, 24, 16, 20)
    x = torch.randn(2, 24, 21, device=DEVICE).transpose(1, 2)  # [2, 21, 24], strided
    w_o = torch.randn(16, 20, device=DEVICE).t() / 4  # [20, 16], transposed view
    args[0], args[4] = x, w_o
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(dwconv_attention_triton(*args, path=path), reference(*args), atol=atol, rtol=rtol)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", _low_precision_dtypes())
@pytest.mark.parametrize("batch,prefix,gh,gw", [(1, 0, 6, 6), (2, 1, 5, 7)])
def test_low_precision_no_worse_than_torch(dtype, batch, prefix, gh, gw, path, tol):
    args = make_args(batch, prefix, gh, gw, 32, 32, 32, dtype=dtype)

    def kernel(*a):
        return dwconv_attention_triton(*a, path=path)

    assert_low_precision_no_worse(kernel, reference, args, dtype, tol)


def test_automatic_path_choice_matches_the_reference(tol):
    # path=None: "fused" under the interpreter, by program count on a GPU (batch 1 → split, large batch → fused).
    atol, rtol = tol[torch.float32]
    for batch in (1, 3):
        args = make_args(batch, 1, 8, 9, 32, 32, 32)
        torch.testing.assert_close(dwconv_attention_triton(*args), reference(*args), atol=atol, rtol=rtol)


@pytest.mark.parametrize("path", PATHS)
def test_numpy_integer_grid_as_the_reference_takes_it(path, tol):
    import numpy as np

    args = make_args(1, 1, 3, 4, 8, 8, 8)
    expected = reference(*args)
    args[6], args[7] = np.int64(3), np.int32(4)  # "cannot convert 3 of type numpy.int64 to tensor" before
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(dwconv_attention_triton(*args, path=path), expected, atol=atol, rtol=rtol)


def test_bad_arguments_rejected():
    with pytest.raises(ValueError, match="path: expected None, 'fused' or 'split'"):
        dwconv_attention_triton(*make_args(1, 0, 3, 3, 8, 8, 8), path="other")
    args = make_args(1, 0, 3, 3, 8, 8, 8)
    with pytest.raises(ValueError, match="kernel: expected"):
        dwconv_attention_triton(args[0], args[1], args[2], args[3][:, :2, :2], *args[4:])
    with pytest.raises(ValueError, match="x: expected N >= grid_h"):
        dwconv_attention_triton(*args[:6], 4, 4, args[8])


def test_cuda_path_policy():
    from vitfast.ops import use_triton_dwconv_attention

    # Measured slower than the cuBLAS/cuDNN composition everywhere (docstring): Triton only when forced.
    assert not use_triton_dwconv_attention()
    assert not use_triton_dwconv_attention("torch")
    assert use_triton_dwconv_attention("triton")
