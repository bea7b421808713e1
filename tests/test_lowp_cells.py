"""benchmarks/lowp_cells.py: the target checks read the paired ratios of one report correctly, and a smoke run is
never recorded."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import lowp_cells


def _report(threads=1, batch=1, int8_vs_ort=(1.3, 1.2, 1.4), bf16_vs_ov=(1.05, 1.0, 1.1), f32_vs_ov=(1.02, 1.0, 1.1)):
    fp32_ms = [10.0, 11.0, 10.0, 12.0, 10.0]
    int8_ms = [4.0, 5.0, 6.0, 4.0, 5.0]  # fp32 ÷ int8 per round: 2.5, 2.2, 1.667, 3.0, 2.0 -> median 2.2
    return {"results": [
        {"provider": "vitfast", "threads": threads, "batch": batch, "round_ms": fp32_ms,
         "paired_vs": {"openvino-f32": list(f32_vs_ov)}},
        {"provider": "vitfast-int8", "threads": threads, "batch": batch, "round_ms": int8_ms,
         "paired_vs": {"ort-int8": list(int8_vs_ort)}},
        {"provider": "vitfast-bf16", "threads": threads, "batch": batch, "round_ms": fp32_ms,
         "paired_vs": {"openvino": list(bf16_vs_ov)}},
    ]}


def _by_check(rows):
    return {r["check"]: r for r in rows}


def test_checks_batch_1():
    rows = _by_check(lowp_cells.checks(_report(), "deit_small", bf16=True))
    assert rows["ORT dynamic int8 ÷ vitfast int8"]["met"] == "met"
    fp32_int8 = rows["vitfast fp32 ÷ vitfast int8"]
    assert fp32_int8["ratio"].startswith("2.200×") and fp32_int8["met"] == "met"
    assert rows["OpenVINO default ÷ vitfast bf16"]["met"] == "NOT met"  # 1.05 < 1.1
    assert rows["OpenVINO f32 ÷ vitfast fp32"]["met"] == "met"
    assert all(r["model"] == "DeiT-S" and r["threads"] == 1 and r["batch"] == 1 for r in rows.values())


def test_checks_bf16_only_at_batch_1_one_thread_and_only_with_its_kernel():
    assert "OpenVINO default ÷ vitfast bf16" not in _by_check(lowp_cells.checks(_report(2, 8), "deit_base", True))
    assert "OpenVINO default ÷ vitfast bf16" not in _by_check(lowp_cells.checks(_report(), "deit_base", False))


def test_fp32_against_openvino_is_strict_and_a_missing_anchor_is_unmeasured():
    rows = _by_check(lowp_cells.checks(_report(f32_vs_ov=(1.0, 0.9, 1.1)), "deit_base", True))
    assert rows["OpenVINO f32 ÷ vitfast fp32"]["met"] == "NOT met"  # a tie is not "ahead"
    report = _report()
    report["results"][1]["paired_vs"] = {}  # ORT int8 not timed (onnxruntime.quantization missing)
    rows = _by_check(lowp_cells.checks(report, "deit_base", True))
    assert rows["ORT dynamic int8 ÷ vitfast int8"]["met"] == "unmeasured"


def test_7bit_rows_and_their_exact_ort_counterpart():
    """With the AVX2 kernel the 7-bit model is checked against ORT's int8 and its reduce_range form (7-bit weights
    on both sides: the pair where both are exact on a CPU without VNNI); without the rows, no such checks."""
    assert lowp_cells.providers(False, False, narrow=True) == [
        "ort-fused", "ort-int8", "ort-int8-rr", "ort-qdq", "vitfast", "vitfast-int8", "vitfast-int8-w7"]
    assert "ort-int8-rr" not in lowp_cells.providers(True, True)
    report = _report()
    report["results"].append({"provider": "vitfast-int8-w7", "threads": 1, "batch": 1,
                              "round_ms": [5.0, 5.5, 5.0, 6.0, 5.0],
                              "paired_vs": {"ort-int8": [1.1, 1.0, 1.2], "ort-int8-rr": [1.25, 1.2, 1.3]}})
    rows = _by_check(lowp_cells.checks(report, "deit_small", bf16=False))
    assert rows["ORT dynamic int8 ÷ vitfast int8 (7-bit weights)"]["met"] == "NOT met"
    assert rows["vitfast fp32 ÷ vitfast int8 (7-bit weights)"]["ratio"].startswith("2.000×")
    exact = rows["ORT int8 7-bit weights ÷ vitfast int8 (7-bit weights)"]
    assert exact["ratio"].startswith("1.250×") and exact["met"] == "met"
    assert "ORT int8 7-bit weights ÷ vitfast int8 (7-bit weights)" not in _by_check(
        lowp_cells.checks(_report(), "deit_small", bf16=False))


def test_quick_runs_are_not_recorded(capsys):
    with pytest.raises(SystemExit):
        lowp_cells.main(["--quick", "--record"])
    assert "--record: a --quick run is not recorded" in capsys.readouterr().err


def test_table_prefix_names_the_forced_path_and_its_int8_kernel():
    assert lowp_cells.table_prefix(False, "avx512", "avx512_vnni", None) == "lowp"
    # the AVX2 path: an AVX-VNNI CPU's kernel and the plain one (an AVX2-only CPU's, or --ext none) keep apart
    assert lowp_cells.table_prefix(True, "avx2", "avx_vnni", None) == "avx_vnni_path_lowp"
    assert lowp_cells.table_prefix(True, "avx2", "avx2", "none") == "avx2_path_lowp"
    assert lowp_cells.table_prefix(True, "avx2", "avx2", None) == "avx2_path_lowp"
    assert lowp_cells.table_prefix(True, "avx512", "avx512_vnni", "noamx") == "lowp_path_avx512_avx512_vnni"
