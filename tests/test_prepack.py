"""Weights packed once at fuse / load / patch time (`vitfast.ops.prepack`): the first inference packs nothing.

The packed-weight cache counts packs as misses (`vitfast._C._weight_cache_stats()`); after `vitfast.fuse`,
`vitfast.load` or `vitfast.patch_timm` a forward must add hits only.
"""
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast import _env

from helpers import randomize

pytestmark = pytest.mark.skipif(not vitfast.ops.extension_loaded(), reason="needs the C++ extension (vitfast._C)")

IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))


def _vit(**overrides) -> VisionTransformer:
    kwargs = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10, qkv_bias=True)
    kwargs.update(overrides)
    return randomize(VisionTransformer(**kwargs)).eval()


def _stats():
    return vitfast._C._weight_cache_stats()


def _forward_packs_nothing(model):
    before = _stats()
    with torch.no_grad():
        out = model(IMAGES)
    after = _stats()
    assert after["misses"] == before["misses"], f"the first forward packed {after['misses'] - before['misses']} weights"
    assert after["hits"] > before["hits"]
    return out


def _fused_repavit():
    train = vitfast.convert.from_timm(_vit(), channel_idle=0.75)
    return vitfast.fuse(train.eval())


def test_fuse_prepacks():
    vitfast._C._weight_cache_clear()
    fused = _fused_repavit()
    # 2 blocks × (qkv, proj, FFN) + the patch projection (GemmPatchProjection) + the head (PackedLinear) = 8
    # packed entries, all made before any inference.
    assert _stats()["misses"] == 8 and _stats()["entries"] == 8
    _forward_packs_nothing(fused)


def test_load_prepacks_and_matches(tmp_path):
    fused = _fused_repavit()
    path = tmp_path / "m.safetensors"
    vitfast.save(fused, path)
    with torch.no_grad():
        expected = fused(IMAGES)
    vitfast._C._weight_cache_clear()
    loaded = vitfast.load(path)
    assert _stats()["misses"] == 8
    torch.testing.assert_close(_forward_packs_nothing(loaded), expected, rtol=0, atol=0)


def test_patch_timm_prepacks():
    model = _vit()
    vitfast._C._weight_cache_clear()
    vitfast.patch_timm(model)
    assert _stats()["misses"] == 8  # 2 blocks × (qkv, proj, FFN) + the patch projection + the head
    _forward_packs_nothing(model)


def test_prepack_opt_out_packs_on_first_call():
    vitfast._C._weight_cache_clear()
    fused = vitfast.fuse(vitfast.convert.from_timm(_vit(), channel_idle=0.75).eval(), prepack=False)
    assert _stats()["misses"] == 0
    with torch.no_grad():
        fused(IMAGES)
    assert _stats()["misses"] == 8


def test_prepack_counts_modules_and_is_idempotent():
    fused = vitfast.fuse(vitfast.convert.from_timm(_vit(), channel_idle=0.75).eval(), prepack=False)
    vitfast._C._weight_cache_clear()
    assert vitfast.ops.prepack(fused) == 6  # 2 × (Attention, FusedChannelIdleFFN) + GemmPatchProjection + head
    misses = _stats()["misses"]
    assert vitfast.ops.prepack(fused) == 6
    assert _stats()["misses"] == misses  # already packed: hits only


def test_prepack_after_in_place_update_repacks_once():
    fused = _fused_repavit()
    with torch.no_grad():
        fused.blocks[0].mlp.w_in.mul_(0.5)  # bumps the version: the old packed entry is stale
    misses = _stats()["misses"]
    vitfast.ops.prepack(fused)
    assert _stats()["misses"] == misses + 1
    _forward_packs_nothing(fused)


def test_prepack_skips_reference_backend(monkeypatch):
    fused = vitfast.fuse(vitfast.convert.from_timm(_vit(), channel_idle=0.75).eval(), prepack=False)
    monkeypatch.setattr(_env, "_backend", "reference")
    assert vitfast.ops.prepack(fused) == 0


def test_prepack_rejects_non_modules():
    with pytest.raises(TypeError, match="module: expected a torch.nn.Module, got str"):
        vitfast.ops.prepack("model")


@pytest.mark.parametrize("recipe", ["nondeep_full", "nondeep_factored", "dwconv_mixed"])
def test_fuse_prepacks_every_method(recipe):
    # Non-deep (xwx_attention, both score forms) and drop-in depthwise-conv blocks (dwconv_attention plus the
    # remaining heads' linears) pack at fuse time too, so their first forward also only hits the cache.
    if recipe.startswith("nondeep"):
        train = vitfast.convert.from_timm(_vit(depth=4), branches=2)
        for block in train.blocks:
            block.set_lambda(1.0)  # joining finished: the collapse is exact
        kwargs = {"score_form": recipe.split("_")[1]}
    else:
        train = vitfast.convert.from_timm(_vit(), dwconv_blocks=[0], dwconv_heads={1: [0]})
        kwargs = {}
    vitfast._C._weight_cache_clear()
    fused = vitfast.fuse(train.eval(), **kwargs)
    assert _stats()["misses"] > 0
    out = _forward_packs_nothing(fused)
    with torch.no_grad():
        torch.testing.assert_close(out, train.eval()(IMAGES), atol=1e-4, rtol=1e-4)


def _misses_per_forward(model, x, calls, mode=torch.inference_mode):
    counts = []
    with mode():
        for _ in range(calls):
            before = _stats()["misses"]
            model(x)
            counts.append(_stats()["misses"] - before)
    return counts


