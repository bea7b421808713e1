"""One-thread end-to-end latency on a *shared, loaded* machine: CPU time of the calling thread, not wall time.

    .venv/bin/python benchmarks/cputime_vs_ort.py                      # DeiT-Ti/S/B θ=0.75, batch 1 and 8
    .venv/bin/python benchmarks/cputime_vs_ort.py --models deit_tiny --batches 1 --rounds 40

At one thread every provider computes on the calling thread (timm eager and vitfast: torch with one intra-op
thread; ONNX Runtime: intra_op_num_threads = 1 has no worker threads), so `time.thread_time()` around a call
counts the cycles that call really ran and leaves out the time the OS gave to other processes.  On this
project's 2 shared cores wall-time medians swing by 2-3x with the load while thread CPU time stays within a
few %; `vitfast bench` (wall time, the number a user sees) remains the reference on a quiet machine.  Each
round calls every provider once, in rotating order; the table gives medians of both clocks and the ratios
vitfast / ORT (≤ 1.0: vitfast faster) and timm / vitfast.  Cache and memory-bandwidth contention from other
processes still affects both clocks.  Not a pytest suite: a report for the notes.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import timm
import torch

import vitfast
from vitfast.export import ort_session, to_onnx

TIMM_NAMES = {"deit_tiny": "deit_tiny_patch16_224", "deit_small": "deit_small_patch16_224",
              "deit_base": "deit_base_patch16_224"}


def build(model_key: str, theta: float, workdir: str):
    torch.manual_seed(0)
    baseline = timm.create_model(TIMM_NAMES[model_key], pretrained=False).eval()
    fused = vitfast.fuse(vitfast.convert.from_timm(baseline, channel_idle=theta).eval())
    path = os.path.join(workdir, f"{model_key}.onnx")
    to_onnx(fused, path, input_shape=(3, 224, 224))
    return baseline, fused, path


def measure(baseline, fused, onnx_path, batch: int, rounds: int):
    x = torch.randn(batch, 3, 224, 224)
    session = ort_session(onnx_path, 1, spinning=False)
    name, xn = session.get_inputs()[0].name, x.numpy()
    providers = {
        "timm": lambda: baseline(x),
        "vitfast": lambda: fused(x),
        "ort": lambda: session.run(None, {name: xn}),
    }
    keys = list(providers)
    cpu = {k: [] for k in keys}
    wall = {k: [] for k in keys}
    with torch.no_grad():
        for f in providers.values():
            f()
            f()
        for r in range(rounds):
            for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                w0, c0 = time.perf_counter(), time.thread_time()
                providers[k]()
                cpu[k].append(time.thread_time() - c0)
                wall[k].append(time.perf_counter() - w0)
    return ({k: statistics.median(v) * 1e3 for k, v in cpu.items()},
            {k: statistics.median(v) * 1e3 for k, v in wall.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="deit_tiny,deit_small,deit_base")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--theta", type=float, default=0.75)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"vitfast CPU path: {vitfast.ops.cpu_isa()}; 1 thread; load average {os.getloadavg()[0]:.1f}")
    print(f"{'model':10s} {'batch':>5s} | {'CPU ms: timm':>12s} {'vitfast':>9s} {'ORT':>9s} | {'vitfast/ORT':>11s} "
          f"{'timm/vitfast':>12s} | {'wall ms: vitfast':>16s} {'ORT':>9s} {'vitfast/ORT':>11s}")
    with tempfile.TemporaryDirectory(prefix="vitfast-cputime-") as workdir:
        for model_key in args.models.split(","):
            baseline, fused, path = build(model_key, args.theta, workdir)
            for batch in (int(b) for b in args.batches.split(",")):
                cpu, wall = measure(baseline, fused, path, batch, args.rounds)
                print(f"{model_key:10s} {batch:5d} | {cpu['timm']:12.2f} {cpu['vitfast']:9.2f} {cpu['ort']:9.2f} | "
                      f"{cpu['vitfast'] / cpu['ort']:11.3f} {cpu['timm'] / cpu['vitfast']:12.3f} | "
                      f"{wall['vitfast']:16.2f} {wall['ort']:9.2f} {wall['vitfast'] / wall['ort']:11.3f}", flush=True)


if __name__ == "__main__":
    main()
