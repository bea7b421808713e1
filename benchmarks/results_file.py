"""Write measured tables into `benchmarks/results/<date>-<machine>.json`, the data the docs' tables are made from.

A results file (schema "vitfast.results/1", rendered by `make_tables.py`) holds the date, the machine, the software
versions and named tables; each table records the script and command that measured it, the conditions, its columns
(a label and a format string over the row's fields) and its rows.  The benchmark scripts call `record(...)` (e.g.
`ort_split.py --record`); a `vitfast bench --json` report becomes a table with

    python benchmarks/results_file.py REPORT.json [REPORT2.json ...] --table NAME [--title TEXT] [--conditions TEXT]

(several reports of the same model, e.g. one per threads/batch run, become one table, rows in the order given).
Reports with the low-precision anchors (ort-int8, openvino, ...) get their accuracy against the fused fp32 model
and the paired ratios against ORT int8, OpenVINO and the fastest anchor as extra columns.

Recording a table of the same name again on the same day and machine replaces it; other tables stay.  Files are
written atomically (temporary file, fsync, rename), so an interrupted run leaves the previous file intact.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import sys
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
SCHEMA = "vitfast.results/1"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def machine(device: str = "cpu") -> Dict[str, str]:
    """{"id", "description"} of this machine: the GPU's name on CUDA, else the CPU model and vitfast's CPU path.
    Under cpuid_mask.py's masked view of the CPU, the host's own (asked of a process without the mask): the tables
    say what was emulated, the file names the machine that ran them."""
    if os.environ.get("VITFAST_CPUID_MASK") and device == "cpu":
        import subprocess

        env = {k: v for k, v in os.environ.items() if k not in ("VITFAST_CPUID_MASK", "LD_PRELOAD")}
        code = "import json, results_file; print(json.dumps(results_file.machine()))"
        done = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.abspath(__file__)), env=env,
                              capture_output=True, text=True, check=True)
        return json.loads(done.stdout)
    import torch

    from vitfast.bench import machine_info

    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
        return {"id": _slug(name), "description": f"{name}, torch {torch.__version__}"}
    info = machine_info()
    words = _slug(info["cpu"]).split("-")[:3]
    signature = info.get("cpu_signature")
    box = {"id": "-".join(words + [info["cpu_isa"]]),
           "description": f"{info['cpu']}" + (f" ({signature})" if signature else "")
                          + f", {info['cores']} cores, CPU path {info['cpu_isa']}"
                          + (f" ({', '.join(info['cpu_extensions'])})" if info.get("cpu_extensions") else "")}
    if signature:
        box["signature"] = signature
    return box


def software() -> Dict[str, str]:
    from vitfast.bench import machine_info

    versions = {k: v for k, v in machine_info()["versions"].items() if v is not None}
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        pass
    return versions


def device_env(path: str) -> tuple:
    """(box, versions) of the GPU machine that a prepared device run described in its env.txt (benchmarks/
    gpu_common.sh: nvidia-smi's "name, driver, memory" line, then "torch X triton Y timm Z"): for recording that
    run's JSON on another machine (`gpu_blocks.py --from-json`)."""
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    if len(lines) < 2 or "torch" not in lines[1].split():
        raise ValueError(f"{path}: expected nvidia-smi's name line then 'torch X triton Y ...', got {lines[:2]}")
    name = lines[0].split(",")[0].strip()
    words = lines[1].split()
    versions = dict(zip(words[0::2], words[1::2]))
    box = {"id": _slug(name), "description": f"{name}, torch {versions['torch']}"}
    return box, versions


def record(name: str, table: Dict[str, Any], *, device: str = "cpu", directory: str = RESULTS,
           date: Optional[str] = None, box: Optional[Dict[str, str]] = None,
           versions: Optional[Dict[str, str]] = None) -> str:
    """Put `table` (title, script, command, conditions, columns, rows) under `name` in today's file for this
    machine (or for `box`, a {"id", "description"} such as an accuracy study's own file, or another machine's run;
    `versions` then its software); returns the file's path."""
    missing = [k for k in ("title", "script", "command", "columns", "rows") if k not in table]
    if missing:
        raise ValueError(f"table: expected the keys {missing}, not found")
    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise ValueError(f"name: expected lower-case letters, digits and _, got {name!r}")
    from vitfast.io.atomic import atomic_write

    date = date or datetime.date.today().isoformat()
    box = box or machine(device)
    os.makedirs(directory, exist_ok=True)
    # Two kinds of core can share a model name and so an id (a Zen 4 "AMD EPYC" and a faster one): a file of the same
    # date and id from another signature is not this machine's, and its tables stay apart, in <id>-2, <id>-3, ...
    # (a file without a signature, written before they were recorded, is taken as this machine's).
    base_id, n, versions = box["id"], 1, versions or software()
    while True:
        path = os.path.join(directory, f"{date}-{box['id']}.json")
        data: Dict[str, Any] = {"schema": SCHEMA, "date": date, "machine": box, "software": versions, "tables": {}}
        if not os.path.exists(path):
            break
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("schema") != SCHEMA:
            raise ValueError(f"{path}: expected schema {SCHEMA!r}, got {data.get('schema')!r}")
        other = data.get("machine", {}).get("signature")
        if other is None or other == box.get("signature"):
            break
        n += 1
        box = dict(box, id=f"{base_id}-{n}")
    data["tables"][name] = table
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)
    return path


