"""One environment switch of vitfast's CPU path off and on, in fresh processes: forward latency, page faults and system
time of fused RePa-DeiT/0.75 models (fp32, int8, bf16), settings interleaved over rounds.  The measurement and command
line of `output_pool_ab.py` (VITFAST_OUTPUT_POOL), `huge_pages_ab.py` (VITFAST_HUGE_PAGES) and
`next_panel_prefetch_ab.py` (VITFAST_NEXT_PANEL_PREFETCH).

Why a fresh process per measurement: the memory switches change where memory comes from (glibc's heap, the kernel's
pages), and a process carries one setting's heap and page tables into the other's; the prefetch switch is read once
per process.  Per process: 3 warm-up forwards, then
`calls` timed ones (median); minor page faults and system CPU time per forward from getrusage around the timed calls.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Dict, List, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = r"""
import json, os, resource, sys, time
import torch, timm, vitfast
model_name, precision, batch, threads, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.manual_seed(0)
torch.set_num_threads(threads)
m = timm.create_model(model_name)
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
                  "sys_ms": (r1.ru_stime - r0.ru_stime) * 1e3 / calls, "isa": vitfast.ops.cpu_isa(),
                  "int8_kernel": vitfast.ops.int8_kernel()}))
"""

# (precision, batch, threads), or (precision, batch, threads, model, path) where path is "" (vitfast's default CPU
# path), "avx2" (VITFAST_CPU_ISA=avx2) or "noamx" (VITFAST_CPU_EXT=noamx: the AVX-512 VNNI / BF16 kernels on an AMX
# CPU); the 3-tuple form runs measure()'s `model` on the default path.
Cell = Tuple

PATH_ENV = {"": {}, "avx2": {"VITFAST_CPU_ISA": "avx2"}, "noamx": {"VITFAST_CPU_EXT": "noamx"}}


def cell_parts(cell: Cell, model: str) -> Tuple[str, int, int, str, str]:
    precision, batch, threads = cell[:3]
    return precision, batch, threads, cell[3] if len(cell) > 3 else model, cell[4] if len(cell) > 4 else ""


def short_name(model: str) -> str:
    """"deit_base" for "deit_base_patch16_224"."""
    return model.split("_patch")[0]


def cell_label(cell: Cell) -> str:
    """"fp32 b1 t1", with the model and the path when the cell names them: "deit_base fp32 avx2 b1 t1"."""
    precision, batch, threads, model, path = cell_parts(cell, "")
    head = " ".join(x for x in (short_name(model), precision, path) if x)
    return f"{head} b{batch} t{threads}"


def run(env_var: str, on: bool, cell: Cell, calls: int, model: str) -> dict:
    precision, batch, threads, model, path = cell_parts(cell, model)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **PATH_ENV[path])
    env[env_var] = "1" if on else "0"
    out = subprocess.run([sys.executable, "-c", CHILD, model, precision, str(batch), str(threads), str(calls)],
                         env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def usable_cells(cells: Sequence[Cell]) -> List[Cell]:
    """`cells` without those this CPU cannot run as named: bf16 where it has no bf16 kernel (they would time fp32
    compute), the "avx2" path without AVX2, the "noamx" path without AMX (it would be the default path again)."""
    import vitfast
    from vitfast.ops import _extension

    ext = vitfast.ops.cpu_extensions()
    isas = [] if _extension._C is None else list(_extension._C.supported_cpu_isas())
    ok = {"": True, "avx2": "avx2" in isas, "noamx": any(e.startswith("amx") for e in ext)}
    return [c for c in cells if (c[0] != "bf16" or vitfast.ops.bf16_kernel() != "none") and ok[cell_parts(c, "")[4]]]


def measure(env_var: str, what: str, cells: Sequence[Cell], rounds: int, calls: int,
            model: str = "deit_small_patch16_224") -> List[dict]:
    """Rows (one per cell) of `env_var` off (=0) and on (=1), alternating which goes first every round; prints each
    process's figures as they come and the table at the end.  `what` names the switch in the output."""
    cells = usable_cells(cells)
    got: Dict[Tuple[Cell, bool], List[dict]] = {(c, on): [] for c in cells for on in (False, True)}
    for r in range(rounds):
        for cell in cells:
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                g = run(env_var, on, cell, calls, model)
                got[(cell, on)].append(g)
                print(f"round {r + 1}: {cell_label(cell)} {what} {'on ' if on else 'off'}: "
                      f"{g['ms']:.2f} ms, {g['faults']:.0f} faults, {g['sys_ms']:.2f} ms sys", flush=True)
    rows = []
    print(f"\n{'cell':<28} {what + ' off ms':>20} {what + ' on ms':>19} {'off ÷ on':>18} {'faults off/on':>16} "
          f"{'sys ms off/on':>14}")
    for cell in cells:
        off, on = got[(cell, False)], got[(cell, True)]
        ratios = sorted(a["ms"] / b["ms"] for a, b in zip(off, on))  # paired by round
        med = lambda rs, k: statistics.median(x[k] for x in rs)  # noqa: E731
        precision, batch, threads, model_name, path = cell_parts(cell, model)
        row = {"precision": precision, "batch": batch, "threads": threads, "off_ms": round(med(off, "ms"), 2),
               "on_ms": round(med(on, "ms"), 2), "ratio": f"{statistics.median(ratios):.3f}× "
               f"({ratios[0]:.2f}–{ratios[-1]:.2f})", "faults_off": round(med(off, "faults")),
               "faults_on": round(med(on, "faults")), "sys_off": round(med(off, "sys_ms"), 2),
               "sys_on": round(med(on, "sys_ms"), 2)}
        if len(cell) > 3:
            row.update(model=short_name(model_name), path=path or "default")
        rows.append(row)
        print(f"{cell_label(cell):<28} {row['off_ms']:>20.2f} {row['on_ms']:>19.2f} {row['ratio']:>18} "
              f"{row['faults_off']:>8}/{row['faults_on']:<7} {row['sys_off']:>6.2f}/{row['sys_on']:<6.2f}")
    return rows


