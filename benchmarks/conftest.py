"""pytest-benchmark set-up shared by the `benchmarks/bench_*.py` suites.

    .venv/bin/python -m pytest benchmarks/bench_channel_idle_ffn.py          # all providers and shapes
    .venv/bin/python -m pytest benchmarks/ -k "deit_base and b1 and t1"       # one slice

Collects `bench_*.py` (pytest's default pattern is test_*.py) and prints, at the end, the table of
GFLOP/s, % of measured sgemm and ratios vs eager / torch.compile (see harness.py).
"""
from __future__ import annotations

import pytest

from harness import _SGEMM, INTERLEAVED, RESULTS


def pytest_collect_file(file_path, parent):
    # Files named on the command line are collected by pytest itself; collecting them here too would run
    # every benchmark twice.
    if parent.session.isinitpath(file_path):
        return None
    if file_path.suffix == ".py" and file_path.name.startswith("bench_"):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def pytest_terminal_summary(terminalreporter):
    tr = terminalreporter
    _interleaved_summary(tr)
    if not RESULTS:
        return
    tr.section("vitfast ops: GFLOP/s, % of measured sgemm, ratios (medians, same run)")
    for threads, rate in sorted(_SGEMM.items()):
        tr.write_line(f"sgemm (torch.mm 2048^3 fp32) at {threads} thread(s): {rate:.1f} GFLOP/s")
    header = f"{'case':<32} {'provider':<9} {'ms':>9} {'GFLOP/s':>8} {'%sgemm':>7} {'vs eager':>9} {'vs compile':>11}"
    tr.write_line(header)
    for (case, provider), r in RESULTS.items():
        eager = RESULTS.get((case, "eager"))
        compiled = RESULTS.get((case, "compile"))
        vs_eager = f"{eager['median'] / r['median']:.2f}x" if eager else "-"
        vs_compile = f"{compiled['median'] / r['median']:.2f}x" if compiled else "-"
        tr.write_line(
            f"{'/'.join(map(str, case)):<32} {provider:<9} {r['median'] * 1e3:>9.3f} {r['gflops']:>8.1f} "
            f"{r['pct_of_sgemm']:>6.1f}% {vs_eager:>9} {vs_compile:>11}"
        )


def _interleaved_summary(tr):
    if not INTERLEAVED:
        return
    tr.section("interleaved providers: one call of each per round (ratios = baseline / provider, per round)")
    tr.write_line(f"{'case':<32} {'provider':<9} {'ms':>9} {'GFLOP/s':>8} {'vs first, median':>17} {'p10-p90':>13}")
    for case, entry in INTERLEAVED.items():
        for name, r in entry["providers"].items():
            tr.write_line(
                f"{'/'.join(map(str, case)):<32} {name:<9} {r['median'] * 1e3:>9.3f} {r['gflops']:>8.1f} "
                f"{r['ratio_median']:>16.3f}x {r['ratio_p10']:>6.3f}-{r['ratio_p90']:<6.3f}"
            )
        tr.write_line(f"{'':<32} ({entry['rounds']} rounds, {entry['threads']} thread(s); first = baseline)")
