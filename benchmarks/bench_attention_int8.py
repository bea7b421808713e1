"""Benchmark of attention with int8 score and value products (`torch.ops.vitfast.attention_int8`) against the fp32
op (`torch.ops.vitfast.attention`): DeiT-S / DeiT-B shapes (N = 197, head dim 64, 6 / 12 heads), batch 1 and 8.

Providers:
  cpp_fp32  torch.ops.vitfast.attention (C++, fp32 on the GEMM core): the baseline of the ratios
  cpp_int8  torch.ops.vitfast.attention_int8 (C++, int8 core: VNNI / AVX2 / NEON dot / scalar)
  eager     vitfast.reference.attention (SDPA)

test_attention_int8 times each provider on its own (pytest-benchmark medians); test_attention_int8_interleaved
calls them in rotating order, one call each per round, and reports the per-round ratio fp32 / int8 (robust to the
load drift of a shared machine: see harness.run_interleaved).  FLOPs = 4·B·H·N²·D (as bench_attention.py, for
both: the int8 op does the same products on int8).

    .venv/bin/python -m pytest benchmarks/bench_attention_int8.py
"""
from __future__ import annotations

import pytest

from harness import interleaved_rounds, op_provider, run_case, run_interleaved
from shapes import VIT_SHAPES, attention_flops, attention_qkv

PROVIDERS = ["cpp_fp32", "cpp_int8", "eager"]


def provider_fn(provider, case):
    if provider == "cpp_fp32":
        return op_provider("attention", "cpp", case)
    if provider == "cpp_int8":
        return op_provider("attention_int8", "cpp", case)
    if provider == "eager":
        return op_provider("attention", "eager", case)
    raise ValueError(provider)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape_name", ["deit_small", "deit_base"])
def test_attention_int8(benchmark, shape_name, batch, threads, provider):
    shape = VIT_SHAPES[shape_name]
    case = (shape.name, f"b{batch}", f"t{threads}")
    run_case(benchmark, provider_fn(provider, case), (attention_qkv(shape, batch), shape.heads), case, provider,
             attention_flops(shape, batch), threads)


@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape_name", ["deit_small", "deit_base"])
def test_attention_int8_interleaved(benchmark, shape_name, batch, threads):
    """cpp_fp32 (the baseline of the ratios) vs cpp_int8, one call of each per round (the order rotating)."""
    shape = VIT_SHAPES[shape_name]
    case = (shape.name, f"b{batch}", f"t{threads}", "interleaved")
    fns = {p: provider_fn(p, case) for p in ("cpp_fp32", "cpp_int8")}
    flops = attention_flops(shape, batch)
    rounds = interleaved_rounds(flops, threads, 2)
    entry = run_interleaved(benchmark, fns, (attention_qkv(shape, batch), shape.heads), case, threads, flops,
                            rounds=rounds)
    benchmark.extra_info.update({p: v for p, v in entry["providers"].items()})
