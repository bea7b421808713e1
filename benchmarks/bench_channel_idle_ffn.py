"""Benchmark of the channel-idle FFN (RePaViT eq. 6): providers × ViT shapes × θ × batch × threads.

Providers (baselines imported from vitfast.reference, so they are the same code the tests trust):
  cpp      torch.ops.vitfast.channel_idle_ffn on CPU: the C++ kernel (weights packed once, cached)
  eager    vitfast.reference.channel_idle_ffn: F.linear (MKL/oneDNN sgemm) + F.gelu + slicing/adds
  compile  torch.compile(vitfast.reference.channel_idle_ffn)
  triton   the Triton kernel on CUDA (skipped without a GPU)

FLOPs = 2·M·C·(A + L) + 2·M·A·C (benchmarks/shapes.py).  Reported per case: median ms, GFLOP/s, % of the
measured sgemm rate (torch.mm 2048³ fp32 at the same thread count), and the ratio vs eager and vs compile
(terminal summary at the end of the run; also in pytest-benchmark's extra_info / --benchmark-json).

`test_channel_idle_ffn_interleaved` calls cpp, eager and compile in alternation (harness.run_interleaved): its
ratios compare calls made milliseconds apart, the robust figure on a shared machine whose clock drifts.

    .venv/bin/python -m pytest benchmarks/bench_channel_idle_ffn.py
    .venv/bin/python -m pytest benchmarks/bench_channel_idle_ffn.py -k "deit_base and theta0.75 and b1 and t1"
    .venv/bin/python -m pytest benchmarks/bench_channel_idle_ffn.py -k interleaved
"""
from __future__ import annotations

import pytest
import torch

from harness import median_seconds_of, op_provider, record, run_interleaved
from shapes import VIT_SHAPES, channel_idle_dims, channel_idle_ffn_flops

PROVIDERS = ["cpp", "eager", "compile", "triton"]


def make_args(shape, theta, batch, device="cpu"):
    active, linear = channel_idle_dims(shape, theta)
    c = shape.width
    g = torch.Generator().manual_seed(0)

    def uni(*s, fan_in):
        return ((torch.rand(*s, generator=g) * 2 - 1) / fan_in**0.5).to(device)

    x = torch.randn(batch, shape.tokens, c, generator=g).to(device)
    return (x, uni(active + linear, c, fan_in=c), uni(active + linear, fan_in=c), uni(c, active, fan_in=active),
            uni(c, fan_in=active), None)


def provider_fn(provider, case):
    fn = op_provider("channel_idle_ffn", provider, case)
    if fn is not None:
        return fn
    if provider == "triton":
        from vitfast.kernels.channel_idle_ffn import channel_idle_ffn_triton

        def run(*args):
            out = channel_idle_ffn_triton(*args)
            torch.cuda.synchronize()  # time the kernel, not the launch
            return out

        return run
    raise ValueError(provider)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("theta", [0.5, 0.75], ids=lambda t: f"theta{t}")
@pytest.mark.parametrize("shape_name", ["deit_small", "deit_base"])
def test_channel_idle_ffn(benchmark, shape_name, theta, batch, threads, provider):
    if provider == "triton" and not torch.cuda.is_available():
        pytest.skip("triton provider needs CUDA")
    shape = VIT_SHAPES[shape_name]
    device = "cuda" if provider == "triton" else "cpu"
    args = make_args(shape, theta, batch, device)
    case = (shape.name, f"theta{theta}", f"b{batch}", f"t{threads}")
    fn = provider_fn(provider, case)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            fn(*args)  # warm-up: packs the weights (cpp) / compiles (compile) outside the timed rounds
            fn(*args)
            # ~1.5 s of rounds per case: enough for a stable median on a shared 2-core machine.
            t_est = max(channel_idle_ffn_flops(shape, theta, batch) / 50e9 / threads, 1e-4)
            rounds = int(min(60, max(7, 1.5 / t_est)))
            benchmark.pedantic(fn, args=args, rounds=rounds, iterations=1, warmup_rounds=1)
            median = median_seconds_of(benchmark, fn, args)
    finally:
        torch.set_num_threads(previous)
    benchmark.extra_info.update(
        record(case, provider, median, channel_idle_ffn_flops(shape, theta, batch), threads)
    )


@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape_name", ["deit_small", "deit_base"])
def test_channel_idle_ffn_interleaved(benchmark, shape_name, batch, threads):
    """cpp vs eager vs compile at θ = 0.75, one call of each per round (the order rotating)."""
    shape = VIT_SHAPES[shape_name]
    args = make_args(shape, 0.75, batch)
    case = (shape.name, "theta0.75", f"b{batch}", f"t{threads}")
    fns = {p: provider_fn(p, case) for p in ("eager", "cpp", "compile")}
    flops = channel_idle_ffn_flops(shape, 0.75, batch)
    # ~4 s per case: each round holds all three providers.
    rounds = int(min(150, max(15, 4.0 / (3 * max(flops / 50e9 / threads, 1e-4)))))
    entry = run_interleaved(benchmark, fns, args, case, threads, flops, rounds=rounds)
    benchmark.extra_info.update({p: v for p, v in entry["providers"].items()})
