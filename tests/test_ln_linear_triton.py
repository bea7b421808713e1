"""The LayerNorm-folded Triton GEMM (`kernels/ln_linear.py`): parity with LN-then-linear computed in fp64, the
cancellation fallback at large per-row offsets, its epilogues (split GELU, bias2, add, residual) and the row
statistics it emits for the next LayerNorm.

Natively on CUDA when a GPU is present, else through the Triton interpreter (conftest.py).  Shapes are ragged
against every tile (M = 37, N = 100, K = 72; the interpreter config is 32 × 64 × 32) and tiny.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import triton

from helpers import triton_test_device
import vitfast
import vitfast.kernels.ln_linear as lnl
from vitfast import reference
from vitfast.kernels.ln_linear import fold_kappa_max, ln_linear_triton, row_stats_triton

pytestmark = pytest.mark.triton

DEVICE, INTERPRET = triton_test_device()

M, N, K = 37, 100, 72
EPS = 1e-6


def operands(dtype=torch.float32, offset=0.0, m=M, n=N, k=K):
    """x with per-row offsets (row r gets offset·(1 + r/m), signs alternating), nn.Linear-scale weight and bias."""
    r = torch.arange(m, device=DEVICE, dtype=torch.float32)
    shift = offset * (1 + r / m) * (1 - 2 * (r % 2))
    x = (torch.randn(m, k, device=DEVICE) + shift[:, None]).to(dtype)
    w = ((torch.rand(n, k, device=DEVICE) * 2 - 1) / k**0.5).to(dtype)
    b = (torch.rand(n, device=DEVICE) * 2 - 1).to(dtype)
    return x, w, b


def exact(x, w, b, **epilogue):
    """The reference (LN non-affine, then linear, then the epilogue) in fp64, from the stored (already rounded)
    inputs."""
    epilogue = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in epilogue.items()}
    return reference.ln_linear(x.double(), w.double(), b.double(), eps=EPS, **epilogue)


def composition(x, w, b):
    """The train-time composition in x's dtype: F.layer_norm, then F.linear (the reference in x's dtype)."""
    return reference.ln_linear(x, w, b, eps=EPS)


def err(y, ref):
    return (y.double() - ref).abs().max().item()


# ---------------------------------------------------------------------------------------------- parity
@pytest.mark.parametrize("norm", ["auto", "explicit", "fold"])
def test_fp32_parity_ragged(norm, tol):
    x, w, b = operands()
    atol, rtol = tol[torch.float32]
    y = ln_linear_triton(x, w, b, eps=EPS, norm=norm)
    torch.testing.assert_close(y.double(), exact(x, w, b), atol=atol, rtol=rtol)


def test_no_layer_norm_is_a_linear(tol):
    x, w, b = operands()
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(ln_linear_triton(x, w, b), F.linear(x, w, b), atol=atol, rtol=rtol)
    torch.testing.assert_close(ln_linear_triton(x, w), F.linear(x, w), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype,offset", [(torch.float16, 0.0), (torch.float16, 1e3), (torch.bfloat16, 0.0),
                                          (torch.bfloat16, 1e2)], ids=str)
def test_low_precision_no_worse_than_twice_the_composition(dtype, offset, tol):
    # The precision criterion of the GPU block path: the error against fp64 at most twice the train-time
    # composition's own error in that dtype.  Offsets stay where the dtype still resolves σ = 1 (bf16 has 8
    # significant bits: at 1e3 its rows collapse onto a few levels; test_constant_rows_fall_back covers that).
    x, w, b = operands(dtype, offset)
    truth = exact(x, w, b)
    y = ln_linear_triton(x, w, b, eps=EPS)
    assert y.dtype == dtype
    assert err(y, truth) <= 2 * err(composition(x, w, b), truth)
    atol, rtol = tol[dtype]
    torch.testing.assert_close(y, composition(x, w, b), atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------------- cancellation
@pytest.mark.parametrize("offset", [1e3, 1e4])
def test_fp32_large_offsets_fall_back_and_stay_accurate(offset):
    # κ = |μ|/σ ≈ offset ≫ κ_max (≈ 4.5 at K = 72, ieee): "auto" must normalise explicitly and be as accurate as
    # torch's own fp32 composition (whose error grows with κ too: the fp32 mean of values of size |μ|).
    x, w, b = operands(torch.float32, offset)
    truth = exact(x, w, b)
    scale = truth.abs().max().item()
    auto = ln_linear_triton(x, w, b, eps=EPS)
    assert torch.equal(auto, ln_linear_triton(x, w, b, eps=EPS, norm="explicit"))
    assert err(auto, truth) <= 2 * err(composition(x, w, b), truth) + 1e-6 * scale
    # Folding loses more than that (ieee: the accumulation's √K against the mean's log₂K, module docstring).
    assert err(ln_linear_triton(x, w, b, eps=EPS, norm="fold"), truth) > err(auto, truth)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_constant_rows_fall_back(dtype, tol):
    # Rows that are constant (σ = 0, κ = ∞: all of x·Wᵀ cancels against μ·colsum(W), then rstd = 1/√eps amplifies
    # what is left) next to ordinary rows.  LN of a constant row is 0, so the exact output is the bias.
    x, w, b = operands(dtype)
    x[::3] = 1000.0
    truth = exact(x, w, b)
    auto = ln_linear_triton(x, w, b, eps=EPS)
    atol, rtol = tol[dtype]
    torch.testing.assert_close(auto.double(), truth, atol=atol, rtol=rtol)
    assert torch.equal(auto[::3], b.expand(len(range(0, M, 3)), N))
    folded = ln_linear_triton(x, w, b, eps=EPS, norm="fold")
    # Folded, those rows are off where auto's are exact: by several ulps of the dtype at the output's scale under
    # the interpreter, by fewer natively in bf16 (0.0625 against 4 ulps = 0.074 on an H200), so the bar is relative
    # to auto's exact rows, not a count of ulps.
    assert err(folded[::3], truth[::3]) > 0 == err(auto[::3], truth[::3])


def test_auto_picks_per_row_tile_by_the_bound():
    # Rows 0..31 (one interpreter row tile) centred, rows 32.. offset by 1e4: the first tile folds, the second
    # normalises.  (Natively the autotuned BLOCK_M decides the tiles: checked through the bound only.)
    x, w, b = operands(torch.float32)
    x[32:] += 1e4
    auto = ln_linear_triton(x, w, b, eps=EPS)
    fold = ln_linear_triton(x, w, b, eps=EPS, norm="fold")
    explicit = ln_linear_triton(x, w, b, eps=EPS, norm="explicit")
    if INTERPRET:
        assert torch.equal(auto[32:], explicit[32:])
        kappa = (x[:32].mean(-1).abs() / x[:32].std(-1, unbiased=False)).max().item()
        assert torch.equal(auto[:32], fold[:32] if kappa <= fold_kappa_max(x.dtype, "ieee", K) else explicit[:32])
    assert not torch.equal(fold[32:], explicit[32:])


def test_kappa_max_follows_the_bound():
    # e_fold/e_norm from the module docstring: bf16 tolerates the most offset (its own rounding 2⁻⁸ dominates),
    # fp32 about |μ| ≈ σ, and a wider K (more fp32 accumulation error) tolerates less.
    bf16, fp16 = fold_kappa_max(torch.bfloat16, "tf32", 768), fold_kappa_max(torch.float16, "tf32", 768)
    ieee, tf32 = fold_kappa_max(torch.float32, "ieee", 768), fold_kappa_max(torch.float32, "tf32", 768)
    assert bf16 > fp16 > ieee >= tf32 >= 1.0
    assert ieee < 2 and abs(tf32 - 1) < 1e-2
    assert fold_kappa_max(torch.bfloat16, "tf32", 3072) < bf16
    with pytest.raises(ValueError, match="dtype"):
        fold_kappa_max(torch.float64, "ieee", 8)


# ---------------------------------------------------------------------------------------------- epilogues
def test_epilogues_split_gelu_bias2_add_residual(tol):
    x, w, b = operands()
    b2 = torch.randn(N, device=DEVICE)
    add = torch.randn(M, N, device=DEVICE)
    res = torch.randn(M, N, device=DEVICE)
    gelu_cols = 45  # not a multiple of any tile: one tile straddles the GELU boundary
    expected = exact(x, w, b, gelu_cols=gelu_cols, bias2=b2, add=add, residual=res)
    y = ln_linear_triton(x, w, b, eps=EPS, gelu_cols=gelu_cols, bias2=b2, add=add, residual=res)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(y.double(), expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_emitted_stats_describe_the_stored_output(dtype):
    x, w, b = operands(dtype)
    res = (torch.randn(M, N, device=DEVICE) + 50).to(dtype)  # a residual stream with |μ| ≫ σ
    y, stats = ln_linear_triton(x, w, b, residual=res, emit_stats=True)
    assert stats.partials.shape == (2, -(-N // lnl.STAT_TILE), M) and stats.width == N
    mean, var = stats.mean_var()
    yd = y.double()
    torch.testing.assert_close(mean, yd.mean(-1), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(var, yd.var(-1, unbiased=False), atol=1e-5, rtol=1e-5)


def test_stats_chain_into_the_next_layer_norm(tol):
    # The producer's statistics (3 tiles + a ragged one) give the consumer the same LN as computing them afresh.
    x, w, b = operands()
    res = torch.randn(M, N, device=DEVICE) * 3 + 7
    y, stats = ln_linear_triton(x, w, b, residual=res, emit_stats=True)
    w2 = torch.randn(24, N, device=DEVICE) / N**0.5
    chained = ln_linear_triton(y, w2, eps=EPS, stats=stats, norm="explicit")
    fresh = ln_linear_triton(y, w2, eps=EPS, stats=row_stats_triton(y), norm="explicit")
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(chained, fresh, atol=atol, rtol=rtol)
    torch.testing.assert_close(chained.double(), F.linear(F.layer_norm(y.double(), (N,), eps=EPS), w2.double()),
                               atol=atol, rtol=rtol)


def test_row_stats_two_pass():
    x = torch.randn(5, 3, 300, device=DEVICE) + 1e4
    mean, var = row_stats_triton(x).mean_var()
    xd = x.double().reshape(15, 300)
    torch.testing.assert_close(mean, xd.mean(-1), atol=0, rtol=1e-6)
    torch.testing.assert_close(var, xd.var(-1, unbiased=False), atol=0, rtol=1e-3)


def test_launch_counter_and_errors():
    x, w, b = operands()
    before = lnl.launch_count()
    ln_linear_triton(x, w, b, eps=EPS)  # no stats given: row_stats + the GEMM
    assert lnl.launch_count() - before == 2
    ln_linear_triton(x, w, b, eps=EPS, stats=row_stats_triton(x))
    assert lnl.launch_count() - before == 4
    with pytest.raises(ValueError, match="norm"):
        ln_linear_triton(x, w, b, eps=EPS, norm="fast")
    with pytest.raises(ValueError, match="weight"):
        ln_linear_triton(x, w[:, :-1], b)
    with pytest.raises(ValueError, match="gelu_cols"):
        ln_linear_triton(x, w, b, gelu_cols=N + 1)
    with pytest.raises(ValueError, match="stats"):
        ln_linear_triton(x, w, b, eps=EPS, stats=row_stats_triton(x[:-1]))


# ---------------------------------------------------------------------------------------------- split-K
@pytest.mark.parametrize("split", [2, 3, 4])
@pytest.mark.parametrize("norm", ["auto", "explicit", "fold"])
def test_split_k_parity_with_every_epilogue(split, norm, tol):
    # K = 72 is 3 K-tiles of the interpreter's 32: split 2 gives slices of 2 and 1 tiles, 3 one each, 4 a trailing
    # empty slice.  The slices' sum in fixed order, then the epilogues (split GELU, bias2, add, residual) and the
    # statistics of the stored output: the same result as no split, within fp32 rounding of the sum's order.
    x, w, b = operands()
    if norm != "fold":  # (forced folding at κ ≈ 1e4 is the inaccurate path: its slices' sum differs by that error)
        x[32:] += 1e4  # the second row tile normalises explicitly under "auto", the first folds
    b2, add, res = torch.randn(N, device=DEVICE), torch.randn(M, N, device=DEVICE), torch.randn(M, N, device=DEVICE)
    kw = {"eps": EPS, "norm": norm, "gelu_cols": 45, "bias2": b2, "add": add, "residual": res, "emit_stats": True}
    whole, whole_stats = ln_linear_triton(x, w, b, split_k=1, **kw)
    before = lnl.launch_count()
    parts, parts_stats = ln_linear_triton(x, w, b, split_k=split, stats=row_stats_triton(x), **kw)
    assert lnl.launch_count() - before == 2  # row_stats + the one split GEMM: the reduction adds no launch
    atol, rtol = tol[torch.float32]
    scale = whole.abs().max().item()
    torch.testing.assert_close(parts, whole, atol=atol * scale, rtol=rtol)
    torch.testing.assert_close(parts_stats.partials, whole_stats.partials, atol=atol * scale**2 * N, rtol=rtol)
    assert torch.equal(parts, ln_linear_triton(x, w, b, split_k=split, **kw)[0])  # deterministic
    if INTERPRET:  # every tile counter is back to zero for the next launch
        assert int(lnl._COUNTERS[x.device].abs().sum()) == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_split_k_low_precision(dtype):
    # One rounding to the output dtype after the fp32 sum of the slices: no worse than twice the composition.
    x, w, b = operands(dtype)
    truth = exact(x, w, b)
    y = ln_linear_triton(x, w, b, eps=EPS, split_k=3)
    assert y.dtype == dtype
    assert err(y, truth) <= 2 * err(composition(x, w, b), truth)


def test_split_k_heuristic_and_errors():
    f, sms = lnl.split_k_factor, 132
    # DeiT-B, batch 1 (197 rows): qkv and proj leave most SMs idle and split; batch 64 (12608 rows) does not.
    for n, k in ((2304, 768), (768, 768), (768, 3072)):
        s = f(197, n, k, sms)
        assert 2 <= s <= lnl.MAX_SPLIT_K and k // s >= 256
        assert f(64 * 197, n, k, sms) == 1
    assert f(197, 768, 256, sms) == 1  # a short K keeps one slice: each slice needs 256 columns
    assert f(197, 768, 768, 0) == 1  # no SM count (the interpreter): never split
    x, w, b = operands()
    for bad in (0, lnl.MAX_SPLIT_K + 1, True, 2.0):
        with pytest.raises(ValueError, match="split_k"):
            ln_linear_triton(x, w, b, split_k=bad)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device: the slices' programs run concurrently there")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_split_k_race_free_and_deterministic(dtype, tol):
    # DeiT-B's proj at batch 1 (197 × 768 × 768), forced to 3 slices: many tiles whose slices race for the last
    # arrival.  A missed partial or a stale read shows as a difference from the fp64 reference or between repeats.
    # Everything is measured before anything is asserted, so one native run tells a race (repeats differ) from a
    # systematic error (repeats agree), and which of the split and the unsplit GEMM is off (a native run had 7
    # outputs of row 193 of the split result 0.23 away from the unsplit one, and stopped there).
    x, w, b = operands(dtype, m=197, n=768, k=768)
    res = torch.randn(197, 768, device=DEVICE).to(dtype)
    truth = exact(x, w, b, residual=res)
    whole = ln_linear_triton(x, w, b, eps=EPS, residual=res, split_k=1)
    first = ln_linear_triton(x, w, b, eps=EPS, residual=res, split_k=3)
    repeats_differing = sum(not torch.equal(ln_linear_triton(x, w, b, eps=EPS, residual=res, split_k=3), first)
                            for _ in range(20))
    atol, rtol = tol[dtype]

    def off(y):  # (outputs outside the tolerance of the fp64 reference, the rows they are in, the largest error)
        bad = ~torch.isclose(y.double(), truth, atol=atol, rtol=rtol)
        return int(bad.sum()), sorted(set(bad.nonzero()[:, 0].tolist()))[:8], err(y, truth)

    report = {"split vs fp64": off(first), "unsplit vs fp64": off(whole), "repeats differing of 20": repeats_differing,
              "counters left": int(lnl._COUNTERS[x.device].abs().sum())}
    assert report["split vs fp64"][0] == 0 and report["unsplit vs fp64"][0] == 0, report
    assert repeats_differing == 0 and report["counters left"] == 0, report
    torch.testing.assert_close(first, whole, atol=atol, rtol=rtol)


@pytest.mark.parametrize("call", ["qkv", "proj", "fc1", "fc2"])
def test_every_candidate_gives_the_reference(call, tol):
    # The block path's four GEMMs of RePa-DeiT-S/0.75 in bf16 at every autotune candidate forced (the parity tests
    # above run the first candidate only: VITFAST_TRITON_AUTOTUNE=0).  Natively at batch 64 (12608 rows: more
    # 128-row tiles than SMs, so the persistent candidates loop over tiles); under the interpreter at 197 rows of
    # half the width (a ragged last row tile at every BLOCK_M; the persistent candidates run on two programs, the
    # TMA ones on the interpreter's descriptors), which checks each candidate's index and mask logic in CI.  With
    # autotuning on, the block path's logits were 7-12% off the fp32 model on an H200 (gpu_blocks.py), against
    # 1.4-1.8% on an H100 before the TMA and persistent candidates existed: this names the candidate that is wrong.
    from vitfast.kernels._common import forced_config

    m, k, dtype = (12608, 384, torch.bfloat16) if DEVICE == "cuda" else (197, 192, torch.bfloat16)
    n, kwargs = {"qkv": (3 * k, {"eps": EPS}), "proj": (k, {"residual": True, "emit_stats": True}),
                 "fc1": (2 * k, {"eps": EPS, "gelu_cols": k}),
                 "fc2": (k, {"add": True, "residual": True, "emit_stats": True})}[call]
    x, w, b = operands(dtype, offset=0.5, m=m, n=n, k=k)
    extra = {name: torch.randn(m, n, device=DEVICE).to(dtype) for name in ("add", "residual") if kwargs.get(name)}
    kwargs = dict(kwargs, **extra)
    want = reference.ln_linear(x.double(), w.double(), b.double(), eps=kwargs.get("eps"),
                               gelu_cols=kwargs.get("gelu_cols", 0),
                               **{name: t.double() for name, t in extra.items()})
    atol, rtol = tol[dtype]
    wrong = []
    # lnl.candidates, not the autotuner's list: with VITFAST_TRITON_AUTOTUNE=0 (the GPU scripts' test runs) that
    # holds the first candidate only.
    offered = lnl.candidates(tma=True)
    for cfg in offered + [c for c in lnl.persistent_configs() if str(c) not in {str(o) for o in offered}]:
        got = ln_linear_triton(x, w, b, **kwargs, _wrap=forced_config(cfg))
        out, stats = got if kwargs.get("emit_stats") else (got, None)
        if not torch.allclose(out.double(), want, atol=atol, rtol=rtol):
            wrong.append((str(cfg), err(out, want)))
        elif stats is not None:
            mean, var = stats.mean_var()
            stored = out.double()
            if not (torch.allclose(mean, stored.mean(-1), atol=1e-4, rtol=1e-4)
                    and torch.allclose(var, stored.var(-1, unbiased=False), atol=1e-4, rtol=1e-3)):
                wrong.append((str(cfg), "statistics"))
    assert not wrong, wrong


# ---------------------------------------------------------------------------------------------- colsum(W)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("split", [1, 2])
def test_kept_colsum_matches_the_in_kernel_sum(dtype, split, tol):
    # The launcher's kept fp32 colsum (first K slice subtracts it) against the in-kernel per-tile sum (every slice
    # its own part): the same value up to fp32 summation order, at an offset that folds (κ ≈ 3).
    x, w, b = operands(dtype, offset=3.0)
    truth = exact(x, w, b)
    kept = ln_linear_triton(x, w, b, eps=EPS, norm="fold", split_k=split)
    in_kernel = ln_linear_triton(x, w, b, eps=EPS, norm="fold", split_k=split, _colsum_in_kernel=True)
    atol, rtol = tol[dtype]
    torch.testing.assert_close(kept.double(), truth, atol=atol, rtol=rtol)
    torch.testing.assert_close(kept, in_kernel, atol=atol, rtol=rtol)
    # A split subtracting the kept vector in every slice (not only the first) would be off by μ·colsum·(S − 1).
    torch.testing.assert_close(kept, ln_linear_triton(x, w, b, eps=EPS, norm="fold", split_k=1), atol=atol,
                               rtol=rtol)


def test_kept_colsum_follows_the_weight():
    # Kept per weight version: an in-place update is seen; a write through .data is not, until clear_weight_cache.
    x, w, b = operands(torch.bfloat16, offset=3.0)
    w = w.clone()
    before = ln_linear_triton(x, w, b, eps=EPS, norm="fold")
    assert lnl._COLSUMS.value_of(w).dtype == torch.float32
    with torch.no_grad():
        w.mul_(2)
    after = ln_linear_triton(x, w, b, eps=EPS, norm="fold")
    torch.testing.assert_close(after.double(), exact(x, w, b), atol=0.05, rtol=0.02)
    assert not torch.equal(after, before)
    w.data.mul_(0.5)  # invisible to the version counter
    stale = lnl._COLSUMS.value_of(w).clone()
    ln_linear_triton(x, w, b, eps=EPS, norm="fold")
    assert torch.equal(lnl._COLSUMS.value_of(w), stale)
    vitfast.ops.clear_weight_cache()  # clears the kept colsum vectors too (every vitfast._derived cache)
    assert w not in lnl._COLSUMS
    restored = ln_linear_triton(x, w, b, eps=EPS, norm="fold")
    assert torch.equal(restored, before)
    kept = len(lnl._COLSUMS)
    del w
    assert len(lnl._COLSUMS) == kept - 1  # dropped with its weight


def test_colsum_is_not_kept_inside_a_cuda_graph_capture(monkeypatch):
    # Captured launches sum colsum(W) in the graph itself (replays read the weights in place): nothing kept, and the
    # same result as the kept vector.
    x, w, b = operands(torch.bfloat16, offset=3.0)
    w = w.clone()
    monkeypatch.setattr(lnl, "_capturing", lambda t: True)
    captured = ln_linear_triton(x, w, b, eps=EPS, norm="fold")
    assert w not in lnl._COLSUMS
    monkeypatch.setattr(lnl, "_capturing", lambda t: False)
    assert torch.equal(ln_linear_triton(x, w, b, eps=EPS, norm="fold"), captured)
    assert w in lnl._COLSUMS


def test_traced_launches_sum_colsum_in_the_graph(monkeypatch):
    # Under tracing (fake tensors: torch.compile of the registered op) the sum is a graph op, never a kept vector.
    from torch._subclasses.fake_tensor import FakeTensorMode

    class NoLaunch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    monkeypatch.setattr(lnl, "_launcher", lambda kernel, wrap: NoLaunch())
    summed = []
    real_sum = torch.sum
    monkeypatch.setattr(torch, "sum", lambda *a, **k: summed.append(k.get("dtype")) or real_sum(*a, **k))
    before = len(lnl._COLSUMS)
    with FakeTensorMode():
        x, w, b = (torch.empty(8, 32, dtype=torch.bfloat16, device=DEVICE),
                   torch.empty(16, 32, dtype=torch.bfloat16, device=DEVICE),
                   torch.empty(16, dtype=torch.bfloat16, device=DEVICE))
        ln_linear_triton(x, w, b, eps=EPS, stats=lnl.RowStats(torch.empty(2, 1, 8, device=DEVICE), 32, 32))
    assert summed == [torch.float32] and len(lnl._COLSUMS) == before


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device: a real CUDA-graph capture")
def test_cuda_graph_replay_sees_in_place_weight_updates():
    # vitfast.cuda_graph's contract (parameters read in place at every replay) with the folded LayerNorm's colsum.
    x, w, b = operands(torch.bfloat16, offset=3.0, m=197, n=768, k=384)
    w = w.clone()
    static = x.clone()
    for _ in range(2):  # warm-up: compiles outside the capture
        ln_linear_triton(static, w, b, eps=EPS)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ln_linear_triton(static, w, b, eps=EPS)
    with torch.no_grad():
        w.mul_(-0.5)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, ln_linear_triton(static, w, b, eps=EPS), atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------- TMA candidates
@pytest.mark.skipif(not hasattr(triton.language, "make_tensor_descriptor"), reason="triton without tensor descriptors")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("norm,split", [("fold", 1), ("explicit", 1), (None, 1), ("fold", 2)])
def test_tma_loads_give_the_pointer_loads_result(dtype, norm, split, monkeypatch):
    # The same tile config with bulk tensor copies instead of masked pointer loads: zero-filled edges in M, N and K
    # (37 × 100 × 72 against 32 × 64 × 32 tiles) must give the same bits.
    from vitfast.kernels._common import forced_config

    if DEVICE != "cuda":
        # The interpreter's tl.dot is numpy's matmul, whose summation order depends on the operands' memory layout
        # on some OpenBLAS kernels (measured on an Intel host: ones[16 × 32] · a transposed 32 × 64 view differs
        # from the contiguous copy by 1 ulp); the TMA path's W is such a view (`.T` of a [BLOCK_N, BLOCK_K] load).
        # Contiguous operands make the interpreter's dot layout-blind, so what is compared is the loads' values.
        matmul = np.matmul
        monkeypatch.setattr(np, "matmul", lambda a, b, **kw: matmul(np.ascontiguousarray(a), np.ascontiguousarray(b),
                                                                    **kw))

    x, w, b = operands(dtype, offset=3.0)
    res = torch.randn(M, N, device=DEVICE).to(dtype)
    kwargs = {"eps": EPS if norm else None, "norm": norm or "auto", "gelu_cols": 40, "residual": res,
              "emit_stats": True, "split_k": split}
    tile = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4}
    outs = [ln_linear_triton(x, w, b, **kwargs, _wrap=forced_config(triton.Config(dict(tile, USE_TMA=tma),
                                                                                  num_warps=4)))
            for tma in (False, True)]
    assert torch.equal(outs[1][0], outs[0][0])
    assert torch.equal(outs[1][1].partials, outs[0][1].partials)


@pytest.mark.skipif(not lnl._FLATTEN, reason="triton without loop-nest flattening: no persistent configs")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("norm", ["fold", "explicit", "auto", None])
def test_persistent_programs_give_the_per_tile_result(dtype, norm):
    # Two programs (the launcher's count without a GPU) looping over the 2 × 2 tiles of a 37 × 100 output, flattened
    # loop nest (NORM ≠ 2) or not (auto): the same bits as one program per tile at the same tile config.
    from vitfast.kernels._common import forced_config

    x, w, b = operands(dtype, offset=3.0)
    res = torch.randn(M, N, device=DEVICE).to(dtype)
    kwargs = {"eps": EPS if norm else None, "norm": norm or "auto", "gelu_cols": 40, "residual": res,
              "emit_stats": True}
    tile = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4, "USE_TMA": False}
    outs = [ln_linear_triton(x, w, b, **kwargs, _wrap=forced_config(triton.Config(dict(tile, PERSISTENT=p),
                                                                                  num_warps=4)))
            for p in (False, True)]
    assert torch.equal(outs[1][0], outs[0][0])
    assert torch.equal(outs[1][1].partials, outs[0][1].partials)


# ---------------------------------------------------------------------------------------------- GPU legality
_SM90_COMPILE = r"""
import os
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import vitfast.kernels.ln_linear as L
from sm90 import ptxas_report

