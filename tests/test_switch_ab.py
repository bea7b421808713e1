"""benchmarks/switch_ab.py (the measurement behind output_pool_ab.py and huge_pages_ab.py): one small cell, one
round, both settings in fresh processes, the row it reports."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import switch_ab  # noqa: E402


def test_measure_reports_both_settings_of_a_cell(capsys):
    rows = switch_ab.measure("VITFAST_HUGE_PAGES", "huge pages", [("fp32", 1, 1)], rounds=1, calls=2,
                             model="deit_tiny_patch16_224")
    out = capsys.readouterr().out
    assert "fp32 b1 t1 huge pages off" in out and "fp32 b1 t1 huge pages on" in out, out
    (row,) = rows
    assert (row["precision"], row["batch"], row["threads"]) == ("fp32", 1, 1)
    assert row["off_ms"] > 0 and row["on_ms"] > 0 and row["faults_off"] >= 0
    assert row["ratio"].endswith(")") and "×" in row["ratio"]


def test_cell_with_model_and_path_runs_that_path(capsys):
    """A 5-tuple cell names its model and CPU path (next_panel_prefetch_ab.py's cells): the label and the row say
    which, and the child really ran on that path (VITFAST_CPU_ISA=avx2 reaches it)."""
    cell = ("fp32", 1, 1, "deit_tiny_patch16_224", "avx2")
    assert switch_ab.cell_label(cell) == "deit_tiny fp32 avx2 b1 t1"
    assert switch_ab.PATH_ENV["avx2"] == {"VITFAST_CPU_ISA": "avx2"}
    if cell not in switch_ab.usable_cells([cell]):
        import pytest
        pytest.skip("no AVX2 on this CPU")
    assert switch_ab.run("VITFAST_NEXT_PANEL_PREFETCH", True, cell, 1, "unused")["isa"] == "avx2"
    rows = switch_ab.measure("VITFAST_NEXT_PANEL_PREFETCH", "prefetch", [cell], rounds=1, calls=2)
    out = capsys.readouterr().out
    assert "deit_tiny fp32 avx2 b1 t1 prefetch off" in out and "deit_tiny fp32 avx2 b1 t1 prefetch on" in out, out
    (row,) = rows
    assert (row["model"], row["path"], row["precision"]) == ("deit_tiny", "avx2", "fp32")
    assert row["off_ms"] > 0 and row["on_ms"] > 0
