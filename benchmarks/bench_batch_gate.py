"""Benchmark of the USDC batch gate: the decision's cost against a DeiT-S block, and gated-model latency.

Cases (medians, same run; ratios are what to read on a shared machine):
  gate/DeiT-S/b{1,8}/t1     providers: block (the ungated fused DeiT-S Block), cpp (torch.ops.vitfast.batch_gate
                            on CPU, G0 network, H = C/2), eager (vitfast.reference.batch_gate), compile
                            (torch.compile of the reference), triton (the op on CUDA; skipped without a GPU),
                            gated_open (FusedGatedBlock whose real gate decides "execute both": block + decision).
  model/DeiT-S/b1/t1        providers: ungated (fused DeiT-S, 12 Blocks), gated_half (the same weights as
                            GatedBlocks whose gates — computed, not forced — close one sub-block per layer,
                            alternately MHSA and FFN: half of the sub-blocks).
  cuda-block/DeiT-S/b{1,64}/{fp32,fp16}   (CUDA only) providers: ungated (fused Block), gated_open /
                            gated_closed (FusedGatedBlock whose real gate opens / closes both sub-blocks: the gated
                            Triton kernels of kernels/gated.py, which return early when closed), select_open /
                            select_closed (the same with VITFAST_CUDA_KERNELS=torch: cuBLAS/SDPA sub-block, then
                            gate_select — the path before the gated kernels).  Each replayed as a CUDA graph.

    .venv/bin/python -m pytest benchmarks/bench_batch_gate.py          # pytest-benchmark suite + summary
    .venv/bin/python benchmarks/bench_batch_gate.py [--cuda]            # quick table of the same ratios
    .venv/bin/python benchmarks/bench_batch_gate.py --cuda --skip-cpu   # GPU only: gated closed / open / ungated
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vitfast  # noqa: E402
from shapes import VIT_SHAPES  # noqa: E402
from vitfast import reference  # noqa: E402

PROVIDERS = ["block", "cpp", "eager", "compile", "triton", "gated_open"]


def deit_small_timm(depth: int = 12):
    from timm.models.vision_transformer import VisionTransformer

    s = VIT_SHAPES["deit_small"]
    torch.manual_seed(0)
    return VisionTransformer(img_size=224, patch_size=16, embed_dim=s.width, depth=depth, num_heads=s.heads,
                             num_classes=1000).eval()


def gated_model(timm_model, pattern=None):
    """Fused USDC model with G0 gates.  pattern[i] = (run MHSA, run FFN) per layer: the gate's last bias is set so
    that its real decision is that (weights ≈ 0, so the decision does not depend on the input); None = all open."""
    model = vitfast.convert.from_timm(timm_model, gates=True, gate_search=False, gate_kind="G0")
    fused = vitfast.fuse(model)
    for i, block in enumerate(fused.blocks):
        run = pattern[i] if pattern is not None else (True, True)
        with torch.no_grad():
            block.gate.w2.mul_(1e-6)
            block.gate.b2.copy_(torch.tensor([1.0 if r else -1.0 for r in run]))
    return fused


def gate_args(c: int, device="cpu"):
    g = torch.Generator().manual_seed(0)
    h = c // 2
    w1 = (torch.randn(h, c, generator=g) / c**0.5).to(device)
    b1 = torch.zeros(h).to(device)
    w2 = (torch.randn(2, h, generator=g) / h**0.5).to(device)
    b2 = torch.zeros(2).to(device)
    return w1, b1, w2, b2, True, "relu", 1e-5


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def op_fn(provider, case):
    from harness import op_provider

    fn = op_provider("batch_gate", provider, case)
    if fn is not None:
        return fn
    if provider == "triton":
        from vitfast.kernels.batch_gate import batch_gate_triton

        def run(*args):
            out = batch_gate_triton(*args)
            torch.cuda.synchronize()
            return out

        return run
    raise ValueError(provider)


def median_seconds(fn, args, rounds=15, device="cpu"):
    with torch.no_grad():
        fn(*args)
        fn(*args)
        _sync(device)
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            fn(*args)
            _sync(device)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---------------------------------------------------------------------------------------------- pytest-benchmark
@pytest.fixture(scope="module")
def deit_s_block():
    timm_model = deit_small_timm(depth=1)
    ungated = vitfast.fuse(vitfast.convert.from_timm(timm_model, channel_idle=0.0, norm="layer")).blocks[0]
    gated = gated_model(timm_model).blocks[0]
    return ungated, gated


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
def test_gate_overhead(benchmark, deit_s_block, batch, provider):
    from harness import median_seconds_of, record

    if provider == "triton" and not torch.cuda.is_available():
        pytest.skip("triton provider needs CUDA")
    device = "cuda" if provider == "triton" else "cpu"
    s = VIT_SHAPES["deit_small"]
    x = torch.randn(batch, s.tokens, s.width).to(device)
    case = ("gate", s.name, f"b{batch}", "t1")
    ungated, gated = deit_s_block
    if provider == "block":
        fn, args = ungated, (x,)
    elif provider == "gated_open":
        fn, args = gated, (x,)
    else:
        fn, args = op_fn(provider, case), (x, *gate_args(s.width, device))
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            fn(*args)
            fn(*args)
            benchmark.pedantic(fn, args=args, rounds=15, iterations=1, warmup_rounds=1)
            median = median_seconds_of(benchmark, fn, args)
    finally:
        torch.set_num_threads(previous)
    flops = batch * s.tokens * s.width + s.width * s.width // 2
    if provider in ("block", "gated_open"):
        flops = batch * s.tokens * 2 * 12 * s.width * s.width
    benchmark.extra_info.update(record(case, provider, median, flops, 1))


@pytest.mark.parametrize("provider", ["ungated", "gated_half"])
def test_gated_model_latency(benchmark, provider):
    from harness import median_seconds_of, record

    timm_model = deit_small_timm()
    if provider == "ungated":
        model = vitfast.fuse(vitfast.convert.from_timm(timm_model, channel_idle=0.0, norm="layer"))
    else:
        model = gated_model(timm_model, [(i % 2 == 0, i % 2 == 1) for i in range(12)])
    x = torch.randn(1, 3, 224, 224)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            model(x)
            benchmark.pedantic(model, args=(x,), rounds=7, iterations=1, warmup_rounds=1)
            median = median_seconds_of(benchmark, model, (x,))
    finally:
        torch.set_num_threads(previous)
    benchmark.extra_info.update(record(("model", "DeiT-S", "b1", "t1"), provider, median, int(4.6e9), 1))


# ---------------------------------------------------------------------------------------------- CUDA: gated kernels
CUDA_PROVIDERS = ["ungated", "gated_open", "gated_closed", "select_open", "select_closed"]
CUDA_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def cuda_blocks(dtype, depth: int = 1, device: str = "cuda"):
    """The DeiT-S blocks (an nn.Sequential of `depth`) of the CUDA comparison, on the GPU in `dtype`: ungated,
    gated open, gated closed (the gates decide for real on the device — `gated_model` biases them; not forced)."""
    timm_model = deit_small_timm(depth=depth)
    ungated = vitfast.fuse(vitfast.convert.from_timm(timm_model, channel_idle=0.0, norm="layer"))
    opened = gated_model(timm_model, [(True, True)] * depth)
    closed = gated_model(timm_model, [(False, False)] * depth)
    return {name: m.to(device=device, dtype=dtype).eval().blocks for name, m in
            (("ungated", ungated), ("gated_open", opened), ("gated_closed", closed))}


def with_cuda_kernels(policy: str, fn):
    """fn run under VITFAST_CUDA_KERNELS=`policy` ("torch": the compute-then-gate_select path of FusedGatedBlock)."""
    from vitfast._env import get_cuda_kernels, set_cuda_kernels

    def run(*args):
        previous = get_cuda_kernels()
        set_cuda_kernels(policy)
        try:
            return fn(*args)
        finally:
            set_cuda_kernels(previous)

    return run


def cuda_graph(fn, x):
    """fn(x) captured once as a CUDA graph; returns a callable that replays it (launch overhead gone: what the
    kernels themselves cost)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        fn(x)
    return lambda *_: graph.replay()


