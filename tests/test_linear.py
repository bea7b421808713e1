"""The C++ CPU kernel behind `torch.ops.vitfast.linear` against `vitfast.reference.linear`.

y = x · Wᵀ + b + residual at the fused ViT block's shapes (qkv: C → 3C, proj: C → C with the block's shortcut
as residual, head: C → 1000 on the cls tokens) and odd sizes that break the 6 × 16 register block.  Every
CPU code path this machine supports is forced in turn, at 1 and 2 threads (row split and, for fewer rows
than threads, panel split: both must give the same bits).  Also strided views (no copy), fp16/bf16, argument
errors, the packed-weight cache, opcheck and torch.compile.
"""
import pytest
import torch

import vitfast
from vitfast import reference
from helpers import assert_low_precision_no_worse, assert_thread_parity

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

from vitfast import _C  # noqa: E402

op = torch.ops.vitfast.linear
ISAS = _C.supported_cpu_isas()


def make_args(k, n, lead, *, bias=True, residual=False, dtype=torch.float32):
    """nn.Linear-like scales (W ~ U(±1/√K)), built in fp32 then cast."""
    args = [
        torch.randn(*lead, k),
        (torch.rand(n, k) * 2 - 1) / max(k, 1) ** 0.5,
        (torch.rand(n) * 2 - 1) / max(k, 1) ** 0.5 if bias else None,
        torch.randn(*lead, n) if residual else None,
    ]
    return [a.to(dtype) if a is not None else None for a in args]


def check_parity(args, tol, threads=(1, 2)):
    assert_thread_parity(op, reference.linear, args, tol, threads)

# ---------------------------------------------------------------------------------------------- fp32 parity
@pytest.mark.parametrize("layer", ["qkv", "proj", "head"])
@pytest.mark.parametrize("c", [192, 384, 768])
@pytest.mark.parametrize("batch", [1, 2])
def test_parity_vit_layers(layer, c, batch, isa, tol, restore_threads):
    if layer == "qkv":
        args = make_args(c, 3 * c, (batch, 197))
    elif layer == "proj":
        args = make_args(c, c, (batch, 197), residual=True)
    else:  # the classifier on the cls tokens: a strided [B, C] view of the final features
        feats = torch.randn(batch, 197, c)
        _, w, b, _ = make_args(c, 1000, (batch,))
        args = [feats[:, 0], w, b, None]
    check_parity(args, tol)


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 13, 50, 197])
@pytest.mark.parametrize("k,n", [(1, 1), (5, 17), (16, 16), (17, 33), (33, 15), (64, 40)])
def test_parity_odd_sizes(rows, k, n, isa, tol, restore_threads):
    for bias in (False, True):
        for residual in (False, True):
            check_parity(make_args(k, n, (rows,), bias=bias, residual=residual), tol)


@pytest.mark.parametrize("lead", [(), (5,), (2, 3, 7), (0,), (2, 0)], ids=str)
def test_leading_dimensions(lead, isa, tol):
    args = make_args(33, 20, lead, residual=True)
    out = op(*args)
    assert out.shape == (*lead, 20)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(out, reference.linear(*args), atol=atol, rtol=rtol)


@pytest.mark.parametrize("k,n", [(0, 5), (4, 0)])
def test_degenerate_sizes(k, n, isa, tol):
    """K = 0 (y = b + residual) and N = 0 (an empty output)."""
    args = make_args(k, n, (2, 5), residual=True)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(op(*args), reference.linear(*args), atol=atol, rtol=rtol)


def test_strided_and_non_contiguous_inputs(isa, tol, restore_threads):
    x, w, b, r = make_args(48, 40, (3, 20), residual=True)
    nc = [
        x.transpose(0, 1).contiguous().transpose(0, 1),
        w.t().contiguous().t(),
        torch.stack([b, b], 1)[:, 0],
        r.transpose(0, 1).contiguous().transpose(0, 1),
    ]
    assert not any(t.is_contiguous() for t in nc)
    check_parity(nc, tol)
    # 2-D row views with a unit inner stride (read in place) and with a non-unit one (copied).
    big = torch.randn(7, 3, 48)
    for view in (big[:, 1], big[:, :, ::2].reshape(7, -1)[:, :24].contiguous().t().t(), big[:, 2, :48]):
        k = view.shape[-1]
        _, w2, b2, _ = make_args(k, 40, (7,))
        res = torch.randn(9, 7, 40)[2]
        check_parity([view, w2, b2, res], tol)
    check_parity([torch.randn(48, 7).t(), *make_args(48, 40, (7,))[1:3], None], tol)


