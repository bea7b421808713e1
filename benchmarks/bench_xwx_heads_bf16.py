"""Benchmark of `xwx_heads_bf16` (the heads of collapsed non-deep attention with bf16-operand score and value products,
fp32 sums) against `xwx_heads` (fp32 products) and `xwx_heads_int8`: what an int8 model's non-deep attention gains
with `vitfast.quantize(attention="bf16")`, the accurate one of the two low-precision products.

Shapes and providers as benchmarks/bench_xwx_heads_int8.py (cpp_fp32 the baseline of the ratios), plus:
  cpp_bf16  torch.ops.vitfast.xwx_heads_bf16 (attention_bf16's head on the projection's strided operands; the
            portable bf16 kernel on a CPU without a bf16 extension, which is slower than fp32)
  eager     vitfast.reference.xwx_heads_bf16

    .venv/bin/python -m pytest benchmarks/bench_xwx_heads_bf16.py -k "t1"
"""
from __future__ import annotations

import pytest
from bench_xwx_heads_int8 import bench_interleaved, bench_one
from harness import op_provider

PROVIDERS = ["cpp_fp32", "cpp_bf16", "cpp_int8", "eager"]


def provider_fn(provider, case):
    name = {"cpp_fp32": "xwx_heads", "cpp_bf16": "xwx_heads_bf16", "cpp_int8": "xwx_heads_int8"}.get(provider)
    if name is not None:
        return op_provider(name, "cpp", case)
    if provider == "eager":
        return op_provider("xwx_heads_bf16", "eager", case)
    raise ValueError(provider)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("form", ["factored", "full"])
@pytest.mark.parametrize("shape_name", ["deit_tiny", "deit_small"])
def test_xwx_heads_bf16(benchmark, shape_name, form, batch, threads, provider):
    bench_one(benchmark, provider_fn, shape_name, form, batch, threads, provider)


@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("form", ["factored", "full"])
@pytest.mark.parametrize("shape_name", ["deit_tiny", "deit_small"])
def test_xwx_heads_bf16_interleaved(benchmark, shape_name, form, batch, threads):
    """cpp_fp32 (the baseline of the ratios) vs cpp_bf16 vs cpp_int8, one call of each per round (rotating order)."""
    bench_interleaved(benchmark, provider_fn, ("cpp_fp32", "cpp_bf16", "cpp_int8"), shape_name, form, batch, threads)
