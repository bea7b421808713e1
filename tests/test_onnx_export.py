"""Plain `torch.onnx.export` of fused vitfast models (both exporters): while an export runs the ops take their
reference formulas, so the graph holds standard ONNX operators only (the same graph as `vitfast.export.to_onnx`),
and ONNX Runtime reproduces the model; `vitfast.export` is a lazy attribute; a missing optional package is one line
naming the `export` extra."""
import collections
import contextlib
import inspect
import json
import os
import subprocess
import sys
import warnings

import onnx
import onnxruntime as ort
import pytest
import torch
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast.export import DEFAULT_OPSET, STANDARD_DOMAINS, check_standard_ops, to_onnx

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = (3, 32, 32)

# The torch.export-based ONNX exporter (torch >= 2.5).
needs_dynamo_exporter = pytest.mark.skipif("dynamic_shapes" not in inspect.signature(torch.onnx.export).parameters,
                                           reason="torch < 2.5: no torch.export-based ONNX exporter")


def _vit(**overrides):
    torch.manual_seed(0)
    kwargs = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2, "num_classes": 10}
    kwargs.update(overrides)
    return VisionTransformer(**kwargs).eval()


def _channel_idle():
    return vitfast.convert.from_timm(_vit(), channel_idle=0.75)


def _swin():
    torch.manual_seed(0)
    return vitfast.convert.from_timm(SwinTransformer(img_size=32, patch_size=4, embed_dim=32, depths=(2, 2),
                                                     num_heads=(2, 4), window_size=4, num_classes=10).eval())


def _dwconv():
    return vitfast.convert.from_timm(_vit(), dwconv_blocks=[1])


def _nondeep():
    model = vitfast.convert.from_timm(_vit(qkv_bias=True), branches=2)
    for block in model.blocks:
        block.set_lambda(1.0)  # joined: the collapsed XWX form
    return model


def _gated():
    return vitfast.convert.from_timm(_vit(), gates=True, gate_search=False)


KINDS = {"channel_idle": (_channel_idle, "FusedBlock"), "swin": (_swin, "FusedSwinBlock"),
         "dwconv": (_dwconv, "FusedDWConvBlock"), "nondeep": (_nondeep, "FusedXWXBlock"),
         "gated": (_gated, "FusedGatedBlock")}
EXPORTERS = ["torchscript", pytest.param("dynamo", marks=needs_dynamo_exporter)]


@pytest.fixture(scope="module")
def fused():
    cache = {}

    def get(kind):
        if kind not in cache:
            make, block = KINDS[kind]
            model = vitfast.fuse(make().eval()).eval()
            assert any(type(m).__name__ == block for m in model.modules()), kind  # the fused kind under test
            cache[kind] = model
        return cache[kind]

    return get


def export(model, path, exporter, opset=None):
    """`torch.onnx.export` as a user calls it, with a dynamic batch axis (so other batch sizes are checked)."""
    x = torch.randn(2, *IMAGE, generator=torch.Generator().manual_seed(0))
    kwargs = {"input_names": ["images"], "output_names": ["logits"]}
    if opset is not None:
        kwargs["opset_version"] = opset
    with warnings.catch_warnings(), contextlib.redirect_stdout(open(os.devnull, "w")):
        warnings.simplefilter("ignore")  # the deprecation of the TorchScript exporter, the exporters' progress lines
        if exporter == "torchscript":
            torch.onnx.export(model, (x,), str(path), dynamo=False,
                              dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}}, **kwargs)
        else:
            program = torch.onnx.export(model, (x,), dynamo=True,
                                        dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},), **kwargs)
            program.save(str(path))
    return onnx.load(str(path))


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_torch_onnx_export_of_a_fused_model_runs_in_onnx_runtime(tmp_path, tol, fused, kind, exporter):
    model = fused(kind)
    backend = vitfast.get_backend()
    proto = export(model, tmp_path / "m.onnx", exporter)
    assert vitfast.get_backend() == backend and not vitfast.ops.onnx_exporting()
    onnx.checker.check_model(proto)
    check_standard_ops(proto)  # no custom domain anywhere, subgraphs and functions included
    assert {n.domain for n in proto.graph.node} <= STANDARD_DOMAINS
    assert not any("vitfast" in n.domain or "vitfast" in n.op_type.lower() for n in proto.graph.node)

    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    atol, rtol = tol[torch.float32]
    g = torch.Generator().manual_seed(1)
    for batch in (1, 3):
        x = torch.randn(batch, *IMAGE, generator=g)
        with torch.no_grad():
            expected = model(x)  # vitfast's own forward: the kernels on the CPU
        got = torch.from_numpy(session.run(None, {"images": x.numpy()})[0])
        torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize(("kind", "exporter"), [
    ("channel_idle", "torchscript"), pytest.param("channel_idle", "dynamo", marks=needs_dynamo_exporter),
    ("swin", "torchscript"), pytest.param("swin", "dynamo", marks=[needs_dynamo_exporter, pytest.mark.slow]),
    ("gated", "torchscript")])
