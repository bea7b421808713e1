"""Benchmark of bf16 compute on CPUs with a bf16 extension (csrc/kernels/gemm_bf16.h) against fp32, same kernels' tier.

Each case calls the fp32 op and the same op on the bf16 conversions of its arguments in alternation
(harness.run_interleaved: fp32 is the baseline, so `ratio_median` = fp32 time / bf16 time), and records the bf16
result's relative error against fp32 (‖bf16 − fp32‖ / ‖fp32‖) in extra_info:

  ops     linear (qkv, proj with its residual), channel_idle_ffn, attention, vit_block (RePaViT θ = 0.75, BN variant)
          at DeiT-S / DeiT-B shapes, batch 1, one thread
  model   a fused RePa-DeiT-S/0.75 and RePa-DeiT-B/0.75 (timm random weights, vitfast.convert.from_timm + fuse),
          batch 1, one thread: the fp32 model against its `.to(torch.bfloat16)` copy

Without a bf16 extension (`vitfast._C.bf16_kernel() == "none"`) the bf16 side is today's fp32 compute of bf16
inputs: the cases still run (and show its conversion cost), the summary says which kernel ran.

    .venv/bin/python -m pytest benchmarks/bench_bf16_cpu.py
    .venv/bin/python -m pytest benchmarks/bench_bf16_cpu.py -k model
"""
from __future__ import annotations

import copy

import pytest
import timm
import torch

import vitfast
from harness import run_interleaved
from shapes import VIT_SHAPES, attention_flops, channel_idle_dims, channel_idle_ffn_flops, linear_flops

THETA = 0.75
THREADS = 1


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _bf16(args):
    return tuple(a.to(torch.bfloat16) if isinstance(a, torch.Tensor) else a for a in args)


def _uni(g, *s, fan_in):
    return (torch.rand(*s, generator=g) * 2 - 1) / fan_in**0.5


def op_case(shape, op):
    """(function, fp32 args, flops) of one op at this shape, batch 1."""
    g = torch.Generator().manual_seed(0)
    c, n = shape.width, shape.tokens
    x = torch.randn(1, n, c, generator=g)
    if op == "qkv":
        return torch.ops.vitfast.linear, (x, _uni(g, 3 * c, c, fan_in=c), _uni(g, 3 * c, fan_in=c), None), \
            linear_flops(c, 3 * c, n)
    if op == "proj":
        return torch.ops.vitfast.linear, (x, _uni(g, c, c, fan_in=c), _uni(g, c, fan_in=c), x.clone()), \
            linear_flops(c, c, n)
    if op == "channel_idle_ffn":
        active, linear = channel_idle_dims(shape, THETA)
        args = (x, _uni(g, active + linear, c, fan_in=c), _uni(g, active + linear, fan_in=c),
                _uni(g, c, active, fan_in=active), _uni(g, c, fan_in=active), None)
        return torch.ops.vitfast.channel_idle_ffn, args, channel_idle_ffn_flops(shape, THETA, 1)
    if op == "attention":
        return torch.ops.vitfast.attention, (torch.randn(1, n, 3 * c, generator=g), shape.heads, None), \
            attention_flops(shape, 1)
    if op == "vit_block":
        active, linear = channel_idle_dims(shape, THETA)
        args = (x, 1e-6, _uni(g, 3 * c, c, fan_in=c), _uni(g, 3 * c, fan_in=c), shape.heads, _uni(g, c, c, fan_in=c),
                _uni(g, c, fan_in=c), None, _uni(g, active + linear, c, fan_in=c), _uni(g, active + linear, fan_in=c),
                _uni(g, c, active, fan_in=active), _uni(g, c, fan_in=active), False)
        flops = (linear_flops(c, 3 * c, n) + attention_flops(shape, 1) + linear_flops(c, c, n)
                 + channel_idle_ffn_flops(shape, THETA, 1))
        return torch.ops.vitfast.vit_block, args, flops
    raise ValueError(op)


@pytest.mark.parametrize("op", ["qkv", "proj", "channel_idle_ffn", "attention", "vit_block"])
@pytest.mark.parametrize("shape_name", ["deit_small", "deit_base"])
def test_op_bf16_vs_fp32(benchmark, shape_name, op):
    shape = VIT_SHAPES[shape_name]
    fn, args, flops = op_case(shape, op)
    args16 = _bf16(args)
    case = (shape.name, op, "b1", f"t{THREADS}", "bf16_vs_fp32")
    entry = run_interleaved(benchmark, {"fp32": lambda *_: fn(*args), "bf16": lambda *_: fn(*args16)}, (), case,
                            THREADS, flops, rounds=60)
    with torch.no_grad():
        err = _rel(fn(*args16), fn(*args))
    benchmark.extra_info.update({"bf16_kernel": vitfast._C.bf16_kernel(), "rel_err": err,
                                 **{p: v for p, v in entry["providers"].items()}})


MODELS = {"repa_deit_s": "deit_small_patch16_224", "repa_deit_b": "deit_base_patch16_224"}


@pytest.mark.parametrize("model_name", list(MODELS))
def test_model_bf16_vs_fp32(benchmark, model_name):
    """Fused RePa-DeiT/0.75 (BN variant) at batch 1, one thread: fp32 model vs its bf16 copy, interleaved."""
    torch.manual_seed(0)
    base = timm.create_model(MODELS[model_name], pretrained=False).eval()
    fused = vitfast.fuse(vitfast.convert.from_timm(base, channel_idle=THETA, norm="batch")).eval()
    del base
    half = copy.deepcopy(fused).to(torch.bfloat16)
    x = torch.randn(1, 3, 224, 224)
    x16 = x.to(torch.bfloat16)
    case = (model_name, f"theta{THETA}", "b1", f"t{THREADS}", "bf16_vs_fp32")
    entry = run_interleaved(benchmark, {"fp32": lambda: fused(x), "bf16": lambda: half(x16)}, (), case, THREADS,
                            0, rounds=20 if model_name == "repa_deit_b" else 40)
    with torch.no_grad():
        err = _rel(half(x16), fused(x))
    benchmark.extra_info.update({"bf16_kernel": vitfast._C.bf16_kernel(), "rel_err": err,
                                 **{p: v for p, v in entry["providers"].items()}})