def cuda_provider_fn(blocks, provider):
    if provider.startswith("select_"):
        return with_cuda_kernels("torch", blocks["gated_" + provider[len("select_"):]])
    return blocks[provider]


@pytest.mark.parametrize("provider", CUDA_PROVIDERS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("batch", [1, 64], ids=lambda b: f"b{b}")
def test_gated_block_cuda(benchmark, batch, dtype, provider):
    from harness import median_seconds_of, record

    if not torch.cuda.is_available():
        pytest.skip("the gated kernels' benchmark needs CUDA")
    s = VIT_SHAPES["deit_small"]
    blocks = cuda_blocks(CUDA_DTYPES[dtype])
    x = torch.randn(batch, s.tokens, s.width, device="cuda", dtype=CUDA_DTYPES[dtype])
    replay = cuda_graph(cuda_provider_fn(blocks, provider), x)

    def timed():
        replay()
        torch.cuda.synchronize()

    benchmark.pedantic(timed, rounds=50, iterations=1, warmup_rounds=3)
    flops = batch * s.tokens * 2 * 12 * s.width * s.width
    benchmark.extra_info.update(record(("cuda-block", s.name, f"b{batch}", dtype), provider,
                                       median_seconds_of(benchmark, timed), flops, 1))


# ---------------------------------------------------------------------------------------------- script
def cuda_report(rounds: int = 50, dtypes=("fp32", "fp16"), batches=(1, 8, 64)) -> None:
    """GPU table: the gated kernels' saving (closed) and cost (open) against the ungated fused block, eager and
    as CUDA-graph replays, then a 12-block DeiT-S whose gates close half of the sub-blocks."""
    from vitfast.kernels.batch_gate import batch_gate_triton

    s = VIT_SHAPES["deit_small"]
    print(f"CUDA {torch.cuda.get_device_name()}: torch {torch.__version__}, medians of {rounds} synchronised calls")
    for batch in (1, 8, 64):
        x = torch.randn(batch, s.tokens, s.width, device="cuda")
        ga = (x, *gate_args(s.width, "cuda"))
        t_tri = median_seconds(batch_gate_triton, ga, 2 * rounds, "cuda")
        t_ref = median_seconds(reference.batch_gate, ga, 2 * rounds, "cuda")
        print(f"  batch_gate b{batch}: triton {t_tri * 1e6:.1f} us, reference {t_ref * 1e6:.1f} us "
              f"({t_ref / t_tri:.2f}x)")
    print("  DeiT-S block (us); gated_* = FusedGatedBlock on the gated kernels, select_* = VITFAST_CUDA_KERNELS=torch "
          "(cuBLAS/SDPA sub-block + gate_select)")
    print(f"  {'dtype':5} {'batch':>5} {'mode':6} " + " ".join(f"{p:>13}" for p in CUDA_PROVIDERS)
          + "  closed/ungated  open/ungated")
    for name in dtypes:
        dtype = CUDA_DTYPES[name]
        if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            continue
        blocks = cuda_blocks(dtype)
        for batch in batches:
            x = torch.randn(batch, s.tokens, s.width, device="cuda", dtype=dtype)
            for mode in ("eager", "graph"):
                times = {}
                for provider in CUDA_PROVIDERS:
                    fn = cuda_provider_fn(blocks, provider)
                    if mode == "graph":
                        fn = cuda_graph(fn, x)
                    times[provider] = median_seconds(fn, (x,), rounds, "cuda")
                print(f"  {name:5} {batch:5d} {mode:6} " + " ".join(f"{times[p] * 1e6:13.1f}" for p in CUDA_PROVIDERS)
                      + f"  {times['gated_closed'] / times['ungated']:14.3f}  {times['gated_open'] / times['ungated']:12.3f}")
    timm12 = deit_small_timm()
    pattern = [(i % 2 == 0, i % 2 == 1) for i in range(12)]
    for name in dtypes:
        dtype = CUDA_DTYPES[name]
        if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            continue
        base = vitfast.fuse(vitfast.convert.from_timm(timm12, channel_idle=0.0, norm="layer")).to("cuda", dtype)
        half = gated_model(timm12, pattern).to("cuda", dtype)
        for batch in (8, 64):
            x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=dtype)
            t_base = median_seconds(cuda_graph(base, x), (x,), rounds // 2, "cuda")
            t_half = median_seconds(cuda_graph(half, x), (x,), rounds // 2, "cuda")
            t_sel = median_seconds(cuda_graph(with_cuda_kernels("torch", half), x), (x,), rounds // 2, "cuda")
            print(f"  DeiT-S model {name} b{batch} (CUDA graph): ungated {t_base * 1e3:.3f} ms | gates closing half "
                  f"the sub-blocks: gated kernels {t_half * 1e3:.3f} ms = {100 * t_half / t_base:.1f}%, "
                  f"compute + gate_select {t_sel * 1e3:.3f} ms = {100 * t_sel / t_base:.1f}%")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true",
                        help="also time the Triton op and the gated kernels (closed / open / ungated) on CUDA")
    parser.add_argument("--skip-cpu", action="store_true", help="only the CUDA table (with --cuda)")
    parser.add_argument("--dtypes", default="fp32,fp16", help="CUDA dtypes, comma-separated (fp32, fp16, bf16)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--skip-model", action="store_true", help="only the per-block overhead")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if not args.skip_cpu:
        cpu_report(args)
    if args.cuda:
        if not torch.cuda.is_available():
            print("--cuda: no CUDA device, nothing timed on the GPU")
            return
        dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
        bad = [d for d in dtypes if d not in CUDA_DTYPES]
        if bad:
            parser.error(f"--dtypes: expected names among {sorted(CUDA_DTYPES)}, got {bad}")
        cuda_report(max(20, args.rounds * 3), dtypes)


def cpu_report(args) -> None:
    s = VIT_SHAPES["deit_small"]
    timm1 = deit_small_timm(depth=1)
    ungated = vitfast.fuse(vitfast.convert.from_timm(timm1, channel_idle=0.0, norm="layer")).blocks[0]
    gated = gated_model(timm1).blocks[0]
    print(f"1 thread, CPU ISA {vitfast.ops.cpu_isa()}; medians of {args.rounds} rounds")
    for batch in (1, 8):
        x = torch.randn(batch, s.tokens, s.width)
        ga = (x, *gate_args(s.width))
        t_block = median_seconds(ungated, (x,), args.rounds)
        t_open = median_seconds(gated, (x,), args.rounds)
        t_cpp = median_seconds(torch.ops.vitfast.batch_gate, ga, args.rounds * 4)
        t_ref = median_seconds(reference.batch_gate, ga, args.rounds * 4)
        print(f"DeiT-S block b{batch}: block {t_block * 1e3:.3f} ms | batch_gate cpp {t_cpp * 1e6:.1f} us "
              f"({100 * t_cpp / t_block:.2f}% of the block), eager {t_ref * 1e6:.1f} us | FusedGatedBlock (gate open) "
              f"{t_open * 1e3:.3f} ms ({100 * (t_open / t_block - 1):+.2f}% vs block)")
    if not args.skip_model:
        timm12 = deit_small_timm()
        x = torch.randn(1, 3, 224, 224)
        base = vitfast.fuse(vitfast.convert.from_timm(timm12, channel_idle=0.0, norm="layer"))
        half = gated_model(timm12, [(i % 2 == 0, i % 2 == 1) for i in range(12)])
        t_base = median_seconds(base, (x,), max(5, args.rounds // 2))
        t_half = median_seconds(half, (x,), max(5, args.rounds // 2))
        print(f"DeiT-S model b1: ungated {t_base * 1e3:.1f} ms | gates closing half the sub-blocks "
              f"{t_half * 1e3:.1f} ms = {100 * t_half / t_base:.1f}% of ungated")


if __name__ == "__main__":
    main()
