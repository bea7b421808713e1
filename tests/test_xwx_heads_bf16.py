"""`torch.ops.vitfast.xwx_heads_bf16` (csrc/ops/xwx_heads.cpp: `attention_bf16`'s head on strided operands,
csrc/kernels/attention.h with `HeadOperands`) against `vitfast.reference.xwx_heads_bf16`.

The heads of collapsed non-deep attention (as `xwx_heads`) with the score and value products on bf16 operands and
fp32 sums.  Projections made from real `xwx_attention` arguments (test_xwx_heads.heads_args), both forms with and
without a key bias, DeiT widths at N = 197 and odd sizes, every CPU path with its bf16 extension on and off (off: the
portable bf16 kernel, the same products), 1 and 2 threads (bit-equal); the tolerance of tests/test_attention_bf16.py
(the kernel's only other roundings are its fp32 sums: relative error under 1e-4 and every element within one bf16
flip, 2^-8 · max |V|); NaN.  Strided and empty inputs, fp16/bf16, argument errors, opcheck and the reference backend:
test_xwx_heads.py (the contracts the variants share).
"""
import pytest
import torch
from helpers import assert_bf16_heads_close, at_1_and_2_threads, bf16_flip_allowance
from test_xwx_heads import VIT_SHAPES, heads_args
from test_xwx_heads_int8 import _values

import vitfast
from vitfast import reference
from vitfast.reference.xwx_heads import head_operands, merge_heads

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

from vitfast import _C  # noqa: E402

op = torch.ops.vitfast.xwx_heads_bf16


def assert_close_to_reference(out, args):
    proj, x, heads, d = args
    a, b, v = head_operands(proj.float(), None if x is None else x.float(), heads, d)
    assert_bf16_heads_close(out, reference.xwx_heads_bf16(*args), _values(proj, heads, d),
                            merge_heads(bf16_flip_allowance(a, b, v, 1.0)))


@pytest.mark.parametrize("shape", VIT_SHAPES, ids=lambda s: f"C{s[0]}-H{s[1]}-{'full' if s[2] is None else s[2]}-D{s[3]}")
@pytest.mark.parametrize("batch", [1, 2])
def test_parity_deit_shapes(shape, batch, isa, restore_threads):
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
def test_without_bf16_hardware_the_same_products(isa, rank):
    """With the extensions off the portable bf16 kernel runs: the same definition (not fp32 heads)."""
    args = heads_args(2, 65, 192, 3, rank, 64)
    _C.set_cpu_ext_enabled(False)
    try:
        off = op(*args)
    finally:
        _C.set_cpu_ext_enabled(True)
    assert_close_to_reference(off, args)


def test_close_to_fp32_heads():
    """The point of the op: bf16 rounding of the operands, ~10× closer to the fp32 heads than the int8 ones
    (measured on these operands: 0.4% against 4-5%)."""
    for rank in (128, None):
        args = heads_args(2, 197, 384, 6, rank, 128 if rank else 64)
        ref = reference.xwx_heads(*args)
        err = float((op(*args) - ref).norm() / ref.norm())
        assert err < 0.01
        assert err < float((torch.ops.vitfast.xwx_heads_int8(*args) - ref).norm() / ref.norm()) / 4


def test_nan_positions(isa):
    """A NaN in a query's A row or in a value: NaN where the reference has it (as `attention_bf16`'s test)."""
    proj, x, heads, d = heads_args(2, 9, 16, 2, 4, 8, key_bias=False)
    per_head = proj.shape[-1] // heads  # [A (4) | B (4) | V (8)]
    proj[0, 4, per_head + 1] = float("nan")          # image 0, query 4 of head 1
    proj[1, 7, 8 + 3] = float("nan")                 # image 1, V[7, 3] of head 0
    out = op(proj, x, heads, d)
    assert out[0, 4, d:].isnan().all() and out[1, :, 3].isnan().all()
    assert_close_to_reference(out, [proj, x, heads, d])
