"""`vitfast bench`'s low-precision anchors on the same fused graph (ort-int8, ort-qdq, openvino-f32, openvino) and
vitfast's own quantized rows (vitfast-int8, vitfast-bf16): each builds and runs on a tiny fused model, its accuracy
against the fused fp32 model is in the report, rows carry paired ratios against every anchor and the fastest one,
a vitfast row slower than its anchor is marked, and a missing optional package skips the provider (not a failure).
No timing assertions (DESIGN.md §4)."""
import importlib.util
import sys

import onnx
import pytest
import torch
from test_bench import TINY, _check_consistent, _tiny_pair

import vitfast
from vitfast._env import host_cpu_flags
from vitfast.bench import ANCHORS, PROVIDERS, _quantiles, format_report, run_bench
from vitfast.cli import main

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
ONNX_ANCHORS = (["ort-fused", "ort-int8", "ort-int8-rr", "ort-qdq"]
                + (["openvino-f32", "openvino"] if HAS_OPENVINO else []))


def _cpu_has_bf16() -> bool:
    flags = host_cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


@pytest.fixture(scope="module")
def lowp(tmp_path_factory):
    """One run of every ONNX-based anchor next to vitfast (batches 1 and 2: 3 bench images), files kept."""
    workdir = tmp_path_factory.mktemp("lowp")
    baseline, fused = _tiny_pair()
    providers = ["timm", *ONNX_ANCHORS, "vitfast"]
    report = run_bench(baseline, fused, threads=[1], batch_sizes=[1, 2], providers=providers, repeats=3, warmup=1,
                       workdir=str(workdir), log=lambda s: None)
    return report, providers, workdir


