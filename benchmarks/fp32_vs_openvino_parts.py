"""Where vitfast fp32 and OpenVINO f32 differ on a RePa-DeiT forward: the block's GEMMs alone, then the whole model
with OpenVINO's own per-node-type profile, each paired in interleaved rounds.

    python benchmarks/fp32_vs_openvino_parts.py [--models deit_small deit_base] [--rounds 7] [--record]

For each model (RePa-DeiT θ = 0.75, random weights) and setting (batch 1 on one thread, batch 8 on two):

* **GEMMs.** The fused block's four weight shapes — qkv (C → 3C), proj (C → C), the channel-idle FFN's input
  (C → A + L, its activated and linear channels) and output (A → C) — on rows = batch × 197, each as twelve layers with
  different weights, as in the model's twelve blocks (so each weight comes from L3 or memory, not from L2).
  OpenVINO runs one compiled model of the twelve MatMul + bias (INFERENCE_PRECISION_HINT=f32, LATENCY, one stream,
  the same thread count; each output reduced to a scalar so that the graph reuses one output buffer, as a forward
  does) and is timed by its own profile: the FullyConnected nodes' times of each request (PERF_COUNT), bias
  included, not the reductions or the request's overhead.  vitfast calls `torch.ops.vitfast.linear` on the same
  twelve weights, timed by the wall clock with ~3 µs of dispatch a call (a `vit_block` does not pay it: its GEMMs are
  called from C++).  A design that kept twelve outputs slowed OpenVINO by 1.3–1.7× at batch 8 (twelve fresh output
  buffers); one that summed vitfast's outputs in Python cost vitfast ~15 µs a call.  The ratio is OpenVINO's time ÷
  vitfast's in the same round (> 1: vitfast faster).
* **Whole model.** vitfast's fused model against OpenVINO f32 on its ONNX export (as `vitfast bench`), paired, and
  OpenVINO's PERF_COUNT profile of the same requests summed by node type and kernel (exec type): which of its
  kernels runs the FullyConnected layers (MLAS's sgemm on x86) and how much of the forward the rest takes.

The anchor for the fp32 target of the low-precision work ("vitfast fp32 ahead of OpenVINO f32", lowp_cells.py) is
the whole-model ratio; the parts say where a lead or a tie comes from.  Not a pytest file: a report for the docs
(docs/performance.md, "vitfast fp32 against OpenVINO f32").  Needs openvino (the bench extra).
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time

from vitfast.bench import paired_speedups

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MODELS = {"deit_small": "deit_small_patch16_224", "deit_base": "deit_base_patch16_224"}
SETTINGS = ((1, 1), (2, 8))  # (threads, batch)
THETA = 0.75
LAYERS = 12
TOKENS = 197


def block_shapes(width: int) -> list[tuple[str, int, int]]:
    """(name, K, N) of the fused block's GEMMs at θ = 0.75: of the FFN's 4C channels a quarter stays activated (A = C)
    and the idle ones merge into one linear C → C (L = C), so its input GEMM is C → 2C and its output C → C."""
    active = round((1 - THETA) * 4 * width)
    return [("qkv", width, 3 * width), ("proj", width, width), ("ffn in", width, active + width),
            ("ffn out", active, width)]


def paired(fns: dict, rounds: int, calls: int = 1) -> dict:
    """Seconds per call of each function in each round, the functions alternating within a round (the first one
    first in even rounds, the last one first in odd ones); a function returning a float is timed by that value."""
    for f in fns.values():  # warm-up: packing, compilation, first-touch of the buffers
        f()
        f()
    times = {k: [] for k in fns}
    keys = list(fns)
    for r in range(rounds):
        for k in (keys if r % 2 == 0 else keys[::-1]):
            t0 = time.perf_counter()
            own = [fns[k]() for _ in range(calls)]
            wall = time.perf_counter() - t0
            # A function that returns a time (OpenVINO's own node times) is timed by it, else by the wall clock.
            times[k].append((sum(own) if own[0] is not None else wall) / calls)
    return times


def ov_config(threads: int, profile: bool = False) -> dict:
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
              "INFERENCE_PRECISION_HINT": "f32"}
    if profile:
        config["PERF_COUNT"] = True
    return config


def gemm_rows(model: str, width: int, threads: int, batch: int, rounds: int) -> list[dict]:
    import numpy as np
    import openvino as ov
    import torch

    import vitfast  # noqa: F401  (registers torch.ops.vitfast)

    try:
        from openvino import opset13 as ops
    except ImportError:  # older releases
        from openvino.runtime import opset13 as ops
    rows_n = batch * TOKENS
    core = ov.Core()
    gen = torch.Generator().manual_seed(0)
    out = []
    for name, k, n in block_shapes(width):
        ws = [torch.randn(n, k, generator=gen) / k**0.5 for _ in range(LAYERS)]
        bs = [torch.randn(n, generator=gen) * 0.1 for _ in range(LAYERS)]
        x = torch.randn(rows_n, k, generator=gen)
        p = ops.parameter([rows_n, k], np.float32)
        total = None
        for w, b in zip(ws, bs):
            y = ops.add(ops.matmul(p, ops.constant(w.numpy()), False, True), ops.constant(b.numpy()))
            s = ops.reduce_sum(y, ops.constant(np.array([0, 1], dtype=np.int64)), False)
            total = s if total is None else ops.add(total, s)
        compiled = core.compile_model(ov.Model([total], [p]), "CPU", ov_config(threads, profile=True))
        request = compiled.create_infer_request()
        xn = x.numpy()

        def run_ov(request=request, xn=xn):
            request.infer({0: xn})
            return sum(i.real_time.total_seconds() for i in request.profiling_info if i.node_type == "FullyConnected")

        def run_vitfast(x=x, ws=ws, bs=bs):
            for w, b in zip(ws, bs):
                torch.ops.vitfast.linear(x, w, b, None)

        torch.set_num_threads(threads)
        flops = 2.0 * rows_n * k * n * LAYERS
        calls = max(1, round(0.15 / (flops / (100e9 * threads))))  # ~0.15 s a timing at ~100 GFLOP/s a thread
        times = paired({"openvino": run_ov, "vitfast": run_vitfast}, rounds, calls)
        med, lo, hi = paired_speedups(times["openvino"], times["vitfast"])
        out.append({"model": model, "threads": threads, "batch": batch, "layer": name,
                    "shape": f"{rows_n} x {k} x {n}",
                    "ov_gflops": flops / statistics.median(times["openvino"]) / 1e9,
                    "vf_gflops": flops / statistics.median(times["vitfast"]) / 1e9,
                    "ratio": med, "lo": lo, "hi": hi})
        print(f"  {model} t{threads} b{batch} {name:8s} {rows_n}x{k}x{n}: OpenVINO {out[-1]['ov_gflops']:.1f}, "
              f"vitfast {out[-1]['vf_gflops']:.1f} GFLOP/s; OpenVINO ÷ vitfast {med:.3f} ({lo:.2f}-{hi:.2f})",
              flush=True)
    return out


def whole_rows(model: str, threads: int, batch: int, rounds: int, workdir: str) -> tuple[dict, list[dict]]:
    import openvino as ov
    import timm
    import torch

    import vitfast
    from vitfast.export import to_onnx

    torch.set_num_threads(threads)
    source = timm.create_model(MODELS[model], pretrained=False).eval()
    fused = vitfast.fuse(vitfast.convert.from_timm(source, channel_idle=THETA)).eval()
    path = os.path.join(workdir, f"{model}.onnx")
    if not os.path.exists(path):
        to_onnx(fused, path, input_shape=(3, 224, 224))
    core = ov.Core()
    onnx_model = core.read_model(path)
    onnx_model.reshape([batch, 3, 224, 224])  # a static shape, as vitfast bench's OpenVINO rows (bench_runtimes.py)
    # Timed without PERF_COUNT (its bookkeeping is not part of a deployed request); profiled on a second compile.
    request = core.compile_model(onnx_model, "CPU", ov_config(threads)).create_infer_request()
    profiled = core.compile_model(onnx_model, "CPU", ov_config(threads, profile=True)).create_infer_request()
    x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    xn = x.numpy()

    def run_ov():
        request.infer({0: xn})

    def run_vitfast():
        with torch.no_grad():
            fused(x)

    times = paired({"openvino": run_ov, "vitfast": run_vitfast}, rounds)
    med, lo, hi = paired_speedups(times["openvino"], times["vitfast"])
    ov_ms, vf_ms = 1e3 * statistics.median(times["openvino"]), 1e3 * statistics.median(times["vitfast"])
    by_node: collections.Counter = collections.Counter()
    profiled.infer({0: xn})
    for _ in range(rounds):
        profiled.infer({0: xn})
        for info in profiled.profiling_info:
            by_node[(info.node_type, info.exec_type)] += info.real_time.total_seconds()
    node_total = sum(by_node.values()) / rounds * 1e3
    whole = {"model": model, "threads": threads, "batch": batch, "ov_ms": ov_ms, "vf_ms": vf_ms, "ratio": med,
             "lo": lo, "hi": hi, "ov_nodes_ms": node_total}
    print(f"  {model} t{threads} b{batch} whole: OpenVINO f32 {ov_ms:.2f} ms, vitfast {vf_ms:.2f} ms; "
          f"OpenVINO ÷ vitfast {med:.3f} ({lo:.2f}-{hi:.2f})", flush=True)
    split = []
    for (node, kernel), seconds in by_node.most_common():
        ms = seconds / rounds * 1e3
        if ms / node_total < 0.01:
            continue
        split.append({"model": model, "threads": threads, "batch": batch, "node": node, "kernel": kernel, "ms": ms,
                      "share": 100.0 * ms / node_total})
        print(f"    OpenVINO {node:18s} {kernel:24s} {ms:8.2f} ms {split[-1]['share']:5.1f}%")
    return whole, split


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--record", action="store_true", help="write the tables into benchmarks/results/")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds: expected a positive count, got {args.rounds}")
    try:
        import openvino  # noqa: F401
    except ImportError as exc:
        print(f"openvino is not installed (pip install openvino, or 'vitfast[bench]'): {exc}")
        return 1
    widths = {"deit_small": 384, "deit_base": 768}
    gemms, wholes, splits = [], [], []
    with tempfile.TemporaryDirectory() as workdir:
        for model in args.models:
            for threads, batch in SETTINGS:
                gemms += gemm_rows(model, widths[model], threads, batch, args.rounds)
                whole, split = whole_rows(model, threads, batch, args.rounds, workdir)
                wholes.append(whole)
                splits += split
    if args.record:
        from results_file import command_line, record

        command = command_line()
        conditions = (f"RePa-DeiT θ = {THETA}, random weights; batch 1 on one thread and batch 8 on two; "
                      f"{args.rounds} interleaved rounds (the order alternating), ratio = OpenVINO's time ÷ vitfast's "
                      "in the same round, median (p10–p90); OpenVINO f32 = INFERENCE_PRECISION_HINT=f32, LATENCY hint, "
                      "one stream, INFERENCE_NUM_THREADS = threads")
        setting = [{"label": "model", "fmt": "{model}"}, {"label": "threads", "fmt": "{threads}"},
                   {"label": "batch", "fmt": "{batch}"}]
        record("fp32_gemms_vs_openvino", {
            "title": "The fused block's GEMMs alone: OpenVINO f32 (its FullyConnected) against vitfast's linear",
            "script": "benchmarks/fp32_vs_openvino_parts.py", "command": command,
            "conditions": conditions + f"; each shape as {LAYERS} layers with different weights (as the model's "
                                       "blocks): OpenVINO one model of them timed by its FullyConnected nodes' "
                                       "profile times, vitfast as many torch.ops.vitfast.linear calls by the wall "
                                       "clock; GFLOP/s = 2·M·K·N per layer",
            "columns": setting + [{"label": "layer", "fmt": "{layer}"}, {"label": "M x K x N", "fmt": "{shape}"},
                                  {"label": "OpenVINO GFLOP/s", "fmt": "{ov_gflops:.1f}"},
                                  {"label": "vitfast GFLOP/s", "fmt": "{vf_gflops:.1f}"},
                                  {"label": "OpenVINO ÷ vitfast", "fmt": "{ratio:.3f}× ({lo:.2f}–{hi:.2f})"}],
            "rows": gemms,
        })
        record("fp32_whole_vs_openvino", {
            "title": "The whole fused model: OpenVINO f32 against vitfast fp32, and OpenVINO's node profile total",
            "script": "benchmarks/fp32_vs_openvino_parts.py", "command": command,
            "conditions": conditions + "; the last column: OpenVINO's node times summed per forward, from as many "
                                       "requests again on a second compile with PERF_COUNT on (the timed one has it off)",
            "columns": setting + [{"label": "OpenVINO f32 ms", "fmt": "{ov_ms:.2f}"},
                                  {"label": "vitfast fp32 ms", "fmt": "{vf_ms:.2f}"},
                                  {"label": "OpenVINO ÷ vitfast", "fmt": "{ratio:.3f}× ({lo:.2f}–{hi:.2f})"},
                                  {"label": "OpenVINO nodes ms", "fmt": "{ov_nodes_ms:.2f}"}],
            "rows": wholes,
        })
        path = record("openvino_f32_profile", {
            "title": "OpenVINO f32's forward by node type and kernel (PERF_COUNT), node types of 1% and more",
            "script": "benchmarks/fp32_vs_openvino_parts.py", "command": command,
            "conditions": conditions + "; ms per forward = the requests' summed node times ÷ their count",
            "columns": setting + [{"label": "node type", "fmt": "{node}"}, {"label": "kernel", "fmt": "{kernel}"},
                                  {"label": "ms per forward", "fmt": "{ms:.2f}"}, {"label": "share", "fmt": "{share:.1f}%"}],
            "rows": splits,
        })
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
