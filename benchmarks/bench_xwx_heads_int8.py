"""Benchmark of `xwx_heads_int8` (the heads of collapsed non-deep attention with int8 score and value products)
against `xwx_heads` (the same heads, fp32 products): what an int8 non-deep model's attention gains when
`vitfast.quantize(attention=...)` puts its products on int8.

Shapes: as benchmarks/bench_xwx_heads.py (a 2-branch non-deep DeiT after `vitfast.fuse`: factored R = 128, full
R = C; D = 128, key bias, N = 197).

Providers:
  cpp_fp32  torch.ops.vitfast.xwx_heads (fp32 products on the GEMM core): the baseline of the ratios
  cpp_int8  torch.ops.vitfast.xwx_heads_int8 (attention_int8's head on the projection's strided operands)
  eager     vitfast.reference.xwx_heads_int8 (the formula the tests trust)

test_xwx_heads_int8 times each provider on its own; test_xwx_heads_int8_interleaved calls the two kernels in
rotating order, one call each per round, and reports the per-round ratio fp32 / int8 (harness.run_interleaved).
FLOPs = 2·B·H·N²·(left width + D), as bench_xwx_heads.py, for all three.

    .venv/bin/python -m pytest benchmarks/bench_xwx_heads_int8.py -k "t1"
"""
from __future__ import annotations

import pytest
from bench_xwx_heads import VALUE_DIM, _heads_args
from harness import interleaved_rounds, op_provider, run_case, run_interleaved
from shapes import VIT_SHAPES

PROVIDERS = ["cpp_fp32", "cpp_int8", "eager"]


def provider_fn(provider, case):
    if provider == "cpp_fp32":
        return op_provider("xwx_heads", "cpp", case)
    if provider == "cpp_int8":
        return op_provider("xwx_heads_int8", "cpp", case)
    if provider == "eager":
        return op_provider("xwx_heads_int8", "eager", case)
    raise ValueError(provider)


def _case(shape_name, form, batch):
    shape = VIT_SHAPES[shape_name]
    args, _ = _heads_args(batch, shape, form)
    left = (args[0].shape[-1] // shape.heads - VALUE_DIM + (shape.width if form == "full" else 0)) // 2
    return shape, args, 2 * batch * shape.heads * shape.tokens ** 2 * (left + VALUE_DIM)


def bench_one(benchmark, provider_fn, shape_name, form, batch, threads, provider):
    """One provider timed on its own (the test bodies of this file and bench_xwx_heads_bf16.py)."""
    shape, args, flops = _case(shape_name, form, batch)
    case = (shape.name, form, f"b{batch}", f"t{threads}")
    run_case(benchmark, provider_fn(provider, case), args, case, provider, flops, threads)


def bench_interleaved(benchmark, provider_fn, providers, shape_name, form, batch, threads):
    """`providers` (the first the baseline of the ratios) one call each per round, the order rotating."""
    shape, args, flops = _case(shape_name, form, batch)
    case = (shape.name, form, f"b{batch}", f"t{threads}", "interleaved")
    fns = {p: provider_fn(p, case) for p in providers}
    entry = run_interleaved(benchmark, fns, args, case, threads, flops,
                            rounds=interleaved_rounds(flops, threads, len(providers)))
    benchmark.extra_info.update({p: v for p, v in entry["providers"].items()})


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("form", ["factored", "full"])
@pytest.mark.parametrize("shape_name", ["deit_tiny", "deit_small"])
def test_xwx_heads_int8(benchmark, shape_name, form, batch, threads, provider):
    bench_one(benchmark, provider_fn, shape_name, form, batch, threads, provider)


@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("form", ["factored", "full"])
@pytest.mark.parametrize("shape_name", ["deit_tiny", "deit_small"])
def test_xwx_heads_int8_interleaved(benchmark, shape_name, form, batch, threads):
    """cpp_fp32 (the baseline of the ratios) vs cpp_int8, one call of each per round (the order rotating)."""
    bench_interleaved(benchmark, provider_fn, ("cpp_fp32", "cpp_int8"), shape_name, form, batch, threads)