@pytest.mark.parametrize("mode", [torch.inference_mode, torch.no_grad], ids=["inference_mode", "no_grad"])
def test_channels_last_model_repacks_once(tmp_path, mode):
    """`model.to(memory_format=torch.channels_last)` makes the patch-projection weight channels_last; flattening it
    for the GEMM copied it on every call: a new tensor each time, repacked on every call (under inference_mode the
    copy was an inference tensor, and the op warned that the *weights* were).  Now the layout change repacks once,
    for each input layout."""
    model = _vit()
    vitfast.patch_timm(model)
    path = tmp_path / "m.safetensors"
    vitfast.save(model, path)
    loaded = vitfast.load(path)
    with torch.no_grad():
        expected = loaded(IMAGES)
    loaded = loaded.to(memory_format=torch.channels_last)
    assert not loaded.patch_embed.proj.weight.is_contiguous()
    assert _misses_per_forward(loaded, IMAGES, 3, mode) == [1, 0, 0]  # the re-ordered weight: packed once, kept
    nhwc = IMAGES.contiguous(memory_format=torch.channels_last)
    assert _misses_per_forward(loaded, nhwc, 3, mode) == [1, 0, 0]  # a channels_last input reads the weight as is
    with mode():
        torch.testing.assert_close(loaded(IMAGES), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loaded(nhwc), expected, rtol=1e-5, atol=1e-5)
    # the kept copy follows the weight: an in-place update, and a write through .data after clear_weight_cache()
    proj = loaded.patch_embed.proj
    with torch.no_grad():
        proj.weight.mul_(2)
        doubled = loaded(IMAGES)
        assert not torch.equal(doubled, expected)
        torch.testing.assert_close(loaded(nhwc), doubled, rtol=1e-5, atol=1e-5)
        proj.weight.data.mul_(0.5)
        vitfast.ops.clear_weight_cache()
        torch.testing.assert_close(loaded(IMAGES), expected, rtol=1e-5, atol=1e-5)
    # back to contiguous: the weight is read as is again
    loaded = loaded.to(memory_format=torch.contiguous_format)
    assert _misses_per_forward(loaded, IMAGES, 2, mode) == [1, 0]


def test_channels_last_projection_trains():
    """With gradients on, the re-ordered weight is made per call (differentiable): the same gradients as the conv."""
    conv = torch.nn.Conv2d(3, 16, 8, 8)
    reference = torch.nn.Conv2d(3, 16, 8, 8).to(memory_format=torch.channels_last)
    reference.load_state_dict(conv.state_dict())
    proj = vitfast.nn.GemmPatchProjection(3, 16, 8).to(memory_format=torch.channels_last)
    proj.load_state_dict(conv.state_dict())
    x = torch.randn(2, 3, 16, 16)
    upstream = torch.randn(2, 16, 2, 2)
    got = torch.autograd.grad(proj(x), [proj.weight, proj.bias], upstream)
    want = torch.autograd.grad(reference(x), [reference.weight, reference.bias], upstream)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


_INFERENCE_TENSOR_WARNING = r"""
import torch
import vitfast
from timm.models.vision_transformer import VisionTransformer
torch.manual_seed(0)
model = vitfast.patch_timm(VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=2,
                                             num_classes=10).eval())
x = torch.randn(1, 3, 32, 32)
channels_last = model.to(memory_format=torch.channels_last)
with torch.inference_mode():
    channels_last(x)
print("converted outside inference_mode: done", flush=True)
with torch.inference_mode():
    model.to(memory_format=torch.contiguous_format)  # the new weight is an inference tensor
    model(x)
print("converted under inference_mode: done", flush=True)
"""


def test_inference_tensor_warning_only_for_inference_tensor_weights():
    """The op's one-time warning says a weight is an inference tensor: it must not fire for a channels_last model
    converted outside inference_mode (it did: the per-call copy was one), and must for a weight that really is one."""
    import subprocess
    import sys

    # one stream: the warning (stderr, unbuffered) lands between the flushed prints that bracket its cause
    proc = subprocess.run([sys.executable, "-c", _INFERENCE_TENSOR_WARNING], check=False, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out[-2000:]
    first, _, second = out.partition("converted outside inference_mode: done")
    assert second, out[-2000:]
    assert "inference tensor" not in first
    assert "a weight is an inference tensor" in second


def test_low_precision_projection_under_autocast_packs_once():
    """Under CPU autocast the op runs in fp32: the flattened bf16 weight (a view, no parameter, so not the one fp32
    copy the autocast rule keeps per parameter) was cast, so packed, on every call.  Both layouts now pack once."""
    conv = torch.nn.Conv2d(3, 16, 8, 8)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():  # the fp32 conv of the bf16-rounded inputs and parameters: what the fp32 op computes
        conv.weight.copy_(conv.weight.bfloat16().float())
        conv.bias.copy_(conv.bias.bfloat16().float())
        expected = conv(x.bfloat16().float())
    proj = vitfast.nn.GemmPatchProjection(3, 16, 8).eval()
    proj.load_state_dict(conv.state_dict())
    proj = proj.bfloat16()
    for memory_format in (torch.contiguous_format, torch.channels_last):
        proj = proj.to(memory_format=memory_format)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert _misses_per_forward(proj, x.bfloat16(), 3, torch.no_grad) == [1, 0, 0]
            with torch.no_grad():
                torch.testing.assert_close(proj(x.bfloat16()), expected, rtol=1e-5, atol=1e-5)