def test_the_graph_is_the_one_to_onnx_writes(tmp_path, fused, kind, exporter):
    model = fused(kind)
    ours = export(model, tmp_path / "plain.onnx", exporter, opset=DEFAULT_OPSET[exporter])
    to_onnx(model, tmp_path / "to_onnx.onnx", exporter=exporter)
    theirs = onnx.load(str(tmp_path / "to_onnx.onnx"))
    # do_constant_folding differs in name only between the two calls' defaults: compare the computing nodes
    def count(proto):
        return collections.Counter(n.op_type for n in proto.graph.node if n.op_type != "Constant")

    assert count(ours) == count(theirs)


def test_the_kernels_run_again_after_an_export(tmp_path, fused, monkeypatch):
    """The switch is torch's own "export in progress" flag, which torch.onnx.export resets: the reference runs
    during the export only."""
    model = fused("channel_idle")
    calls = []
    for name in ("linear", "channel_idle_ffn"):
        original = getattr(vitfast.reference, name)
        monkeypatch.setattr(vitfast.reference, name, lambda *a, _f=original: calls.append(1) or _f(*a))
    export(model, tmp_path / "m.onnx", "torchscript")
    assert calls  # the export traced the reference
    calls.clear()
    with torch.no_grad():
        model(torch.randn(1, *IMAGE))
    assert not calls and not vitfast.ops.onnx_exporting()


PACKAGES = ("onnx", "onnxruntime", "onnxscript")

# One fresh interpreter for both checks below (importing vitfast takes seconds): vitfast.export, not imported
# before, resolves on first use; then, each optional package hidden in turn (None in sys.modules, as Python
# treats a module that is not installed), to_onnx's exception and `vitfast export`'s output and status.
_SCRIPT = """
import contextlib, io, json, sys
import torch, vitfast
lazy = "vitfast.export" not in sys.modules and vitfast.export.to_onnx.__module__ == "vitfast.export"
from vitfast.cli import main
fused_file, out = sys.argv[1:3]
results = {}
for name in sys.argv[3:]:
    saved = sys.modules.get(name)
    sys.modules[name] = None
    try:
        try:
            vitfast.export.to_onnx(torch.nn.Linear(1, 1), out)
            raised = None
        except ImportError as exc:
            raised = [type(exc).__name__, str(exc)]
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            status = main(["export", fused_file, "-o", out])
        results[name] = [raised, status, stdout.getvalue(), stderr.getvalue()]
    finally:
        if saved is None:
            del sys.modules[name]
        else:
            sys.modules[name] = saved
print(json.dumps({"lazy": lazy, "missing": results}))
"""


@pytest.fixture(scope="module")
def fresh_interpreter(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fresh")
    fused_file = tmp / "fused.safetensors"
    fused_file.write_bytes(b"not read: the packages are checked first")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", _SCRIPT, str(fused_file), str(tmp / "out.onnx"), *PACKAGES],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert not (tmp / "out.onnx").exists()
    return json.loads(result.stdout.splitlines()[-1])


def test_vitfast_export_is_a_lazy_attribute(fresh_interpreter):
    assert fresh_interpreter["lazy"]


@pytest.mark.parametrize("missing", PACKAGES)
def test_a_missing_optional_package_is_one_line_naming_the_extra(fresh_interpreter, missing):
    raised, status, stdout, stderr = fresh_interpreter["missing"][missing]
    line = f"vitfast export needs onnx, onnxruntime and onnxscript: pip install 'vitfast[export]' (missing: {missing})"
    assert raised == ["MissingExportPackagesError", line]
    assert (status, stdout, stderr) == (1, "", line + "\n")  # one line, no traceback, before the model is read