def _paired(provider: str, paired: Optional[List[float]]) -> str:
    """'1.250× (1.20–1.30)', with SLOWER on a vitfast row below 1; '–' without a ratio."""
    if not paired:
        return "–"
    slower = " SLOWER" if provider.startswith("vitfast") and paired[0] < 1.0 else ""
    return f"{paired[0]:.3f}×{slower} ({paired[1]:.2f}–{paired[2]:.2f})"


def from_bench_report(report: Dict[str, Any], *, title: str, conditions: str = "",
                      command: str = "vitfast bench ...") -> Dict[str, Any]:
    """A `vitfast bench --json` report as a results table: one row per (provider, threads, batch), with the median
    latency, its p10-p90, the speed-up over the baseline and, where measured, the paired ratio to ORT."""
    return from_bench_reports([report], title=title, conditions=conditions, command=command)


def from_bench_reports(reports: List[Dict[str, Any]], *, title: str, conditions: str = "",
                       command: str = "vitfast bench ...") -> Dict[str, Any]:
    """Several `vitfast bench --json` reports (e.g. one per threads/batch run of one model) as one results table.
    With the low-precision anchors in a report (vitfast/bench.py ANCHORS beyond ort-fused) or an accuracy record,
    the table also has: rel err / top-1 agreement vs the fused fp32 model, the paired ratios against ORT int8 and
    OpenVINO's default, and against the fastest anchor of the row's (threads, batch), named."""
    rows: List[Dict[str, Any]] = []
    lowp = False
    for report in reports:
        accuracy = report.get("accuracy") or {}
        lowp = lowp or bool(accuracy) or any(set(r.get("paired_vs") or {}) - {"ort-fused"} for r in report["results"])
        labels = report.get("providers", {})
        for r in report["results"]:
            row = {"provider": r["provider"], "threads": r["threads"], "batch": r["batch"],
                   "median_ms": round(r["median_ms"], 3), "p10_ms": round(r["p10_ms"], 3),
                   "p90_ms": round(r["p90_ms"], 3)}
            vs = r.get("paired_vs") or {}
            own = r["provider"] == "ort-fused"
            row["vs_ort"] = _paired(r["provider"], None if own else r.get("paired_vs_ort_fused"))
            for key, field in (("ort-int8", "vs_ort_int8"), ("openvino", "vs_openvino")):
                row[field] = _paired(r["provider"], None if r["provider"] == key else vs.get(key))
            fastest = r.get("fastest_anchor")
            if fastest and fastest != r["provider"] and fastest in vs:
                row["vs_fastest"] = f"{labels.get(fastest, fastest)}: {_paired(r['provider'], vs[fastest])}"
            else:
                row["vs_fastest"] = "(fastest anchor)" if fastest and fastest == r["provider"] else "–"
            a = accuracy.get(r["provider"])
            row["accuracy"] = "–" if not a else f"{a['rel_err']:.1e} / {a['top1_agreement'] * 100:.0f}%"
            rows.append(row)
    first = reports[0]
    columns = [
        {"label": "provider", "fmt": "{provider}"},
        {"label": "threads", "fmt": "{threads}"},
        {"label": "batch", "fmt": "{batch}"},
        {"label": "median ms", "fmt": "{median_ms}"},
        {"label": "p10–p90 ms", "fmt": "{p10_ms}–{p90_ms}"},
        {"label": "ORT fused ÷ provider, paired", "fmt": "{vs_ort}"},
    ]
    if lowp:
        columns[5:5] = [{"label": "rel err / top-1 vs fused fp32", "fmt": "{accuracy}"}]
        columns += [{"label": "ORT int8 ÷ provider, paired", "fmt": "{vs_ort_int8}"},
                    {"label": "OpenVINO default ÷ provider, paired", "fmt": "{vs_openvino}"},
                    {"label": "fastest anchor ÷ provider, paired", "fmt": "{vs_fastest}"}]
    return {
        "title": title,
        "script": "vitfast bench",
        "command": command,
        "conditions": conditions or f"{first.get('repeats')} interleaved rounds; input {first.get('input_shape')}",
        "columns": columns,
        "rows": rows,
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", nargs="+", help="`vitfast bench --json` reports (several: one table, rows in order)")
    parser.add_argument("--table", required=True, help="the table's name in the results file (e.g. cpu_grid_deit_b)")
    parser.add_argument("--title", default="vitfast bench")
    parser.add_argument("--conditions", default="")
    parser.add_argument("--command", default="vitfast bench ...", help="the command that wrote the report")
    args = parser.parse_args(argv)
    reports = []
    for path in args.report:
        with open(path, encoding="utf-8") as f:
            reports.append(json.load(f))
    table = from_bench_reports(reports, title=args.title, conditions=args.conditions, command=args.command)
    print(record(args.table, table, device=str(reports[0].get("device", "cpu"))))
    return 0


def command_line() -> str:
    """The command that is running, for a table's "command" field."""
    return " ".join(shlex.quote(a) for a in ["python"] + sys.argv)


if __name__ == "__main__":
    sys.exit(main())
