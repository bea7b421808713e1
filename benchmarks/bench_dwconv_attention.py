"""Benchmark of drop-in depthwise-convolution heads (dropin-depthwise-conv-attention): op, block, end to end.

1. The op `dwconv_attention` (value projection + k×k depthwise conv + output projection), batch 1, a 24×24
   token grid, ViT-B (C = 768) and ViT-L (C = 1024) widths, all heads replaced (D = C) or ensembled (D = d_h):
     cpp       torch.ops.vitfast.dwconv_attention on CPU (C++ kernel, weights packed once)
     eager     vitfast.reference.dwconv_attention (F.linear + F.conv2d depthwise + F.linear)
     compile   torch.compile of the reference
     triton    the Triton kernel on CUDA          (skipped without a GPU; synchronised inside the timed call)
     cuda_ref  the reference on CUDA (cuBLAS + cuDNN)  (skipped without a GPU)
2. The attention sub-block target (section 3, Table 1): one block's MHSA vs the same block with all heads as DW
   convolutions, both on the vitfast kernels (mhsa = ops.linear qkv + ops.attention + ops.linear proj with the
   shortcut; dwconv = one ops.dwconv_attention with the shortcut), plus timm's eager Attention for reference.
   Target: dwconv ≥ 2.5× faster than mhsa (1 thread, batch 1, 24×24 tokens).
3. End to end: a ViT-B at 384×384 (24×24 tokens + cls), batch 1, in one interleaved run: timm eager
   (unreplaced), vitfast fused unreplaced, and fused with half of its blocks (the 6 even ones) replaced,
   unensembled (eq. 11) and ensembled (eq. 13).  Target: ≥ 17% lower latency; the script prints the reduction
   against both baselines (wall and thread-CPU time), the FLOP ratios, and which comparison meets the target.  FLOP bound at this shape: an MHSA is 3.74 GFLOP, its unensembled replacement 1.36 GFLOP, the MLP
   5.44 GFLOP, so replacing 6 of 12 blocks removes at most 13% of the model's FLOPs (ensembled: 20%).

Ratios come from medians of the same run (terminal summary; pytest-benchmark's JSON has every number).  FLOPs:
2·M·C·D + 2·M·D·C + 2·M·D·k² for the op.

    .venv/bin/python -m pytest benchmarks/bench_dwconv_attention.py
    .venv/bin/python benchmarks/bench_dwconv_attention.py            # the three targets, printed as ratios
    .venv/bin/python benchmarks/bench_dwconv_attention.py --e2e      # only the end-to-end comparison
    .venv/bin/python benchmarks/bench_dwconv_attention.py --cuda     # triton vs cuda_ref on a GPU
"""
from __future__ import annotations

import statistics
import sys
import time

import pytest
import torch

import vitfast
from harness import op_provider, run_case
from shapes import VIT_SHAPES, attention_flops, linear_flops
from vitfast import reference

GRID = (24, 24)
WIDTHS = {"vit_base": VIT_SHAPES["deit_base"], "vit_large": VIT_SHAPES["vit_large"]}
PROVIDERS = ["cpp", "eager", "compile", "triton", "cuda_ref"]


def op_args(shape, form, batch=1, device="cpu", prefix=0, k=3):
    c = shape.width
    d = c if form == "all_heads" else c // shape.heads
    g = torch.Generator().manual_seed(0)
    n = prefix + GRID[0] * GRID[1]

    def uni(*s, fan_in):
        return ((torch.rand(*s, generator=g) * 2 - 1) / fan_in**0.5).to(device)

    x = torch.randn(batch, n, c, generator=g).to(device)
    kernel = (torch.randn(d, k, k, generator=g) / k).to(device)
    return (x, uni(d, c, fan_in=c), uni(d, fan_in=c), kernel, uni(c, d, fan_in=d), uni(c, fan_in=d), GRID[0], GRID[1],
            x)


def op_flops(shape, form, batch=1, k=3):
    c = shape.width
    d = c if form == "all_heads" else c // shape.heads
    m = batch * GRID[0] * GRID[1]
    return 2 * m * c * d * 2 + 2 * m * d * k * k


