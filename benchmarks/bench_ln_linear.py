"""Benchmark of the LayerNorm-folded GEMM of the Triton block path (kernels/ln_linear.py): the fused block's GEMMs
with their epilogues, against the composition they replace.

Providers (the baselines are vitfast.reference.ln_linear, the oracle the parity tests use):
  eager    vitfast.reference.ln_linear: F.layer_norm + F.linear (cuBLAS on CUDA) + GELU split + adds
  compile  torch.compile(vitfast.reference.ln_linear)
  triton   ln_linear_triton, autotuned over its candidates (CUDA only; skipped elsewhere)

Layers (RePa-DeiT θ = 0.75, LN variant): qkv (LN folded, bias), fc1 (LN folded, bias, split-GELU over the C
active columns) and fc2 (bias, the linear path added, the shortcut, the next LayerNorm's statistics emitted).
All providers run on the GPU when there is one (bf16); without one the reference providers run on the CPU (fp32,
batch 1 only) so that the file stays a smoke test there.  FLOPs = 2·M·K·N (benchmarks/shapes.py).

    .venv/bin/python -m pytest benchmarks/bench_ln_linear.py
    .venv/bin/python -m pytest benchmarks/bench_ln_linear.py -k "deit_base and qkv"
"""
from __future__ import annotations

import pytest
import torch
from harness import median_seconds_of, op_provider, record
from shapes import VIT_SHAPES, channel_idle_dims, linear_flops

from vitfast import reference

PROVIDERS = ["eager", "compile", "triton"]
CUDA = torch.cuda.is_available()
EPS = 1e-6


def make_args(shape, layer, batch, device, dtype):
    """(x, weight, bias, kwargs) of one of the block's GEMMs as the Triton block path calls it."""
    c = shape.width
    active, linear = channel_idle_dims(shape, 0.75)
    k, n = {"qkv": (c, 3 * c), "fc1": (c, active + linear), "fc2": (active, c)}[layer]
    g = torch.Generator().manual_seed(0)
    rows = batch * shape.tokens

    def t(*s, scale=1.0):
        return (torch.randn(*s, generator=g) * scale).to(device, dtype)

    x, w, b = t(rows, k), t(n, k, scale=k ** -0.5), t(n)
    kwargs = {"qkv": {"eps": EPS}, "fc1": {"eps": EPS, "gelu_cols": active},
              "fc2": {"add": t(rows, n), "residual": t(rows, n)}}[layer]
    return x, w, b, kwargs


def provider_fn(provider, case, layer):
    sync = torch.cuda.synchronize if CUDA else (lambda: None)
    if provider == "triton":
        from vitfast.kernels.ln_linear import ln_linear_triton

        emit = layer == "fc2"  # the residual epilogue hands the next LayerNorm its statistics

        def fn(x, w, b, kwargs):
            out = ln_linear_triton(x, w, b, emit_stats=emit, **kwargs)
            sync()  # time the kernel, not the launch
            return out
        return fn
    base = op_provider("ln_linear", provider, case)

    def fn(x, w, b, kwargs):
        out = base(x, w, b, **kwargs)
        sync()
        return out
    return fn


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("batch", [1, 8, 64], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("layer", ["qkv", "fc1", "fc2"])
@pytest.mark.parametrize("shape_name", ["deit_small", "deit_base"])
def test_ln_linear(benchmark, shape_name, layer, batch, provider):
    if provider == "triton" and not CUDA:
        pytest.skip("the triton provider needs CUDA")
    if not CUDA and batch > 1:
        pytest.skip("without CUDA only the reference providers at batch 1 run (a smoke test)")
    shape = VIT_SHAPES[shape_name]
    device, dtype = ("cuda", torch.bfloat16) if CUDA else ("cpu", torch.float32)
    x, w, b, kwargs = make_args(shape, layer, batch, device, dtype)
    case = (shape.name, layer, f"b{batch}", str(dtype).split(".")[-1])
    fn = provider_fn(provider, case, layer)
    args = (x, w, b, kwargs)
    with torch.no_grad():
        fn(*args)  # warm-up: autotunes (triton) / compiles (compile) outside the timed rounds
        fn(*args)
        benchmark.pedantic(fn, args=args, rounds=20, iterations=1, warmup_rounds=2)
        median = median_seconds_of(benchmark, fn, args)
    flops = linear_flops(x.shape[-1], w.shape[0], x.shape[0])
    benchmark.extra_info.update(record(case, provider, median, flops, torch.get_num_threads()))


def test_reference_is_the_kernels_formula():
    # The providers time one formula: the reference's epilogue terms are the launcher's keyword arguments.
    x, w, b, kwargs = make_args(VIT_SHAPES["deit_tiny"], "fc1", 1, "cpu", torch.float32)
    out = reference.ln_linear(x, w, b, **kwargs)
    assert out.shape == (x.shape[0], w.shape[0]) and torch.isfinite(out).all()