# What the JIT specialises at ViT shapes: unit inner strides as constants, pointers and the other sizes/strides
# divisible by 16 (without these hints the loads are gathers and neither cp.async nor wgmma is used).
UNIT = ("stride_xk", "stride_wk", "stride_an", "stride_rn", "stride_on")
ALIGNED = ("M", "N", "K", "stride_xm", "stride_wn", "stride_am", "stride_rm", "stride_om")

def build(fn, consts, dt, floats=(), float_type="fp32", **opts):
    # Every constexpr named: ASTSource ignores the kernel's defaults, and a left-out flag would compile as an i32
    # argument with both of its branches.
    missing = [n for i, n in enumerate(fn.arg_names) if i in fn.constexprs and n not in consts]
    assert not missing, missing
    consts = dict(consts, **{n: 1 for n in UNIT if n in fn.arg_names})
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in consts:
            sig[n] = "constexpr"
            continue
        ptr = "*fp32" if n.startswith(("stats", "ws", "colsum")) else "*i32" if n.startswith("cnt") else "*" + dt
        sig[n] = ptr if n.endswith("_ptr") else (
            float_type if n in floats else "i32")
        if n.endswith("_ptr") or n in ALIGNED:
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=opts)
    assert k.metadata.shared <= 227 * 1024, (fn, dt, k.metadata.shared)
    return k



