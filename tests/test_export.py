"""vitfast.export.to_onnx and `vitfast export`: standard ONNX ops only, ONNX Runtime equals vitfast, dynamic batch,
the check really fails on a mismatch, and bad arguments give clear errors."""
import inspect
import os

import onnx
import onnxruntime as ort
import pytest
import timm
import torch
import torch.nn as nn

import vitfast
from vitfast.cli import main
from vitfast.export import (STANDARD_DOMAINS, ExportError, ExportMismatchError, check_standard_ops, model_input_shape,
                            to_onnx)

TINY = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=10)


# The torch.export-based ONNX exporter (torch >= 2.5); torch 2.4 has only the TorchScript one for vitfast.
needs_dynamo_exporter = pytest.mark.skipif("dynamic_shapes" not in inspect.signature(torch.onnx.export).parameters,
                                           reason="torch < 2.5: no torch.export-based ONNX exporter")


def tiny_fused(theta=0.75, norm="batch", seed=0):
    torch.manual_seed(seed)
    baseline = timm.create_model("vit_tiny_patch16_224", **TINY).eval()
    model = vitfast.convert.from_timm(baseline, channel_idle=theta, norm=norm).eval()
    # non-trivial BatchNorm statistics, so that folding them is exercised by the comparison
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm1d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
    return vitfast.fuse(model).eval()


def ort_run(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])


@pytest.mark.parametrize("exporter", ["torchscript", pytest.param("dynamo", marks=[pytest.mark.slow, needs_dynamo_exporter])])
@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_ort_equals_vitfast_with_standard_ops_only(tmp_path, tol, exporter, norm):
    fused = tiny_fused(norm=norm)
    path = tmp_path / "m.onnx"
    backend = vitfast.get_backend()
    report = to_onnx(fused, path, exporter=exporter)
    assert vitfast.get_backend() == backend  # the reference switch is undone
    assert report.exporter == exporter and report.dynamic_batch and report.checked_batches == [1, 3]
    assert report.max_abs_diff <= report.tolerance and report.max_abs_output > 0
    assert report.bytes == os.path.getsize(path)

    proto = onnx.load(str(path))
    domains = {n.domain for n in proto.graph.node}
    assert domains <= STANDARD_DOMAINS, domains
    assert not any("vitfast" in n.op_type.lower() or "channel" in n.op_type.lower() for n in proto.graph.node)
    assert "Erf" in report.op_types  # the split GELU is really in the graph (exact erf GELU)

    atol, rtol = tol[torch.float32]
    for batch in (1, 2, 5):  # dynamic batch axis: sizes the export never saw
        x = torch.randn(batch, *model_input_shape(fused))
        with torch.no_grad():
            expected = fused(x)  # vitfast's own output: kernels on CPU
        torch.testing.assert_close(ort_run(path, x), expected, atol=atol, rtol=rtol)


def test_dynamic_and_fixed_batch_axes(tmp_path):
    fused = tiny_fused()
    dyn, fixed = tmp_path / "dyn.onnx", tmp_path / "b3.onnx"
    to_onnx(fused, dyn)
    report = to_onnx(fused, fixed, batch=3)
    assert report.batch == 3 and not report.dynamic_batch and report.checked_batches == [3]
    dim = onnx.load(str(dyn)).graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param == "batch"
    dim = onnx.load(str(fixed)).graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_value == 3 and not dim.dim_param
    assert ort_run(dyn, torch.randn(7, 3, 16, 16)).shape == (7, 10)
    with pytest.raises(Exception, match="(?i)dimension|shape"):
        ort_run(fixed, torch.randn(2, 3, 16, 16))


def test_a_plain_timm_model_exports_too(tmp_path):
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", **TINY).eval()
    report = to_onnx(model, tmp_path / "timm.onnx")
    assert report.max_abs_diff <= report.tolerance


