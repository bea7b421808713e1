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