def _synchronised(fn):
    def run(*args):
        out = fn(*args)
        torch.cuda.synchronize()  # time the kernel, not the launch
        return out

    return run


def provider_fn(provider, case):
    fn = op_provider("dwconv_attention", provider, case)
    if fn is not None:
        return fn
    if provider == "triton":
        from vitfast.kernels.dwconv_attention import dwconv_attention_triton

        return _synchronised(dwconv_attention_triton)
    if provider == "cuda_ref":
        return _synchronised(reference.dwconv_attention)
    raise ValueError(provider)


# ---------------------------------------------------------------------------------------------- 1. the op
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("form", ["all_heads", "ensembled"])
@pytest.mark.parametrize("shape_name", list(WIDTHS))
def test_dwconv_attention_op(benchmark, shape_name, form, provider):
    cuda = provider in ("triton", "cuda_ref")
    if cuda and not torch.cuda.is_available():
        pytest.skip(f"{provider} provider needs CUDA")
    shape = WIDTHS[shape_name]
    args = op_args(shape, form, device="cuda" if cuda else "cpu")
    case = (shape_name, form, "24x24", "b1", "t1")
    run_case(benchmark, provider_fn(provider, case), args, case, provider, op_flops(shape, form), threads=1)


# ---------------------------------------------------------------------------------------------- 2. block target
def block_fns(shape, device="cpu"):
    """(name -> (fn, args)) for one block's attention sub-block: MHSA vs all heads as DW conv, same weights."""
    from timm.models.vision_transformer import Attention as TimmAttention

    torch.manual_seed(0)
    c = shape.width
    attn = TimmAttention(c, num_heads=shape.heads, qkv_bias=True).eval().to(device)
    x = torch.randn(1, GRID[0] * GRID[1], c, device=device)
    w_qkv, b_qkv, w_p, b_p = attn.qkv.weight, attn.qkv.bias, attn.proj.weight, attn.proj.bias
    kernel = torch.randn(c, 3, 3, device=device) / 3
    w_v, b_v = w_qkv[2 * c:].contiguous(), b_qkv[2 * c:].contiguous()

    def mhsa(x):  # the fused engine's MHSA (vitfast.nn.FusedAttention): qkv GEMM, attention kernel, proj GEMM + shortcut
        return vitfast.ops.linear(vitfast.ops.attention(vitfast.ops.linear(x, w_qkv, b_qkv), shape.heads), w_p, b_p, x)

    def dwconv(x):  # FusedDWConvBlock's replacement of the same sub-block
        return vitfast.ops.dwconv_attention(x, w_v, b_v, kernel, w_p, b_p, GRID[0], GRID[1], x)

    def timm_mhsa(x):
        return x + attn(x)

    return {"mhsa": (mhsa, (x,)), "dwconv": (dwconv, (x,)), "timm_mhsa": (timm_mhsa, (x,))}


def block_flops(shape, name):
    c, m = shape.width, GRID[0] * GRID[1]
    if name == "dwconv":
        return 4 * m * c * c + 18 * m * c
    tokens_shape = type(shape)(shape.name, shape.width, shape.depth, shape.heads, tokens=m)
    return linear_flops(c, 3 * c, m) + attention_flops(tokens_shape, 1) + linear_flops(c, c, m)


@pytest.mark.parametrize("provider", ["mhsa", "dwconv", "timm_mhsa"])
@pytest.mark.parametrize("shape_name", list(WIDTHS))
def test_block_mhsa_vs_dwconv(benchmark, shape_name, provider):
    shape = WIDTHS[shape_name]
    fn, args = block_fns(shape)[provider]
    case = (shape_name, "attn_block", "24x24", "b1", "t1")
    run_case(benchmark, fn, args, case, provider, block_flops(shape, provider), threads=1)


# ---------------------------------------------------------------------------------------------- 3. end to end
def vit_base_384(replaced_blocks, ensemble=False):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(img_size=384, patch_size=16, embed_dim=768, depth=12, num_heads=12, qkv_bias=True).eval()
    if replaced_blocks:
        converted = vitfast.convert.from_timm(model, dwconv_blocks=replaced_blocks, dwconv_ensemble=ensemble)
    else:
        converted = vitfast.convert.from_timm(model, channel_idle=0.0, norm="layer")  # the same fused engine
    return vitfast.fuse(converted)


