"""`vitfast.patch_timm` and the fused `vitfast.nn.FusedBlock` as a drop-in for timm's ViT `Block`."""
import copy
import gc
import math
from functools import partial
import inspect

import pytest
import torch
import torch.nn as nn
from timm.models.swin_transformer import SwinTransformer, SwinTransformerBlock
from timm.models.vision_transformer import Block as TimmBlock
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast.nn import FusedAttention, FusedBlock, FusedChannelIdleFFN, GemmPatchProjection, FusedSwinBlock

from helpers import assert_close_scaled, randomize


def _deit_tiny_like(**overrides) -> VisionTransformer:
    kwargs = dict(img_size=32, patch_size=8, embed_dim=192, depth=2, num_heads=3, num_classes=10)
    kwargs.update(overrides)
    return randomize(VisionTransformer(**kwargs))


IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize(
    "overrides",
    [
        dict(qkv_bias=True),  # DeiT-Tiny
        dict(qkv_bias=False),
        dict(qkv_bias=True, init_values=1e-1),  # LayerScale (DeiT-III): folded into proj / fc2
        dict(qkv_bias=False, qk_norm=True, init_values=1e-1),
        dict(qkv_bias=True, global_pool="avg", class_token=False),  # no cls token: N = 16, fc_norm
        dict(qkv_bias=True, proj_bias=False),
        dict(qkv_bias=True, scale_attn_norm=True),  # LayerNorm before proj, kept as attn.norm
    ],
    ids=["qkv_bias", "no_qkv_bias", "layer_scale", "qk_norm", "avg_pool", "no_proj_bias", "scale_attn_norm"],
)
def test_patched_vit_outputs_identical(overrides):
    model = _deit_tiny_like(**overrides)
    with torch.no_grad():
        expected = model(IMAGES)
        expected_features = model.forward_features(IMAGES)
    patched = vitfast.patch_timm(model)
    assert patched is model
    assert all(type(b) is FusedBlock for b in model.blocks)
    assert type(model.patch_embed.proj) is GemmPatchProjection
    with torch.no_grad():
        assert_close_scaled(model.forward_features(IMAGES), expected_features)
        assert_close_scaled(model(IMAGES), expected)


def test_patched_swin_outputs_identical():
    model = randomize(SwinTransformer(img_size=32, patch_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4),
                                      window_size=4, num_classes=10))
    with torch.no_grad():
        expected = model(IMAGES)
    vitfast.patch_timm(model)
    assert type(model.patch_embed.proj) is GemmPatchProjection  # Swin's NHWC PatchEmbed reads the same view
    blocks = [b for stage in model.layers for b in stage.blocks]
    assert all(type(b) is FusedSwinBlock and isinstance(b, SwinTransformerBlock) for b in blocks)
    with torch.no_grad():
        assert_close_scaled(model(IMAGES), expected)


def _masked_forward(model, x, mask):
    """timm's forward with an attention mask on every block (forward_features takes none in all timm versions)."""
    h = model._pos_embed(model.patch_embed(x))
    for block in model.blocks:
        h = block(h, attn_mask=mask)
    return model.forward_head(model.norm(h))


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("case", ["vit_causal_mask", "vit_qk_norm_mask", "swin"])
def test_patched_models_run_under_cpu_autocast(case, backend):
    # SDPA (and Swin's patch-merging Linear) give bf16 activations under autocast while the fused weights stay
    # fp32: every vitfast op refused the mix ("weight: expected dtype torch.bfloat16 (same as x)"), where timm runs.
    if case == "swin":
        model = randomize(SwinTransformer(img_size=32, patch_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4),
                                          window_size=4, num_classes=10))
        forward = model.__call__
    else:
        model = _deit_tiny_like(qk_norm=case == "vit_qk_norm_mask")
        mask = torch.ones(17, 17, dtype=torch.bool).tril() if case == "vit_causal_mask" else torch.rand(17, 17) > 0.2
        mask.fill_diagonal_(True)
        forward = lambda x: _masked_forward(model, x, mask)  # noqa: E731
    with torch.no_grad():
        expected = forward(IMAGES)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            timm_bf16 = forward(IMAGES).float()
    assert vitfast.patch_timm(model) is model  # in place: `forward` now runs the patched blocks
    previous = vitfast.get_backend()
    vitfast.set_backend(backend)  # the reference path takes the same rule (it alone refused the mix once)
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = forward(IMAGES).float()
    finally:
        vitfast.set_backend(previous)
    # the low-precision rule of STYLE.md / helpers.assert_low_precision_no_worse: no worse than 2x timm's own bf16
    # autocast error (vitfast's ops run in fp32 inside the region; the layers around them in bf16, as in timm)
    assert (out - expected).abs().max() <= 2 * (timm_bf16 - expected).abs().max()


