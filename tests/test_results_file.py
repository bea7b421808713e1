"""benchmarks/results_file.py: benchmark scripts write their tables as data that make_tables.py renders."""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import make_tables  # noqa: E402
import results_file  # noqa: E402


def _report():
    # the shape `vitfast bench --json` writes (vitfast/bench.py run_bench), two providers, one configuration
    return {"device": "cpu", "repeats": 3, "input_shape": [3, 32, 32], "results": [
        {"provider": "ort-fused", "threads": 1, "batch": 1, "median_ms": 2.5, "p10_ms": 2.4, "p90_ms": 2.7},
        {"provider": "vitfast", "threads": 1, "batch": 1, "median_ms": 2.0, "p10_ms": 1.9, "p90_ms": 2.2,
         "paired_vs_ort_fused": [1.25, 1.2, 1.3]},
    ]}


def test_a_bench_report_becomes_a_rendered_table(tmp_path):
    table = results_file.from_bench_report(_report(), title="tiny", command="vitfast bench tiny")
    path = results_file.record("tiny_grid", table, directory=str(tmp_path), date="2026-01-02")
    data = json.loads(open(path, encoding="utf-8").read())
    assert data["schema"] == make_tables.SCHEMA and data["date"] == "2026-01-02"
    assert os.path.basename(path) == f"2026-01-02-{data['machine']['id']}.json"
    name = f"2026-01-02-{data['machine']['id']}/tiny_grid"
    rendered = make_tables.render(name, make_tables.load_results(str(tmp_path)))
    assert "| vitfast | 1 | 1 | 2.0 | 1.9–2.2 | 1.250× (1.20–1.30) |" in rendered
    assert "| ort-fused | 1 | 1 | 2.5 | 2.4–2.7 | – |" in rendered


def test_recording_again_replaces_one_table_and_keeps_the_others(tmp_path):
    table = results_file.from_bench_report(_report(), title="a")
    results_file.record("a", table, directory=str(tmp_path), date="2026-01-02")
    path = results_file.record("b", dict(table, title="b"), directory=str(tmp_path), date="2026-01-02")
    results_file.record("a", dict(table, title="a2"), directory=str(tmp_path), date="2026-01-02")
    tables = json.loads(open(path, encoding="utf-8").read())["tables"]
    assert sorted(tables) == ["a", "b"] and tables["a"]["title"] == "a2"