def timm_vit_base_384():
    """The same ViT-B (same seed, same weights as vit_base_384's source) as plain timm, eager PyTorch."""
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(img_size=384, patch_size=16, embed_dim=768, depth=12, num_heads=12, qkv_bias=True).eval()


HALF = [0, 2, 4, 6, 8, 10]
E2E = {"unreplaced": ([], False), "half_replaced": (HALF, False), "half_replaced_ensembled": (HALF, True)}
TARGET_REDUCTION = 0.17  # the paper's claim: a ViT-B with half of its blocks replaced runs >= 17% faster end to end


def e2e_models():
    """name -> model: timm eager (unreplaced), and the three fused models of E2E."""
    return {"timm_eager": timm_vit_base_384(), **{k: vit_base_384(*v) for k, v in E2E.items()}}


@pytest.mark.parametrize("provider", ["timm_eager"] + list(E2E))
def test_vit_base_end_to_end(benchmark, provider):
    model = timm_vit_base_384() if provider == "timm_eager" else vit_base_384(*E2E[provider])
    x = torch.randn(1, 3, 384, 384)
    case = ("vit_base_384", "e2e", "b1", "t1")
    run_case(benchmark, model, (x,), case, provider, flops=1, threads=1)


# ---------------------------------------------------------------------------------------------- script mode
def _median_ms(fn, args, repeats):
    with torch.no_grad():
        fn(*args)
        fn(*args)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _median_cpu_ms(fn, args, repeats):
    """Median thread CPU time (time.thread_time) of `repeats` calls: on one thread the op runs on this thread, and
    CPU time does not count the time other processes of a loaded machine hold the core."""
    with torch.no_grad():
        fn(*args)
        times = []
        for _ in range(repeats):
            t0 = time.thread_time()
            fn(*args)
            times.append(time.thread_time() - t0)
    return statistics.median(times) * 1e3


def _interleaved_both(fns, args, rounds, repeats):
    """{name: (median wall ms, median thread-CPU ms)} over `rounds` interleaved rounds of `repeats` calls each."""
    wall = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            with torch.no_grad():
                fn(*args[name])
                for _ in range(repeats):
                    t0, c0 = time.perf_counter(), time.thread_time()
                    fn(*args[name])
                    c1, t1 = time.thread_time(), time.perf_counter()
                    wall[name].append((t1 - t0) * 1e3)
                    cpu[name].append((c1 - c0) * 1e3)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in fns}


def end_to_end_report(rounds=5, repeats=3, out=print):
    """The end-to-end target, measured against both baselines in one interleaved run (1 thread, batch 1, 384²:
    24×24 tokens + cls): timm eager unreplaced, vitfast fused unreplaced, vitfast fused half-replaced (blocks
    0, 2, ..., 10 all DW conv, eq. 11) and its ensembled form (eq. 13).  Prints the latency reductions of each
    replaced model against each baseline, the FLOP ratios, and which comparison meets the 17% target.
    Returns the numbers as a dict."""
    from vitfast.measure import flops_per_image

    models = e2e_models()
    x = torch.randn(1, 3, 384, 384)
    flops = {k: flops_per_image(m, (3, 384, 384)) for k, m in models.items()}
    t = _interleaved_both(models, {k: (x,) for k in models}, rounds=rounds, repeats=repeats)
    out(f"ViT-B 384 (24x24 + cls), batch 1, {torch.get_num_threads()} thread(s), {rounds} interleaved rounds x "
        f"{repeats} calls; medians, wall ms / thread-CPU ms; GFLOP per image (reference path, FlopCounterMode):")
    for k in models:
        out(f"  {k:<24} wall {t[k][0]:8.1f} ms   cpu {t[k][1]:8.1f} ms   {flops[k] / 1e9:7.2f} GFLOP")
    report = {"ms": t, "flops": flops, "reductions": {}}
    for replaced in ("half_replaced", "half_replaced_ensembled"):
        for base in ("timm_eager", "unreplaced"):
            wall = 1 - t[replaced][0] / t[base][0]
            cpu = 1 - t[replaced][1] / t[base][1]
            flop = 1 - flops[replaced] / flops[base]
            report["reductions"][(replaced, base)] = {"wall": wall, "cpu": cpu, "flops": flop}
            verdict = "MEETS" if min(wall, cpu) >= TARGET_REDUCTION else (
                "does NOT meet" if max(wall, cpu) < TARGET_REDUCTION else "meets on one clock only")
            out(f"  {replaced} vs {base}: {100 * wall:5.1f}% lower wall, {100 * cpu:5.1f}% lower CPU time; FLOPs "
                f"{flops[replaced] / flops[base]:.3f}x ({100 * flop:.1f}% fewer) -> {verdict} the 17% target")
    return report


