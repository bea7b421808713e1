"""Smoke test of benchmarks/nondeep_digits.py (single vs non-deep on the digits, several seeds)."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import nondeep_digits  # noqa: E402


def test_experiment_runs_both_models_and_resumes(tmp_path, capsys, one_thread):
    argv = ["--seeds", "0", "--lrs", "1e-3", "--steps", "3", "--recipes", "paper", "--out", str(tmp_path),
            "--no-progress", "--threads", "1"]
    assert nondeep_digits.main(argv) == 0
    runs = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["model"] for r in runs] == ["single", "paper"]
    nondeep = runs[1]
    assert nondeep["lambda_end"] == [1.0, 1.0] and nondeep["acc_fused"] == nondeep["acc"]
    out = capsys.readouterr().out
    assert "mean ± std" in out and "best LR per model" in out and "paper - single at lr 0.001" in out
    assert nondeep_digits.main(argv) == 0  # the second run reads the results back instead of training again
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2