# ---------------------------------------------------------------------------------------------- fp16 / bf16
@pytest.mark.parametrize("k,n", [(33, 17), (192, 576), (384, 384)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision(dtype, k, n, isa, tol):
    """fp16/bf16 in, same dtype out (computed in fp32 inside): no worse than 2× PyTorch's own error."""
    args = make_args(k, n, (2, 50), residual=True, dtype=dtype)
    assert_low_precision_no_worse(op, reference.linear, args, dtype, tol)


# ---------------------------------------------------------------------------------------------- bad inputs
def _args():
    return make_args(16, 24, (2, 5), residual=True)


def _replace(i, value):
    def mutate(a):
        a = list(a)
        a[i] = value(a)
        return a

    return mutate


BAD = [
    ("x 0-d", _replace(0, lambda a: torch.tensor(1.0)), "x"),
    ("x int", _replace(0, lambda a: a[0].to(torch.int32)), "x"),
    ("x float64", lambda a: [t.double() for t in a], "x"),
    ("weight 1-D", _replace(1, lambda a: a[1][0]), "weight"),
    ("weight K", _replace(1, lambda a: a[1][:, :-1]), "weight"),
    ("bias shape", _replace(2, lambda a: a[2][:-1]), "bias"),
    ("bias 2-D", _replace(2, lambda a: a[2][None]), "bias"),
    ("residual shape", _replace(3, lambda a: a[3][:, :-1]), "residual"),
] + [
    (f"{name} dtype", _replace(i, (lambda i: lambda a: a[i].double())(i)), name)
    for i, name in [(1, "weight"), (2, "bias"), (3, "residual")]
] + [
    (f"{name} device", _replace(i, (lambda i: lambda a: a[i].to("meta"))(i)), name)
    for i, name in [(1, "weight"), (2, "bias"), (3, "residual")]
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c[0])
def test_bad_arguments_name_the_argument(case):
    _, mutate, argname = case
    args = mutate(_args())
    with pytest.raises(ValueError, match=rf"^{argname}: expected"):
        op(*args)
    with pytest.raises(ValueError, match=rf"^{argname}: expected"):
        reference.linear(*args)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("index,name", [(1, "weight"), (2, "bias")])
def test_non_finite_weights_are_refused(index, name, bad):
    a = _args()
    a[index].view(-1)[3] = bad
    with pytest.raises(ValueError, match=rf"^{name}: expected finite values, got 1 non-finite of"):
        op(*a)
    with torch.no_grad():
        a[index].view(-1)[3] = 0.25
    torch.testing.assert_close(op(*a), reference.linear(*a))


# ---------------------------------------------------------------------------------------------- packed-weight cache
def test_weight_is_packed_once_and_repacked_after_an_update(tol):
    _C._weight_cache_clear()
    a = make_args(64, 48, (1, 9), residual=True)
    op(*a)
    for _ in range(3):
        op(torch.randn_like(a[0]), a[1], a[2], torch.randn_like(a[3]))  # new activations never repack
    s = _C._weight_cache_stats()
    assert (s["misses"], s["entries"], s["hits"]) == (1, 1, 3)
    with torch.no_grad():
        a[1].mul_(-1.5)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(op(*a), reference.linear(*a), atol=atol, rtol=rtol)
    assert _C._weight_cache_stats()["misses"] == 2, "an in-place update did not invalidate the packed weight"


def test_same_weight_with_and_without_bias_are_cached_apart(tol):
    x, w, b, _ = make_args(20, 12, (3,))
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(op(x, w, b), reference.linear(x, w, b), atol=atol, rtol=rtol)
    torch.testing.assert_close(op(x, w), reference.linear(x, w), atol=atol, rtol=rtol)


def test_entries_sharing_a_first_weight_are_all_served_and_hit(tol):
    """The cache index is keyed by (op, first weight): several biases on one weight share a bucket."""
    _C._weight_cache_clear()
    x, w, _, _ = make_args(20, 12, (3,))
    biases = [torch.randn(12) for _ in range(5)]
    atol, rtol = tol[torch.float32]
    for _ in range(2):
        for b in biases:
            torch.testing.assert_close(op(x, w, b), reference.linear(x, w, b), atol=atol, rtol=rtol)
    s = _C._weight_cache_stats()
    assert (s["misses"], s["hits"], s["entries"]) == (5, 5, 5)


def test_least_recently_used_entries_are_evicted_at_capacity():
    _C._weight_cache_clear()
    x = torch.randn(2, 8)
    weights = [torch.randn(4, 8) for _ in range(300)]  # more than the cache's 256 entries
    for w in weights:
        op(x, w)
    s = _C._weight_cache_stats()
    assert s["entries"] == 256 and s["misses"] == 300
    op(x, weights[-1])  # recent: still cached
    assert _C._weight_cache_stats()["misses"] == 300
    torch.testing.assert_close(op(x, weights[0]), reference.linear(x, weights[0]))  # evicted: packed again
    s2 = _C._weight_cache_stats()
    assert s2["misses"] == 301 and s2["entries"] == 256 and s2["bytes"] == s["bytes"]


# ---------------------------------------------------------------------------------------------- torch integration
@pytest.mark.parametrize("optional", [True, False], ids=["with_optionals", "without_optionals"])
def test_opcheck(optional):
    a = make_args(24, 40, (2, 7), bias=optional, residual=optional)
    torch.library.opcheck(op.default, tuple(a))


@pytest.mark.slow
def test_torch_compile_fullgraph(tol):
    torch._dynamo.reset()
    _, w, b, _ = make_args(48, 48, (1,))

    def block(t):
        return op(t * 0.5, w, b, t).relu()  # proj with the block's shortcut, inside ordinary PyTorch code

    compiled = torch.compile(block, fullgraph=True, backend="inductor")
    atol, rtol = tol[torch.float32]
    for x in (torch.randn(2, 13, 48), torch.randn(2, 13, 48)):
        torch.testing.assert_close(compiled(x), block(x), atol=atol, rtol=rtol)
