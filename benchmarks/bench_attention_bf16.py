"""Benchmark of attention with bf16 score and value products on fp32 qkv (`torch.ops.vitfast.attention_bf16`, what
`vitfast.quantize(..., attention="bf16")` gives an int8 model) against the fp32 op and the int8 one: DeiT-S / DeiT-B
shapes (N = 197, head dim 64, 6 / 12 heads), batch 1 and 8.

Providers:
  cpp_fp32  torch.ops.vitfast.attention (C++, fp32 on the GEMM core): the baseline of the ratios
  cpp_int8  torch.ops.vitfast.attention_int8 (C++, int8 core)
  cpp_bf16  torch.ops.vitfast.attention_bf16 (C++, the bf16 GEMMs: AMX / AVX512_BF16 / ARM BF16; without any, the
            portable bf16 kernel, far slower: `vitfast.ops.bf16_kernel()` says which)

test_attention_bf16 times each provider on its own (pytest-benchmark medians); test_attention_bf16_interleaved calls
the three in rotating order, one call each per round, and reports per-round ratios (harness.run_interleaved).
FLOPs = 4·B·H·N²·D, as bench_attention.py.

    .venv/bin/python -m pytest benchmarks/bench_attention_bf16.py
"""
from __future__ import annotations

import pytest

from harness import interleaved_rounds, op_provider, run_case, run_interleaved
from shapes import VIT_SHAPES, attention_flops, attention_qkv

PROVIDERS = ["cpp_fp32", "cpp_int8", "cpp_bf16"]
_OPS = {"cpp_fp32": "attention", "cpp_int8": "attention_int8", "cpp_bf16": "attention_bf16"}


def provider_fn(provider, case):
    if provider not in _OPS:
        raise ValueError(provider)
    return op_provider(_OPS[provider], "cpp", case)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape_name", ["deit_small", "deit_base"])
def test_attention_bf16(benchmark, shape_name, batch, threads, provider):
    shape = VIT_SHAPES[shape_name]
    case = (shape.name, f"b{batch}", f"t{threads}")
    run_case(benchmark, provider_fn(provider, case), (attention_qkv(shape, batch), shape.heads), case, provider,
             attention_flops(shape, batch), threads)


@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape_name", ["deit_small", "deit_base"])
def test_attention_bf16_interleaved(benchmark, shape_name, batch, threads):
    """cpp_fp32 (the baseline of the ratios) vs cpp_int8 vs cpp_bf16, one call of each per round."""
    shape = VIT_SHAPES[shape_name]
    case = (shape.name, f"b{batch}", f"t{threads}", "interleaved")
    fns = {p: provider_fn(p, case) for p in PROVIDERS}
    flops = attention_flops(shape, batch)
    rounds = interleaved_rounds(flops, threads, 3)
    entry = run_interleaved(benchmark, fns, (attention_qkv(shape, batch), shape.heads), case, threads, flops,
                            rounds=rounds)
    benchmark.extra_info.update({p: v for p, v in entry["providers"].items()})
