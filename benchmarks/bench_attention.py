"""Benchmark of multi-head self-attention from packed qkv: providers × DeiT shapes × batch × threads.

Providers (baselines imported from vitfast.reference, so they are the same code the tests trust):
  cpp      torch.ops.vitfast.attention on CPU: heads read straight from qkv [B, N, 3·H·D], written as
           [B, N, H·D] (C++ on the GEMM core, vectorised softmax)
  eager    vitfast.reference.attention: permuted views + F.scaled_dot_product_attention (flash attention for
           CPU) + transpose/reshape back — exactly what the fused block ran before
  compile  torch.compile(vitfast.reference.attention)

N = 197, head dim 64, heads 3/6/12 (DeiT-Ti/S/B).  FLOPs = 4·B·H·N²·D (Q·Kᵀ and P·V).  The terminal summary
prints GFLOP/s, % of the measured sgemm rate and the ratios vs eager and vs compile.

    .venv/bin/python -m pytest benchmarks/bench_attention.py
"""
from __future__ import annotations

import pytest

from harness import op_provider, run_case
from shapes import VIT_SHAPES, attention_flops, attention_qkv

PROVIDERS = ["cpp", "eager", "compile"]


def provider_fn(provider, case):
    fn = op_provider("attention", provider, case)
    if fn is not None:
        return fn
    raise ValueError(provider)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape_name", ["deit_tiny", "deit_small", "deit_base"])
def test_attention(benchmark, shape_name, batch, threads, provider):
    shape = VIT_SHAPES[shape_name]
    qkv = attention_qkv(shape, batch)
    case = (shape.name, f"b{batch}", f"t{threads}")
    run_case(benchmark, provider_fn(provider, case), (qkv, shape.heads), case, provider,
             attention_flops(shape, batch), threads)
