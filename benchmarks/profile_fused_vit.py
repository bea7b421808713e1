"""Where a fused RePa-DeiT's CPU time goes, against timm eager: latency, % of the FLOP floor, op breakdown.

    .venv/bin/python benchmarks/profile_fused_vit.py                       # DeiT-Ti/S/B, batch 1 and 8, 1 and 2 threads
    .venv/bin/python benchmarks/profile_fused_vit.py --models deit_base --batches 1 --threads 1

For each (model, batch, threads): median latency of timm eager and of the fused model (random weights,
`vitfast.fuse(vitfast.convert.from_timm(m, channel_idle=θ))`, whose blocks run as whole-block `vit_block` ops) in the
same run, the speed-up, each one's FLOP count (`vitfast.measure.flops_per_image`, as `vitfast bench` counts them:
matmuls and attention, the fused model through its reference path), % of the floor (= FLOPs / measured torch.mm
2048³ rate at that thread count, measured in the same run), and the fused model's self-CPU-time share per op from
torch.profiler (inside a `vit_block`, `perf` sees the kernels: docs/performance.md).  Not a pytest suite: a report
for the notes (end-to-end benchmarks proper live in benchmarks/bench_models.py; the deployed anchors in
benchmarks/lowp_cells.py).
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch

import timm

import vitfast
from vitfast.measure import flops_per_image

TIMM_NAMES = {"deit_tiny": "deit_tiny_patch16_224", "deit_small": "deit_small_patch16_224",
              "deit_base": "deit_base_patch16_224"}


def sgemm_now(threads, n=2048, repeats=7):
    """torch.mm n³ GFLOP/s measured now (not cached: the shared machine's load drifts between cases)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


def median_latency(model, x, min_time=1.0, min_rounds=5, max_rounds=30):
    with torch.no_grad():
        model(x)
        model(x)
        times = []
        start = time.perf_counter()
        while len(times) < max_rounds and (len(times) < min_rounds or time.perf_counter() - start < min_time):
            t0 = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def op_breakdown(model, x, rounds=3):
    """Self CPU time share per op name (self time: a parent op's children are not counted twice)."""
    with torch.no_grad():
        model(x)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(rounds):
                model(x)
    shares = defaultdict(float)
    for evt in prof.key_averages():
        shares[evt.key] += evt.self_cpu_time_total
    total = sum(shares.values())
    return sorted(((k, 100 * v / total) for k, v in shares.items()), key=lambda kv: -kv[1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(TIMM_NAMES))
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--theta", type=float, default=0.75)
    p.add_argument("--top", type=int, default=8)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    for name in args.models:
        base = timm.create_model(TIMM_NAMES[name], pretrained=False).eval()
        fused = vitfast.fuse(vitfast.convert.from_timm(base, channel_idle=args.theta)).eval()
        for batch in args.batches:
            x = torch.randn(batch, 3, 224, 224)
            # Attention's products included (vitfast.bench's count): plain FlopCounterMode has no formula for
            # SDPA on CPU, which left them out of both models' floors here.
            f_base, f_fused = (batch * flops_per_image(m, x.shape[1:]) for m in (base, fused))
            for threads in args.threads:
                sg = sgemm_now(threads)
                # Alternating measurements, best median kept: less drift on a shared machine.
                t = {"timm": [], "fused": []}
                for _ in range(2):
                    t["timm"].append(median_latency(base, x))
                    t["fused"].append(median_latency(fused, x))
                t = {k: min(v) for k, v in t.items()}
                sg = max(sg, sgemm_now(threads))
                pct = lambda f, s: 100 * f / (sg * 1e9) / s  # noqa: E731
                print(f"{name} b{batch} t{threads}: sgemm {sg:.1f} GFLOP/s | timm eager {t['timm'] * 1e3:.1f} ms "
                      f"({f_base / 1e9:.2f} GFLOP, {pct(f_base, t['timm']):.0f}% of floor) | fused θ={args.theta} "
                      f"{t['fused'] * 1e3:.1f} ms ({f_fused / 1e9:.2f} GFLOP, {pct(f_fused, t['fused']):.0f}% of floor) | "
                      f"speed-up vs timm {t['timm'] / t['fused']:.2f}x", flush=True)
                top = op_breakdown(fused, x)[: args.top]
                print("    fused self-CPU: " + ", ".join(f"{k} {v:.1f}%" for k, v in top), flush=True)


if __name__ == "__main__":
    main()
