"""benchmarks/gpu_profile_blocks.py's pieces that need no GPU: the config-forcing launch wrapper (every autotune
candidate launched directly gives the autotuned launch's result), the recorder of a block's GEMM calls, and the
sdpa / gemm sections with their timing stubbed, under the Triton interpreter (natively on CUDA)."""
import os
import sys

import pytest
import torch
import vitfast.kernels.ln_linear as lnl
from helpers import triton_test_device
from vitfast.kernels._common import forced_config
from vitfast.kernels.vit_block import vit_block_triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import gpu_profile_blocks as gpb

pytestmark = pytest.mark.triton
DEVICE, INTERPRET = triton_test_device()


def _operands(m=40, k=48, n=64):
    torch.manual_seed(0)
    x = torch.randn(m, k, device=DEVICE) + 3.0
    return x, torch.randn(n, k, device=DEVICE) / k ** 0.5, torch.randn(n, device=DEVICE), torch.randn(m, n, device=DEVICE)


def test_forced_config_matches_the_autotuned_launch(monkeypatch):
    x, w, b, res = _operands()
    tiles = []  # the BLOCK_M each launch's grid was computed for: the forced config must reach the kernel
    grid = lnl._grid

    def spy(*args):
        inner = grid(*args)
        return lambda meta: (tiles.append(meta["BLOCK_M"]), inner(meta))[1]

    monkeypatch.setattr(lnl, "_grid", spy)
    kwargs = {"eps": 1e-6, "gelu_cols": 16, "residual": res, "emit_stats": True}
    out, stats = lnl.ln_linear_triton(x, w, b, **kwargs)
    # The interpreter's candidate, and a different tile shape (16-row tiles: crosses M's edge at 40 rows).
    configs = list(lnl._ln_linear_kernel.configs)
    other = type(configs[0])({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2}, num_warps=4)
    for cfg in configs[:1] + [other]:
        forced, forced_stats = lnl.ln_linear_triton(x, w, b, **kwargs, _wrap=forced_config(cfg))
        assert tiles[-1] == cfg.kwargs["BLOCK_M"]
        torch.testing.assert_close(forced, out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(forced_stats.partials, stats.partials, atol=1e-4, rtol=1e-5)


def test_record_block_gemms_captures_the_four_calls_in_order():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_vit_block_triton import FORMS, make_args

    args = make_args(FORMS[0])
    calls = gpb.record_block_gemms(lambda x: vit_block_triton(x, *args[1:]), args[0])
    assert [tuple(a[1].shape) for a, _ in calls] == [tuple(args[i].shape) for i in (2, 5, 8, 10)]
    assert calls[0][1]["eps"] == args[1] and calls[2][1]["gelu_cols"] == args[10].shape[1]
    assert calls[1][1]["emit_stats"] and calls[3][1]["emit_stats"]
    # Replaying a recorded call reproduces the block's own qkv.
    out = lnl.ln_linear_triton(*calls[0][0], **calls[0][1])
    assert out.shape == args[0].shape[:-1] + (args[2].shape[0],)


def test_sdpa_and_gemm_sections_run(monkeypatch):
    # The sections' own code on the interpreter's tensors, timing and profiling stubbed (they need CUDA): what the
    # device run would otherwise find out first.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_vit_block_triton import FORMS, make_args

    timed = []
    monkeypatch.setattr(gpb, "_bench_us", lambda fn, reps=20: (fn(), timed.append(1), 1.0)[2])
    monkeypatch.setattr(gpb, "_kernel_names", lambda fn: ["k"])
    args = make_args(FORMS[0])
    calls = gpb.record_block_gemms(lambda x: vit_block_triton(x, *args[1:]), args[0])
    rows = gpb.section_gemm(calls)
    assert [r["gemm"] for r in rows] == ["qkv", "proj", "fc1", "fc2"]
    assert all(r["autotuned_us"] == 1.0 and r["cublas_us"] == 1.0 and r["configs"] for r in rows)
    qkv = lnl.ln_linear_triton(*calls[0][0], **calls[0][1])
    sdpa = gpb.section_sdpa(qkv, heads=args[4])
    assert sdpa["default"]["us"] == 1.0 and sdpa["default"]["kernels"] == ["k"]
    # vitfast's Triton attention beside SDPA: autotuned and at every candidate, none failing.
    import vitfast.kernels.attention as ak

    triton_rows = {name: r for name, r in sdpa.items() if name.startswith(("vitfast triton", "triton "))}
    assert len(triton_rows) == 1 + len(ak.candidates()) and all(r.get("us") == 1.0 for r in triton_rows.values())
    assert len(timed) >= 4 * 2 + 1 + len(triton_rows)


def test_kernel_tables_from_profiler_events():
    # Fake profiler events in launch order: two blocks' GEMMs (qkv, proj, fc1, fc2 each) around an attention kernel.
    from types import SimpleNamespace

    def event(name, us):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(elapsed_us=lambda us=us: us))

    events = []
    for block in range(2):
        events += [event("_ln_linear_kernel", 10 + block), event("sdpa", 5), event("_ln_linear_kernel", 20 + block),
                   event("_ln_linear_kernel", 30 + block), event("_ln_linear_kernel", 40 + block)]
    assert gpb._gemm_positions(events) == {"qkv": 10.5, "proj": 20.5, "fc1": 30.5, "fc2": 40.5}
    table = gpb._per_kernel(events, reps=2)
    assert table["_ln_linear_kernel"] == {"calls": 4.0, "us": (10 + 20 + 30 + 40 + 11 + 21 + 31 + 41) / 2}
    assert table["sdpa"] == {"calls": 1.0, "us": 5.0}
    assert isinstance(gpb._autotuner_choices(), dict)


def test_gemm_table_from_a_report():
    report = {"model": "deit_small_patch16_224", "batch": 256, "dtype": "bfloat16",
              "gemm": [{"gemm": "qkv", "m": 100, "n": 30, "k": 20, "epilogue": ["eps"], "autotuned_us": 3.0,
                        "configs": {"a": 4.0, "b": 2.5, "c": "OutOfResources"}, "cublas_us": 1.0},
                       {"gemm": "proj", "m": 100, "n": 20, "k": 20, "epilogue": [], "autotuned_us": 1.0,
                        "configs": {"a": 1.0}, "cublas_us": 2.0}],
              "kernels": {"vitfast blocks": {"k1": {"calls": 1, "us": 30.0}},
                          "inductor fused": {"k2": {"calls": 2, "us": 20.0}}}}
    table = gpb.gemm_table(report, "cmd")
    rows = table["rows"]
    assert [r["ratio"] for r in rows[:2]] == ["3.00× SLOWER", "2.00× faster"]
    assert rows[0]["best"] == "b: 2.5" and rows[1]["epilogue"] == "–"
    assert rows[2]["ratio"] == "inductor max-autotune 20.0 µs: vitfast 1.50× SLOWER"
    assert len(gpb.gemm_table(dict(report, kernels={}), "cmd")["rows"]) == 2


def test_the_sweep_covers_every_candidate_and_the_exploratory_tiles():
    sweep = gpb._sweep(lnl)
    labels = [str(c) for c, _ in sweep]
    assert len(labels) == len(set(labels))
    assert all(str(c) in labels for c in lnl.candidates(tma=True) + lnl.persistent_configs())
    assert sum(explore for _, explore in sweep) == len(gpb.EXPLORE)
