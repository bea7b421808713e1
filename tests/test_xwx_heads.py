"""The C++ CPU kernel behind `torch.ops.vitfast.xwx_heads` against `vitfast.reference.xwx_heads`.

The heads of collapsed non-deep attention from one projection of the tokens (per head [A_h | B'_h | V_h]):
softmax(A_h B_hᵀ) · V_h side by side, B_h = B'_h (factored) or [x | B'_h] (full).  The projections are made from
real `xwx_attention` arguments (the columns `ProjectedXWXAttention` packs), so the scores are what a non-deep block
computes.  Both forms with and without a key bias, DeiT widths at N = 197 and odd N that break the 256-key tile,
batch 1 and 2, every CPU code path, 1 and 2 threads (bit-equal); the identity with `xwx_attention`; fp16/bf16,
argument errors worded as the reference's, opcheck and the reference backend — these last contracts for the product
variants `xwx_heads_int8` / `xwx_heads_bf16` too.
"""
import pytest
import torch
from helpers import (assert_backend_reaches_reference, assert_low_precision_no_worse, assert_refused_alike,
                     assert_thread_parity, make_xwx_args)

import vitfast
from vitfast import reference
from vitfast.nn.xwx import FusedXWXAttention, ProjectedXWXAttention

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

op = torch.ops.vitfast.xwx_heads


def _projected(args):
    """(ProjectedXWXAttention of the xwx_attention arguments, the fused attention holding them)."""
    x, w_q, w_k, kb, w_v, w_o, b_o, _ = args
    heads, channels, rank = w_q.shape
    fused = FusedXWXAttention(channels, heads, "full" if w_k is None else "factored", rank, w_v.shape[2],
                              key_bias=kb is not None, out_bias=b_o is not None)
    with torch.no_grad():
        for name, value in zip(("w_q", "w_k", "key_bias", "w_v", "w_o", "b_o"), (w_q, w_k, kb, w_v, w_o, b_o)):
            if value is not None:
                getattr(fused, name).copy_(value)
    return ProjectedXWXAttention.from_fused(fused), fused


def heads_args(batch, tokens, channels, heads, rank=None, value_dim=None, **kw):
    """(proj, x or None, num_heads, value_dim) as a non-deep block's projected attention passes them."""
    args = make_xwx_args(batch, tokens, channels, heads, rank, value_dim, **kw)
    projected, _ = _projected(args)
    x = args[0]
    with torch.no_grad():
        proj = torch.nn.functional.linear(x, projected.proj_in.weight, projected.proj_in.bias)
    return [proj, x if rank is None else None, heads, args[4].shape[2]]


def check_parity(args, tol, threads=(1, 2)):
    assert_thread_parity(op, reference.xwx_heads, args, tol, threads)


# (C, heads, rank or None = full form, value width D): DeiT-Ti / DeiT-S, 2 branches (as test_xwx_attention.py)
VIT_SHAPES = [(192, 3, 128, 128), (192, 3, None, 64), (384, 6, 128, 128), (384, 6, None, 64)]


@pytest.mark.parametrize("shape", VIT_SHAPES, ids=lambda s: f"C{s[0]}-H{s[1]}-{'full' if s[2] is None else s[2]}-D{s[3]}")
@pytest.mark.parametrize("batch", [1, 2])
def test_parity_deit_shapes(shape, batch, isa, tol, restore_threads):
    c, h, r, d = shape
    check_parity(heads_args(batch, 197, c, h, r, d), tol)


@pytest.mark.parametrize("tokens", [1, 2, 7, 65, 255, 256, 257])
@pytest.mark.parametrize("rank", [None, 3, 16], ids=lambda r: f"R{r}")
@pytest.mark.parametrize("key_bias", [True, False], ids=["kb", "no_kb"])
def test_parity_odd_sizes(tokens, rank, key_bias, isa, tol, restore_threads):
    check_parity(heads_args(2, tokens, 24, 2, rank, 20, key_bias=key_bias), tol)


@pytest.mark.parametrize("rank", [None, 8], ids=lambda r: f"R{r}")
@pytest.mark.parametrize("key_bias", [True, False], ids=["kb", "no_kb"])
def test_projected_attention_is_xwx_attention(rank, key_bias, isa, tol, restore_threads):
    """proj_in → xwx_heads → proj_out (+ residual) computes xwx_attention: the same columns through the same GEMM
    core and the same phases, so the same values up to rounding (measured: the same bits on this build)."""
    args = make_xwx_args(2, 37, 32, 2, rank, 16, key_bias=key_bias)
    projected, fused = _projected(args)
    x, residual = args[0], args[7]
    atol, rtol = tol[torch.float32]
    with torch.no_grad():
        torch.testing.assert_close(projected(x, residual), vitfast.ops.xwx_attention(*args), atol=atol, rtol=rtol)
        torch.testing.assert_close(projected(x, residual), reference.xwx_attention(*args), atol=atol, rtol=rtol)
        torch.testing.assert_close(projected(x), fused(x), atol=atol, rtol=rtol)