def record_rows(name: str, title: str, script: str, what: str, rows: List[dict], rounds: int, calls: int) -> str:
    """Write the rows as table `name` of today's results file; returns its path."""
    sys.path.insert(0, HERE)
    from results_file import command_line, record

    return record(name, {
        "title": title, "script": script, "command": command_line(),
        "conditions": f"one fresh process per (setting, cell, round), settings alternating first, {rounds} "
                      f"rounds; per process 3 warm-up and {calls} timed forwards (median); faults = minor page "
                      f"faults per forward, sys = system CPU ms per forward (getrusage); ratio = off ÷ on paired "
                      f"by round, median (min–max)",
        "columns": ([{"label": "model", "fmt": "{model}"}, {"label": "CPU path", "fmt": "{path}"}]
                    if rows and "model" in rows[0] else []) +
                   [{"label": "precision", "fmt": "{precision}"}, {"label": "batch", "fmt": "{batch}"},
                    {"label": "threads", "fmt": "{threads}"}, {"label": f"{what} off ms", "fmt": "{off_ms}"},
                    {"label": f"{what} on ms", "fmt": "{on_ms}"}, {"label": "off ÷ on", "fmt": "{ratio}"},
                    {"label": "faults off / on", "fmt": "{faults_off} / {faults_on}"},
                    {"label": "sys ms off / on", "fmt": "{sys_off} / {sys_on}"}],
        "rows": rows,
    })


def main(argv, *, env_var: str, what: str, cells: Sequence[Cell], table: str, title: str, script: str,
         description: str) -> int:
    """The command line both scripts share: --rounds, --calls, --record (table `table` of today's results file)."""
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--record", action="store_true", help="write the table into benchmarks/results/")
    args = p.parse_args(argv)
    rows = measure(env_var, what, cells, args.rounds, args.calls)
    if args.record:
        print(f"recorded: {record_rows(table, title, script, what, rows, args.rounds, args.calls)}")
    return 0
