"""The C++ CPU kernel behind `torch.ops.vitfast.dwconv_heads` against `vitfast.reference.dwconv_heads`.

The drop-in DW-conv heads on their values: a k×k depthwise convolution over the token grid (zero padding), each
prefix token the grid's mean.  Grids and kernel sizes that cut the 48-token bands, prefix tokens 0-2, widths off
the 16-channel slices, batch 1-3, every CPU code path, 1 and 2 threads (bit-equal); the identity with
`dwconv_attention` around its two GEMMs; fp16/bf16, argument errors worded as the reference's, a non-finite or
updated kernel, opcheck and the reference backend.
"""
import pytest
import torch
import torch.nn.functional as F
from helpers import (assert_backend_reaches_reference, assert_low_precision_no_worse, assert_refused_alike,
                     assert_thread_parity)

import vitfast
from vitfast import reference

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

op = torch.ops.vitfast.dwconv_heads


def make_args(batch, prefix, grid_h, grid_w, width, ksize, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(batch, prefix + grid_h * grid_w, width, generator=g)
    kernel = torch.randn(width, ksize, ksize, generator=g) / ksize
    return [v.to(dtype), kernel.to(dtype), grid_h, grid_w]


# (prefix, grid_h, grid_w, width, k): DeiT-S's 14 × 14 grid with a cls token at its widths, grids cutting the bands
# (48 tokens: 2 rows of 24, 4 of 12, ...), one-row / one-column grids, odd widths, k = 1, 3, 5, 7
CASES = [(1, 14, 14, 384, 3), (0, 14, 14, 64, 3), (2, 7, 9, 17, 5), (1, 1, 11, 24, 3), (0, 11, 1, 24, 3),
         (1, 24, 24, 40, 7), (0, 3, 5, 33, 1), (1, 2, 2, 8, 5)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "P{}-{}x{}-D{}-k{}".format(*c))
@pytest.mark.parametrize("batch", [1, 3])
def test_parity(case, batch, isa, tol, restore_threads):
    assert_thread_parity(op, reference.dwconv_heads, make_args(batch, *case), tol)


@pytest.mark.parametrize("prefix", [0, 1])
def test_around_its_gemms_it_is_dwconv_attention(prefix, isa, tol, restore_threads):
    """linear(dwconv_heads(linear(x, w_v, b_v)), w_o, b_o, residual) = dwconv_attention(x, ...): the same convolution
    kernels on the same values (the fused op averages x for the prefix tokens before projecting: equal in exact
    arithmetic)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, prefix + 36, 32, generator=g)
    w_v, b_v = torch.randn(24, 32, generator=g) / 6, torch.randn(24, generator=g)
    kernel = torch.randn(24, 3, 3, generator=g) / 3
    w_o, b_o = torch.randn(32, 24, generator=g) / 5, torch.randn(32, generator=g)
    residual = torch.randn(2, prefix + 36, 32, generator=g)
    fused = vitfast.ops.dwconv_attention(x, w_v, b_v, kernel, w_o, b_o, 6, 6, residual)
    split = F.linear(op(F.linear(x, w_v, b_v), kernel, 6, 6), w_o, b_o) + residual
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(split, fused, atol=atol, rtol=rtol)


def test_empty_batch():
    assert op(*make_args(0, 1, 2, 2, 8, 3)).shape == (0, 5, 8)


def test_non_contiguous_values(tol, restore_threads):
    v, kernel, gh, gw = make_args(2, 1, 4, 4, 16, 3)
    wide = torch.cat([v, v], dim=-1)[..., 16:]
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(op(wide, kernel, gh, gw), reference.dwconv_heads(v, kernel, gh, gw), atol=atol,
                               rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision(dtype, isa, tol):
    assert_low_precision_no_worse(op, reference.dwconv_heads, make_args(2, 1, 14, 14, 64, 3, dtype=dtype), dtype, tol)


def test_kernel_update_repacks(tol):
    """The transposed kernel is cached per version: an in-place update must be seen by the next call."""
    args = make_args(1, 1, 5, 5, 16, 3)
    atol, rtol = tol[torch.float32]
    for _ in range(2):
        torch.testing.assert_close(op(*args), reference.dwconv_heads(*args), atol=atol, rtol=rtol)
        with torch.no_grad():
            args[1].mul_(-1.5)


def test_non_finite_kernel_is_refused():
    args = make_args(1, 0, 3, 3, 8, 3)
    args[1][0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="^kernel: expected finite values"):
        op(*args)


def _bad(i, value):
    def make():
        args = make_args(1, 1, 2, 2, 8, 3)
        args[i] = value(args)
        return args
    return make


BAD = [
    ("v 2-D", _bad(0, lambda a: a[0][0]), "v"),
    ("v int", _bad(0, lambda a: a[0].int()), "v"),
    ("grid too large", _bad(2, lambda a: 3), "v"),
    ("grid_w 0", _bad(3, lambda a: 0), "grid_w"),
    ("kernel width", _bad(1, lambda a: a[1][:4]), "kernel"),
    ("kernel even", _bad(1, lambda a: torch.randn(8, 2, 2)), "kernel"),
    ("kernel not square", _bad(1, lambda a: torch.randn(8, 3, 5)), "kernel"),
    ("kernel dtype", _bad(1, lambda a: a[1].double()), "kernel"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c[0])
def test_bad_arguments_name_the_argument(case):
    """The C++ check and the reference refuse the same inputs with the same words."""
    _, make, argname = case
    assert_refused_alike("dwconv_heads", make, argname)


def test_opcheck():
    torch.library.opcheck(op.default, tuple(make_args(2, 1, 3, 4, 8, 3)))


def test_backend_switch_reaches_the_reference(monkeypatch):
    assert_backend_reaches_reference(monkeypatch, "dwconv_heads", make_args(1, 1, 2, 2, 8, 3))