"""The C++ CPU kernel behind `torch.ops.vitfast.attention` against `vitfast.reference.attention`.

qkv [B, N, 3·H·D] (timm's qkv Linear output) → [B, N, H·D] (what proj reads).  DeiT-Ti/S/B heads at N = 197
and odd N / D that break the 6 × 16 register block and the 8-lane softmax; every CPU code path forced in turn,
at 1 and 2 threads (the (image, head, query block) split must not change a bit).  Also strided qkv (a slice
of a wider tensor, read in place), fp16/bf16, large logits (softmax stability), argument errors, opcheck
and torch.compile.
"""
import pytest
import torch

import vitfast
from vitfast import reference
from helpers import assert_low_precision_no_worse, assert_thread_parity

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

from vitfast import _C  # noqa: E402

op = torch.ops.vitfast.attention
ISAS = _C.supported_cpu_isas()


def check_parity(qkv, heads, tol, scale=None, threads=(1, 2)):
    assert_thread_parity(op, reference.attention, (qkv, heads, scale), tol, threads, contiguous=True)

@pytest.mark.parametrize("heads", [3, 6, 12], ids=lambda h: f"H{h}")
@pytest.mark.parametrize("batch", [1, 2])
def test_parity_deit_heads(heads, batch, isa, tol, restore_threads):
    check_parity(torch.randn(batch, 197, 3 * heads * 64), heads, tol)


def test_parity_long_sequence_query_blocks(isa, tol, restore_threads):
    """N = 577 (ViT at 384 px): the score tile is capped to stay in L2, so each head runs in query blocks."""
    check_parity(torch.randn(1, 577, 3 * 2 * 64), 2, tol)


@pytest.mark.parametrize("tokens", [1, 2, 5, 7, 16, 17, 50, 196])
@pytest.mark.parametrize("heads,head_dim", [(1, 1), (2, 3), (3, 8), (1, 17), (2, 32), (4, 33)])
def test_parity_odd_sizes(tokens, heads, head_dim, isa, tol, restore_threads):
    check_parity(torch.randn(2, tokens, 3 * heads * head_dim), heads, tol)


@pytest.mark.parametrize("case", ["huge_key", "huge_scale", "large_qkv"])
def test_huge_scores_stay_finite(case, isa, restore_threads):
    """Scores near 1e29: the exp pass took fma(s, scale, −m), the exact product, while the max was of the rounded
    products; half an ulp there is ~1e22, so the max's own exp was 0 or inf and the row NaN (the reference: finite).
    At head dim 8 the scale 1/√8 is not a power of two, so the products round."""
    torch.manual_seed(0)
    qkv, scale = torch.randn(3, 20, 3 * 4 * 8), None
    if case == "huge_key":
        qkv[0, 0, 32] = 1e30  # one key element of head 0
    elif case == "huge_scale":
        scale = 1e10
    else:
        qkv = qkv * 3e4  # |q·k| ~ 1e10 > 2³¹
    out, ref = op(qkv, 4, scale), reference.attention(qkv, 4, scale)
    assert torch.isfinite(ref).all() and torch.isfinite(out).all()
    # at these magnitudes a probability is 0 or 1 up to rounding: the output rows are rows of V
    torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("scale", [0.05, 1.0, -0.3])
def test_explicit_scale(scale, isa, tol, restore_threads):
    check_parity(torch.randn(2, 33, 3 * 2 * 16), 2, tol, scale=scale)


def test_large_logits_are_stable(isa, restore_threads):
    """Scores in the hundreds: exp must be taken after subtracting the row maximum (no inf/NaN).

    At this conditioning fp32 rounding of the scores (|q·k| ~ 10³) moves the probabilities by ~1e-4 in any
    implementation, so the check is against float64 truth: no worse than 2× PyTorch's own fp32 SDPA error.
    """
    qkv = torch.randn(1, 50, 3 * 2 * 16) * 8
    q, k, v = qkv.double().reshape(1, 50, 3, 2, 16).permute(2, 0, 3, 1, 4).unbind(0)
    truth = torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v
    truth = truth.transpose(1, 2).reshape(1, 50, 32)
    torch_err = (reference.attention(qkv, 2).double() - truth).abs().max().item()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        out = op(qkv, 2)
        assert torch.isfinite(out).all()
        kernel_err = (out.double() - truth).abs().max().item()
        assert kernel_err <= 2 * torch_err, f"kernel error {kernel_err:.3g} > 2 × SDPA's {torch_err:.3g}"


def test_parity_vit_large_row_stride(isa, tol, restore_threads):
    """ViT-L width: qkv rows 12 KiB apart (a multiple of 2 KiB), where the kernel copies each chunk's Q rows."""
    check_parity(torch.randn(1, 50, 3 * 16 * 64), 16, tol)


