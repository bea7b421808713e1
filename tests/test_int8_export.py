"""An int8 model (`vitfast.quantize`, static activation scales) exported as an ONNX QDQ graph and checked in ONNX
Runtime against the int8 kernels; a per-token (dynamic) model is refused with the reason."""
import warnings

import pytest
import timm
import torch

import vitfast
from vitfast.onnx_qdq import ort_int8_saturates

pytest.importorskip("onnxruntime")  # the export extra; installed by scripts/setup.sh

# ONNX Runtime's int8 GEMM on an x86 CPU without VNNI saturates 8-bit weights (vitfast/onnx_qdq.py): there an 8-bit
# model's file is compared by ONNX's definition (an unoptimised session, as the export's own check does); 7-bit
# weights are compared in the optimised session on every CPU (test_7bit_weights_run_exactly_in_optimised_ort).
SATURATES = ort_int8_saturates()


def _session(path):
    return vitfast.export.ort_session(str(path), optimize=not SATURATES)


def _int8(activations="static", weight_bits=8):
    m = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, num_classes=10).eval()
    fused = vitfast.fuse(vitfast.convert.from_timm(m, channel_idle=0.75, norm="batch")).eval()
    calib = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return vitfast.quantize(fused, calib if activations == "static" else None, activations=activations,
                            weight_bits=weight_bits)


def test_static_int8_exports_as_qdq(tmp_path):
    import onnx

    q = _int8()
    report = vitfast.export.to_onnx(q, tmp_path / "q.onnx")  # checked in ONNX Runtime against the kernels
    ops = report.op_types
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    proto = onnx.load(str(tmp_path / "q.onnx"))
    # One QuantizeLinear per GEMM for its activation (the patch embedding, 4 attention linears, 2 FFNs × 2 GEMMs); the
    # weights are int8 initializers read by DequantizeLinear (vitfast/onnx_qdq.py), not fp32 constants through
    # QuantizeLinear.
    assert sum(n.op_type == "QuantizeLinear" for n in proto.graph.node) == 1 + 4 + 2 * 2
    int8_weights = [t for t in proto.graph.initializer if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 2]
    assert len(int8_weights) == 1 + 4 + 2 * 2
    dq_inputs = {n.input[0] for n in proto.graph.node if n.op_type == "DequantizeLinear"}
    assert all(t.name in dq_inputs for t in int8_weights)
    n_weights = sum(m.qweight.numel() for m in q.modules() if hasattr(m, "qweight"))
    n_weights += sum(m.qw_in.numel() + m.qw_out.numel() for m in q.modules() if hasattr(m, "qw_in"))
    assert sum(int(torch.tensor(list(t.dims)).prod()) for t in int8_weights) == n_weights
    assert SATURATES or not any("saturates" in n for n in report.notes)
    session = _session(tmp_path / "q.onnx")
    x = torch.randn(5, 3, 32, 32)
    got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    with torch.no_grad():
        ref = q(x)
    # one quantum apart at most per code (vitfast/reference/_int8_qdq.py): far below the int8 error itself
    assert ((got - ref).norm() / ref.norm()).item() < vitfast.export.INT8_EXPORT_RTOL


def test_dynamic_int8_is_refused(tmp_path):
    with pytest.raises(ValueError, match="per-token \\(dynamic\\) activation scales have no ONNX operator"):
        vitfast.export.to_onnx(_int8("dynamic"), tmp_path / "q.onnx")
    assert not (tmp_path / "q.onnx").exists()


@pytest.mark.parametrize("method", ["nondeep", "dwconv"])
def test_static_int8_method_attentions_export_as_qdq(method, tmp_path):
    """A non-deep model's int8 attention GEMMs (ProjectedXWXAttention's proj_in / proj_out) and a DW-conv block's
    (value / out_proj) export as QDQ like the other int8 layers; the heads between them export as xwx_heads' /
    dwconv_heads' reference (plain ONNX operators); ONNX Runtime agrees with the kernels."""
    import onnx

    m = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, num_classes=10).eval()
    if method == "nondeep":
        model = vitfast.convert.from_timm(m, branches=2)
        for block in model.blocks:
            block.set_lambda(1.0)
    else:
        model = vitfast.convert.from_timm(m, dwconv_blocks=[1])
    calib = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    q = vitfast.quantize(vitfast.fuse(model.eval()), calib, activations="static")
    vitfast.export.to_onnx(q, tmp_path / "q.onnx")
    proto = onnx.load(str(tmp_path / "q.onnx"))
    # the patch embedding, then per block: the attention's two GEMMs and the FFN's two
    assert sum(n.op_type == "QuantizeLinear" for n in proto.graph.node) == 1 + len(q.blocks) * 4
    session = _session(tmp_path / "q.onnx")
    # inputs twice the calibration images' scale: many activations beyond the calibrated range, where ONNX's
    # QuantizeLinear saturates at −128 and the kernels at −127 — the export's Clip makes the codes the same (without
    # it: 1–2% apart here); what is left is a quantum where division and the reciprocal round differently
    x = 2 * torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    with torch.no_grad():
        ref = q(x)
    assert ((got - ref).norm() / ref.norm()).item() < 1e-3