def test_low_precision_weights_under_autocast_are_packed_once():
    """The autocast rule's fp32 cast of a bf16 weight made a new tensor every call, so the packed-weight cache
    (keyed on tensor identity) repacked every weight on every call (a DeiT-S block 2.2x slower).  A parameter now
    keeps one fp32 copy per version: packed once, an in-place update still seen, gradients still reach it."""
    from vitfast import _C, ops

    torch.manual_seed(0)
    block = FusedBlock(64, 4).eval().bfloat16()
    x = torch.randn(2, 9, 64, dtype=torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        block(x)
        misses = _C._weight_cache_stats()["misses"]
        first = block(x)
        for _ in range(3):
            torch.testing.assert_close(block(x), first, rtol=0, atol=0)
        assert _C._weight_cache_stats()["misses"] == misses
        block.mlp.w_out.mul_(2)  # a new version: a new fp32 copy, repacked, not the stale one
        expected = block.float()(x.float())
        block.bfloat16()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(block(x).float(), expected, rtol=2e-2, atol=2e-2)
    # training under autocast differentiates through the cast: the bf16 parameter gets its gradient
    block.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        block(x).float().sum().backward()
    assert block.mlp.w_out.grad is not None and block.mlp.w_out.grad.abs().sum() > 0
    # writes the version counter does not see: `.data = new` is seen (the data pointer), a write through `.data`
    # after clear_weight_cache() too (it drops the copies with the packed weights)
    block.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        before = block(x)
        block.mlp.w_out.data = block.mlp.w_out.data * 3
        assert not torch.equal(block(x), before)
        before = block(x)
        block.mlp.w_out.data.mul_(0.5)
        vitfast.ops.clear_weight_cache()
        assert not torch.equal(block(x), before)
    # the copies live only as long as their parameters
    kept = len(ops._fp32_weights)
    del block
    gc.collect()
    assert len(ops._fp32_weights) < kept


@pytest.mark.parametrize("mode", ["compile", "export"])
def test_low_precision_weights_under_autocast_trace(mode):
    """The kept fp32 copy read the data pointer of fake tensors: torch.compile / torch.export of a bf16 model under
    autocast failed ("Cannot access data pointer of Tensor")."""
    torch.manual_seed(0)
    block = FusedBlock(64, 4).eval().bfloat16()
    x = torch.randn(2, 9, 64, dtype=torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        eager = block(x)
        if mode == "compile":
            out = torch.compile(block, backend="aot_eager", fullgraph=True)(x)
        else:
            out = torch.export.export(block, (x,)).module()(x)
    torch.testing.assert_close(out.float(), eager.float(), rtol=2e-2, atol=2e-2)  # bf16 ops around it may differ


_AUTOCAST_WITHOUT_REGISTER_AUTOCAST = r"""
import torch
if hasattr(torch.library, "register_autocast"):  # torch 2.4 has none: vitfast registers the rule on the Autocast keys itself
    del torch.library.register_autocast
import vitfast
from timm.models.vision_transformer import VisionTransformer
torch.manual_seed(0)
model = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10,
                          qk_norm=True).eval()
x = torch.randn(2, 3, 32, 32)
mask = torch.rand(17, 17) > 0.2
mask.fill_diagonal_(True)

def forward(x):
    h = model._pos_embed(model.patch_embed(x))
    for block in model.blocks:
        h = block(h, attn_mask=mask)  # SDPA hands the next op bf16 activations next to fp32 weights
    return model.forward_head(model.norm(h))

with torch.no_grad():
    expected = forward(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        timm_error = (forward(x).float() - expected).abs().max()
    vitfast.patch_timm(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        error = (forward(x).float() - expected).abs().max()
assert error <= 2 * timm_error, (error, timm_error)
print("ok")
"""


def test_autocast_rule_without_register_autocast():
    """torch 2.4 (the oldest supported) has no torch.library.register_autocast: the same fp32 rule is registered on
    the AutocastCPU/AutocastCUDA keys by hand; without it a patched model under autocast refused the bf16/fp32 mix."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _AUTOCAST_WITHOUT_REGISTER_AUTOCAST], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]


def test_not_inplace_leaves_model_alone():
    model = _deit_tiny_like()
    patched = vitfast.patch_timm(model, inplace=False)
    assert patched is not model
    assert all(type(b) is TimmBlock for b in model.blocks)
    assert all(type(b) is FusedBlock for b in patched.blocks)
    assert type(model.patch_embed.proj) is nn.Conv2d and type(patched.patch_embed.proj) is GemmPatchProjection


def test_refuses_training_mode():
    model = _deit_tiny_like().train()
    with pytest.raises(ValueError, match=r"model: expected eval mode .* got training mode; call model.eval\(\) first"):
        vitfast.patch_timm(model)
    assert all(type(b) is TimmBlock for b in model.blocks)


def test_refuses_models_without_blocks():
    with pytest.raises(ValueError, match=r"model: expected a timm model containing .* found none in Sequential"):
        vitfast.patch_timm(nn.Sequential(nn.Linear(4, 4)).eval())


def _kinds(model):
    return [type(b).__name__ for b in model.blocks] + [type(model.patch_embed.proj).__name__, type(model.head).__name__]


def test_second_call_is_a_no_op_and_says_so(tmp_path):
    """A second call raised 'found none' (no timm block left); now it replaces nothing and its report says so."""
    model = _deit_tiny_like()
    with torch.no_grad():
        expected = model(IMAGES)
    report = vitfast.patch_timm(model, return_report=True)
    assert report.model is model and report
    assert report.replaced == ("patch_embed.proj", "blocks.0", "blocks.1", "head")
    children = list(model.modules())
    again = vitfast.patch_timm(model, return_report=True)
    assert again.model is model and not again and again.replaced == ()
    assert list(model.modules()) == children  # the same module objects: nothing swapped
    assert vitfast.patch_timm(model) is model  # the plain call still returns the model
    copied = vitfast.patch_timm(model, inplace=False, return_report=True)
    assert copied.model is not model and copied.replaced == ()
    with torch.no_grad():
        assert_close_scaled(model(IMAGES), expected)
    # a loaded fused model is already patched too
    path = tmp_path / "m.safetensors"
    vitfast.save(model, path)
    loaded = vitfast.load(path)
    assert vitfast.patch_timm(loaded, return_report=True).replaced == ()


@pytest.mark.parametrize("switch,kinds", [
    ("blocks", ["Block", "Block", "GemmPatchProjection", "PackedLinear"]),
    ("patch_embed", ["FusedBlock", "FusedBlock", "Conv2d", "PackedLinear"]),
    ("head", ["FusedBlock", "FusedBlock", "GemmPatchProjection", "Linear"]),
])
def test_part_switches(switch, kinds):
    model = _deit_tiny_like()
    with torch.no_grad():
        expected = model(IMAGES)
    report = vitfast.patch_timm(model, return_report=True, **{switch: False})
    assert _kinds(model) == kinds
    left_out = {"blocks": ("blocks.0", "blocks.1"), "patch_embed": ("patch_embed.proj",), "head": ("head",)}[switch]
    assert set(report.replaced) == {"patch_embed.proj", "blocks.0", "blocks.1", "head"} - set(left_out)
    with torch.no_grad():
        assert_close_scaled(model(IMAGES), expected)
    # the part left out is patched by a later call, and only it
    assert vitfast.patch_timm(model, return_report=True).replaced == left_out
    assert _kinds(model) == ["FusedBlock", "FusedBlock", "GemmPatchProjection", "PackedLinear"]


def test_stem_and_head_only_patch_a_training_model():
    # only the fused blocks are inference modules: the GEMM stem and packed head train as their torch layers do
    model = _deit_tiny_like().train()
    vitfast.patch_timm(model, blocks=False)
    assert _kinds(model) == ["Block", "Block", "GemmPatchProjection", "PackedLinear"]


def test_filter_fn_picks_modules():
    model = _deit_tiny_like(depth=3)
    with torch.no_grad():
        expected = model(IMAGES)
    asked = []

    def keep_middle_block_and_head(module, path):
        asked.append((path, type(module).__name__))
        return path not in ("blocks.1", "head")

    report = vitfast.patch_timm(model, filter_fn=keep_middle_block_and_head, return_report=True)
    assert asked == [("blocks.0", "Block"), ("blocks.1", "Block"), ("blocks.2", "Block"),
                     ("patch_embed.proj", "Conv2d"), ("head", "Linear")]
    assert report.replaced == ("patch_embed.proj", "blocks.0", "blocks.2")
    assert _kinds(model) == ["FusedBlock", "Block", "FusedBlock", "GemmPatchProjection", "Linear"]
    with torch.no_grad():
        assert_close_scaled(model(IMAGES), expected)
    # a later call is asked only about what is still timm's
    asked.clear()
    assert vitfast.patch_timm(model, filter_fn=keep_middle_block_and_head, return_report=True).replaced == ()
    assert asked == [("blocks.1", "Block"), ("head", "Linear")]
    with pytest.raises(TypeError, match="filter_fn: expected a callable"):
        vitfast.patch_timm(model, filter_fn="blocks")


def test_unsupported_block_leaves_model_unchanged():
    model = _deit_tiny_like(depth=3)
    model.blocks[2].mlp.act = nn.GELU(approximate="tanh")
    with pytest.raises(ValueError, match=r"blocks\.2\.mlp\.act: expected the exact GELU"):
        vitfast.patch_timm(model)
    assert all(type(b) is TimmBlock for b in model.blocks)  # nothing swapped half-way


def test_block_forward_signature_and_attention_mask():
    timm_block = randomize(TimmBlock(64, 4, qkv_bias=True))
    fused = FusedBlock.from_timm(timm_block)
    x = torch.randn(2, 9, 64)
    mask = torch.randn(9, 9)
    with torch.no_grad():
        assert_close_scaled(fused(x, attn_mask=mask), timm_block(x, attn_mask=mask))
        assert_close_scaled(fused(x, is_causal=True), timm_block(x, is_causal=True))


def test_block_is_a_drop_in_for_timm_block():
    timm_params = inspect.signature(TimmBlock.__init__).parameters
    ours = inspect.signature(FusedBlock.__init__).parameters
    assert list(ours)[: len(timm_params)] == list(timm_params)  # same positional order, extras keyword-only
    # block_fn injection builds and runs a (randomly initialised) fused ViT
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10,
                              block_fn=FusedBlock, init_values=1e-5).eval()
    assert all(type(b) is FusedBlock for b in model.blocks)
    with torch.no_grad():
        assert model(IMAGES).shape == (2, 10)
    block = model.blocks[0]
    assert [name for name, _ in block.named_children()] == ["norm1", "attn", "mlp"]
    assert type(block.attn) is FusedAttention and isinstance(block.mlp, FusedChannelIdleFFN)
    assert sorted(n for n, _ in block.attn.named_children()) == ["k_norm", "norm", "proj", "q_norm", "qkv"]
    # norm1's affine lives in qkv now, and LayerScale in proj / the FFN
    assert not block.norm1.elementwise_affine and block.mlp.residual


def test_block_fn_with_timm_fix_init():
    # timm's fix_init=True divides block l's attn.proj and mlp.fc2 weights by sqrt(2 (l + 1)); for a θ = 0 fused
    # FFN fc2 is w_out, so the same seed gives exactly the timm-scaled weights.
    kwargs = dict(img_size=32, patch_size=8, embed_dim=64, depth=3, num_heads=4, num_classes=10, block_fn=FusedBlock)
    torch.manual_seed(0)
    plain = VisionTransformer(**kwargs)
    torch.manual_seed(0)
    fixed = VisionTransformer(fix_init=True, **kwargs)
    for layer, (a, b) in enumerate(zip(plain.blocks, fixed.blocks)):
        scale = math.sqrt(2.0 * (layer + 1))
        torch.testing.assert_close(b.mlp.w_out, a.mlp.w_out / scale, rtol=0, atol=0)
        torch.testing.assert_close(b.attn.proj.weight, a.attn.proj.weight / scale, rtol=0, atol=0)
        torch.testing.assert_close(b.mlp.w_in, a.mlp.w_in, rtol=0, atol=0)
    assert not hasattr(FusedBlock(64, 4, idle_ratio=0.75).mlp, "fc2")
    with pytest.raises(AttributeError, match=r"fc2: a fused channel-idle FFN \(θ > 0\) has no separate fc2"):
        VisionTransformer(fix_init=True, **{**kwargs, "block_fn": partial(FusedBlock, idle_ratio=0.75)})


def test_block_constructor_builds_channel_idle_shapes():
    block = FusedBlock(64, 4, idle_ratio=0.75, ffn_norm="batch")
    assert block.mlp.active_features == 64 and block.mlp.linear_path and not block.mlp.residual
    with pytest.raises(ValueError, match=r"scale_mlp_norm: expected False"):
        FusedBlock(64, 4, scale_mlp_norm=True)
    with pytest.raises(ValueError, match=r"act_layer: expected the exact GELU .* got SiLU"):
        FusedBlock(64, 4, act_layer=nn.SiLU)
    with pytest.raises(ValueError, match=r"ffn_norm: expected 'layer' or 'batch', got 'group'"):
        FusedBlock(64, 4, ffn_norm="group")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_error_no_worse_than_timms_own(dtype):
    # STYLE: in bf16/fp16 the fused model's error against the fp32 model must be at most 2x timm's own error.
    model = _deit_tiny_like(init_values=1e-1)
    with torch.no_grad():
        reference = model(IMAGES)
        low = copy.deepcopy(model).to(dtype)
        timm_error = (low(IMAGES.to(dtype)).float() - reference).abs().max()
        fused_error = (vitfast.patch_timm(low)(IMAGES.to(dtype)).float() - reference).abs().max()
    assert all(b.mlp.w_in.dtype == dtype for b in low.blocks)
    assert fused_error <= 2 * timm_error


def test_fused_block_exports_with_the_op():
    block = FusedBlock.from_timm(randomize(TimmBlock(64, 4, qkv_bias=True)))
    x = torch.randn(2, 9, 64)
    exported = torch.export.export(block, (x,), strict=False)  # torch 2.4 defaults to strict (dynamo), which cannot trace the autograd wrapper
    targets = [str(node.target) for node in exported.graph.nodes]
    assert any("vitfast.channel_idle_ffn" in t for t in targets)
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(x), block(x))


def test_hybrid_vit_converts_patches_and_save_refuses_clearly(tmp_path):
    """A hybrid ViT (CNN stem in a HybridEmbed, then plain timm Blocks): describing its patch embedding read
    `patch_embed.norm`, which HybridEmbed lacks, so patch_timm / from_timm died with an AttributeError."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_small_r26_s32_224", pretrained=False, img_size=64, depth=2, embed_dim=64,
                              num_heads=4, num_classes=10).eval()
    randomize(model)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = model(x)
        assert_close_scaled(vitfast.patch_timm(model, inplace=False)(x), ref)
        converted = vitfast.convert.from_timm(model, channel_idle=0.5, norm="layer").eval()
        fused = vitfast.fuse(converted)
        assert_close_scaled(fused(x), converted(x))
    with pytest.raises(ValueError, match="model.patch_embed: expected timm PatchEmbed .* got HybridEmbed"):
        vitfast.save(fused, tmp_path / "hybrid.safetensors")
