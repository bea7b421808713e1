"""Benchmark of multi-head self-attention from packed qkv: providers × DeiT shapes × batch × threads.

Providers (baselines imported from vitfast.reference, so they are the same code the tests trust):
  cpp      torch.ops.vitfast.attention on CPU: heads read straight from qkv [B, N, 3·H·D], written as
           [B, N, H·D] (C++ on the GEMM core, vectorised softmax)
  eager    vitfast.reference.attention: permuted views + F.scaled_dot_product_attention (flash attention for
           CPU) + transpose/reshape back — exactly what the fused block ran before
  compile  torch.compile(vitfast.reference.attention)

N = 197, head dim 64, heads 3/6/12 (DeiT-Ti/S/B).  FLOPs = 4·B·H·N²·D (Q·Kᵀ and P·V).  The terminal summary
prints GFLOP/s, % of the measured sgemm rate and the ratios vs eager and vs compile.

On a GPU (`test_attention_cuda`, bf16, skipped without CUDA), the Triton kernel against SDPA on the same qkv:
  triton   kernels/attention.py attention_triton, autotuned (the Triton block path's attention)
  sdpa     vitfast.reference.attention on CUDA: SDPA on permuted views of qkv (torch picks cuDNN or flash)
  compile  torch.compile of that reference

    .venv/bin/python -m pytest benchmarks/bench_attention.py
"""
from __future__ import annotations

import pytest
import torch

from harness import median_seconds_of, op_provider, record, run_case
from shapes import VIT_SHAPES, attention_flops, attention_qkv
from vitfast import reference

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


CUDA_PROVIDERS = ["triton", "sdpa", "compile"]


def cuda_provider_fn(provider, case):
    if provider == "triton":
        from vitfast.kernels.attention import attention_triton

        base = attention_triton
    else:
        base = reference.attention if provider == "sdpa" else op_provider("attention", "compile", case)

    def fn(qkv, heads):
        out = base(qkv, heads)
        torch.cuda.synchronize()  # time the kernel, not the launch
        return out
    return fn


@pytest.mark.parametrize("provider", CUDA_PROVIDERS)
@pytest.mark.parametrize("batch", [1, 8, 64, 256], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape_name", ["deit_small", "deit_base"])
def test_attention_cuda(benchmark, shape_name, batch, provider):
    if not torch.cuda.is_available():
        pytest.skip("the GPU providers need CUDA")
    shape = VIT_SHAPES[shape_name]
    qkv = attention_qkv(shape, batch).to("cuda", torch.bfloat16)
    case = (shape.name, f"b{batch}", "bfloat16")
    fn = cuda_provider_fn(provider, case)
    with torch.no_grad():
        fn(qkv, shape.heads)  # warm-up: autotunes (triton) / compiles (compile) outside the timed rounds
        benchmark.pedantic(fn, args=(qkv, shape.heads), rounds=20, iterations=1, warmup_rounds=2)
        median = median_seconds_of(benchmark, fn, (qkv, shape.heads))
    benchmark.extra_info.update(record(case, provider, median, attention_flops(shape, batch), 1))
