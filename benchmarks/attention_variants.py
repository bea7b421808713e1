"""The attention ops an int8 model can run, paired on one core: `attention` (fp32), `attention_int8` (int8 products,
the default of `vitfast.quantize`) and `attention_bf16` (bf16-operand products, `vitfast.quantize(...,
attention="bf16")`), at DeiT-S / DeiT-B shapes (N = 197, head dim 64), batch 1 and 8, with each one's relative error
against fp32 attention on the same random qkv.  --record writes the table `attention_variants` into
benchmarks/results/.

    python benchmarks/attention_variants.py [--rounds 15] [--record]

One thread.  Each round calls the three ops once in rotating order; a ratio is the fp32 op's time over the variant's
in the same round, median and p10-p90 over the rounds (a busy neighbour slows a round's calls alike).  Which bf16
kernel runs is in the table's conditions (`vitfast.ops.bf16_kernel()`; without one the portable kernel is slow).

    python benchmarks/attention_variants.py --grid [--configs default,noamx,avx2] [--rounds 9] [--record]

`--grid`: where int8 products pay, the data of `attention="auto"` (vitfast/quant/attention_choice.py): fp32
attention ÷ attention_int8, paired, over token counts N 17-577 and head dims 16-64 (6 heads), batch 1 and 8, for
each int8 kernel this CPU can run — each configuration in its own process (`default`: the best kernel; `noamx`:
VITFAST_CPU_EXT=noamx, the AVX-512 VNNI kernel of a CPU without AMX; `avx2`: VITFAST_CPU_ISA=avx2, the AVX-VNNI
kernel where the CPU has it; `avx2-plain`: that path with the extensions off, the AVX2 kernel).  Table
`attention_crossover`; a cell marked * is one where attention="auto" picks int8 on that kernel.
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
from vitfast.bench import paired_speedups  # noqa: E402
from shapes import VIT_SHAPES, attention_qkv  # noqa: E402

OPS = {"fp32": "attention", "int8": "attention_int8", "bf16": "attention_bf16"}


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
        med = statistics.median(times[k])
        ratio, lo, hi = paired_speedups(times["fp32"], times[k])
        rows.append({"shape": VIT_SHAPES[shape_name].name, "batch": batch, "products": k, "op": OPS[k],
                     "us": med * 1e6, "ratio": ratio, "lo": lo, "hi": hi, "rel_err": err[k]})
    return rows


GRID_TOKENS = (17, 50, 65, 101, 197, 577)
GRID_HEAD_DIMS = (16, 24, 32, 64)
GRID_HEADS = 6
CONFIGS = {"default": {}, "noamx": {"VITFAST_CPU_EXT": "noamx"}, "avx2": {"VITFAST_CPU_ISA": "avx2"},
           "avx2-plain": {"VITFAST_CPU_ISA": "avx2", "VITFAST_CPU_EXT": "none"}}


def grid_cell(batch: int, tokens: int, head_dim: int, rounds: int) -> dict:
    """fp32 ÷ int8 attention at one shape on this process's int8 kernel: median and p10 of the paired ratios."""
    torch.manual_seed(0)
    qkv = torch.randn(batch, tokens, 3 * GRID_HEADS * head_dim)
    fns = [torch.ops.vitfast.attention, torch.ops.vitfast.attention_int8]
    reps = max(1, int(0.004 / max(2e-6, 4.0 * batch * GRID_HEADS * tokens ** 2 * head_dim / 60e9)))
    times = ([], [])
    with torch.inference_mode():
        for r in range(rounds + 2):
            for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                t0 = time.perf_counter()
                for _ in range(reps):
                    fns[i](qkv, GRID_HEADS)
                if r >= 2:
                    times[i].append((time.perf_counter() - t0) / reps)
    ratio, lo, _ = paired_speedups(*times)
    return {"batch": batch, "tokens": tokens, "head_dim": head_dim, "ratio": ratio, "lo": lo,
            "fp32_us": statistics.median(times[0]) * 1e6}