def gemm(norm, dt, *, tma=False, persistent=False, split=1, prec="tf32", ft="fp32", bias2=False, t_in=16, stages=3,
         colsum=False, **extra):
    # The GEMM kernel at the default tile (128 × 128 × 64, 8 warps) with every epilogue on and statistics emitted.
    return build(L._ln_linear_kernel.fn, dict(NORM=norm, T_IN_POW2=t_in, COLSUM_GIVEN=colsum, HAS_BIAS=True,
                 HAS_GELU=True, HAS_BIAS2=bias2, HAS_ADD=True, HAS_RES=True, EMIT_STATS=True, STAT=L.STAT_TILE,
                 SPLIT_K=split, INPUT_PRECISION=prec, INTERPRET_BF16=False, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64,
                 GROUP_M=8, USE_TMA=tma, PERSISTENT=persistent), dt, floats=("eps", "kappa_max"), float_type=ft,
                 num_warps=8, num_stages=stages, **extra)

build(L._row_stats_kernel, dict(BLOCK_M=16, BLOCK_K=256), "fp32", num_warps=4)
# The default config in 16-bit: every NORM mode keeps the main loop's wgmma asynchronous (the folded path's colsum as
# a second, 16-row dot made ptxas serialise them: C7515) and spills nothing.
for dt in ("bf16", "fp16"):
    for norm in (0, 1, 2, 3):
        k = gemm(norm, dt)
        report = ptxas_report(k)
        if report is not None:
            assert "C7515" not in report and " 0 bytes spill stores" in report, (dt, norm, report)
