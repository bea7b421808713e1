"""The op-output cache (csrc/ops/output_pool.h) on and off: forward latency, page faults and system time of fused
RePa-DeiT-S/0.75 models (fp32, int8, bf16) on vitfast's CPU kernels, one fresh process per (setting, precision, cell),
settings interleaved over rounds.

    .venv/bin/python benchmarks/output_pool_ab.py                 # ~4 min on two cores
    .venv/bin/python benchmarks/output_pool_ab.py --rounds 5 --record

Why a fresh process per measurement: what the cache removes is glibc's state-dependent habit of returning freed blocks
to the kernel (its trim threshold follows the largest block freed so far), so the same process would carry one
setting's heap into the other's.  Off = VITFAST_OUTPUT_POOL=0 (every output from the CPU allocator, as before the
cache).  Per process: 3 warm-up forwards, then `--calls` timed ones; minor page faults and system CPU time per
forward from getrusage around the timed calls.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, os, resource, sys, time
import torch, timm, vitfast
precision, batch, threads, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
torch.set_num_threads(threads)
m = timm.create_model("deit_small_patch16_224")
f = vitfast.fuse(vitfast.convert.from_timm(m, channel_idle=0.75)).eval()
model = f if precision == "fp32" else vitfast.quantize(f, dtype=precision)
x = torch.randn(batch, 3, 224, 224)
if precision == "bf16":
    x = x.bfloat16()
with torch.inference_mode():
    for _ in range(3):
        model(x)
    r0, times = resource.getrusage(resource.RUSAGE_SELF), []
    for _ in range(calls):
        t = time.perf_counter()
        model(x)
        times.append(time.perf_counter() - t)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"ms": sorted(times)[len(times) // 2] * 1e3, "faults": (r1.ru_minflt - r0.ru_minflt) / calls,
                  "sys_ms": (r1.ru_stime - r0.ru_stime) * 1e3 / calls}))
"""

CELLS = [("int8", 8, 2), ("bf16", 8, 2), ("fp32", 8, 2), ("int8", 1, 1)]


def run(precision: str, batch: int, threads: int, calls: int, pool: bool) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env["VITFAST_OUTPUT_POOL"] = "1" if pool else "0"
    out = subprocess.run([sys.executable, "-c", CHILD, precision, str(batch), str(threads), str(calls)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--record", action="store_true", help="write the table into benchmarks/results/")
    args = p.parse_args(argv)
    import vitfast

    cells = [c for c in CELLS if c[0] != "bf16" or vitfast.ops.bf16_kernel() != "none"]
    got = {(c, pool): [] for c in cells for pool in (False, True)}
    for r in range(args.rounds):
        for cell in cells:
            for pool in ((False, True) if r % 2 == 0 else (True, False)):  # alternate which goes first
                got[(cell, pool)].append(run(*cell, args.calls, pool))
                g = got[(cell, pool)][-1]
                print(f"round {r + 1}: {cell[0]} b{cell[1]} t{cell[2]} cache {'on ' if pool else 'off'}: "
                      f"{g['ms']:.2f} ms, {g['faults']:.0f} faults, {g['sys_ms']:.2f} ms sys", flush=True)
    rows = []
    print(f"\n{'cell':<18} {'cache off ms':>13} {'cache on ms':>12} {'off ÷ on':>18} {'faults off/on':>16} "
          f"{'sys ms off/on':>14}")
    for cell in cells:
        off, on = got[(cell, False)], got[(cell, True)]
        ratios = sorted(a["ms"] / b["ms"] for a, b in zip(off, on))  # paired by round
        med = lambda rs, k: statistics.median(x[k] for x in rs)  # noqa: E731
        row = {"precision": cell[0], "batch": cell[1], "threads": cell[2], "off_ms": round(med(off, "ms"), 2),
               "on_ms": round(med(on, "ms"), 2), "ratio": f"{statistics.median(ratios):.3f}× "
               f"({ratios[0]:.2f}–{ratios[-1]:.2f})", "faults_off": round(med(off, "faults")),
               "faults_on": round(med(on, "faults")), "sys_off": round(med(off, "sys_ms"), 2),
               "sys_on": round(med(on, "sys_ms"), 2)}
        rows.append(row)
        print(f"{cell[0]} b{cell[1]} t{cell[2]:<10} {row['off_ms']:>13.2f} {row['on_ms']:>12.2f} {row['ratio']:>18} "
              f"{row['faults_off']:>8}/{row['faults_on']:<7} {row['sys_off']:>6.2f}/{row['sys_on']:<6.2f}")
    if args.record:
        sys.path.insert(0, HERE)
        from results_file import command_line, record

        path = record("output_pool_ab", {
            "title": "The op-output cache off (VITFAST_OUTPUT_POOL=0) and on: RePa-DeiT-S/0.75 forwards",
            "script": "benchmarks/output_pool_ab.py", "command": command_line(),
            "conditions": f"one fresh process per (setting, cell, round), settings alternating first, {args.rounds} "
                          f"rounds; per process 3 warm-up and {args.calls} timed forwards (median); faults = minor page "
                          f"faults per forward, sys = system CPU ms per forward (getrusage); ratio = off ÷ on paired "
                          f"by round, median (min–max)",
            "columns": [{"label": "precision", "fmt": "{precision}"}, {"label": "batch", "fmt": "{batch}"},
                        {"label": "threads", "fmt": "{threads}"}, {"label": "cache off ms", "fmt": "{off_ms}"},
                        {"label": "cache on ms", "fmt": "{on_ms}"}, {"label": "off ÷ on", "fmt": "{ratio}"},
                        {"label": "faults off / on", "fmt": "{faults_off} / {faults_on}"},
                        {"label": "sys ms off / on", "fmt": "{sys_off} / {sys_on}"}],
            "rows": rows,
        })
        print(f"recorded: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
