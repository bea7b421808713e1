"""Benchmark of the whole fused ViT block as one op (`torch.ops.vitfast.vit_block`) against its six ops.

Providers, all on the same RePaViT block (θ = 0.75, BN variant: the FFN's norm and shortcut folded):
  cpp      torch.ops.vitfast.vit_block: one dispatch, the six steps in C++ on one scratch buffer
  six_ops  the same kernels called op by op from Python (vitfast.ops._vit_block_composed: what vitfast.nn.FusedBlock
           ran before; without the modules' own Python, so the difference is a lower bound of what the block saves)
  eager    vitfast.reference.vit_block (F.layer_norm, F.linear, SDPA, F.gelu ...), the composition the tests trust
  compile  torch.compile of that reference

The op's whole point is a fixed cost per block (dispatch, argument boxing, output allocations), so it shows at
small widths and batch 1: DeiT-Ti b1 saves the most, DeiT-B b8 almost nothing.  `test_vit_block_interleaved`
calls cpp, six_ops and eager in alternation (harness.run_interleaved), the robust ratio on a drifting machine.
`test_int8_block_interleaved` does the same for an int8 block (`vitfast.quantize`): its five ops called straight
through torch.ops (`vitfast.nn.block.int8_block_forward`, what the block runs) against its module path.

    .venv/bin/python -m pytest benchmarks/bench_vit_block.py
    .venv/bin/python -m pytest benchmarks/bench_vit_block.py -k interleaved
    .venv/bin/python -m pytest benchmarks/bench_vit_block.py -k int8
"""
from __future__ import annotations

import pytest
import torch

import vitfast
from harness import interleaved_rounds, op_provider, run_case, run_interleaved
from shapes import VIT_SHAPES, channel_idle_dims, channel_idle_ffn_flops

PROVIDERS = ["cpp", "six_ops", "eager", "compile"]
THETA = 0.75


def make_args(shape, batch):
    active, linear = channel_idle_dims(shape, THETA)
    c = shape.width
    g = torch.Generator().manual_seed(0)

    def uni(*s, fan_in):
        return (torch.rand(*s, generator=g) * 2 - 1) / fan_in**0.5

    x = torch.randn(batch, shape.tokens, c, generator=g)
    return (x, 1e-6, uni(3 * c, c, fan_in=c), uni(3 * c, fan_in=c), shape.heads, uni(c, c, fan_in=c),
            uni(c, fan_in=c), None, uni(active + linear, c, fan_in=c), uni(active + linear, fan_in=c),
            uni(c, active, fan_in=active), uni(c, fan_in=active), False)


def block_flops(shape, batch) -> int:
    """qkv + attention (Q·Kᵀ and P·V) + proj + the channel-idle FFN's two GEMMs (norms, softmax, adds not counted)."""
    rows, c, n = batch * shape.tokens, shape.width, shape.tokens
    return (2 * rows * c * 3 * c + 4 * batch * n * n * c + 2 * rows * c * c
            + channel_idle_ffn_flops(shape, THETA, batch))


def provider_fn(provider, case):
    fn = op_provider("vit_block", provider, case)
    if fn is not None:
        return fn
    if provider == "six_ops":
        return vitfast.ops._vit_block_composed
    raise ValueError(provider)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape_name", ["deit_tiny", "deit_small", "deit_base"])
def test_vit_block(benchmark, shape_name, batch, threads, provider):
    shape = VIT_SHAPES[shape_name]
    case = (shape.name, f"theta{THETA}", f"b{batch}", f"t{threads}")
    run_case(benchmark, provider_fn(provider, case), make_args(shape, batch), case, provider,
             block_flops(shape, batch), threads)


@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape_name", ["deit_tiny", "deit_small", "deit_base"])
def test_vit_block_interleaved(benchmark, shape_name, batch, threads):
    """six_ops (the baseline of the ratios) vs cpp vs eager, one call of each per round (the order rotating)."""
    shape = VIT_SHAPES[shape_name]
    case = (shape.name, f"theta{THETA}", f"b{batch}", f"t{threads}", "interleaved")
    fns = {p: provider_fn(p, case) for p in ("six_ops", "cpp", "eager")}
    flops = block_flops(shape, batch)
    rounds = interleaved_rounds(flops, threads, 3, seconds=4.0)
    entry = run_interleaved(benchmark, fns, make_args(shape, batch), case, threads, flops, rounds=rounds)
    benchmark.extra_info.update({p: v for p, v in entry["providers"].items()})