# With colsum(W) given (fp16/bf16 eager launches), the folded path's main loop is the plain GEMM's: the same PTX
# lines, without the per-tile reduction of W read back from shared memory that the in-kernel sum adds.
def wgmma_loops(k):
    # Each loop (label to its backward branch) that encloses a wgmma; the pipeliner may peel some before the loop.
    lines, loops = k.asm["ptx"].splitlines(), {}
    for at in (i for i, line in enumerate(lines) if "wgmma.mma_async" in line):
        for j in range(at, -1, -1):
            label = lines[j].split(":")[0].strip()  # "$L__BB0_26:  // comment"
            if label.startswith("$L__BB") and lines[j].strip().startswith(label + ":"):
                ends = [t for t in range(at, len(lines)) if lines[t].split()[-1:] == [label + ";"]]
                if ends:
                    loops[label] = lines[j:ends[-1]]
                    break
    assert loops, "no loop around a wgmma"
    return list(loops.values())
(plain,) = wgmma_loops(gemm(0, "bf16"))
for norm in (2, 3):  # NORM 2 also has the explicit path's loop: the folded one is the shortest
    given, summed = min(wgmma_loops(gemm(norm, "bf16", colsum=True)), key=len), min(wgmma_loops(gemm(norm, "bf16")),
                                                                                     key=len)
    assert len(given) == len(plain) < len(summed), (norm, len(given), len(plain), len(summed))
    assert sum("ld.shared" in line for line in given) == 0 < sum("ld.shared" in line for line in summed), norm
