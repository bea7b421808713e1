"""The C++ CPU kernel behind `torch.ops.vitfast.xwx_attention` against `vitfast.reference.xwx_attention`.

Collapsed non-deep attention: per head softmax(x W_h xᵀ + key bias) · (x w_v[h]) · w_o[h], summed over heads,
+ b_o + residual.  Both score forms (factored w_q/w_k [H, C, R], full W_h [H, C, C]), DeiT-Ti/S widths at
N = 197 and odd N that break the 256-key tile and the 6 × 16 register block, batch 1 and 2, every CPU code path
forced in turn, at 1 and 2 threads (the thread split must not change a bit); optional arguments, fp16/bf16,
large scores, weight updates (cache), argument errors, opcheck and torch.compile.
"""
import pytest
import torch
from helpers import (assert_backend_reaches_reference, assert_low_precision_no_worse, assert_thread_parity,
                     make_xwx_args)

import vitfast
from vitfast import reference

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

op = torch.ops.vitfast.xwx_attention


def check_parity(args, tol, threads=(1, 2)):
    assert_thread_parity(op, reference.xwx_attention, args, tol, threads)

# (C, heads, rank or None = full form, value width D): DeiT-Ti / DeiT-S, 2 branches, values side by side (D = 2·64)
# or joined (D = 64), factored (R = 2·64, the branch factors) and full.
VIT_SHAPES = [(192, 3, 128, 128), (192, 3, None, 64), (384, 6, 128, 128), (384, 6, None, 64)]


@pytest.mark.parametrize("shape", VIT_SHAPES, ids=lambda s: f"C{s[0]}-H{s[1]}-{'full' if s[2] is None else s[2]}-D{s[3]}")
@pytest.mark.parametrize("batch", [1, 2])
def test_parity_deit_shapes(shape, batch, isa, tol, restore_threads):
    c, h, r, d = shape
    check_parity(make_xwx_args(batch, 197, c, h, r, d), tol)


@pytest.mark.parametrize("tokens", [1, 2, 7, 65, 127, 128, 129, 255, 256, 257])
@pytest.mark.parametrize("rank", [None, 3, 16], ids=lambda r: f"R{r}")
def test_parity_odd_sizes(tokens, rank, isa, tol, restore_threads):
    check_parity(make_xwx_args(2, tokens, 24, 2, rank, 20), tol)


@pytest.mark.parametrize("key_bias", [True, False], ids=["kb", "no_kb"])
@pytest.mark.parametrize("b_o", [True, False], ids=["bo", "no_bo"])
@pytest.mark.parametrize("residual", [True, False], ids=["res", "no_res"])
@pytest.mark.parametrize("rank", [None, 8], ids=lambda r: f"R{r}")
def test_optional_arguments(key_bias, b_o, residual, rank, tol, restore_threads):
    check_parity(make_xwx_args(2, 19, 32, 2, rank, 16, key_bias=key_bias, b_o=b_o, residual=residual), tol)


def test_output_width_differs_from_input(tol, restore_threads):
    x, w_q, w_k, kb, w_v, _, _, _ = make_xwx_args(2, 9, 32, 2, 16, 16)
    check_parity((x, w_q, w_k, kb, w_v, torch.randn(2, 16, 40) / 4, torch.randn(40), torch.randn(2, 9, 40)), tol)


def _float64_truth(x, w_q, w_k, key_bias, w_v, w_o, b_o, residual):
    """The op's formula in float64 (the reference itself, like every op, takes fp32/fp16/bf16 only)."""
    x, w_q, w_v, w_o = x.double(), w_q.double(), w_v.double(), w_o.double()
    left = torch.einsum("bnc,hcr->bhnr", x, w_q)
    right = torch.einsum("bnc,hcr->bhnr", x, w_k.double()) if w_k is not None else x.unsqueeze(1)
    scores = left @ right.transpose(-1, -2) + torch.einsum("bnc,hc->bhn", x, key_bias.double()).unsqueeze(-2)
    heads = scores.softmax(-1) @ torch.einsum("bnc,hcd->bhnd", x, w_v)
    return torch.einsum("bhnd,hdc->bnc", heads, w_o) + b_o.double() + residual.double()


def test_large_scores_are_stable(isa, restore_threads):
    """Scores in the hundreds, over several key tiles: the online softmax must rescale by the running max.
    At this conditioning fp32 rounding of the scores moves the result in any implementation, so the check is
    against float64 truth: no worse than 2× PyTorch's own fp32 error."""
    args = make_xwx_args(1, 600, 32, 2, 16, 16, score_std=200.0)  # 3 key tiles of 256
    truth = _float64_truth(*args)
    torch_err = (reference.xwx_attention(*args).double() - truth).abs().max().item()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        out = op(*args)
        assert torch.isfinite(out).all()
        kernel_err = (out.double() - truth).abs().max().item()
        assert kernel_err <= 2 * torch_err + 1e-5, f"kernel error {kernel_err:.3g} > 2 × torch's {torch_err:.3g}"


@pytest.mark.parametrize("tokens,overflowed", [(40, 32), (300, 256)])
def test_key_tiles_of_overflowed_scores_stay_finite(tokens, overflowed, isa, tol, restore_threads):
    """Leading keys whose scores are -inf (a key-bias term overflowed): a first key tile of them made the flash
    softmax exp(-inf - -inf) = NaN, here as in the Triton kernel, where the reference gives them weight 0."""
    x, w_q, w_k, kb, w_v, w_o, b_o, res = make_xwx_args(1, tokens, 32, 2, 16, 16)
    x = x.clone()
    x[0, :overflowed, 0] = 300.0
    kb = torch.zeros_like(kb)
    kb[0, 0] = -1e37
    args = (x, w_q, w_k, kb, w_v, w_o, b_o, res)
    expected = reference.xwx_attention(*args)
    assert torch.isfinite(expected).all()
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(vitfast.ops.xwx_attention(*args), expected, atol=atol, rtol=rtol)


