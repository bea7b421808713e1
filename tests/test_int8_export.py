"""An int8 model (`vitfast.quantize`, static activation scales) exported as an ONNX QDQ graph and checked in ONNX
Runtime against the int8 kernels; a per-token (dynamic) model is refused with the reason."""
import pytest
import timm
import torch

import vitfast

pytest.importorskip("onnxruntime")  # the export extra; installed by scripts/setup.sh


def _int8(activations="static"):
    m = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, num_classes=10).eval()
    fused = vitfast.fuse(vitfast.convert.from_timm(m, channel_idle=0.75, norm="batch")).eval()
    calib = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return vitfast.quantize(fused, calib if activations == "static" else None, activations=activations)


def test_static_int8_exports_as_qdq(tmp_path):
    import onnx
    import onnxruntime as ort

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
    session = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"])
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
    import onnxruntime as ort

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
    session = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"])
    # inputs twice the calibration images' scale: many activations beyond the calibrated range, where ONNX's
    # QuantizeLinear saturates at −128 and the kernels at −127 — the export's Clip makes the codes the same (without
    # it: 1–2% apart here); what is left is a quantum where division and the reciprocal round differently
    x = 2 * torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    with torch.no_grad():
        ref = q(x)
    assert ((got - ref).norm() / ref.norm()).item() < 1e-3