# The persistent candidates: the tile loop (flattened with the K loop where NORM != 2) keeps wgmma asynchronous.
# (Up to ~260 bytes of spills at 255 registers with every epilogue on: a candidate, kept only if the autotuner
# finds it faster.)
for norm in (0, 2, 3) if L._FLATTEN else ():
    k = gemm(norm, "bf16", persistent=True)
    report = ptxas_report(k)
    assert report is None or "C7515" not in report, ("persistent", norm, report)
# The TMA candidates (device-side descriptors: triton >= 3.4): bulk tensor copies feed the loop, same checks.
if hasattr(triton.language, "make_tensor_descriptor"):
    for norm in (0, 1, 2, 3):
        k = gemm(norm, "bf16", tma=True)
        assert "tma" in k.asm["ttgir"] and "warp_group_dot" in k.asm["ttgir"], norm
        report = ptxas_report(k)
        if report is not None:
            assert "C7515" not in report and " 0 bytes spill stores" in report, ("tma", norm, report)
# The register-capped candidate (maxnreg 128): every epilogue on, ptxas keeps to the cap, so two 256-thread programs
# fit an SM (65536 registers), with the main loop's wgmma still asynchronous.
if L._MAXNREG:
    import re
    for norm in (0, 2):
        report = ptxas_report(gemm(norm, "bf16", colsum=norm == 2, maxnreg=128))
        if report is not None:
            used = int(re.search(r"Used (\d+) registers", report).group(1))
            assert used <= 128 and "C7515" not in report, ("maxnreg", norm, report)