def test_large_scores_are_stable(isa, restore_threads):
    """Scores in the hundreds over three key tiles (the online softmax rescales): no worse than 2× PyTorch's own
    fp32 error against float64."""
    args = heads_args(1, 600, 32, 2, 16, 16, score_std=200.0)
    proj = args[0].double()  # the reference takes fp32/fp16/bf16 only: its formula in float64 here
    p = proj.reshape(1, 600, 2, -1).transpose(1, 2)
    a, b, v = p[..., :17], p[..., 17:34], p[..., 34:]
    truth = ((a @ b.transpose(-1, -2)).softmax(-1) @ v).transpose(1, 2).reshape(1, 600, 32)
    torch_err = (reference.xwx_heads(*args).double() - truth).abs().max().item()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        out = op(*args)
        assert torch.isfinite(out).all()
        assert (out.double() - truth).abs().max().item() <= 2 * torch_err + 1e-5


# The op and its product variants (test_xwx_heads_int8.py, test_xwx_heads_bf16.py) share these contracts.
VARIANTS = ["xwx_heads", "xwx_heads_int8", "xwx_heads_bf16"]


@pytest.mark.parametrize("name", VARIANTS)
def test_non_contiguous_inputs(name, restore_threads):
    """Strided proj and x are read as they are: the bits of their contiguous copies."""
    variant = getattr(torch.ops.vitfast, name)
    proj, x, h, d = heads_args(2, 21, 32, 2, None, 16)
    nc_proj = torch.cat([proj, proj], dim=-1)[..., proj.shape[-1]:]
    nc_x = x.transpose(0, 1).contiguous().transpose(0, 1)
    torch.testing.assert_close(variant(nc_proj, nc_x, h, d), variant(proj, x, h, d), atol=0, rtol=0)


@pytest.mark.parametrize("name", VARIANTS)
def test_empty_batch_and_tokens(name):
    for batch, tokens in ((0, 5), (2, 0)):
        proj, x, h, d = heads_args(batch, tokens, 16, 2, 8, 8)
        assert getattr(torch.ops.vitfast, name)(proj, x, h, d).shape == (batch, tokens, 16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rank", [None, 128], ids=lambda r: f"R{r}")
def test_low_precision(dtype, rank, isa, tol):
    """fp16/bf16 in, same dtype out (computed in fp32 inside): no worse than 2× PyTorch's own error."""
    proj, x, h, d = heads_args(2, 197, 192, 3, rank, 64)
    args = [proj.to(dtype), None if x is None else x.to(dtype), h, d]
    assert_low_precision_no_worse(op, reference.xwx_heads, args, dtype, tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", VARIANTS[1:])
def test_variants_low_precision_is_their_fp32_conversion(name, dtype):
    """The product variants take fp16/bf16 as `attention_int8` / `attention_bf16` do: computed from the fp32 values,
    the output rounded once to the input's dtype."""
    variant = getattr(torch.ops.vitfast, name)
    proj, x, h, d = heads_args(2, 21, 32, 2, None, 16)
    args = [proj.to(dtype), x.to(dtype), h, d]
    out = variant(*args)
    assert out.dtype == dtype
    torch.testing.assert_close(out, variant(args[0].float(), args[1].float(), h, d).to(dtype), atol=0, rtol=0)


def _bad(i, value, rank=8):
    def make():
        args = heads_args(1, 5, 16, 2, rank, 8)
        args[i] = value(args)
        return args
    return make


BAD = [
    ("proj 2-D", _bad(0, lambda a: a[0][0]), "proj"),
    ("proj int", _bad(0, lambda a: a[0].int()), "proj"),
    ("num_heads 0", _bad(2, lambda a: 0), "num_heads"),
    ("num_heads not dividing", _bad(2, lambda a: 3), "proj"),
    ("value_dim 0", _bad(3, lambda a: 0), "value_dim"),
    ("value_dim too wide", _bad(3, lambda a: 17), "proj"),
    ("factored odd rest", _bad(3, lambda a: 9), "proj"),
    ("full x tokens", _bad(1, lambda a: a[1][:, :3], rank=None), "x"),
    ("full x dtype", _bad(1, lambda a: a[1].double(), rank=None), "x"),
    ("full x width", _bad(1, lambda a: a[1][..., :12], rank=None), "proj"),
]


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("case", BAD, ids=lambda c: c[0])
def test_bad_arguments_name_the_argument(case, name):
    """The C++ check and the reference refuse the same inputs with the same words (the variants: those of
    `xwx_heads`)."""
    _, make, argname = case
    assert_refused_alike(name, make, argname)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("rank", [None, 8], ids=lambda r: f"R{r}")
def test_opcheck(rank, name):
    torch.library.opcheck(getattr(torch.ops.vitfast, name).default, tuple(heads_args(2, 7, 16, 2, rank, 8)))


@pytest.mark.parametrize("name", VARIANTS)
def test_backend_switch_reaches_the_reference(monkeypatch, name):
    assert_backend_reaches_reference(monkeypatch, name, heads_args(1, 5, 16, 2, 8, 8))