def _interleaved(fns, args, rounds, repeats):
    """Median per function over `rounds` interleaved rounds (a loaded machine drifts: interleaving keeps the
    ratio fair)."""
    results = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            results[name].append(_median_ms(fn, args[name], repeats))
    return {name: statistics.median(v) for name, v in results.items()}


def main(argv) -> int:
    torch.set_num_threads(1)
    print(f"threads: {torch.get_num_threads()}, cpu isa: {vitfast.ops.cpu_isa()}")
    if "--cuda" in argv:
        from vitfast.kernels.dwconv_attention import dwconv_attention_triton

        def triton_path(path):
            return _synchronised(lambda *a: dwconv_attention_triton(*a, path=path))

        for name, shape in WIDTHS.items():
            for form in ("all_heads", "ensembled"):
                for batch in (1, 8):
                    args = op_args(shape, form, batch=batch, device="cuda")
                    fns = {"auto": triton_path(None), "fused": triton_path("fused"), "split": triton_path("split"),
                           "cuda_ref": _synchronised(reference.dwconv_attention)}
                    t = _interleaved(fns, {k: args for k in fns}, rounds=5, repeats=50)
                    err = (dwconv_attention_triton(*args) - reference.dwconv_attention(*args)).abs().max().item()
                    print(f"{name} {form} b{batch}: triton auto {t['auto']:.4f} ms (fused {t['fused']:.4f}, split "
                          f"{t['split']:.4f}), cuda_ref {t['cuda_ref']:.4f} ms -> {t['cuda_ref'] / t['auto']:.2f}x, "
                          f"max|diff| {err:.2e}")
        return 0
    if "--e2e" in argv:
        end_to_end_report()
        return 0
    # Wall and thread-CPU medians of the same interleaved calls (CPU time is the steadier one on a loaded machine).
    for name, shape in WIDTHS.items():
        fns = block_fns(shape)
        t = _interleaved_both({k: v[0] for k, v in fns.items()}, {k: v[1] for k, v in fns.items()}, rounds=5,
                              repeats=5)
        print(f"{name} attention sub-block, 24x24 tokens, b1 (wall / cpu ms): mhsa {t['mhsa'][0]:.2f} / "
              f"{t['mhsa'][1]:.2f}, dwconv {t['dwconv'][0]:.2f} / {t['dwconv'][1]:.2f} -> "
              f"{t['mhsa'][0] / t['dwconv'][0]:.2f}x / {t['mhsa'][1] / t['dwconv'][1]:.2f}x "
              f"(timm eager mhsa {t['timm_mhsa'][0]:.2f} / {t['timm_mhsa'][1]:.2f})")
        args = op_args(shape, "all_heads")
        t = _interleaved_both({"cpp": torch.ops.vitfast.dwconv_attention, "eager": reference.dwconv_attention},
                              {"cpp": args, "eager": args}, rounds=5, repeats=5)
        print(f"{name} op all heads (wall / cpu ms): cpp {t['cpp'][0]:.2f} / {t['cpp'][1]:.2f}, eager "
              f"{t['eager'][0]:.2f} / {t['eager'][1]:.2f} -> {t['eager'][0] / t['cpp'][0]:.2f}x / "
              f"{t['eager'][1] / t['cpp'][1]:.2f}x")
    end_to_end_report()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    sys.exit(main(sys.argv[1:]))
