"""Benchmark of the row LayerNorm: providers × DeiT widths × affine or not × batch × threads.

Providers (baselines imported from vitfast.reference, so they are the same code the tests trust):
  cpp         torch.ops.vitfast.layer_norm on CPU (two passes per row, AVX-512 rows in pairs)
  eager       vitfast.reference.layer_norm = F.layer_norm with the same arguments
  eager_unit  plain case only: F.layer_norm with γ = 1, β = 0 — the same function on torch's faster affine path,
              which is what the fused blocks ran before this op (torch's non-affine CPU path is ~2× slower)
  compile     torch.compile(vitfast.reference.layer_norm)

x [B, 197, C], C = 192/384/768 (DeiT-Ti/S/B).  A memory-bound op: the "GFLOP/s" column uses a nominal 8 FLOPs
per element (deviation and sum, deviation² accumulated, normalise, affine) and only compares providers; read
the ratios vs eager and vs compile.

    .venv/bin/python -m pytest benchmarks/bench_layer_norm.py
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness import op_provider, run_case
from shapes import VIT_SHAPES

PROVIDERS = ["cpp", "eager", "eager_unit", "compile"]
FLOPS_PER_ELEMENT = 8


def provider_fn(provider, case):
    fn = op_provider("layer_norm", provider, case)
    if fn is not None:
        return fn
    if provider == "eager_unit":
        units = {}

        def unit_affine(x, weight, bias, eps):
            c = x.shape[-1]
            if c not in units:
                units[c] = (torch.ones(c), torch.zeros(c))
            return F.layer_norm(x, (c,), *units[c], eps)

        return unit_affine
    raise ValueError(provider)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
@pytest.mark.parametrize("shape_name", ["deit_tiny", "deit_small", "deit_base"])
def test_layer_norm(benchmark, shape_name, affine, batch, threads, provider):
    if provider == "eager_unit" and affine:
        pytest.skip("eager_unit is the plain norm on torch's affine path")
    shape = VIT_SHAPES[shape_name]
    g = torch.Generator().manual_seed(0)
    c = shape.width
    x = torch.randn(batch, shape.tokens, c, generator=g)
    weight, bias = (torch.randn(c, generator=g), torch.randn(c, generator=g)) if affine else (None, None)
    case = (shape.name, "affine" if affine else "plain", f"b{batch}", f"t{threads}")
    run_case(benchmark, provider_fn(provider, case), (x, weight, bias, 1e-6), case, provider,
             FLOPS_PER_ELEMENT * x.numel(), threads)
