"""Benchmark of `xwx_heads` (the heads of collapsed non-deep attention from its projection) and of the int8 non-deep
attention it serves (`ProjectedXWXAttention` of a `vitfast.quantize`d model) against the fp32 op.

Shapes: what `vitfast.fuse` produces from a 2-branch non-deep DeiT (as benchmarks/bench_xwx_attention.py): factored
(R = 128, DeiT-S) and full (R = C, DeiT-Ti), values side by side (D = 128), key bias, N = 197.

test_xwx_heads providers (baselines from vitfast.reference, the code the tests trust):
  cpp      torch.ops.vitfast.xwx_heads on CPU (xwx_attention's phases 2-3: packed keys, online softmax over key tiles)
  eager    vitfast.reference.xwx_heads ([B, H, N, N] scores, softmax, P·V)
  compile  torch.compile of that reference
FLOPs = 2·B·H·N²·(left width + D) (scores and P·V).

test_nondeep_attention providers (one whole attention, y → x + attention(y), the block's call):
  fp32     FusedXWXAttention: torch.ops.vitfast.xwx_attention (fp32 projection and output GEMMs inside)
  int8     ProjectedXWXAttention after vitfast.quantize (dynamic per-token int8): linear_int8 → xwx_heads →
           linear_int8 + residual
FLOPs = the fp32 attention's (bench_xwx_attention.xwx_flops), for both.

    .venv/bin/python -m pytest benchmarks/bench_xwx_heads.py -k "t1"
"""
from __future__ import annotations

import pytest
import torch
from bench_xwx_attention import RANK, VALUE_DIM, make_args, xwx_flops
from harness import op_provider, run_case
from shapes import VIT_SHAPES

from vitfast.nn.xwx import FusedXWXAttention, ProjectedXWXAttention


def _fused(shape, form):
    """A FusedXWXAttention holding make_args' weights, and the block input."""
    x, w_q, w_k, kb, w_v, w_o, b_o, _ = make_args(1, shape, form, "cpu")
    attn = FusedXWXAttention(shape.width, shape.heads, form, w_q.shape[2], VALUE_DIM)
    with torch.no_grad():
        for name, value in zip(("w_q", "w_k", "key_bias", "w_v", "w_o", "b_o"), (w_q, w_k, kb, w_v, w_o, b_o)):
            if value is not None:
                getattr(attn, name).copy_(value)
    return attn.eval()


def _heads_args(batch, shape, form):
    attn = _fused(shape, form)
    projected = ProjectedXWXAttention.from_fused(attn)
    x = make_args(batch, shape, form, "cpu")[0]
    with torch.no_grad():
        proj = torch.nn.functional.linear(x, projected.proj_in.weight, projected.proj_in.bias)
    return (proj, x if form == "full" else None, shape.heads, VALUE_DIM), projected


@pytest.mark.parametrize("provider", ["cpp", "eager", "compile"])
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("form", ["factored", "full"])
@pytest.mark.parametrize("shape_name", ["deit_tiny", "deit_small"])
def test_xwx_heads(benchmark, shape_name, form, batch, threads, provider):
    shape = VIT_SHAPES[shape_name]
    args, projected = _heads_args(batch, shape, form)
    left = (args[0].shape[-1] // shape.heads - VALUE_DIM + (shape.width if form == "full" else 0)) // 2
    flops = 2 * batch * shape.heads * shape.tokens ** 2 * (left + VALUE_DIM)
    case = (shape.name, form, f"b{batch}", f"t{threads}")
    run_case(benchmark, op_provider("xwx_heads", provider, case), args, case, provider, flops, threads)


@pytest.mark.parametrize("provider", ["fp32", "int8"])
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("form", ["factored", "full"])
@pytest.mark.parametrize("shape_name", ["deit_tiny", "deit_small"])
def test_nondeep_attention(benchmark, shape_name, form, batch, threads, provider):
    import vitfast

    shape = VIT_SHAPES[shape_name]
    attn = _fused(shape, form)
    if provider == "int8":
        attn = vitfast.quantize(torch.nn.Sequential(attn))[0]  # dynamic per-token int8 proj_in / proj_out
        assert type(attn) is ProjectedXWXAttention
    x = make_args(batch, shape, form, "cpu")[0]
    flops = xwx_flops(batch, shape.tokens, shape.width, shape.heads, shape.width if form == "full" else RANK,
                      VALUE_DIM, form == "full")
    case = (shape.name, form, f"b{batch}", f"t{threads}")
    run_case(benchmark, lambda y: attn(y, residual=y), (x,), case, provider, flops, threads)
