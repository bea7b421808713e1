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
    monkeypatch.setattr(gpb, "_bench_us", lambda fn: (fn(), timed.append(1), 1.0)[2])
    monkeypatch.setattr(gpb, "_kernel_names", lambda fn: ["k"])
    args = make_args(FORMS[0])
    calls = gpb.record_block_gemms(lambda x: vit_block_triton(x, *args[1:]), args[0])
    rows = gpb.section_gemm(calls)
    assert [r["gemm"] for r in rows] == ["qkv", "proj", "fc1", "fc2"]
    assert all(r["autotuned_us"] == 1.0 and r["cublas_us"] == 1.0 and r["configs"] for r in rows)
    qkv = lnl.ln_linear_triton(*calls[0][0], **calls[0][1])
    sdpa = gpb.section_sdpa(qkv, heads=args[4])
    assert sdpa["default"]["us"] == 1.0 and sdpa["default"]["kernels"] == ["k"]
    assert len(timed) >= 4 * 2 + 1
