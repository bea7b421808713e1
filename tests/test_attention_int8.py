"""`torch.ops.vitfast.attention_int8` (csrc/ops/attention_int8.cpp, csrc/kernels/attention_int8.{h,cpp}) against its
reference (vitfast/reference/attention_int8.py): every CPU path this machine runs, with its low-precision extension
on and off (AVX-512 with VNNI runs the `vpdpbusd` kernel, without it the AVX2 sign-trick kernel), at 1 and 2 threads
(the (image, head, query block) split must not change a bit); N = 1, 5, 197, odd N and D, 1 to 12 heads; strided
qkv; fp16/bf16; NaN; argument errors (those of `attention`); opcheck.

Tolerance.  The int8 sums are exact and the epilogues round as the reference does, so the scores S are the
reference's to the last unit or two, and the reference makes E with the kernels' exp (exp_for_bf16): a last-bit
difference of S still moves E, which can move a P code across a rounding boundary (rne(127 · E) at a half).  One
such flip changes the output by at most 2 · max_t |V[t, d]| / Σ_j q_E ≤ 2 · max_t |V[t, d]| / 127 (numerator by
one code times a quantized V value, denominator by one), and flips are rare: every element must be within the fp32
tolerance, or within two flips' bound, and at most 1% of them outside the fp32 tolerance.
"""
import pytest
import torch

import vitfast
from helpers import assert_attention_variant_contract, assert_int8_heads_close, at_1_and_2_threads
from vitfast import reference

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

from vitfast import _C  # noqa: E402

op = torch.ops.vitfast.attention_int8
TOL = dict(atol=1e-6, rtol=1e-6)


def assert_attention_int8_close(out, qkv, heads, scale=None):
    b, n, w = qkv.shape
    values = qkv.float()[..., 2 * (w // 3):]  # [B, N, H·D]: V's channels in the output's column order
    assert_int8_heads_close(out, reference.attention_int8(qkv, heads, scale), values, TOL)


SHAPES = [(1, 197, 6, 64), (2, 197, 12, 64), (1, 197, 3, 16), (2, 5, 12, 32), (3, 1, 1, 16), (1, 1, 7, 64),
          (2, 5, 1, 16), (1, 50, 2, 32), (2, 17, 5, 20), (1, 33, 4, 3)]


@pytest.mark.parametrize("batch, tokens, heads, d", SHAPES)
def test_parity(isa, ext, restore_threads, batch, tokens, heads, d):
    g = torch.Generator().manual_seed(tokens * 131 + heads * 7 + d)
    qkv = torch.randn(batch, tokens, 3 * heads * d, generator=g)
    out = at_1_and_2_threads(op, [qkv, heads, None])
    assert_attention_int8_close(out, qkv, heads)


@pytest.mark.parametrize("scale", [0.05, 1.0])
def test_parity_scale_and_large_logits(isa, ext, scale):
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(2, 197, 3 * 6 * 64, generator=g) * 3
    assert_attention_int8_close(op(qkv, 6, scale), qkv, 6, scale)


@pytest.mark.parametrize("batch, tokens, heads, d", [(2, 197, 6, 64), (1, 17, 5, 20), (1, 33, 4, 3)])
def test_extension_off_gives_the_same_bits(isa, batch, tokens, heads, d):
    """Within one CPU path the int8 kernels (VNNI or the AVX2 sign trick, NEON dot or scalar) compute the same exact
    integer sums and the same epilogue, and everything else (quantizers, softmax) is the path's: identical bits."""
    qkv = torch.randn(batch, tokens, 3 * heads * d, generator=torch.Generator().manual_seed(5))
    on = op(qkv, heads)
    _C.set_cpu_ext_enabled(False)
    try:
        off = op(qkv, heads)
    finally:
        _C.set_cpu_ext_enabled(True)
    torch.testing.assert_close(off, on, atol=0, rtol=0)


def test_strided_qkv_is_read_in_place(isa):
    wide = torch.randn(2, 37, 3 * 4 * 16 + 40)
    qkv = wide[..., 8:8 + 3 * 4 * 16]
    assert not qkv.is_contiguous()
    out = op(qkv, 4)
    torch.testing.assert_close(out, op(qkv.contiguous(), 4), atol=0, rtol=0)
    assert_attention_int8_close(out, qkv, 4)


def test_close_to_fp32_attention():
    """The point of the op: ~1-2% relative error on random activations (the int8 error, not a bug's)."""
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(2, 197, 3 * 6 * 64, generator=g)
    ref = reference.attention(qkv, 6)
    assert float((op(qkv, 6) - ref).norm() / ref.norm()) < 0.03


def test_nan_positions_are_fp32_attentions(isa, ext):
    """A NaN in a query row: that row of the head is NaN; in a key row: the whole head; in V[t, d]: column d of the
    head.  As fp32 `attention`, and independent of how the exp polynomial treats NaN."""
    heads, d, n = 3, 16, 9
    qkv = torch.randn(2, n, 3 * heads * d)
    qkv[0, 4, 1 * d + 2] = float("nan")                    # image 0, query 4 of head 1
    qkv[1, 2, heads * d + 2 * d + 5] = float("inf")        # image 1, key 2 of head 2
    qkv[0, 7, 2 * heads * d + 0 * d + 3] = float("nan")    # image 0, V[7, 3] of head 0
    out = op(qkv, heads)
    expected = torch.zeros(2, n, heads * d, dtype=torch.bool)
    expected[0, 4, d:2 * d] = True
    expected[1, :, 2 * d:] = True
    expected[0, :, 3] = True
    assert torch.equal(out.isnan(), expected)
    # the fp32 op's positions (torch's SDPA, behind reference.attention, returns a finite row for a NaN query)
    assert torch.equal(torch.ops.vitfast.attention(qkv.masked_fill(qkv.isinf(), float("nan")), heads).isnan(), expected)
    assert_attention_int8_close(out, qkv, heads)


def test_zero_rows_and_columns(isa, ext):
    """All-zero queries, keys or V channels quantize to scale 0: finite outputs, as the reference."""
    qkv = torch.randn(1, 7, 3 * 2 * 16)
    qkv[0, 3, :16] = 0          # query 3 of head 0
    qkv[0, :, 32:48] = 0        # every key of head 0: uniform softmax
    qkv[0, :, 64 + 16 + 5] = 0  # V channel 5 of head 1
    out = op(qkv, 2)
    assert out.isfinite().all()
    assert_attention_int8_close(out, qkv, 2)


def test_empty_low_precision_bad_arguments_and_opcheck_as_attention():
    assert_attention_variant_contract(vitfast.ops.attention_int8, op)