def test_non_contiguous_inputs(tol, restore_threads):
    args = make_xwx_args(2, 21, 32, 2, 16, 16)
    x, w_q, w_k, kb, w_v, w_o, b_o, res = args
    nc = [x.transpose(0, 1).contiguous().transpose(0, 1), w_q.transpose(1, 2).contiguous().transpose(1, 2), w_k,
          kb.t().contiguous().t(), w_v, w_o.transpose(1, 2).contiguous().transpose(1, 2), b_o,
          torch.cat([res, res], dim=-1)[..., 32:]]
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(op(*nc), reference.xwx_attention(*args), atol=atol, rtol=rtol)


def test_weight_update_repacks(tol):
    """The packed weights are cached per weight version: an in-place update must be seen by the next call."""
    args = make_xwx_args(1, 11, 16, 2, 8, 8)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(op(*args), reference.xwx_attention(*args), atol=atol, rtol=rtol)
    for i in (1, 2, 3, 4, 5, 6):
        with torch.no_grad():
            args[i].mul_(1.5)
        torch.testing.assert_close(op(*args), reference.xwx_attention(*args), atol=atol, rtol=rtol)


def test_empty_batch_and_tokens():
    assert op(*make_xwx_args(0, 5, 16, 2, 8, 8)).shape == (0, 5, 16)
    assert op(*make_xwx_args(2, 0, 16, 2, 8, 8)).shape == (2, 0, 16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rank", [None, 128], ids=lambda r: f"R{r}")
def test_low_precision(dtype, rank, isa, tol):
    """fp16/bf16 in, same dtype out (computed in fp32 inside): no worse than 2× PyTorch's own error."""
    args = make_xwx_args(2, 197, 192, 3, rank, 64, dtype=dtype)
    assert_low_precision_no_worse(op, reference.xwx_attention, args, dtype, tol)


def _bad(i, value):
    def make():
        args = make_xwx_args(1, 5, 16, 2, 8, 8)
        args[i] = value(args)
        return args
    return make


BAD = [
    ("x 2-D", _bad(0, lambda a: a[0][0]), "x"),
    ("x int", _bad(0, lambda a: a[0].int()), "x"),
    ("w_q width", _bad(1, lambda a: a[1][:, :8]), "w_q"),
    ("w_q not full without w_k", _bad(2, lambda a: None), "w_q"),
    ("w_k shape", _bad(2, lambda a: a[2][:, :, :4]), "w_k"),
    ("key_bias shape", _bad(3, lambda a: a[3][:1]), "key_bias"),
    ("w_v heads", _bad(4, lambda a: a[4][:1]), "w_v"),
    ("w_o shape", _bad(5, lambda a: a[5][:, :3]), "w_o"),
    ("b_o shape", _bad(6, lambda a: a[6][:3]), "b_o"),
    ("residual shape", _bad(7, lambda a: a[7][:, :2]), "residual"),
    ("w_v dtype", _bad(4, lambda a: a[4].double()), "w_v"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c[0])
def test_bad_arguments_name_the_argument(case):
    _, make, argname = case
    with pytest.raises(ValueError, match=rf"^{argname}: expected"):
        op(*make())
    with pytest.raises(ValueError, match=rf"^{argname}: expected"):
        reference.xwx_attention(*make())


def test_non_finite_weight_is_refused():
    args = make_xwx_args(1, 5, 16, 2, 8, 8)
    args[4] = args[4].clone()
    args[4][0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="^w_v: expected finite values"):
        op(*args)


@pytest.mark.parametrize("rank", [None, 8], ids=lambda r: f"R{r}")
def test_opcheck(rank):
    torch.library.opcheck(op.default, tuple(make_xwx_args(2, 7, 16, 2, rank, 8)))


def test_backend_switch_reaches_the_reference(monkeypatch):
    assert_backend_reaches_reference(monkeypatch, "xwx_attention", make_xwx_args(1, 5, 16, 2, 8, 8))


@pytest.mark.slow
def test_torch_compile_fullgraph(tol):
    torch._dynamo.reset()
    args = make_xwx_args(2, 13, 16, 2, 8, 8)

    def block(x):
        return op(x * 0.5, *args[1:]).relu()

    compiled = torch.compile(block, fullgraph=True, backend="inductor")
    atol, rtol = tol[torch.float32]
    for x in (torch.randn(2, 13, 16), torch.randn(2, 13, 16)):
        torch.testing.assert_close(compiled(x), block(x), atol=atol, rtol=rtol)


@pytest.mark.parametrize("rank", [None, 128], ids=lambda r: f"R{r}")
def test_bf16_gemms_keep_the_bits_across_threads(rank, tol, restore_threads):
    """bf16 on a CPU with a bf16 extension: the projection and output GEMMs on the bf16 kernels (rows split between
    threads without changing any row's arithmetic: the same bits at 1 and 2 threads), within bf16 tolerance of the
    reference."""
    if vitfast.ops.bf16_kernel() == "none":
        pytest.skip("no bf16 CPU extension: bf16 computes in fp32 (test_low_precision)")
    args = [a.bfloat16() if a is not None else None for a in make_xwx_args(3, 197, 192, 3, rank, 64)]
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        outs.append(op(*args))
    assert outs[0].dtype == torch.bfloat16 and torch.equal(outs[0], outs[1])
    truth = reference.xwx_attention(*[a.float() if a is not None else None for a in args])
    atol, rtol = tol[torch.bfloat16]
    torch.testing.assert_close(outs[0].float(), truth, atol=atol, rtol=rtol)