class _DiffersOffReference(nn.Module):
    """Adds 1 to its output unless vitfast runs on the reference backend: the export (traced on the reference
    path) then disagrees with the model's own forward, which the check must catch."""

    def __init__(self):
        super().__init__()
        self.patch_embed = timm.layers.PatchEmbed(img_size=16, patch_size=4, in_chans=3, embed_dim=8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        y = self.head(self.patch_embed(x).mean(1))
        return y if vitfast.get_backend() == "reference" else y + 1.0


def test_a_mismatch_fails_loudly_and_writes_nothing(tmp_path):
    path = tmp_path / "bad.onnx"
    backend = vitfast.get_backend()
    with pytest.raises(ExportMismatchError, match=r"max \|Δ\| = 1\.0") as info:
        to_onnx(_DiffersOffReference().eval(), path)
    assert info.value.report.max_abs_diff == pytest.approx(1.0, abs=1e-5)
    assert not path.exists() and os.listdir(tmp_path) == []  # no temporary file left either
    assert vitfast.get_backend() == backend
    # without the check the same model exports (only onnx.checker runs)
    report = to_onnx(_DiffersOffReference().eval(), path, check=False)
    assert path.exists() and report.max_abs_diff != report.max_abs_diff  # NaN: not measured


def test_custom_domain_nodes_are_refused():
    node = onnx.helper.make_node("channel_idle_ffn", ["x"], ["y"], domain="vitfast")
    graph = onnx.helper.make_graph(
        [node], "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
    )
    with pytest.raises(ExportError, match=r"custom-domain nodes \['vitfast::channel_idle_ffn'\]"):
        check_standard_ops(onnx.helper.make_model(graph))
    relu = onnx.helper.make_node("Relu", ["x"], ["y"])
    graph = onnx.helper.make_graph([relu], "g", graph.input, graph.output)
    assert check_standard_ops(onnx.helper.make_model(graph)) == ["Relu"]


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(path="{tmp}/missing/m.onnx"), ValueError, "path: expected a file path in an existing directory"),
    (dict(path="{tmp}"), ValueError, "path: expected a file path, got"),
    (dict(path=3), TypeError, "path: expected a str or os.PathLike, got int"),
    (dict(batch=0), ValueError, "batch: expected 'dynamic' or a positive int, got 0"),
    (dict(batch="static"), ValueError, "batch: expected 'dynamic' or a positive int, got 'static'"),
    (dict(exporter="tflite"), ValueError, "exporter: expected one of"),
    (dict(opset=9), ValueError, r"opset: expected an int in \[14, 23\]"),
    (dict(input_shape=(3, 16)), ValueError, r"input_shape: expected \(C, H, W\)"),
    (dict(atol=-1.0), ValueError, "atol: expected a finite number >= 0, got -1.0"),
    (dict(atol=float("inf")), ValueError, "atol: expected a finite number >= 0, got inf"),  # turned the check off
    (dict(input_shape=(3, 32.9, 32)), ValueError, r"input_shape: expected \(C, H, W\), three positive ints"),
    (dict(input_shape=32), ValueError, r"input_shape: expected \(C, H, W\), three positive ints, got 32"),
    (dict(check="no"), ValueError, "check: expected True or False, got 'no'"),
    (dict(seed="x"), ValueError, "seed: expected an int, got 'x'"),
])
def test_bad_arguments(tmp_path, kwargs, error, message):
    kwargs = {k: (v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) and "{tmp}" in v else v)
              for k, v in kwargs.items()}
    path = kwargs.pop("path", tmp_path / "m.onnx")
    with pytest.raises(error, match=message):
        to_onnx(tiny_fused(), path, **kwargs)


def test_not_a_module_and_no_input_shape(tmp_path):
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module, got str"):
        to_onnx("model", tmp_path / "m.onnx")
    with pytest.raises(ValueError, match=r"input_shape: could not read the input size .* pass input_shape"):
        to_onnx(nn.Linear(4, 4), tmp_path / "m.onnx")


# ---------------------------------------------------------------------------------------------- CLI
def _fused_file(tmp_path):
    path = tmp_path / "fused.safetensors"
    vitfast.save(tiny_fused(), str(path))
    return str(path)


