"""The low-precision CPU cells of the int8/bf16 work, on this host, in one command: RePa-DeiT-S/B θ = 0.75 at batch
1 on one thread and batch 8 on two, vitfast fp32 / int8 / bf16 against ONNX Runtime (fp32 and its one-call dynamic
int8) and OpenVINO (f32 and its default precision) on the same fused graph, then each target checked on the paired
ratios of the same rounds.

    python benchmarks/lowp_cells.py [--models deit_small deit_base] [--isa avx2 [--ext none] | --emulate avx2]
                                    [--record] [--quick]

Each (model, setting) is one `vitfast bench --json` process (the rounds interleave every provider, so a ratio's
two times come from the same seconds).  The targets:

    vitfast int8  ÷  ORT dynamic int8      >= 1.2   every cell
    vitfast fp32  ÷  vitfast int8          >= 2.0   every cell (int8 speed-up over fp32)
    OpenVINO default ÷ vitfast bf16        >= 1.1   batch 1, one thread, where the CPU has a bf16 kernel
    OpenVINO f32  ÷  vitfast fp32          >  1.0   every cell (fp32 stays ahead)

--isa runs vitfast on another of its CPU paths (VITFAST_CPU_ISA; e.g. `avx2` on an AVX-512 host).  The anchors
keep their own ISA choice then, so the anchor ratios are not an AVX2-only host's: such tables are recorded as
`avx2_path_lowp_*` (the plain AVX2 int8 kernel) or `avx_vnni_path_lowp_*` (the AVX2 path's AVX-VNNI kernel, where
the CPU has AVX-VNNI), a host's own as `lowp_anchors_*` (benchmarks/results/<date>-<machine>.json, with the targets
in `lowp_targets` / `<prefix>_targets`).  --ext sets VITFAST_CPU_EXT for vitfast (`none`: no VNNI/BF16/AMX
extension, so `--isa avx2 --ext none` is an AVX2-only CPU's kernels on an AVX-VNNI host).  Run it on a quiet host:
an OpenMP job on the other core slows vitfast and the anchors unequally.

--emulate avx2|avx512 runs every benchmark process under benchmarks/cpuid_mask.py's LD_PRELOAD library: the whole
process (vitfast, PyTorch, ONNX Runtime, OpenVINO) sees an AVX2-only CPU, or AVX-512 without AMX, and each picks
that CPU's kernels, so the anchor ratios are those of such a CPU's instruction set (on this host's cores: not a Zen
3's timings).  Its tables are `emulated_<profile>_lowp_*`.  Needs CPUID faulting (`cpuid_fault` in /proc/cpuinfo).  The exit status is 0 whether or not a target
is met (it measures, it does not gate); a failed benchmark process is 1.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MODELS = {"deit_small": "deit_small_patch16_224", "deit_base": "deit_base_patch16_224"}
SHORT = {"deit_small": "DeiT-S", "deit_base": "DeiT-B"}
TAG = {"deit_small": "deit_s", "deit_base": "deit_b"}  # the tables' names
# (threads, batch, repeats): the two settings of the targets
SETTINGS = ((1, 1, 20), (2, 8, 10))


def providers(bf16: bool, openvino: bool, narrow: bool = False) -> list[str]:
    """narrow: also vitfast int8 with 7-bit weights (where the int8 kernel is the plain AVX2 one, the only kernel it
    makes faster) and its exact ORT counterpart, quantize_dynamic(reduce_range=True) (ORT's own int8 GEMM without
    VNNI saturates 8-bit weights)."""
    keys = (["ort-fused", "ort-int8"] + (["ort-int8-rr"] if narrow else []) + ["ort-qdq"]
            + (["openvino-f32", "openvino"] if openvino else []))
    return (keys + ["vitfast", "vitfast-int8"] + (["vitfast-int8-w7"] if narrow else [])
            + (["vitfast-bf16"] if bf16 else []))


def bench(model: str, threads: int, batch: int, repeats: int, keys: list[str], isa: str | None,
          out: str, ext: str | None = None, base_env: dict[str, str] | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "vitfast", "bench", MODELS[model], "--channel-idle", "0.75", "--providers",
           ",".join(keys), "--threads", str(threads), "--batch-sizes", str(batch), "--repeats", str(repeats),
           "--json", out]
    env = dict(os.environ if base_env is None else base_env)
    if env.get("VITFAST_CPUID_MASK"):
        print(f"(the process sees a CPU masked to {env['VITFAST_CPUID_MASK']}: LD_PRELOAD={env['LD_PRELOAD']})")
    if isa:
        env["VITFAST_CPU_ISA"] = isa
    if ext:
        env["VITFAST_CPU_EXT"] = ext
    print("$", ("VITFAST_CPU_ISA=" + isa + " " if isa else "") + ("VITFAST_CPU_EXT=" + ext + " " if ext else "")
          + " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True, env=env)
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def _row(report: dict[str, Any], key: str) -> dict[str, Any] | None:
    return next((r for r in report["results"] if r["provider"] == key), None)


def checks(report: dict[str, Any], model: str, bf16: bool) -> list[dict[str, Any]]:
    """The targets of one report (one model and setting), each as a row with the paired ratio (median, p10, p90)."""
    from vitfast.bench import paired_speedups

    rows: list[dict[str, Any]] = []
    fp32, int8, b16 = _row(report, "vitfast"), _row(report, "vitfast-int8"), _row(report, "vitfast-bf16")
    if fp32 is None:
        return rows
    threads, batch = fp32["threads"], fp32["batch"]

    def add(check: str, ratio: tuple[float, float, float] | None, target: float, strict: bool = False) -> None:
        if ratio is None:
            met = "unmeasured"
        else:
            met = "met" if (ratio[0] > target if strict else ratio[0] >= target) else "NOT met"
        rows.append({"model": SHORT[model], "threads": threads, "batch": batch, "check": check,
                     "ratio": "–" if ratio is None else f"{ratio[0]:.3f}× ({ratio[1]:.2f}–{ratio[2]:.2f})",
                     "target": f"{'>' if strict else '≥'} {target:g}×", "met": met})

    for row, what in ((int8, "vitfast int8"), (_row(report, "vitfast-int8-w7"), "vitfast int8 (7-bit weights)")):
        if row is not None:
            add(f"ORT dynamic int8 ÷ {what}", (row.get("paired_vs") or {}).get("ort-int8"), 1.2)
            add(f"vitfast fp32 ÷ {what}", paired_speedups(fp32["round_ms"], row["round_ms"]), 2.0)
    w7 = _row(report, "vitfast-int8-w7")
    if w7 is not None and "ort-int8-rr" in (w7.get("paired_vs") or {}):  # both exact: 7-bit weights on each side
        add("ORT int8 7-bit weights ÷ vitfast int8 (7-bit weights)", w7["paired_vs"]["ort-int8-rr"], 1.2)
    if bf16 and b16 is not None and threads == 1 and batch == 1:
        add("OpenVINO default ÷ vitfast bf16", (b16.get("paired_vs") or {}).get("openvino"), 1.1)
    add("OpenVINO f32 ÷ vitfast fp32", (fp32.get("paired_vs") or {}).get("openvino-f32"), 1.0, strict=True)
    return rows


def print_checks(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'model':7s} {'thr':>3s} {'batch':>5s}  {'check':54s} {'paired ratio':24s} {'target':8s} result")
    for r in rows:
        print(f"{r['model']:7s} {r['threads']:>3d} {r['batch']:>5d}  {r['check']:54s} {r['ratio']:24s} "
              f"{r['target']:8s} {r['met']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["deit_small", "deit_base"])
    p.add_argument("--isa", choices=("avx512", "avx2", "neon", "scalar"), default=None,
                   help="vitfast's CPU path for the benchmark processes (VITFAST_CPU_ISA); default: this CPU's own")
    p.add_argument("--ext", choices=("none", "noamx"), default=None,
                   help="VITFAST_CPU_EXT for vitfast's processes (none: no low-precision extension)")
    p.add_argument("--emulate", choices=("avx2", "avx_vnni", "avx512"), default=None,
                   help="run every benchmark process on a CPU view masked to this profile (cpuid_mask.py): "
                        "vitfast and the anchors alike")
    p.add_argument("--quick", action="store_true", help="5 rounds per setting (a smoke run; not for the record)")
    p.add_argument("--record", action="store_true", help="write the tables into benchmarks/results/")
    args = p.parse_args(argv)
    if args.record and args.quick:
        p.error("--record: a --quick run is not recorded (5 rounds; run without --quick)")
    if args.emulate and (args.isa or args.ext):
        p.error("--emulate: not with --isa/--ext (the emulated CPU chooses vitfast's path as it does the anchors')")
    base_env = None
    if args.emulate:
        import cpuid_mask

        reason = cpuid_mask.unsupported()
        if reason:
            print(reason, file=sys.stderr)
            return 2
        base_env = cpuid_mask.environment(cpuid_mask.build(os.path.join(os.path.dirname(HERE), "build",
                                                                        "cpuid-mask")), args.emulate)
    import importlib.util

    import vitfast

    native = vitfast.ops.cpu_isa()
    forced = (args.isa is not None and args.isa != native) or args.ext is not None or args.emulate is not None
    if forced:  # the kernels of the forced path: ask a process that runs on it
        env = {**(base_env or os.environ), **({"VITFAST_CPU_ISA": args.isa} if args.isa else {}),
               **({"VITFAST_CPU_EXT": args.ext} if args.ext else {})}
        probe = "import vitfast; print(vitfast.ops.bf16_kernel(), vitfast.ops.int8_kernel(), vitfast.ops.cpu_isa())"
        out = subprocess.run([sys.executable, "-c", probe],
                             check=True, capture_output=True, text=True, env=env)
        bf16_kernel, int8_kernel, path = out.stdout.split()
    else:
        bf16_kernel, int8_kernel, path = vitfast.ops.bf16_kernel(), vitfast.ops.int8_kernel(), native
    bf16 = bf16_kernel != "none"
    openvino = importlib.util.find_spec("openvino") is not None
    if not openvino:
        print("openvino is not installed: its rows and the bf16 / f32 targets are unmeasured "
              "(pip install openvino, or 'vitfast[bench]')")
    if not bf16:
        seen = f" (the CPU masked to {args.emulate})" if args.emulate else ""
        print(f"no bf16 kernel on vitfast's {path} path{seen}: vitfast bf16 would compute in fp32 (no row)")
    keys = providers(bf16, openvino, narrow=int8_kernel == "avx2")
    all_checks: list[dict[str, Any]] = []
    all_reports: list[dict[str, Any]] = []
    failed = False
    prefix = f"emulated_{args.emulate}_lowp" if args.emulate else table_prefix(forced, path, int8_kernel, args.ext)
    forced_how = (path, int8_kernel, args.ext, args.emulate) if forced else None
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            reports = []
            for threads, batch, repeats in SETTINGS:
                out = os.path.join(tmp, f"{model}-{threads}-{batch}.json")
                try:
                    reports.append(bench(model, threads, batch, 5 if args.quick else repeats, keys, args.isa, out,
                                         args.ext, base_env))
                except subprocess.CalledProcessError as exc:
                    print(f"{model} threads {threads} batch {batch}: the benchmark failed ({exc})", file=sys.stderr)
                    failed = True
                    continue
                all_checks += checks(reports[-1], model, bf16)
            all_reports += reports
            if args.record and reports:
                record_model(model, reports, forced_how, prefix)
    print_checks(all_checks)
    if args.record and all_checks:
        record_checks(all_checks, forced_how, prefix, all_reports)
    return 1 if failed else 0


def table_prefix(forced: bool, path: str, int8_kernel: str, ext: str | None) -> str:
    """The tables' name prefix: `lowp` for the host's own kernels; on a forced path `avx2_path_lowp` (the AVX2 path
    with the plain AVX2 int8 kernel), `avx_vnni_path_lowp` (the AVX2 path on the AVX-VNNI kernel), else
    `lowp_path_<path>[_<int8 kernel>]`."""
    if not forced:
        return "lowp"
    if path == "avx2":
        return "avx_vnni_path_lowp" if int8_kernel == "avx_vnni" else "avx2_path_lowp"
    return f"lowp_path_{path}" + (f"_{int8_kernel}" if ext else "")


Forced = tuple[str, str, "str | None", "str | None"]  # (path, int8 kernel, VITFAST_CPU_EXT, cpuid_mask profile)


def _conditions(forced: Forced | None, reports: list[dict[str, Any]]) -> str:
    path = ""
    if forced and forced[3]:
        import cpuid_mask

        isa, kernel, _, profile = forced
        path = cpuid_mask.describe(profile) + f"vitfast's path there: {isa}, int8 kernel {kernel}. "
    elif forced:
        isa, kernel, ext, _ = forced
        env = f"VITFAST_CPU_ISA={isa}" + (f", VITFAST_CPU_EXT={ext}" if ext else "")
        path = (f"vitfast forced to its {isa} path ({env}; int8 kernel {kernel}); ONNX Runtime and OpenVINO on "
                f"their own ISA choice, so the anchor ratios are not those of a CPU that has only vitfast's. ")
    loads = [x for r in reports for x in ((r.get("load_average") or {}).get("start") or [None])[:1] if x is not None]
    load = f"; 1-minute load average at the runs' starts {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    return (f"RePa-DeiT θ = 0.75, random weights. {path}Two runs (1 thread batch 1: 20 interleaved rounds; 2 threads "
            f"batch 8: 10 rounds), each a separate process{load}; ratios paired (the anchor's time / this row's time "
            f"in the same round, median and p10-p90). vitfast int8 = vitfast.quantize defaults (dynamic per-token "
            f"activations; attention products by attention='auto': int8 at these shapes, 197 tokens and head dim 64, "
            f"on every x86 int8 kernel); on the AVX2 kernel also vitfast int8 (7-bit weights) "
            f"= vitfast.quantize(weight_bits=7); vitfast bf16 = vitfast.quantize(dtype='bf16'); "
            f"accuracy against "
            f"the fused fp32 model on the bench's own images (random weights: ORT's per-tensor int8 breaks on the "
            f"fused channel-idle FFN weights, see docs/performance.md)")


def record_model(model: str, reports: list[dict[str, Any]], forced: Forced | None, prefix: str) -> None:
    import results_file

    name = f"lowp_anchors_{TAG[model]}" if prefix == "lowp" else f"{prefix}_{TAG[model]}"
    title = f"{SHORT[model]}/0.75 in low precision against the deployed anchors on the same fused graph"
    table = results_file.from_bench_reports(reports, title=title, conditions=_conditions(forced, reports),
                                            command=results_file.command_line())
    print(results_file.record(name, table))


def record_checks(rows: list[dict[str, Any]], forced: Forced | None, prefix: str,
                  reports: list[dict[str, Any]]) -> None:
    import results_file

    table = {
        "title": "The low-precision targets, each on the paired ratio of one run's interleaved rounds",
        "script": "benchmarks/lowp_cells.py", "command": results_file.command_line(),
        "conditions": _conditions(forced, reports),
        "columns": [{"label": "model", "fmt": "{model}"}, {"label": "threads", "fmt": "{threads}"},
                    {"label": "batch", "fmt": "{batch}"}, {"label": "check (above 1: vitfast faster)",
                                                           "fmt": "{check}"},
                    {"label": "paired ratio (p10–p90)", "fmt": "{ratio}"}, {"label": "target", "fmt": "{target}"},
                    {"label": "result", "fmt": "{met}"}],
        "rows": rows,
    }
    print(results_file.record(f"{prefix}_targets", table))


if __name__ == "__main__":
    sys.exit(main())
