"""Benchmark of the dense layer y = x·Wᵀ + b (+ residual): providers × the fused ViT's layers × batch × threads.

Providers (baselines imported from vitfast.reference, so they are the same code the tests trust):
  cpp      torch.ops.vitfast.linear on CPU: the C++ GEMM core (weights packed once, cached)
  eager    vitfast.reference.linear: F.linear (MKL/oneDNN addmm) + the residual add
  compile  torch.compile(vitfast.reference.linear)

Layers (benchmarks/shapes.py `linear_layers`): qkv (C → 3C), proj (C → C with the block's shortcut as
residual), head (C → 1000 on the cls tokens, a strided view), and head_cold: the head with its weight evicted
from the caches before every call (a 64 MB pass), as inside a model, where it is memory-bound (the case for
`vitfast.nn.PackedLinear`).  FLOPs = 2·M·K·N.  The terminal summary prints GFLOP/s, % of the measured sgemm
rate and the ratios vs eager and vs compile.

    .venv/bin/python -m pytest benchmarks/bench_linear.py
    .venv/bin/python -m pytest benchmarks/bench_linear.py -k "deit_base and b1 and t1"
"""
from __future__ import annotations

import pytest
import torch

from harness import op_provider, run_case
from shapes import VIT_SHAPES, linear_flops, linear_layers

PROVIDERS = ["cpp", "eager", "compile"]


def make_args(shape, layer, batch):
    k, n, rows, residual = linear_layers(shape)[layer]
    g = torch.Generator().manual_seed(0)
    w = (torch.rand(n, k, generator=g) * 2 - 1) / k**0.5
    b = (torch.rand(n, generator=g) * 2 - 1) / k**0.5
    if layer == "head":
        x = torch.randn(batch, shape.tokens, k, generator=g)[:, 0]  # the cls token, as timm's head reads it
    else:
        x = torch.randn(batch, rows, k, generator=g)
    r = torch.randn(*x.shape[:-1], n, generator=g) if residual else None
    return (x, w, b, r), linear_flops(k, n, batch * rows)


def provider_fn(provider, case):
    fn = op_provider("linear", provider, case)
    if fn is not None:
        return fn
    raise ValueError(provider)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("layer", ["qkv", "proj", "head", "head_cold"])
@pytest.mark.parametrize("shape_name", ["deit_tiny", "deit_small", "deit_base"])
def test_linear(benchmark, shape_name, layer, batch, threads, provider):
    shape = VIT_SHAPES[shape_name]
    cold = layer == "head_cold"
    args, flops = make_args(shape, "head" if cold else layer, batch)
    case = (shape.name, layer, f"b{batch}", f"t{threads}")
    buffer = torch.empty(16 << 20) if cold else None  # 64 MB: twice this machine's L3
    evict = (lambda: buffer.fill_(1.0)) if cold else None
    run_case(benchmark, provider_fn(provider, case), args, case, provider, flops, threads, evict=evict)