def test_strided_and_non_contiguous_qkv(isa, tol, restore_threads):
    wide = torch.randn(2, 40, 3 * 2 * 24 + 10)
    check_parity(wide[:, :, 5 : 5 + 3 * 2 * 24], 2, tol)  # rows strided: read in place
    check_parity(torch.randn(40, 2, 3 * 2 * 24).transpose(0, 1), 2, tol)  # batch/token swapped: copied
    check_parity(torch.randn(2, 40, 3 * 2 * 24 * 2)[:, :, ::2], 2, tol)  # inner stride 2: copied


def test_empty_batch_and_tokens(isa):
    assert op(torch.randn(0, 5, 18), 2).shape == (0, 5, 6)
    assert op(torch.randn(2, 0, 18), 2).shape == (2, 0, 6)


@pytest.mark.parametrize("where", ["q", "k", "v", "k inf"])
def test_non_finite_inputs_propagate_like_the_formula(where, isa, tol):
    """A NaN (or ±inf) in q, k or v poisons exactly the outputs it poisons in softmax(q·kᵀ·scale)·v written out
    in float64.  The SIMD softmax once clamped a NaN score to exp(-87) ≈ 0: a NaN key was silently dropped and
    a NaN query gave a finite row.  (The truth is the explicit formula, not SDPA: CPU SDPA returns zeros for a
    NaN query row.)"""
    heads, d = 2, 8
    qkv = torch.randn(2, 11, 3 * heads * d)
    part = {"q": 0, "k": 1, "v": 2, "k inf": 1}[where]
    qkv[1, 4, part * heads * d + 3] = float("inf") if where == "k inf" else float("nan")  # head 0, token 4
    q, k, v = qkv.double().view(2, 11, 3, heads, d).permute(2, 0, 3, 1, 4)
    want = ((q @ k.transpose(-1, -2) * d**-0.5).softmax(-1) @ v).transpose(1, 2).reshape(2, 11, heads * d).float()
    out = op(qkv, heads)
    assert torch.equal(torch.isnan(out), torch.isnan(want)), f"NaN pattern differs ({torch.isnan(want).sum()} NaNs)"
    assert torch.isnan(want).any()
    atol, rtol = tol[torch.float32]
    finite = ~torch.isnan(want)
    torch.testing.assert_close(out[finite], want[finite], atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision(dtype, isa, tol):
    """fp16/bf16 in, same dtype out (computed in fp32 inside): no worse than 2× PyTorch's own error."""
    qkv = torch.randn(2, 197, 3 * 3 * 64).to(dtype)
    assert_low_precision_no_worse(op, reference.attention, (qkv, 3), dtype, tol)


BAD = [
    ("qkv 2-D", lambda: (torch.randn(5, 18), 2, None), "qkv"),
    ("qkv int", lambda: (torch.ones(1, 5, 18, dtype=torch.int32), 2, None), "qkv"),
    ("qkv float64", lambda: (torch.randn(1, 5, 18, dtype=torch.float64), 2, None), "qkv"),
    ("qkv width", lambda: (torch.randn(1, 5, 20), 2, None), "qkv"),
    ("num_heads 0", lambda: (torch.randn(1, 5, 18), 0, None), "num_heads"),
    # 3·num_heads wraps to 2 in int64: the check once passed it and the kernel crashed (segfault).
    ("num_heads int64 wrap", lambda: (torch.randn(1, 2, 6), 0x5555555555555556, None), "qkv"),
    ("scale nan", lambda: (torch.randn(1, 5, 18), 2, float("nan")), "scale"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c[0])
def test_bad_arguments_name_the_argument(case):
    _, make, argname = case
    args = make()
    with pytest.raises(ValueError, match=rf"^{argname}: expected"):
        op(*args)
    with pytest.raises(ValueError, match=rf"^{argname}: expected"):
        reference.attention(*args)


@pytest.mark.parametrize("scale", [None, 0.2])
def test_opcheck(scale):
    torch.library.opcheck(op.default, (torch.randn(2, 7, 3 * 2 * 8), 2, scale))


@pytest.mark.slow
def test_torch_compile_fullgraph(tol):
    torch._dynamo.reset()

    def block(t):
        return op(t * 0.5, 2).relu()

    compiled = torch.compile(block, fullgraph=True, backend="inductor")
    atol, rtol = tol[torch.float32]
    for x in (torch.randn(2, 13, 48), torch.randn(2, 13, 48)):
        torch.testing.assert_close(compiled(x), block(x), atol=atol, rtol=rtol)
