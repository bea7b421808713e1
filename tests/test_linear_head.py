"""The classifier head on the packed-weight GEMM (`vitfast.nn.PackedLinear`): equal to timm's nn.Linear, same
state dict, used by `vitfast.fuse` / `vitfast.load` / `vitfast.patch_timm`, and the nn.Linear itself wherever the
kernel must not run."""
import pytest
import torch
import torch.nn as nn
from timm.models.deit import VisionTransformerDistilled
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast.nn import PackedLinear, use_packed_linear_head

from helpers import count_linear_calls, randomize

needs_ext = pytest.mark.skipif(not vitfast.ops.extension_loaded(), reason="needs the C++ extension (vitfast._C)")


@needs_ext
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 64)])
def test_equals_nn_linear(monkeypatch, bias, shape):
    layer = nn.Linear(64, 10, bias=bias)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = layer(x)
        holder = nn.Module()
        holder.head = layer
        assert use_packed_linear_head(holder) == 1 and type(layer) is PackedLinear
        calls = count_linear_calls(monkeypatch)
        out = layer(x)
    assert calls == [x.shape], "the packed GEMM did not run"
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@needs_ext
@pytest.mark.filterwarnings("ignore:`torch.jit.trace")  # deprecated in torch 2.14, still what ONNX export uses
def test_runs_nn_linear_where_the_kernel_must_not(monkeypatch):
    layer = nn.Linear(64, 10)
    holder = nn.Module()
    holder.head = layer
    use_packed_linear_head(holder)
    calls = count_linear_calls(monkeypatch)
    with torch.no_grad():
        traced = torch.jit.trace(layer, torch.randn(2, 64), check_trace=False)
    assert "linear" in str(traced.inlined_graph).lower() or "addmm" in str(traced.inlined_graph).lower()
    assert calls == []
    with pytest.raises(RuntimeError):  # another dtype than the weight's: nn.Linear's own error, not the kernel's
        layer(torch.randn(2, 64, dtype=torch.float64))


def _heads(model):
    return [m for m in (getattr(model, "head", None), getattr(model, "head_dist", None),
                        getattr(getattr(model, "head", None), "fc", None)) if isinstance(m, nn.Linear)]


@needs_ext
@pytest.mark.parametrize("arch", ["vit", "distilled", "swin"])
def test_fuse_load_and_patch_timm_use_it(tmp_path, arch):
    if arch == "vit":
        model = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10)
    elif arch == "distilled":
        model = VisionTransformerDistilled(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                                           num_classes=10)
    else:
        model = SwinTransformer(img_size=32, patch_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4),
                                window_size=4, num_classes=10)
    model = randomize(model).eval()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(images)
    fused = vitfast.fuse(vitfast.convert.from_timm(model, channel_idle=0.0, norm="layer").eval())
    heads = _heads(fused)
    assert heads and all(type(h) is PackedLinear for h in heads)
    path = tmp_path / "m.safetensors"
    vitfast.save(fused, path)
    kinds = [m["kind"] for m in vitfast.io.read_config(path)["modules"].values()]
    assert kinds.count("packed_linear") == len(heads)
    loaded = vitfast.load(path)
    assert all(type(h) is PackedLinear for h in _heads(loaded))
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), fused(images), rtol=0, atol=0)
        torch.testing.assert_close(fused(images), expected, rtol=1e-4, atol=1e-4)
    patched = vitfast.patch_timm(model, inplace=False)
    assert all(type(h) is PackedLinear for h in _heads(patched))
    with torch.no_grad():
        torch.testing.assert_close(patched(images), expected, rtol=1e-4, atol=1e-4)


def test_config_is_checked():
    good = {"kind": "packed_linear", "in_features": 8, "out_features": 3, "bias": False}
    layer = PackedLinear.from_vitfast_config(good)
    assert layer.bias is None and layer.vitfast_config() == good
    with pytest.raises(ValueError, match=r"cfg\['in_features'\]"):
        PackedLinear.from_vitfast_config({**good, "in_features": 0})
    with pytest.raises(ValueError, match="unexpected keys"):
        PackedLinear.from_vitfast_config({**good, "dtype": "float32"})
