"""The patch embedding as one GEMM (`vitfast.nn.GemmPatchProjection`): equal to timm's Conv2d, same state dict,
used by `vitfast.fuse` / `vitfast.load`, and the Conv2d itself wherever the GEMM path must not run."""
import pytest
import torch
import torch.nn as nn
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast.nn import GemmPatchProjection, use_gemm_patch_projection

from helpers import count_linear_calls, randomize

needs_ext = pytest.mark.skipif(not vitfast.ops.extension_loaded(), reason="needs the C++ extension (vitfast._C)")


def _projection(in_chans=3, out=48, patch=(8, 8), bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    conv = nn.Conv2d(in_chans, out, kernel_size=patch, stride=patch, bias=bias)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * 0.05)
        if bias:
            conv.bias.copy_(torch.randn(out, generator=g))
    return conv


def _holder(conv) -> nn.Module:
    """A model with timm's attribute path to the patch projection: model.patch_embed.proj."""
    holder = nn.Module()
    holder.patch_embed = nn.Module()
    holder.patch_embed.proj = conv
    return holder


@needs_ext
@pytest.mark.parametrize("shape,patch,bias", [
    ((1, 3, 32, 32), (8, 8), True),
    ((2, 3, 32, 48), (8, 8), True),        # non-square grid, batch 2
    ((1, 4, 24, 30), (4, 6), False),       # non-square patch, no bias, 4 input channels
])
def test_equals_the_conv(monkeypatch, shape, patch, bias):
    conv = _projection(in_chans=shape[1], patch=patch, bias=bias)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = conv(x)
        assert use_gemm_patch_projection(nn.Module()) is False  # no patch_embed: nothing to do
        assert use_gemm_patch_projection(_holder(conv)) is True
        assert type(conv) is GemmPatchProjection
        calls = count_linear_calls(monkeypatch)
        out = conv(x)
    assert calls, "the GEMM path did not run"
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # timm's PatchEmbed flattens to tokens: that view of the GEMM output is contiguous (no copy).
    assert out.flatten(2).transpose(1, 2).is_contiguous()


@needs_ext
@pytest.mark.filterwarnings("ignore:`torch.jit.trace")  # deprecated in torch 2.14, still what ONNX export uses
def test_falls_back_to_the_conv(monkeypatch):
    conv = _projection()
    use_gemm_patch_projection(_holder(conv))
    calls = count_linear_calls(monkeypatch)
    reference = nn.Conv2d(3, 48, 8, 8)
    reference.load_state_dict(conv.state_dict())
    with torch.no_grad():
        x = torch.randn(1, 3, 36, 32)  # 36 is not a whole number of 8-pixel patches: the conv's own semantics
        torch.testing.assert_close(conv(x), reference(x))
        x = torch.randn(1, 3, 32, 32)
        vitfast.set_backend("reference")
        try:
            torch.testing.assert_close(conv(x), reference(x))
        finally:
            vitfast.set_backend("auto")
        traced = torch.jit.trace(conv, x, check_trace=False)  # (the check would rerun it eagerly)
    assert "conv" in str(traced.inlined_graph).lower()  # exported graphs keep the standard convolution
    assert calls == [], "the GEMM path ran where the conv must"


@needs_ext
def test_gradients_equal_the_convs(monkeypatch):
    """With gradients on, the GEMM path still runs (ops.linear differentiates its reference): same gradients."""
    conv = _projection()
    reference = nn.Conv2d(3, 48, 8, 8)
    reference.load_state_dict(conv.state_dict())
    use_gemm_patch_projection(_holder(conv))
    calls = count_linear_calls(monkeypatch)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5), requires_grad=True)
    upstream = torch.randn(2, 48, 4, 4, generator=torch.Generator().manual_seed(6))
    got = torch.autograd.grad(conv(x), [x, conv.weight, conv.bias], upstream)
    want = torch.autograd.grad(reference(x), [x, reference.weight, reference.bias], upstream)
    assert calls, "the GEMM path did not run"
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_only_plain_patch_convolutions_are_turned():
    for conv in (nn.Conv2d(3, 8, 8, stride=4),                 # overlapping
                 nn.Conv2d(3, 8, 8, stride=8, padding=1),      # padded
                 nn.Conv2d(3, 8, 8, stride=8, groups=1, dilation=2)):
        assert use_gemm_patch_projection(_holder(conv)) is False
        assert type(conv) is nn.Conv2d