# The float arguments as triton's launcher types them (fp32), and as inductor does when a compiled graph launches the
# registered op's kernel (fp64: the first torch.compile of the op on an H100 failed in _combine_stats' sqrt_rn).
for dt, prec, split, ft in (("bf16", "tf32", 1, "fp32"), ("fp16", "tf32", 1, "fp32"), ("fp32", "ieee", 1, "fp32"),
                            ("bf16", "tf32", 3, "fp32"), ("fp32", "ieee", 1, "fp64")):
    # NORM=2: both K loops (folded, explicit) behind the per-tile branch; every epilogue on, statistics emitted;
    # SPLIT_K=3: the workspace, the tile counter's acq_rel atomic and the last program's reduction as well.
    ttgir = gemm(2, dt, split=split, prec=prec, ft=ft, bias2=True, t_in=32).asm["ttgir"]
    assert "scf.if" in ttgir and "async_copy_global_to_local" in ttgir, dt  # the branch, and pipelined loads
    assert dt == "fp32" or "warp_group_dot" in ttgir, dt  # Hopper wgmma for fp16/bf16
    assert (split > 1) == ("atomic_rmw" in ttgir), (dt, split)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.gpu_compile
def test_kernels_compile_for_sm90():
    """The interpreter accepts constructs a GPU compile rejects (the row-statistics kernel's first form crashed
    triton's NVIDIA pipeline): compile the kernels to an H100 (sm_90) target at the first autotune config, with the
    specialisation the JIT applies at ViT shapes — no GPU needed, only triton's NVIDIA backend."""
    from sm90 import run_compile_script

    run_compile_script(_SM90_COMPILE)
