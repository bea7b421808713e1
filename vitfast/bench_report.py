"""`vitfast bench`'s report as text (`format_report`: the table, the anchors' paired columns, skipped and failed
runtimes) and as a chart (`plot_report`, matplotlib); vitfast/bench.py measures what they show."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from .bench_runtimes import ANCHORS, DTYPES, PROVIDERS, TABLE_ANCHORS, _FROM_FUSED_ONNX, _SHORT
from .io.atomic import atomic_write


def format_report(report: Mapping[str, Any]) -> str:
    """One plain-text table (rows grouped by threads, then batch) with a header saying how it was measured."""
    from .measure import format_table

    lines = []
    m = report["machine"]
    in_dtype = "" if report.get("dtype", "float32") == "float32" else f" in {report['dtype']}"
    lines.append(f"{report.get('title', 'vitfast bench')}: input {tuple(report['input_shape'])}{in_dtype} on {report['device']} "
                 f"({m['cpu']}, {m['cores']} cores; vitfast CPU path {m['cpu_isa']}"
                 + (f" with {', '.join(m['cpu_extensions'])}" if m.get("cpu_extensions") else "")
                 + (f"; OpenMP wait policy {m['omp_wait_policy']})" if "omp_wait_policy" in m else ")"))
    if report.get("note"):
        lines.append(report["note"])
    fl = report["flops_per_image"]
    lines.append(f"GFLOP/image: baseline {fl['baseline'] / 1e9:.4g}, fused {fl['fused'] / 1e9:.4g} "
                 f"({fl['baseline'] / fl['fused']:.2f}x fewer); {report['repeats']} interleaved rounds"
                 + (f" of {report['burst']} calls per provider (median of calls 2-{report['burst']})"
                    if report.get("burst", 1) > 1 else "") + " after "
                 f"{report['warmup']} warm-up call(s)")
    by_threads: Dict[int, List[float]] = {}
    for s in report["sgemm"]:
        by_threads.setdefault(s["threads"], []).append(s["gflops"])
    dtype = _SHORT[DTYPES[report.get("dtype", "float32")]]
    lines.append(f"sgemm (torch.mm 2048^3 {dtype}, measured around each row group): "
                 + "; ".join(f"{t} thread(s) {min(v):.1f}-{max(v):.1f} GFLOP/s" for t, v in by_threads.items()))
    for key, e in report.get("exports", {}).items():
        users = [k for k in _FROM_FUSED_ONNX if k in report["providers"]] if key == "ort-fused" else [key]
        lines.append(f"{PROVIDERS[key][0]}" + (f" (the ONNX file of {', '.join(users)})" if users != [key] else "")
                     + f": {e['exporter']} exporter, opset {e['opset']}, max |Δ| vs PyTorch {e['max_abs_diff']:.2e}")
    if any(k.startswith("ort-") for k in report["providers"]):
        lines.append("ORT sessions: intra-op threads = threads, 1 inter-op thread, all graph optimisations, worker "
                     f"spinning {'on' if report.get('ort_spinning') else 'off'}")
    for key, info in report.get("provider_info", {}).items():
        lines.append(f"{PROVIDERS[key][0]}: {info.get('summary', '')}")
    accuracy = report.get("accuracy") or {}
    if accuracy:
        n = next(iter(accuracy.values()))["images"]
        lines.append(f"accuracy vs fused fp32 (vitfast kernels) on the {n} bench image(s): rel err = "
                     "‖y − y_fp32‖ / ‖y_fp32‖ over all logits, top-1 = share of images whose argmax agrees")
    if any(r.get("launches") is not None for r in report["results"]):
        lines.append("launches/fwd: CUDA kernels, memsets and copies of one forward (torch.profiler, after the "
                     "timed rounds; a CUDA-graph replay's kernels counted one by one)")
    load = report.get("load_average") or {}
    if load.get("start") and load.get("end"):
        lines.append(f"load average (1 min) at start {load['start'][0]:.2f}, at end {load['end'][0]:.2f}")
    timed_anchors = [k for k in ANCHORS if any(k in (r.get("paired_vs") or {}) for r in report["results"])]
    if not timed_anchors and any(r.get("paired_vs_ort_fused") for r in report["results"]):
        timed_anchors = ["ort-fused"]  # a report written before paired_vs existed
    anchors = [k for k in timed_anchors if k in TABLE_ANCHORS]
    paired = bool(timed_anchors)
    if paired:
        lines.append(f"vs {' / '.join(PROVIDERS[k][0] for k in timed_anchors)} (paired): median and p10-p90 over "
                     "the rounds of the anchor's time / this provider's time in the same round (> 1: faster than "
                     "that runtime on the same fused graph; a vitfast row below 1 is marked SLOWER)")
    fastest_column = len(timed_anchors) > 1 or timed_anchors != anchors
    if fastest_column:
        lines.append("vs fastest anchor: the same paired ratio against the anchor with the smallest median at that "
                     "threads/batch (named)")
    rows = []
    for r in report["results"]:
        row = [
            r["label"], str(r["threads"]), str(r["batch"]), f"{r['median_ms']:.2f}",
            f"{r['p10_ms']:.2f}-{r['p90_ms']:.2f}", f"{r['images_per_s']:.1f}", f"{r['gflop']:.3g}",
            f"{r['pct_of_floor']:.0f}%", f"{r['speedup_vs_timm']:.2f}x" if r["speedup_vs_timm"] else "-",
            str(r["launches"]) if r.get("launches") is not None else "–",
        ]
        if accuracy:
            a = accuracy.get(r["provider"])
            row.append(f"{a['rel_err']:.1e} / {a['top1_agreement'] * 100:.0f}%" if a else "-")
        for k in anchors:
            vs = (r.get("paired_vs") or {}).get(k)
            if vs is None and k == "ort-fused":
                vs = r.get("paired_vs_ort_fused")
            row.append(_paired_cell(r["provider"], vs) if vs and r["provider"] != k else "-")
        if fastest_column:
            k = r.get("fastest_anchor")
            vs = (r.get("paired_vs") or {}).get(k) if k else None
            row.append(f"{PROVIDERS[k][0]}: {_paired_cell(r['provider'], vs)}" if vs and r["provider"] != k
                       else ("(fastest anchor)" if k and r["provider"] == k else "-"))
        rows.append(row)
    lines.append("")
    lines.append(format_table(["provider", "threads", "batch", "median ms", "p10-p90 ms", "img/s", "GFLOP",
                               "% floor", "vs timm eager", "launches/fwd"]
                              + (["rel err / top-1 vs fused fp32"] if accuracy else [])
                              + [f"vs {PROVIDERS[k][0]} (paired)" for k in anchors]
                              + (["vs fastest anchor (paired)"] if fastest_column else []), rows))
    for key, why in report.get("errors", {}).items():
        lines.append(f"FAILED: {PROVIDERS[key][0]}: {why}")
    for key, why in report.get("skipped", {}).items():
        lines.append(f"SKIPPED: {PROVIDERS[key][0]}: {why}")
    return "\n".join(lines)


def _paired_cell(provider: str, vs: Sequence[float]) -> str:
    """'1.234x (1.10-1.30)'; a vitfast row slower than the anchor (median ratio < 1) says SLOWER."""
    slower = " SLOWER" if provider.startswith("vitfast") and vs[0] < 1.0 else ""
    return f"{vs[0]:.3f}x{slower} ({vs[1]:.2f}-{vs[2]:.2f})"


def plot_report(report: Mapping[str, Any], path: str) -> None:
    """PNG chart: speed-up over timm eager and % of the FLOP floor, grouped by (threads, batch), one bar per provider."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys((r["threads"], r["batch"]) for r in report["results"]))
    keys = [k for k in report["providers"] if any(r["provider"] == k for r in report["results"])]
    cell = {(r["provider"], r["threads"], r["batch"]): r for r in report["results"]}
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(configs) + 4), 4.5))
    width = 0.8 / max(1, len(keys))
    for ax, field, title in ((axes[0], "speedup_vs_timm", "speed-up vs timm eager (x)"),
                             (axes[1], "pct_of_floor", "% of FLOP floor (FLOPs / sgemm rate)")):
        for i, key in enumerate(keys):
            xs, ys = [], []
            for j, (t, b) in enumerate(configs):
                r = cell.get((key, t, b))
                if r is not None and r.get(field) is not None:
                    xs.append(j + (i - (len(keys) - 1) / 2) * width)
                    ys.append(r[field])
            ax.bar(xs, ys, width, label=PROVIDERS[key][0])
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels([f"{t} thr\nbatch {b}" for t, b in configs])
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].axhline(1.0, color="black", linewidth=0.8)
    axes[1].axhline(100.0, color="black", linewidth=0.8, linestyle="--")
    axes[0].legend(fontsize=8)
    fig.suptitle(report.get("title", "vitfast bench"), fontsize=11)
    fig.tight_layout()
    try:  # the temporary file has the name of `path` (in a private directory): the format follows it as before
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110))
    finally:
        plt.close(fig)
