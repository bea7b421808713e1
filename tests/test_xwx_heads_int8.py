"""`torch.ops.vitfast.xwx_heads_int8` (csrc/ops/xwx_heads.cpp: `attention_int8`'s head on strided operands,
csrc/kernels/attention_int8.h `Int8HeadOperands`) against `vitfast.reference.xwx_heads_int8`.

The heads of collapsed non-deep attention (as `xwx_heads`) with int8 score and value products: per-token A and B
rows (dk = R (+1) wide, unlike multi-head attention's dk = D), per-row softmax codes, per-channel V.  Projections made
from real `xwx_attention` arguments (test_xwx_heads.heads_args), both forms with and without a key bias, DeiT widths
at N = 197 and odd sizes, every CPU path with its int8 extension on and off, 1 and 2 threads (bit-equal); the
tolerance of tests/helpers.assert_int8_heads_close (a P code may flip where the kernel's scores and the reference's
differ in the last bit); NaN.  Strided and empty inputs, fp16/bf16, argument errors, opcheck and the reference
backend: test_xwx_heads.py (the contracts the variants share).
"""
import pytest
import torch
from helpers import assert_int8_heads_close, at_1_and_2_threads
from test_xwx_heads import VIT_SHAPES, heads_args

import vitfast
from vitfast import reference

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

from vitfast import _C  # noqa: E402

op = torch.ops.vitfast.xwx_heads_int8
TOL = dict(atol=1e-6, rtol=1e-6)


def _values(proj, heads, d):
    """The V columns of proj [B, N, H·P] in the output's column order [B, N, H·D]."""
    b, n, w = proj.shape
    return proj.float().reshape(b, n, heads, w // heads)[..., -d:].reshape(b, n, heads * d)


def assert_close_to_reference(out, args):
    proj, x, heads, d = args
    assert_int8_heads_close(out, reference.xwx_heads_int8(*args), _values(proj, heads, d), TOL)


@pytest.mark.parametrize("shape", VIT_SHAPES, ids=lambda s: f"C{s[0]}-H{s[1]}-{'full' if s[2] is None else s[2]}-D{s[3]}")
@pytest.mark.parametrize("batch", [1, 2])
def test_parity_deit_shapes(shape, batch, isa, ext, restore_threads):
    c, h, r, d = shape
    args = heads_args(batch, 197, c, h, r, d)
    assert_close_to_reference(at_1_and_2_threads(op, args), args)


@pytest.mark.parametrize("tokens", [1, 2, 7, 65, 257])
@pytest.mark.parametrize("rank", [None, 3, 16], ids=lambda r: f"R{r}")
@pytest.mark.parametrize("key_bias", [True, False], ids=["kb", "no_kb"])
def test_parity_odd_sizes(tokens, rank, key_bias, isa, restore_threads):
    args = heads_args(2, tokens, 24, 2, rank, 20, key_bias=key_bias)
    assert_close_to_reference(at_1_and_2_threads(op, args), args)


@pytest.mark.parametrize("rank", [None, 128], ids=lambda r: f"R{r}")
def test_extension_off_gives_the_same_bits(isa, rank):
    """Within one CPU path the int8 kernels (VNNI or the AVX2 sign trick, NEON dot or scalar) compute the same exact
    sums and the same epilogue: identical bits."""
    args = heads_args(2, 197, 192, 3, rank, 64)
    on = op(*args)
    _C.set_cpu_ext_enabled(False)
    try:
        off = op(*args)
    finally:
        _C.set_cpu_ext_enabled(True)
    torch.testing.assert_close(off, on, atol=0, rtol=0)


def test_close_to_fp32_heads():
    """The point of the op: int8 error, not a bug's.  Measured on these random-weight operands (DeiT-S, 2 branches,
    scores of std ~2-11): 4-5% relative error against `xwx_heads` (fp32 products); a trained model's is lower
    (docs/quantization.md, non-deep table)."""
    for rank in (128, None):
        args = heads_args(2, 197, 384, 6, rank, 128 if rank else 64)
        ref = reference.xwx_heads(*args)
        assert float((op(*args) - ref).norm() / ref.norm()) < 0.08


def test_nan_positions(isa):
    """A NaN in a query's A row: that row of the head; in a key's B row: the whole head; in V[t, d]: column d of the
    head (as `attention_int8`)."""
    proj, x, heads, d = heads_args(2, 9, 16, 2, 4, 8, key_bias=False)
    per_head = proj.shape[-1] // heads  # [A (4) | B (4) | V (8)]
    proj[0, 4, per_head + 1] = float("nan")          # image 0, query 4 of head 1
    proj[1, 2, 4 + 2] = float("inf")                 # image 1, key 2 of head 0
    proj[0, 7, per_head + 8 + 3] = float("nan")      # image 0, V[7, 3] of head 1
    out = op(proj, x, heads, d)
    expected = torch.zeros(2, 9, heads * d, dtype=torch.bool)
    expected[0, 4, d:] = True
    expected[1, :, :d] = True
    expected[0, :, d + 3] = True
    assert torch.equal(out.isnan(), expected)
    assert_close_to_reference(out, [proj, x, heads, d])