def test_7bit_weights_run_exactly_in_optimised_ort(tmp_path):
    """weight_bits=7 (codes in [-64, 64]): ONNX Runtime's fused int8 kernels agree with vitfast's on every x86 CPU,
    VNNI or not — no saturation note, the optimised session within the export tolerance."""
    q = _int8(weight_bits=7)
    assert vitfast.nn.int8.max_weight_code(q) <= 64
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = vitfast.export.to_onnx(q, tmp_path / "q.onnx")
    assert not any("saturates" in n for n in report.notes)
    session = vitfast.export.ort_session(str(tmp_path / "q.onnx"))
    x = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    with torch.no_grad():
        ref = q(x)
    assert ((got - ref).norm() / ref.norm()).item() < vitfast.export.INT8_EXPORT_RTOL


class _Skewed:
    """An optimised ONNX Runtime session whose output is 20% off, as a saturating int8 GEMM's can be."""

    def __init__(self, session):
        self.session = session

    def get_inputs(self):
        return self.session.get_inputs()

    def run(self, names, feeds):
        return [1.2 * out for out in self.session.run(names, feeds)]


@pytest.mark.parametrize("saturates, weight_bits, written", [(True, 8, True), (False, 8, False), (True, 7, False)])
def test_saturating_ort_is_checked_by_the_graphs_definition(monkeypatch, tmp_path, saturates, weight_bits, written):
    """Where ONNX Runtime's optimised session is off: an 8-bit model on a CPU whose ORT int8 GEMM saturates is
    checked unfused and written with a RuntimeWarning naming weight_bits=7; anywhere else (a VNNI CPU, or 7-bit
    weights, which cannot saturate) it is a mismatch and nothing is written."""
    real = vitfast.export.ort_session
    monkeypatch.setattr(vitfast.export, "ort_session",
                        lambda path, *a, optimize=True, **k: _Skewed(real(path, *a, **k)) if optimize
                        else real(path, *a, optimize=False, **k))
    monkeypatch.setattr(vitfast.export, "ort_int8_saturates", lambda: saturates)
    q, path = _int8(weight_bits=weight_bits), tmp_path / "q.onnx"
    if written:
        with pytest.warns(RuntimeWarning, match="saturates 8-bit weights.*weight_bits=7"):
            report = vitfast.export.to_onnx(q, path)
        assert path.exists() and report.max_abs_diff <= 0.1 * report.max_abs_output
    else:
        with pytest.raises(vitfast.export.ExportMismatchError, match=r"relative error 2\.0\d*e-01"):
            vitfast.export.to_onnx(q, path)
        assert not path.exists()


@pytest.mark.parametrize("flags, saturates", [(["avx2", "avx512f", "avx512bw"], True), (["avx2", "avx_vnni"], False),
                                              (["avx2", "avx512f", "avx512_vnni"], False), (["avx2"], True)])
def test_ort_int8_saturates_reads_vnni(flags, saturates):
    assert ort_int8_saturates(flags) is saturates


def test_fold_weight_quantize_takes_a_zero_channel_to_its_zero_point():
    """A weight row of zeros has scale 0 (vitfast's s = max|w| / qmax): folded to the zero point, with no NaN and no
    numpy warning (x / 0 was NaN, cast to int8 as whatever the platform gives)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from vitfast.onnx_qdq import fold_weight_quantize

    w = np.array([[0.5, -1.0, 0.0], [0.0, 0.0, 0.0]], np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([0.5, 0.0], np.float32), "s"),
             numpy_helper.from_array(np.zeros(2, np.int8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["w", "s", "z"], ["q"], axis=0),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=0)]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    proto = helper.make_model(helper.make_graph(nodes, "g", [], [out], initializer=inits))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fold_weight_quantize(proto) == 1
    q = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}["q"]
    assert q.dtype == np.int8 and q.tolist() == [[1, -2, 0], [0, 0, 0]]
    assert [n.op_type for n in proto.graph.node] == ["DequantizeLinear"]
    assert isinstance(proto, onnx.ModelProto)