@needs_ext
def test_fuse_and_load_use_it(tmp_path):
    model = randomize(VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                                        num_classes=10, qkv_bias=True)).eval()
    converted = vitfast.convert.from_timm(model, channel_idle=0.75).eval()
    fused = vitfast.fuse(converted)
    assert type(fused.patch_embed.proj) is GemmPatchProjection
    def patch_keys(m):
        return {k for k in m.state_dict() if k.startswith("patch_embed")}

    assert patch_keys(fused) == patch_keys(converted) == {"patch_embed.proj.weight", "patch_embed.proj.bias"}
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), converted(x), rtol=1e-4, atol=1e-4)
    path = tmp_path / "fused.safetensors"
    vitfast.save(fused, path)
    assert vitfast.io.read_config(path)["modules"]["patch_embed.proj"] == {
        "kind": "gemm_patch_projection", "in_channels": 3, "out_channels": 64, "patch_size": [8, 8], "bias": True}
    loaded = vitfast.load(path)
    assert type(loaded.patch_embed.proj) is GemmPatchProjection
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), fused(x), rtol=0, atol=0)


def test_config_is_checked():
    good = {"kind": "gemm_patch_projection", "in_channels": 3, "out_channels": 8, "patch_size": [4, 2], "bias": False}
    proj = GemmPatchProjection.from_vitfast_config(good)
    assert proj.kernel_size == proj.stride == (4, 2) and proj.bias is None and proj.vitfast_config() == good
    with pytest.raises(ValueError, match=r"cfg\['patch_size'\]"):
        GemmPatchProjection.from_vitfast_config({**good, "patch_size": [4]})
    with pytest.raises(ValueError, match="unexpected keys"):
        GemmPatchProjection.from_vitfast_config({**good, "padding": 1})


@needs_ext
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_fp32_it_is_the_conv(monkeypatch):
    """`vitfast.load(...).cuda()`: on a GPU in fp32 the projection is cuDNN's conv, equal to the CPU GEMM path."""
    conv = _projection()
    use_gemm_patch_projection(_holder(conv))
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # ieee products, like the fp32 CPU GEMM
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        on_cpu = conv(x)
        calls = count_linear_calls(monkeypatch)
        on_gpu = conv.cuda()(x.cuda())
    assert calls == []
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_on_cuda_16bit_it_is_one_gemm(monkeypatch, dtype, channels_last):
    """fp16/bf16 on a GPU: patch rows through cuBLAS (no convolution kernel), equal to cuDNN's conv up to the
    summation order of one rounding in `dtype` (module doc)."""
    conv = _projection(out=64, patch=(16, 16))
    reference = nn.Conv2d(3, 64, 16, 16)
    reference.load_state_dict(conv.state_dict())
    use_gemm_patch_projection(_holder(conv))
    conv, reference = conv.cuda().to(dtype), reference.cuda().to(dtype)
    x = torch.randn(4, 3, 64, 96, generator=torch.Generator().manual_seed(2)).cuda().to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # an ieee fp32 reference below
    linear_calls = []
    real_linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a, **k: linear_calls.append(1) or real_linear(*a, **k))
    with torch.no_grad():
        got, want = conv(x), reference(x)
    assert linear_calls, "the CUDA GEMM path did not run"
    exact = reference.float()(x.float())
    # Both round once to dtype from fp32 accumulation: each within one rounding of the fp32 result, so within two
    # of each other (a bound that fails for a wrong patch order: those errors are the size of the output).
    unit = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    scale = exact.abs().amax().item()
    assert (got.float() - exact).abs().max().item() <= 2 * unit * scale
    assert (want.float() - exact).abs().max().item() <= 2 * unit * scale
    assert got.flatten(2).transpose(1, 2).is_contiguous()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_captured_graph_sees_in_place_weight_updates():
    # channels_last input needs the weight re-ordered: inside a capture the copy is captured too, so a replay after
    # an in-place update uses the new weight (vitfast.cuda_graph's contract), not a kept copy of the old one.
    conv = _projection(out=64, patch=(16, 16))
    use_gemm_patch_projection(_holder(conv))
    conv = conv.cuda().to(torch.bfloat16).eval()
    x = torch.randn(2, 3, 64, 64).cuda().to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    graphed = vitfast.cuda_graph(conv)
    with torch.no_grad():
        graphed(x)
        conv.weight.mul_(-2)
        got, want = graphed(x), conv(x)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
