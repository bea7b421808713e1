"""The attention ops an int8 model can run, paired on one core: `attention` (fp32), `attention_int8` (int8 products,
the default of `vitfast.quantize`) and `attention_bf16` (bf16-operand products, `vitfast.quantize(...,
attention="bf16")`), at DeiT-S / DeiT-B shapes (N = 197, head dim 64), batch 1 and 8, with each one's relative error
against fp32 attention on the same random qkv.  --record writes the table `attention_variants` into
benchmarks/results/.

    python benchmarks/attention_variants.py [--rounds 15] [--record]

One thread.  Each round calls the three ops once in rotating order; a ratio is the fp32 op's time over the variant's
in the same round, median and p10-p90 over the rounds (a busy neighbour slows a round's calls alike).  Which bf16
kernel runs is in the table's conditions (`vitfast.ops.bf16_kernel()`; without one the portable kernel is slow).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import vitfast  # noqa: E402
from shapes import VIT_SHAPES, attention_qkv  # noqa: E402

OPS = {"fp32": "attention", "int8": "attention_int8", "bf16": "attention_bf16"}


def _quantiles(values):
    v = sorted(values)
    return statistics.median(v), v[len(v) // 10], v[(len(v) * 9) // 10]


def measure(shape_name: str, batch: int, rounds: int) -> list:
    shape = VIT_SHAPES[shape_name]
    qkv = attention_qkv(shape, batch)
    fns = {k: getattr(torch.ops.vitfast, name) for k, name in OPS.items()}
    with torch.inference_mode():
        ref = fns["fp32"](qkv, shape.heads)
        err = {k: float((fn(qkv, shape.heads) - ref).norm() / ref.norm()) for k, fn in fns.items()}
        reps = max(1, int(0.02 / max(1e-4, 4.0 * batch * shape.heads * shape.tokens ** 2 * 64 / 150e9)))
        times = {k: [] for k in fns}
        order = list(fns)
        for r in range(rounds + 2):
            for k in order[r % 3:] + order[:r % 3]:
                t0 = time.perf_counter()
                for _ in range(reps):
                    fns[k](qkv, shape.heads)
                if r >= 2:  # two warm-up rounds
                    times[k].append((time.perf_counter() - t0) / reps)
    rows = []
    for k in fns:
        med, _, _ = _quantiles(times[k])
        ratio, lo, hi = _quantiles([a / b for a, b in zip(times["fp32"], times[k])])
        rows.append({"shape": VIT_SHAPES[shape_name].name, "batch": batch, "products": k, "op": OPS[k],
                     "us": med * 1e6, "ratio": ratio, "lo": lo, "hi": hi, "rel_err": err[k]})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--record", action="store_true", help="write the table into benchmarks/results/")
    args = parser.parse_args()
    if not vitfast.ops.extension_loaded():
        print("attention_variants: the C++ extension is not built (scripts/setup.sh)", file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    rows = []
    for shape_name in ("deit_small", "deit_base"):
        for batch in (1, 8):
            rows += measure(shape_name, batch, args.rounds)
    for r in rows:
        print(f"{r['shape']:8s} b{r['batch']}  {r['products']:5s} {r['us']:9.1f} us  fp32 ÷ it {r['ratio']:.3f}× "
              f"({r['lo']:.2f}–{r['hi']:.2f})  rel err {r['rel_err']:.2e}")
    if args.record:
        from results_file import command_line, record

        path = record("attention_variants", {
            "title": "An int8 model's attention options, one core: fp32, int8 and bf16-operand score/value products",
            "script": "benchmarks/attention_variants.py", "command": command_line(),
            "conditions": f"one thread, {args.rounds} rounds of the three ops in rotating order (medians; ratios "
                          f"paired per round, p10-p90); bf16 kernel {vitfast.ops.bf16_kernel()}, int8 kernel "
                          f"{vitfast.ops.int8_kernel()}; random N(0, 1) qkv, error against fp32 attention",
            "columns": [{"label": "shape", "fmt": "{shape}"}, {"label": "batch", "fmt": "{batch}"},
                        {"label": "products (op)", "fmt": "{products} ({op})"}, {"label": "µs", "fmt": "{us:.1f}"},
                        {"label": "fp32 ÷ op, paired", "fmt": "{ratio:.3f}× ({lo:.2f}–{hi:.2f})"},
                        {"label": "rel err vs fp32", "fmt": "{rel_err:.2e}"}],
            "rows": rows,
        })
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