@pytest.mark.parametrize("name, table, match", [
    ("Bad Name", {"title": "", "script": "", "command": "", "columns": [], "rows": []}, "name: expected lower-case"),
    ("ok", {"title": "t"}, r"table: expected the keys \['script', 'command', 'columns', 'rows'\]"),
])
def test_bad_tables_are_refused_before_writing(tmp_path, name, table, match):
    with pytest.raises(ValueError, match=match):
        results_file.record(name, table, directory=str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_reports_with_low_precision_anchors_become_one_table(tmp_path):
    """One report per (threads, batch) run of a model, with ORT int8 / OpenVINO: one table, the accuracy and the
    ratios against those anchors and the fastest one as columns, a slower vitfast row marked."""
    def report(threads, batch, vitfast_vs_int8):
        return {"device": "cpu", "repeats": 3, "input_shape": [3, 32, 32],
                "providers": {"ort-int8": "ORT int8 dynamic", "vitfast": "vitfast fused (kernels)"},
                "accuracy": {"ort-int8": {"rel_err": 0.0123, "top1_agreement": 0.875, "images": 8}},
                "results": [
                    {"provider": "ort-int8", "threads": threads, "batch": batch, "median_ms": 1.0, "p10_ms": 0.9,
                     "p90_ms": 1.1, "paired_vs": {"ort-int8": [1.0, 1.0, 1.0]}, "fastest_anchor": "ort-int8"},
                    {"provider": "vitfast", "threads": threads, "batch": batch, "median_ms": 2.0, "p10_ms": 1.9,
                     "p90_ms": 2.2, "paired_vs": {"ort-int8": vitfast_vs_int8}, "fastest_anchor": "ort-int8"}]}

    table = results_file.from_bench_reports([report(1, 1, [0.5, 0.45, 0.55]), report(2, 8, [1.2, 1.1, 1.3])],
                                            title="lowp")
    assert [c["label"] for c in table["columns"]][5:] == [
        "rel err / top-1 vs fused fp32", "ORT fused ÷ provider, paired", "ORT int8 ÷ provider, paired",
        "OpenVINO default ÷ provider, paired", "fastest anchor ÷ provider, paired"]
    path = results_file.record("lowp", table, directory=str(tmp_path), date="2026-01-02")
    stem = os.path.splitext(os.path.basename(path))[0]
    rendered = make_tables.render(f"{stem}/lowp", make_tables.load_results(str(tmp_path)))
    assert "| ort-int8 | 1 | 1 | 1.0 | 0.9–1.1 | 1.2e-02 / 88% | – | – | – | (fastest anchor) |" in rendered
    assert ("| vitfast | 1 | 1 | 2.0 | 1.9–2.2 | – | – | 0.500× SLOWER (0.45–0.55) | – | "
            "ORT int8 dynamic: 0.500× SLOWER (0.45–0.55) |") in rendered
    assert ("| vitfast | 2 | 8 | 2.0 | 1.9–2.2 | – | – | 1.200× (1.10–1.30) | – | "
            "ORT int8 dynamic: 1.200× (1.10–1.30) |") in rendered


def test_another_core_of_the_same_name_gets_its_own_file(tmp_path, monkeypatch):
    """Two kinds of core can share a model name, so an id ("AMD EPYC": a Zen 4 and a faster core): a same-day file
    recorded on another signature keeps its tables, the new ones go to <id>-2; a file without a signature (written
    before signatures were recorded) is taken as this machine's."""
    table = results_file.from_bench_report(_report(), title="t")

    def on(signature):
        box = {"id": "amd-epyc-avx512", "description": f"AMD EPYC ({signature}), 2 cores", "signature": signature}
        monkeypatch.setattr(results_file, "machine", lambda device="cpu": dict(box))

    on("family 25 model 17")
    first = results_file.record("a", table, directory=str(tmp_path), date="2026-01-02")
    on("family 26 model 2")
    second = results_file.record("a", dict(table, title="other core"), directory=str(tmp_path), date="2026-01-02")
    assert os.path.basename(first) == "2026-01-02-amd-epyc-avx512.json"
    assert os.path.basename(second) == "2026-01-02-amd-epyc-avx512-2.json"
    data = json.loads(open(second, encoding="utf-8").read())
    assert data["machine"]["id"] == "amd-epyc-avx512-2" and data["machine"]["signature"] == "family 26 model 2"
    on("family 25 model 17")
    assert results_file.record("b", table, directory=str(tmp_path), date="2026-01-02") == first
    tables = json.loads(open(first, encoding="utf-8").read())["tables"]
    assert sorted(tables) == ["a", "b"] and tables["a"]["title"] == "t"
    # a file from before signatures: merged into, as before
    legacy = tmp_path / "2026-01-03-amd-epyc-avx512.json"
    legacy.write_text(json.dumps({"schema": make_tables.SCHEMA, "date": "2026-01-03",
                                  "machine": {"id": "amd-epyc-avx512", "description": "AMD EPYC, 2 cores"},
                                  "software": {}, "tables": {"old": table}}))
    assert results_file.record("new", table, directory=str(tmp_path), date="2026-01-03") == str(legacy)
    assert sorted(json.loads(legacy.read_text())["tables"]) == ["new", "old"]


def test_the_machine_description_names_the_core():
    from vitfast.bench import machine_info

    info = machine_info()
    box = results_file.machine()
    if info["cpu_signature"] is None:
        pytest.skip("/proc/cpuinfo gives no family/model or CPU part here")
    assert f"({info['cpu_signature']})" in box["description"] and box["signature"] == info["cpu_signature"]


def test_a_device_runs_rows_are_recorded_for_its_machine(tmp_path):
    # A GPU run's env.txt (benchmarks/gpu_common.sh) names the machine and software; gpu_blocks.py --from-json
    # records the rows a cut-short device call returned, with the speed against inductor of the same cell.
    import gpu_blocks

    env = tmp_path / "env.txt"
    env.write_text("NVIDIA H200, 580.159.04, 143771 MiB\ntorch 2.11.0+cu130 triton 3.6.0 timm 1.0.29\n")
    assert results_file.device_env(str(env)) == (
        {"id": "nvidia-h200", "description": "NVIDIA H200, torch 2.11.0+cu130"},
        {"torch": "2.11.0+cu130", "triton": "3.6.0", "timm": "1.0.29"})
    rows = [{"model": "m", "batch": 64, "row": "vitfast blocks graph", "median_ms": 2.0, "kernels": 81,
             "rel_err_vs_fp32": 0.01},
            {"model": "m", "batch": 64, "row": "inductor fused", "median_ms": 3.0, "kernels": 112,
             "rel_err_vs_fp32": 0.01},
            {"model": "m", "batch": 256, "row": "vitfast blocks", "median_ms": 9.0, "kernels": 80,
             "rel_err_vs_fp32": 0.01},
            {"model": "m", "batch": 256, "row": "inductor fused", "skipped": "time budget"}]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    assert gpu_blocks.main(["--from-json", str(tmp_path / "rows.json"), "--env", str(env), "--record",
                            str(tmp_path), "--command", "measured elsewhere"]) == 0
    (path,) = tmp_path.glob("*-nvidia-h200.json")
    data = json.loads(path.read_text())
    assert data["software"]["triton"] == "3.6.0" and data["machine"]["id"] == "nvidia-h200"
    table = data["tables"]["gpu_blocks"]
    assert table["command"] == "measured elsewhere"
    assert [r["vs_inductor"] for r in table["rows"]] == ["1.50×", "–", "–", "–"]
    assert table["rows"][3]["note"] == "time budget"
    bad = tmp_path / "bad.txt"
    bad.write_text("NVIDIA H200\n")
    with pytest.raises(ValueError, match="expected nvidia-smi's name line"):
        results_file.device_env(str(bad))
    with pytest.raises(SystemExit):  # --from-json without --env: refused before anything is read
        gpu_blocks.main(["--from-json", str(tmp_path / "rows.json"), "--record", str(tmp_path)])