def grid_child(rounds: int) -> int:
    """One configuration's cells as JSON lines on stdout (run by `grid` in a fresh process)."""
    import json

    torch.set_num_threads(1)
    kernel = vitfast.ops.int8_kernel()
    for batch in (1, 8):
        for tokens in GRID_TOKENS:
            for head_dim in GRID_HEAD_DIMS:
                print(json.dumps({"kernel": kernel, **grid_cell(batch, tokens, head_dim, rounds)}), flush=True)
    return 0


def grid(configs: list, rounds: int, record_table: bool) -> int:
    import json
    import subprocess

    from vitfast.quant.attention_choice import int8_attention_pays

    cells, kernels = [], []
    for name in configs:
        env = {**os.environ, **CONFIGS[name], "OMP_NUM_THREADS": "1"}
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--grid-child", "--rounds", str(rounds)],
                              env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"attention_variants: configuration {name} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
            return 1
        got = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        if got and got[0]["kernel"] in kernels:  # this CPU has no such kernel: the same one again
            print(f"{name}: the {got[0]['kernel']} kernel again, left out")
            continue
        kernels.append(got[0]["kernel"])
        cells += got
    rows = []
    for kernel in kernels:
        for batch in (1, 8):
            for head_dim in GRID_HEAD_DIMS:
                row = {"kernel": kernel, "batch": batch, "head_dim": head_dim}
                for c in cells:
                    if (c["kernel"], c["batch"], c["head_dim"]) == (kernel, batch, head_dim):
                        mark = "*" if int8_attention_pays(c["tokens"], head_dim, kernel) else ""
                        row[f"n{c['tokens']}"] = f"{c['ratio']:.2f}×{mark}"
                        row[f"n{c['tokens']}_ratio"] = c["ratio"]
                        row[f"n{c['tokens']}_p10"] = c["lo"]
                rows.append(row)
                print(f"{kernel:12s} b{batch} D{head_dim:3d}  " + "  ".join(
                    f"N{n}: {row[f'n{n}']:7s}" for n in GRID_TOKENS))
    if record_table:
        from results_file import command_line, record

        print(record("attention_crossover", {
            "title": "Where int8 attention products pay: fp32 attention ÷ attention_int8 per int8 kernel, one core",
            "script": "benchmarks/attention_variants.py", "command": command_line(),
            "conditions": f"one thread, {GRID_HEADS} heads, random N(0, 1) qkv; {rounds} rounds of the two ops in "
                          f"alternating order, median of the paired ratios (above 1 int8 products are faster); each "
                          f"kernel in its own process (noamx: VITFAST_CPU_EXT=noamx; avx2: VITFAST_CPU_ISA=avx2; "
                          f"avx2-plain: that and VITFAST_CPU_EXT=none); "
                          f"* = attention='auto' picks int8 products there (vitfast/quant/attention_choice.py)",
            "columns": [{"label": "int8 kernel", "fmt": "{kernel}"}, {"label": "batch", "fmt": "{batch}"},
                        {"label": "head dim", "fmt": "{head_dim}"},
                        *[{"label": f"N = {n}", "fmt": f"{{n{n}}}"} for n in GRID_TOKENS]],
            "rows": rows,
        }))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--record", action="store_true", help="write the table into benchmarks/results/")
    parser.add_argument("--grid", action="store_true", help="the int8 crossover grid (table attention_crossover)")
    parser.add_argument("--configs", default="default,noamx,avx2",
                        help=f"--grid: comma-separated configurations of {', '.join(CONFIGS)}")
    parser.add_argument("--grid-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not vitfast.ops.extension_loaded():
        print("attention_variants: the C++ extension is not built (scripts/setup.sh)", file=sys.stderr)
        return 1
    if args.grid_child:
        return grid_child(args.rounds)
    if args.grid:
        configs = [c.strip() for c in args.configs.split(",") if c.strip()]
        unknown = [c for c in configs if c not in CONFIGS]
        if unknown or not configs:
            parser.error(f"--configs: expected names of {', '.join(CONFIGS)}, got {args.configs!r}")
        return grid(configs, args.rounds, args.record)
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