def int8_block(shape_name):
    """One int8 block (`vitfast.quantize` with per-token int8 activations and int8 attention products, asked for so
    that every host times the same ops) of a fused RePa-DeiT of that shape (θ = 0.75, random weights)."""
    import timm

    from vitfast.nn._base import apply_norm

    name = {"deit_tiny": "deit_tiny_patch16_224", "deit_small": "deit_small_patch16_224",
            "deit_base": "deit_base_patch16_224"}[shape_name]
    model = timm.create_model(name, depth=1, num_classes=10).eval()
    block = vitfast.quantize(vitfast.fuse(vitfast.convert.from_timm(model, channel_idle=THETA)).eval(),
                             attention="int8").blocks[0]

    def modules(x):  # what FusedBlock.forward runs when int8_block_forward declines
        return block.mlp(block.attn(apply_norm(block.norm1, x), residual=x))

    return block, modules


def int8_block_torch_ops(block, x):
    """The block's five ops called one by one through torch.ops (what int8_block_forward did before its one C++
    call, csrc/ops/int8_block.h): the same bits, a dispatch and some Python per op."""
    vf, attn, mlp = torch.ops.vitfast, block.attn, block.mlp
    qkv, proj = attn.qkv, attn.proj
    h = vf.linear_int8(vf.layer_norm(x, None, None, float(block.norm1.eps)), qkv.qweight, qkv.w_scale, qkv.bias, None,
                       qkv.smooth, qkv.act_scale)
    h = (vf.attention_int8 if attn.__dict__.get("int8_attention") else
         vf.attention_bf16 if attn.__dict__.get("bf16_attention") else vf.attention)(h, attn.num_heads)
    x1 = vf.linear_int8(h, proj.qweight, proj.w_scale, proj.bias, x, proj.smooth, proj.act_scale)
    y = x1 if mlp.norm is None else vf.layer_norm(x1, None, None, float(mlp.norm.eps))
    return vf.channel_idle_ffn_int8(y, mlp.qw_in, mlp.s_in, mlp.b_in, mlp.qw_out, mlp.s_out, mlp.b_out,
                                    x1 if mlp.residual or mlp.split_identity else None, mlp.smooth_in, mlp.smooth_out,
                                    mlp.act_scale_in, mlp.act_scale_out)


@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape_name", ["deit_small", "deit_base"])
def test_int8_block_interleaved(benchmark, shape_name, batch, threads):
    """An int8 block's five ops in one C++ call (vitfast.nn.block.int8_block_forward, what the block runs), the same
    five ops called one by one through torch.ops, and its module path (the baseline of the ratios), one call of each
    per round."""
    from vitfast.nn.block import int8_block_forward

    shape = VIT_SHAPES[shape_name]
    block, modules = int8_block(shape_name)
    x = torch.randn(batch, shape.tokens, shape.width, generator=torch.Generator().manual_seed(0))
    case = (shape.name, f"theta{THETA}", "int8", f"b{batch}", f"t{threads}", "interleaved")
    flops = block_flops(shape, batch)
    with torch.no_grad():
        assert torch.equal(int8_block_forward(block, x), modules(x))
        assert torch.equal(int8_block_torch_ops(block, x), modules(x))
        fns = {"modules": modules, "torch_ops": lambda x: int8_block_torch_ops(block, x),
               "direct": lambda x: int8_block_forward(block, x)}
        rounds = interleaved_rounds(flops, threads, 3, seconds=4.0, gflops_per_thread=400.0)
        entry = run_interleaved(benchmark, fns, (x,), case, threads, flops, rounds=rounds)
    benchmark.extra_info.update({p: v for p, v in entry["providers"].items()})
