"""Benchmark of `dwconv_heads` (the drop-in DW-conv heads on their values) and of the int8 DW-conv block attention it
serves (`FusedDWConvBlock` of a `vitfast.quantize`d model: value → dwconv_heads → out_proj on int8 GEMMs) against
the fp32 fused op.

Shapes: DeiT-S and DeiT-B widths at 224 px (a 14 × 14 grid and a cls token), every head replaced (D = C), k = 3.

test_dwconv_heads providers (baselines from vitfast.reference):
  cpp      torch.ops.vitfast.dwconv_heads on CPU (dwconv_attention's per-row convolution kernels)
  eager    vitfast.reference.dwconv_heads (F.conv2d depthwise, grid mean for the prefix)
  compile  torch.compile of that reference
FLOPs = 2·B·HW·D·k² (the convolution).

test_dwconv_block_attention providers (one block's attention side, x → x + heads(LN(x)) without the FFN):
  fp32     torch.ops.vitfast.dwconv_attention (the fused op: both GEMMs fp32 inside)
  int8     Int8Linear value (dynamic per-token int8) → dwconv_heads → Int8Linear out_proj + residual
FLOPs = the fp32 op's: 2·B·N·C·D · 2 + 2·B·HW·D·k².

    .venv/bin/python -m pytest benchmarks/bench_dwconv_heads.py -k "t1"
"""
from __future__ import annotations

import pytest
import torch
from harness import op_provider, run_case
from shapes import VIT_SHAPES

import vitfast
from vitfast.nn.int8 import Int8Linear

KSIZE = 3


def _grid(shape):
    side = int(round((shape.tokens - 1) ** 0.5))
    assert side * side + 1 == shape.tokens, shape
    return side


@pytest.mark.parametrize("provider", ["cpp", "eager", "compile"])
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape_name", ["deit_small", "deit_base"])
def test_dwconv_heads(benchmark, shape_name, batch, threads, provider):
    shape = VIT_SHAPES[shape_name]
    side, width = _grid(shape), shape.width
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(batch, shape.tokens, width, generator=g), torch.randn(width, KSIZE, KSIZE, generator=g) / 3,
            side, side)
    flops = 2 * batch * side * side * width * KSIZE * KSIZE
    case = (shape.name, f"b{batch}", f"t{threads}")
    run_case(benchmark, op_provider("dwconv_heads", provider, case), args, case, provider, flops, threads)


@pytest.mark.parametrize("provider", ["fp32", "int8"])
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape_name", ["deit_small", "deit_base"])
def test_dwconv_block_attention(benchmark, shape_name, batch, threads, provider):
    shape = VIT_SHAPES[shape_name]
    side, c = _grid(shape), shape.width
    g = torch.Generator().manual_seed(0)
    value, out_proj = torch.nn.Linear(c, c), torch.nn.Linear(c, c)
    kernel = torch.randn(c, KSIZE, KSIZE, generator=g) / 3
    x = torch.randn(batch, shape.tokens, c, generator=g)
    if provider == "fp32":
        def fn(y):
            return vitfast.ops.dwconv_attention(y, value.weight, value.bias, kernel, out_proj.weight, out_proj.bias,
                                                side, side, y)
    else:
        q_value, q_out = Int8Linear.from_linear(value), Int8Linear.from_linear(out_proj)

        def fn(y):
            return q_out(vitfast.ops.dwconv_heads(q_value(y), kernel, side, side), y)
    flops = 4 * batch * shape.tokens * c * c + 2 * batch * side * side * c * KSIZE * KSIZE
    case = (shape.name, f"b{batch}", f"t{threads}")
    with torch.no_grad():
        run_case(benchmark, fn, (x,), case, provider, flops, threads)