def test_cli_export(tmp_path, capsys):
    fused = _fused_file(tmp_path)
    out = tmp_path / "model.onnx"
    assert main(["export", fused, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert out.exists() and "dynamic batch axis" in text and "standard ONNX ops only" in text
    assert "check: ONNX Runtime vs vitfast at batch 1 and 3: max |Δ| =" in text and text.rstrip().endswith("OK")
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(ort_run(out, x), vitfast.load(fused)(x), atol=2e-5, rtol=2e-5)
    assert main(["export", fused, "-o", str(tmp_path / "b2.onnx"), "--batch", "2", "--opset", "18"]) == 0
    assert "batch 2" in capsys.readouterr().out
    assert onnx.load(str(tmp_path / "b2.onnx")).opset_import[0].version == 18


def test_cli_export_of_a_bf16_file(tmp_path, capsys):
    """A bf16 fused file: the CLI said "call .float().cpu() first", which a command-line user cannot do."""
    path = tmp_path / "bf16.safetensors"
    vitfast.save(tiny_fused().bfloat16(), str(path))
    out = tmp_path / "bf16.onnx"
    assert main(["export", str(path), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "FUSED holds bfloat16 weights: exported as float32" in text and text.rstrip().endswith("OK")
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(ort_run(out, x), vitfast.load(str(path)).float()(x), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("argv, message", [
    (["export", "{tmp}/nope.safetensors", "-o", "{tmp}/m.onnx"], "FUSED: expected an existing file, got"),
    (["export", "{fused}", "-o", "{tmp}/m.onnx", "--batch", "0"], "--batch: expected 'dynamic' or a positive integer, got 0"),
    (["export", "{fused}", "-o", "{tmp}/m.onnx", "--batch", "many"], "--batch: expected 'dynamic' or a positive integer, got 'many'"),
    (["export", "{train}", "-o", "{tmp}/m.onnx"], "FUSED: expected a fused .safetensors (from `vitfast fuse`), got a train-time file"),
    (["export", "{tmp}/junk.txt", "-o", "{tmp}/m.onnx"], "expected a vitfast file"),
])
def test_cli_export_bad_arguments(tmp_path, capsys, argv, message):
    from vitfast.io.trainable import save_trainable

    (tmp_path / "junk.txt").write_text("not a model")
    torch.manual_seed(0)
    train = tmp_path / "train.safetensors"
    save_trainable(vitfast.convert.from_timm(timm.create_model("vit_tiny_patch16_224", **TINY)), str(train))
    subs = {"{tmp}": str(tmp_path), "{fused}": _fused_file(tmp_path), "{train}": str(train)}
    for key, value in subs.items():
        argv = [a.replace(key, value) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("exporter", ["torchscript", pytest.param("dynamo", marks=needs_dynamo_exporter)])
def test_gated_model_exports_a_graph_that_decides_per_batch(tmp_path, exporter):
    """USDC gates decide from the batch: the TorchScript trace once recorded the trace-time decisions (a host-side
    branch), and the file was up to 19% off on batches deciding otherwise while the export check passed; later the
    TorchScript exporter was refused for gates (it failed on the gated sub-block's LayerNorm width)."""
    from vitfast.reference import batch_gate_logits

    torch.manual_seed(0)
    vit = timm.models.vision_transformer.VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2,
                                                           num_heads=2, num_classes=10).eval()
    fused = vitfast.fuse(vitfast.convert.from_timm(vit, gates=True, gate_search=False).eval())
    gate, seen = fused.blocks[0].gate, {}
    hook = gate.register_forward_hook(lambda m, i, o: seen.update(x=i[0]))
    with torch.no_grad():
        fused(torch.randn(64, 3, 32, 32))
        hook.remove()
        # block 0's MHSA logit at 0 for N(0,1) images: its decision then flips from batch to batch
        gate.b2[0] -= batch_gate_logits(seen["x"], gate.w1, gate.b1, gate.w2, gate.b2, gate.layer_norm, gate.act,
                                        gate.eps)[0]
    path = tmp_path / "gated.onnx"
    assert to_onnx(fused, path, exporter=exporter).exporter == exporter
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    decisions, worst, scale = set(), 0.0, 0.0
    hook = gate.register_forward_hook(lambda m, i, o: decisions.add(tuple(o.tolist())))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(16):
            x = torch.randn(3, 3, 32, 32, generator=g)
            y = fused(x)
            got = torch.from_numpy(session.run(None, {"images": x.numpy()})[0])
            worst, scale = max(worst, float((got - y).abs().max())), max(scale, float(y.abs().max()))
    hook.remove()
    assert len(decisions) > 1, "the batches all decided alike: the test would not see a frozen decision"
    assert worst <= 1e-4 * max(scale, 1.0), f"ORT differs from vitfast by {worst:.3g} (output scale {scale:.3g})"


@pytest.mark.slow
@needs_dynamo_exporter
def test_an_opset_the_exporter_did_not_write_is_an_error(tmp_path):
    """The torch.export-based exporter writes opset 18+: asked for 14 it once returned an opset-18 file and a
    report saying so, with nothing but a torch warning; now an error naming opset, and no file."""
    fused = tiny_fused(theta=0.5)
    path = tmp_path / "m.onnx"
    with pytest.raises(ExportError, match=r"opset: expected the file to have opset 14, the dynamo exporter wrote 18"):
        to_onnx(fused, path, exporter="dynamo", opset=14)
    assert not path.exists()
    assert to_onnx(fused, path, opset=14).opset == 14  # "auto": the TorchScript exporter writes it
