"""Benchmark of `linear_int8` against the fp32 op it replaces in an int8 model (`vitfast.quantize`): the fused ViT's
dense layers (qkv, proj), × batch × threads.  The FFN: benchmarks/bench_channel_idle_ffn_int8.py (same providers).

Providers:
  cpp      torch.ops.vitfast.linear_int8 (or channel_idle_ffn_int8: the int8 core, csrc/kernels/gemm_int8.h: AMX, VNNI
           (AVX-512 or, on the AVX2 path, AVX-VNNI),
           AVX2, NEON dot product or scalar, as this CPU runs; activations quantized per token inside the op)
  fp32     torch.ops.vitfast.linear / channel_idle_ffn: the fp32 C++ ops of the same fused model (the anchor an int8
           op must beat; printed as "vs eager" in the summary table)
  eager    vitfast.reference of the fp32 op (MKL/oneDNN), for the usual eager column

FLOPs counted as for fp32 (2·M·K·N): GFLOP/s here are "GOP/s".  The model-level comparison with ONNX Runtime's
int8 and OpenVINO is `vitfast bench` (providers ort-int8, ort-qdq, openvino, vitfast-int8).

    .venv/bin/python -m pytest benchmarks/bench_linear_int8.py -k "deit_small and b1 and t1"
"""
from __future__ import annotations

import pytest
import torch

import vitfast
from harness import run_case
from shapes import VIT_SHAPES, channel_idle_dims, channel_idle_ffn_flops, linear_flops, linear_layers
from vitfast import reference
from vitfast.reference._int8 import quantize_weight

PROVIDERS = ["cpp", "fp32", "eager"]


def _linear_case(shape, layer, batch):
    k, n, rows, residual = linear_layers(shape)[layer]
    g = torch.Generator().manual_seed(0)
    w, b = (torch.rand(n, k, generator=g) * 2 - 1) / k**0.5, (torch.rand(n, generator=g) * 2 - 1) / k**0.5
    x = torch.randn(batch, rows, k, generator=g)
    r = torch.randn(batch, rows, n, generator=g) if residual else None
    qw, sw = quantize_weight(w)
    return (x, qw, sw, b, r), (x, w, b, r), linear_flops(k, n, batch * rows)


def _ffn_case(shape, batch, theta=0.75):
    active, linear = channel_idle_dims(shape, theta)
    c = shape.width
    g = torch.Generator().manual_seed(0)
    w_in = (torch.rand(active + linear, c, generator=g) * 2 - 1) / c**0.5
    w_out = (torch.rand(c, active, generator=g) * 2 - 1) / active**0.5
    b_in, b_out = torch.randn(active + linear, generator=g) * 0.02, torch.randn(c, generator=g) * 0.02
    x = torch.randn(batch, shape.tokens, c, generator=g)
    (qi, si), (qo, so) = quantize_weight(w_in), quantize_weight(w_out)
    return ((x, qi, si, b_in, qo, so, b_out, None), (x, w_in, b_in, w_out, b_out, None),
            channel_idle_ffn_flops(shape, theta, batch))


def _fn(provider, name):
    if provider == "cpp":
        if not vitfast.ops.extension_loaded() or f"{name}_int8" in vitfast.ops._REFERENCE_CPU_FALLBACKS:
            pytest.fail(f"the C++ {name}_int8 kernel is not built: the cpp provider would measure the reference")
        return getattr(torch.ops.vitfast, f"{name}_int8")
    return getattr(torch.ops.vitfast, name) if provider == "fp32" else getattr(reference, name)


def run_int8_case(benchmark, shape_name, layer, batch, threads, provider):
    """One case of this file or of bench_channel_idle_ffn_int8.py (layer "ffn")."""
    shape = VIT_SHAPES[shape_name]
    int8_args, fp32_args, flops = _ffn_case(shape, batch) if layer == "ffn" else _linear_case(shape, layer, batch)
    name = "channel_idle_ffn" if layer == "ffn" else "linear"
    # the summary's "eager" column is the anchor: the fp32 C++ op (provider fp32) is recorded under "eager"
    recorded = {"cpp": "cpp", "fp32": "eager", "eager": "compile"}[provider]
    args = int8_args if provider == "cpp" else fp32_args
    case = (shape.name, f"{layer}-int8", f"b{batch}", f"t{threads}")
    run_case(benchmark, _fn(provider, name), args, case, recorded, flops, threads)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("layer", ["qkv", "proj"])
@pytest.mark.parametrize("shape_name", ["deit_small", "deit_base"])
def test_linear_int8(benchmark, shape_name, layer, batch, threads, provider):
    run_int8_case(benchmark, shape_name, layer, batch, threads, provider)
