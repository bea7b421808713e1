"""int8 against fp32 on the demo model's shape (`vitfast demo`: 32x32 digits, patch 8 → 17 tokens, width 96, 4 heads
of dim 24, depth 4, channel-idle θ = 0.75 with BatchNorm), where the per-call costs of int8 (quantizing activations,
Q/K/P/V, a parallel region per op) weigh most: the fused fp32 model, `vitfast.quantize` defaults (attention="auto":
fp32 products at this shape, vitfast/quant/attention_choice.py) and the same with int8 products asked for.

    .venv/bin/python benchmarks/int8_demo_shape.py [--rounds 30] [--record]

Random weights (latency does not depend on them).  Per (threads, batch): the three models in rotating order, one
timed block of calls each per round; ratios are fp32's time over the int8 model's in the same round (median, p10-p90;
above 1 int8 is faster).  Table `int8_demo_shape` in benchmarks/results/.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import timm  # noqa: E402
import torch  # noqa: E402

import vitfast  # noqa: E402
from vitfast.bench import paired_speedups  # noqa: E402
from vitfast.demos.demo import DEMO_MODEL  # noqa: E402

CELLS = [(1, 1), (2, 1), (1, 64), (2, 64)]  # (threads, batch)


def models() -> dict:
    torch.manual_seed(0)
    timm_model = timm.create_model("vit_tiny_patch16_224", **DEMO_MODEL).eval()
    fused = vitfast.fuse(vitfast.convert.from_timm(timm_model, channel_idle=0.75, norm="batch")).eval()
    return {"fp32": fused, "int8 (auto: fp32 products)": vitfast.quantize(fused),
            "int8, int8 products": vitfast.quantize(fused, attention="int8")}


def measure(nets: dict, threads: int, batch: int, rounds: int) -> list:
    torch.set_num_threads(threads)
    x = torch.randn(batch, 3, DEMO_MODEL["img_size"], DEMO_MODEL["img_size"])
    calls = 50 if batch == 1 else 5
    names = list(nets)
    times = {k: [] for k in names}
    with torch.inference_mode():
        for m in nets.values():
            for _ in range(calls * 2):
                m(x)
        for r in range(rounds):
            for k in names[r % 3:] + names[:r % 3]:
                t0 = time.perf_counter()
                for _ in range(calls):
                    nets[k](x)
                times[k].append((time.perf_counter() - t0) / calls)
    rows = []
    for k in names:
        ratio, lo, hi = paired_speedups(times["fp32"], times[k])
        rows.append({"threads": threads, "batch": batch, "model": k, "ms": statistics.median(times[k]) * 1e3,
                     "ratio": ratio, "lo": lo, "hi": hi})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--record", action="store_true", help="write the table into benchmarks/results/")
    args = p.parse_args()
    if not vitfast.ops.extension_loaded():
        print("int8_demo_shape: the C++ extension is not built (scripts/setup.sh)", file=sys.stderr)
        return 1
    nets = models()
    print(vitfast.quant.describe(nets["int8 (auto: fp32 products)"]))
    rows = [row for threads, batch in CELLS for row in measure(nets, threads, batch, args.rounds)]
    for r in rows:
        print(f"t{r['threads']} b{r['batch']:<3} {r['model']:28s} {r['ms']:7.3f} ms  fp32 ÷ it {r['ratio']:.3f}× "
              f"({r['lo']:.2f}–{r['hi']:.2f})")
    if args.record:
        from results_file import command_line, record

        print(record("int8_demo_shape", {
            "title": "int8 against fp32 on the demo model's shape (17 tokens, width 96, head dim 24)",
            "script": "benchmarks/int8_demo_shape.py", "command": command_line(),
            "conditions": f"random weights; {args.rounds} rounds of the three models in rotating order, 50 calls per "
                          f"timed block at batch 1, 5 at batch 64; ratio = fp32's time ÷ the model's in the same round "
                          f"(median, p10-p90; above 1 faster than fp32); int8 kernel {vitfast.ops.int8_kernel()}",
            "columns": [{"label": "threads", "fmt": "{threads}"}, {"label": "batch", "fmt": "{batch}"},
                        {"label": "model", "fmt": "{model}"}, {"label": "ms", "fmt": "{ms:.3f}"},
                        {"label": "fp32 ÷ model, paired", "fmt": "{ratio:.3f}× ({lo:.2f}–{hi:.2f})"}],
            "rows": rows,
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