def test_every_anchor_runs_on_the_same_fused_onnx(lowp):
    report, providers, workdir = lowp
    _check_consistent(report, providers, [1], [1, 2])
    assert report["skipped"] == {}
    assert list(report["exports"]) == ["ort-fused"]  # one export of the fused model, shared
    # the quantized files really are quantized, from that export
    dynamic = {n.op_type for n in onnx.load(str(workdir / "ort-int8.onnx")).graph.node}
    static = {n.op_type for n in onnx.load(str(workdir / "ort-qdq.onnx")).graph.node}
    assert "DynamicQuantizeLinear" in dynamic and ({"MatMulInteger", "DynamicQuantizeMatMul"} & dynamic)
    assert {"QuantizeLinear", "DequantizeLinear"} <= static
    info = report["provider_info"]
    assert info["ort-int8"]["per_channel"] is False and info["ort-int8"]["weight_type"] == "QInt8"
    assert info["ort-int8"]["reduce_range"] is False and info["ort-int8-rr"]["reduce_range"] is True
    # reduce_range: 7-bit weight codes in the file (ORT stores them as int8 initializers of the MatMulInteger)
    rr = onnx.load(str(workdir / "ort-int8-rr.onnx"))
    codes = [onnx.numpy_helper.to_array(t) for t in rr.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert codes and max(int(abs(c.astype(int)).max()) for c in codes if c.size) <= 64
    assert info["ort-qdq"]["per_channel"] is True and info["ort-qdq"]["calibration_images"] == 3


def test_accuracy_against_the_fused_fp32_model(lowp):
    report, providers, _ = lowp
    acc = report["accuracy"]
    assert set(acc) == {k for k in providers if k in ONNX_ANCHORS}  # vitfast is the reference, timm another model
    for key, a in acc.items():
        assert a["images"] == 3 and 0 <= a["top1_agreement"] <= 1 and a["rel_err"] >= 0, key
    assert acc["ort-fused"]["rel_err"] < 1e-5 and acc["ort-fused"]["top1_agreement"] == 1.0
    for key in ("ort-int8", "ort-qdq"):  # 8-bit: visibly off fp32, but the same function
        assert 1e-4 < acc[key]["rel_err"] < 0.5, (key, acc[key])


def test_ratios_against_every_anchor_and_the_fastest(lowp):
    report, providers, _ = lowp
    rows = {(r["provider"], r["batch"]): r for r in report["results"]}
    anchors = [k for k in ANCHORS if k in providers]
    for (key, b), r in rows.items():
        assert list(r["paired_vs"]) == anchors
        for k in anchors:
            anchor = rows[(k, b)]["round_ms"]
            assert r["paired_vs"][k] == pytest.approx(list(_quantiles([a / v for a, v in zip(anchor, r["round_ms"])])))
        fastest = min(anchors, key=lambda k: rows[(k, b)]["median_ms"])
        assert r["fastest_anchor"] == fastest
        assert r["paired_vs_ort_fused"] == r["paired_vs"]["ort-fused"]


def test_anchor_ratio_formatting_marks_a_slower_vitfast_row(lowp):
    report, _, _ = lowp
    report = {**report, "results": [dict(r) for r in report["results"]]}
    for r in report["results"]:
        r["fastest_anchor"] = "ort-int8"  # whichever was fastest on the tiny model (timing: not asserted)
        if r["provider"] == "vitfast":  # slower than ORT int8 at batch 1, faster at batch 2
            slow = r["batch"] == 1
            r["paired_vs"] = {**r["paired_vs"], "ort-int8": [0.5, 0.4, 0.6] if slow else [1.5, 1.4, 1.6]}
        elif r["provider"] == "ort-fused":
            r["paired_vs"] = {**r["paired_vs"], "ort-int8": [0.25, 0.2, 0.3]}  # an anchor is never marked
    text = format_report(report)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("provider"))
    columns = ["rel err / top-1 vs fused fp32", "vs ORT fused (paired)", "vs ORT int8 dynamic (paired)",
               "vs fastest anchor (paired)"] + (["vs OpenVINO default (paired)"] if HAS_OPENVINO else [])
    for column in columns:
        assert column in header, column
    assert "vs ORT int8 QDQ static (paired)" not in header  # in the JSON and the fastest-anchor column only
    vitfast_rows = [line for line in lines if line.startswith("vitfast fused (kernels)  ")]
    assert len(vitfast_rows) == 2
    assert "0.500x SLOWER (0.40-0.60)" in vitfast_rows[0]
    assert vitfast_rows[0].rstrip().endswith("ORT int8 dynamic: 0.500x SLOWER (0.40-0.60)")
    assert "1.500x (1.40-1.60)" in vitfast_rows[1] and "1.500x SLOWER" not in vitfast_rows[1]
    ort_row = next(line for line in lines if line.startswith("ORT fused  "))
    assert "0.250x (0.20-0.30)" in ort_row and "SLOWER" not in ort_row
    int8_row = next(line for line in lines if line.startswith("ORT int8 dynamic  "))
    assert int8_row.rstrip().endswith("(fastest anchor)")
    assert "ORT int8 dynamic: quantize_dynamic, QInt8 weights per tensor (ORT's default per_channel=False)" in text
    assert "rel err = ‖y − y_fp32‖ / ‖y_fp32‖" in text and "on the 3 bench image(s)" in text


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed (it is in the bench extra / requirements.txt)")
def test_openvino_precisions(lowp):
    report, _, _ = lowp
    info, acc = report["provider_info"], report["accuracy"]
    assert info["openvino-f32"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert info["openvino-f32"]["INFERENCE_NUM_THREADS"] == "1" and info["openvino"]["NUM_STREAMS"] == "1"
    assert info["openvino"]["PERFORMANCE_HINT"] == "LATENCY"
    assert acc["openvino-f32"]["rel_err"] < 1e-5 and acc["openvino-f32"]["top1_agreement"] == 1.0
    default = info["openvino"]["INFERENCE_PRECISION_HINT"]
    if _cpu_has_bf16():  # OpenVINO's CPU default is bf16 where the CPU computes it natively
        assert default == "bf16" and 1e-4 < acc["openvino"]["rel_err"] < 0.05
    else:
        assert default == "f32"
    assert f"inference precision {default} (its default)" in format_report(report)
    assert info["openvino"]["input_shape"] == "static: reshaped to each timed batch"
    assert "static input shape per batch" in info["openvino"]["summary"]


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed (it is in the bench extra / requirements.txt)")
def test_openvino_compiles_a_static_shape_per_batch(lowp):
    # The exported file's batch axis is dynamic; OpenVINO runs a static shape 2-4% faster, so each timed batch
    # gets its own reshaped compile (the anchor as a user serving that batch deploys it).
    from vitfast.bench_runtimes import _OpenVINO

    _, _, workdir = lowp
    ov = _OpenVINO("openvino", "OpenVINO default", "fused", str(workdir / "ort-fused.onnx"), None)
    ov.prepare(1)
    for batch in (1, 2, 1):
        x = torch.randn(batch, 3, 16, 16)
        assert ov.output(x).shape == (batch, 10)
    assert set(ov._requests) == {(1, 3, 16, 16), (2, 3, 16, 16)}
    for shape, (compiled, _) in ov._requests.items():
        assert compiled.input(0).get_partial_shape().is_static
        assert list(compiled.input(0).get_shape()) == list(shape)
    ov.prepare(2)  # another thread count compiles again
    assert ov._requests == {}


def test_missing_openvino_is_skipped_not_failed(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` raises ImportError
    assert main(["bench", *TINY, "--threads", "1", "--batch-sizes", "1", "--repeats", "1", "--warmup", "1",
                 "--providers", "timm,openvino,openvino-f32,vitfast"]) == 0
    out = capsys.readouterr().out
    assert "SKIPPED: OpenVINO default: openvino is not installed (pip install openvino, or 'vitfast[bench]')" in out
    assert "SKIPPED: OpenVINO f32: openvino is not installed" in out
    assert "FAILED" not in out and "ORT fused (the ONNX file" not in out  # nothing exported for a skipped provider
    assert any(line.startswith("vitfast fused (kernels)  ") for line in out.splitlines())


def test_missing_onnxruntime_quantization_is_skipped(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime.quantization", None)
    baseline, fused = _tiny_pair()
    report = run_bench(baseline, fused, threads=[1], batch_sizes=[1], providers=["timm", "ort-int8", "ort-qdq"],
                       repeats=1, log=lambda s: None)
    assert set(report["skipped"]) == {"ort-int8", "ort-qdq"} and report["errors"] == {}
    assert report["skipped"]["ort-int8"].startswith("onnxruntime.quantization is not importable")
    assert {r["provider"] for r in report["results"]} == {"timm"}


def test_vitfast_quantize_unavailable_is_skipped(monkeypatch, capsys):
    baseline, fused = _tiny_pair()
    report = run_bench(baseline, fused, threads=[1], batch_sizes=[1],
                       providers=["timm", "vitfast-int8", "vitfast-bf16"], repeats=1, log=lambda s: None)
    assert report["skipped"] == {"vitfast-int8": "vitfast.quantize unavailable",
                                 "vitfast-bf16": "vitfast.quantize unavailable"}
    text = format_report(report)
    assert "SKIPPED: vitfast int8: vitfast.quantize unavailable" in text and "FAILED" not in text
    # the CLI passes the package's quantize: where there is none, the rows are skipped and the status stays 0
    monkeypatch.setattr(vitfast, "quantize", None, raising=False)  # (a lazy attribute: deleting it re-imports it)
    assert main(["bench", *TINY, "--threads", "1", "--batch-sizes", "1", "--repeats", "1", "--warmup", "1",
                 "--providers", "timm,vitfast-int8"]) == 0
    assert "SKIPPED: vitfast int8: vitfast.quantize unavailable" in capsys.readouterr().out


def test_vitfast_quantize_runs_on_a_copy(monkeypatch, capsys):
    """The quantized rows call quantize(copy, dtype=...) and time what it returns on the kernels; `vitfast bench`
    passes the package's vitfast.quantize."""
    calls = []

    def fake_quantize(model, dtype):
        calls.append((model, dtype))
        with torch.no_grad():  # an observable change: the accuracy row must see it, the fused model must not
            model.head.weight.mul_(1.01 if dtype == "int8" else 1.001)
        return None if dtype == "int8" else model  # in place or returned: both forms accepted

    baseline, fused = _tiny_pair()
    before = fused.head.weight.clone()
    providers = ["timm", "vitfast", "vitfast-int8", "vitfast-bf16"]
    report = run_bench(baseline, fused, threads=[1], batch_sizes=[1, 2], providers=providers, repeats=2,
                       quantize=fake_quantize, log=lambda s: None)
    _check_consistent(report, providers, [1], [1, 2])
    assert [d for _, d in calls] == ["int8", "bf16"] and all(m is not fused for m, _ in calls)
    assert torch.equal(fused.head.weight, before)
    acc = report["accuracy"]
    assert 1e-4 < acc["vitfast-int8"]["rel_err"] < 0.05 and 1e-5 < acc["vitfast-bf16"]["rel_err"] < 5e-3
    assert PROVIDERS["vitfast-int8"][1] == "fused"

    calls.clear()
    monkeypatch.setattr(vitfast, "quantize", fake_quantize, raising=False)
    assert main(["bench", *TINY, "--threads", "1", "--batch-sizes", "1", "--repeats", "1", "--warmup", "1",
                 "--providers", "timm,vitfast-bf16"]) == 0
    assert [d for _, d in calls] == ["bf16"]
    assert any(line.startswith("vitfast bf16  ") for line in capsys.readouterr().out.splitlines())


def test_the_real_quantized_rows_run():
    """vitfast.quantize itself behind vitfast-int8 / vitfast-bf16: a bf16 copy takes bf16 images (an fp32 batch once
    failed in its patch embedding), and both stay close to the fused fp32 model."""
    baseline, fused = _tiny_pair()
    providers = ["vitfast", "vitfast-int8", "vitfast-bf16"]
    report = run_bench(baseline, fused, threads=[1], batch_sizes=[2], providers=providers, repeats=1,
                       quantize=vitfast.quantize, log=lambda s: None)
    assert not report.get("errors"), report.get("errors")
    acc = report["accuracy"]
    assert acc["vitfast-int8"]["rel_err"] < 0.1 and acc["vitfast-bf16"]["rel_err"] < 0.05
