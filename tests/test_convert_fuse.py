"""`vitfast.convert.from_timm` → `vitfast.fuse`: the fused model equals the train-time model (eval mode, fp32)
for θ ∈ {0, .25, .5, .75, 1} × norm ∈ {batch, layer}, on ViT/DeiT (distilled too) and Swin."""
import copy
import math
from functools import partial

import pytest
import torch
import torch.nn as nn
from timm.models.deit import VisionTransformerDistilled
from timm.models.swin_transformer import SwinTransformer, SwinTransformerBlock
from timm.models.vision_transformer import Block as TimmBlock
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast.convert import from_timm
from vitfast.nn import FusedBlock, FusedChannelIdleFFN, FusedSwinBlock, FusedVisionTransformer
from vitfast.methods.repavit import ChannelIdleBlock, ChannelIdleMlp, ChannelIdleSwinBlock, idle_ratios

from helpers import NORMS, THETAS, assert_close_scaled, randomize


def _calibrate_batchnorms(model: nn.Module, seed: int = 1) -> nn.Module:
    """Non-trivial running statistics: a few train-mode forwards, then perturbed affines."""
    g = torch.Generator().manual_seed(seed)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 3, 32, 32, generator=g))
        for module in model.modules():
            if isinstance(module, nn.BatchNorm1d):
                module.weight.copy_(torch.rand(module.num_features, generator=g) + 0.5)
                module.bias.copy_(torch.randn(module.num_features, generator=g) * 0.2)
    return model.eval()


def _vit(**overrides) -> VisionTransformer:
    kwargs = dict(img_size=32, patch_size=8, embed_dim=64, depth=3, num_heads=4, num_classes=10, qkv_bias=True)
    kwargs.update(overrides)
    return randomize(VisionTransformer(**kwargs))


def _swin(**overrides) -> SwinTransformer:
    kwargs = dict(img_size=32, patch_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4), window_size=4,
                  num_classes=10)
    kwargs.update(overrides)
    return randomize(SwinTransformer(**kwargs))


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    return _vit(init_values=0.1)  # DeiT-III style LayerScale: folded into the projections


@pytest.fixture(scope="module")
def swin():
    torch.manual_seed(0)
    return _swin()


IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(7))


def _check_fused_equals_train_time(model: nn.Module) -> nn.Module:
    fused = vitfast.fuse(model)
    with torch.no_grad():
        assert_close_scaled(fused.forward_features(IMAGES), model.forward_features(IMAGES))
        assert_close_scaled(fused(IMAGES), model(IMAGES))
    assert not any(isinstance(m, (ChannelIdleMlp, ChannelIdleBlock, ChannelIdleSwinBlock)) for m in fused.modules())
    assert not any(isinstance(m, nn.BatchNorm1d) for m in fused.modules())  # every BN folded (eq. 3)
    return fused


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("theta", THETAS)
def test_vit_fused_equals_train_time(vit, theta, norm):
    model = _calibrate_batchnorms(from_timm(vit, channel_idle=theta, norm=norm))
    fused = _check_fused_equals_train_time(model)
    assert type(fused) is FusedVisionTransformer  # timm's class with the one-call forward (vitfast.nn.vit)
    for block in fused.blocks:
        assert type(block) is FusedBlock and isinstance(block.mlp, FusedChannelIdleFFN)
        assert block.mlp.active_features == math.ceil(256 * (1 - theta))


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("theta", THETAS)
def test_swin_fused_equals_train_time(swin, theta, norm):
    model = _calibrate_batchnorms(from_timm(swin, channel_idle=theta, norm=norm))
    fused = _check_fused_equals_train_time(model)
    blocks = [b for stage in fused.layers for b in stage.blocks]
    assert all(type(b) is FusedSwinBlock and isinstance(b, SwinTransformerBlock) for b in blocks)
    assert any(any(b.shift_size) for b in blocks)  # the shifted-window path is exercised


def test_swin_after_set_input_size_converts_and_fuses_exactly():
    """timm's set_input_size re-derives each block's shift from its new window (window 4 -> 6, shift 2 -> 3) and
    leaves target_shift_size stale; conversion once rebuilt the blocks with that stale shift (3e-2 off)."""
    model = _swin()
    model.set_input_size(img_size=48)
    # timm 1.0.31 re-derives the shift as (3, 3); older timm leaves another one: conversion must follow timm either way
    x = torch.randn(2, 3, 48, 48)
    converted = from_timm(model, channel_idle=0.0, norm="layer").eval()
    with torch.no_grad():
        assert_close_scaled(converted(x), model(x))
        assert_close_scaled(vitfast.fuse(converted)(x), model(x))
        assert_close_scaled(vitfast.patch_timm(copy.deepcopy(model))(x), model(x))


def test_resized_swin_round_trips_and_resizes_back_like_timm(tmp_path):
    """A Swin resized with set_input_size: described at its current size with its reference windows, the loaded
    model derived other windows on a later resize (0.2 off), a plain resized Swin was refused by save, and a
    patched one too (timm's stale target_shift_size compared exactly)."""
    model = randomize(SwinTransformer(img_size=32, patch_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 4),
                                      window_size=4, num_classes=5))
    if not hasattr(model, "_ref_grid_size"):
        pytest.skip("this timm keeps no reference grid for its windows (timm >= 1.0.31 does)")
    model.set_input_size(img_size=64)
    plain = copy.deepcopy(model)
    vitfast.save(plain, tmp_path / "plain.safetensors")
    patched = vitfast.patch_timm(copy.deepcopy(model))
    vitfast.save(patched, tmp_path / "patched.safetensors")
    x64, x32 = torch.randn(2, 3, 64, 64), torch.randn(2, 3, 32, 32)
    loaded = [vitfast.load(tmp_path / "plain.safetensors"), vitfast.load(tmp_path / "patched.safetensors")]
    with torch.no_grad():
        for m in loaded:
            assert_close_scaled(m(x64), model(x64))
        for m in (model, *loaded):
            m.set_input_size(img_size=32)
        for m in loaded:
            assert [b.window_size for b in m.layers[0].blocks] == [b.window_size for b in model.layers[0].blocks]
            assert_close_scaled(m(x32), model(x32))


def test_train_time_swin_files_keep_mlp_ratio_always_partition_and_no_drop_path(tmp_path):
    """ChannelIdleSwinBlock was matched by exact type only: mlp_ratio 3 and always_partition were written as the
    defaults (the file did not load, or loaded with other windows); and a Swin without drop-path was rebuilt with
    timm's default 0.1 (save_trainable refused it).  Also: remove_cls_token on a Swin names remove_cls_token."""
    from vitfast.io.trainable import load_trainable, save_trainable

    for kwargs in (dict(mlp_ratio=3.0, drop_path_rate=0.0), dict(always_partition=True, window_size=7, img_size=36)):
        args = dict(img_size=32, patch_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4,
                    num_classes=5)
        args.update(kwargs)
        converted = from_timm(randomize(SwinTransformer(**args)), channel_idle=0.5).eval()
        path = save_trainable(converted, tmp_path / "swin.safetensors")
        loaded, _ = load_trainable(path)
        x = torch.randn(2, 3, args["img_size"], args["img_size"])
        with torch.no_grad():
            torch.testing.assert_close(loaded.eval()(x), converted(x), rtol=0, atol=0)
        assert loaded.layers[0].blocks[0].always_partition == args.get("always_partition", False)
        assert loaded.layers[0].blocks[0].mlp_ratio == args.get("mlp_ratio", 4.0)
    with pytest.raises(ValueError, match=r"^remove_cls_token: only timm VisionTransformer models"):
        from_timm(SwinTransformer(img_size=32, patch_size=4, embed_dim=16, depths=(2,), num_heads=(2,),
                                  window_size=4), remove_cls_token=True)


def test_swin_block_with_a_clipped_shift_shifts_again_after_a_resize(tmp_path):
    """A stage whose resolution fits its window has its shift clipped to 0; timm shifts it again (window // 2) once
    a resize makes the resolution larger.  Rebuilt with the clipped (0, 0), vitfast's block never did (1.4e-2 off
    after the resize), in every path: patch_timm, from_timm + fuse, and a saved file."""
    model = randomize(SwinTransformer(img_size=32, patch_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 4),
                                      window_size=4, num_classes=5))
    assert model.layers[1].blocks[1].shift_size == (0, 0) and any(model.layers[1].blocks[1].target_shift_size)
    patched = vitfast.patch_timm(copy.deepcopy(model))
    fused = vitfast.fuse(from_timm(model, channel_idle=0.0, norm="layer").eval())
    vitfast.save(patched, tmp_path / "swin.safetensors")
    loaded = vitfast.load(tmp_path / "swin.safetensors")
    x = torch.randn(2, 3, 64, 64)
    for m in (model, patched, fused, loaded):
        m.set_input_size(img_size=64, window_size=4)
    assert model.layers[1].blocks[1].shift_size == (2, 2)
    with torch.no_grad():
        expected = model(x)
        for m in (patched, fused, loaded):
            assert m.layers[1].blocks[1].shift_size == (2, 2)
            assert_close_scaled(m(x), expected)


@pytest.mark.parametrize("norm_kwargs", [{"elementwise_affine": False}, {"bias": False}], ids=["no-affine", "no-bias"])
@pytest.mark.parametrize("norm", NORMS)
def test_layer_norms_without_affine_or_bias(norm_kwargs, norm):
    """norm2 without a weight or a bias is the identity affine there (norm="layer" once raised a missing
    state-dict key)."""
    model = randomize(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5,
                                        norm_layer=partial(nn.LayerNorm, **norm_kwargs)))
    converted = _calibrate_batchnorms(from_timm(model, channel_idle=0.5, norm=norm))
    _check_fused_equals_train_time(converted)
    if norm == "layer":
        with torch.no_grad():
            assert_close_scaled(from_timm(model, channel_idle=0.0, norm="layer")(IMAGES), model(IMAGES))


@pytest.mark.parametrize("norm_kwargs", [{"elementwise_affine": False}, {"bias": False}], ids=["no-affine", "no-bias"])
@pytest.mark.parametrize("where", ["qk_norm", "scale_attn_norm", "swin"])
def test_attention_norms_without_affine_or_bias(norm_kwargs, where):
    """The attention's q/k norms and scale norm (and Swin's norm1) without a weight or a bias: the fused modules'
    norms always have both, and their strict state-dict load failed ("Missing key(s) ... q_norm.bias")."""
    norm_layer = partial(nn.LayerNorm, **norm_kwargs)
    if where == "swin":
        if "elementwise_affine" in norm_kwargs:
            pytest.skip("timm's own SwinTransformer cannot be built without a norm1 weight (it reads norm1.weight)")
        model = randomize(SwinTransformer(img_size=32, patch_size=4, embed_dim=16, depths=(2, 2), num_heads=(2, 4),
                                          window_size=4, num_classes=5, norm_layer=norm_layer))
    else:
        model = randomize(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4,
                                            num_classes=5, norm_layer=norm_layer, **{where: True}))
    with torch.no_grad():
        expected = model(IMAGES)
        assert_close_scaled(vitfast.patch_timm(copy.deepcopy(model))(IMAGES), expected)
        converted = from_timm(model, channel_idle=0.0, norm="layer").eval()
        assert_close_scaled(converted(IMAGES), expected)
        assert_close_scaled(vitfast.fuse(converted)(IMAGES), expected)


@pytest.mark.parametrize("method", [dict(dwconv_blocks=[0]), dict(dwconv_heads={0: [1]}), dict(gates=True),
                                    dict(channel_idle=0.5)], ids=["dwconv_blocks", "dwconv_heads", "gates", "repavit"])
def test_parallel_blocks_are_refused_by_name(method):
    """Every method names the unsupported block (dwconv and gates once raised AttributeError: no 'attn')."""
    from timm.models.vision_transformer import ParallelScalingBlock

    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=5,
                              block_fn=ParallelScalingBlock)
    with pytest.raises(ValueError, match=r"ParallelScalingBlock"):
        from_timm(model, **method)


def test_distilled_deit():
    model = randomize(VisionTransformerDistilled(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                                                 num_classes=10))
    converted = _calibrate_batchnorms(from_timm(model, channel_idle=0.5))
    assert type(converted) is VisionTransformerDistilled
    _check_fused_equals_train_time(converted)


def test_layer_norm_theta_zero_reproduces_timm_model(vit):
    converted = from_timm(vit, channel_idle=0.0, norm="layer")
    with torch.no_grad():
        torch.testing.assert_close(converted(IMAGES), vit(IMAGES), atol=0, rtol=0)
        assert_close_scaled(vitfast.fuse(converted)(IMAGES), vit(IMAGES))


def test_original_model_is_untouched(vit):
    before = {k: v.clone() for k, v in vit.state_dict().items()}
    converted = from_timm(vit, channel_idle=0.75)
    _calibrate_batchnorms(converted)
    vitfast.fuse(converted)
    assert all(type(b) is TimmBlock for b in vit.blocks)
    after = vit.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_batchnorm_initialisation_from_layernorm(vit):
    converted = from_timm(vit, channel_idle=0.75, norm="batch")
    for source, block in zip(vit.blocks, converted.blocks):
        torch.testing.assert_close(block.mlp.pre_norm.weight, source.norm2.weight, atol=0, rtol=0)
        torch.testing.assert_close(block.mlp.pre_norm.bias, source.norm2.bias, atol=0, rtol=0)
        assert torch.equal(block.mlp.pre_norm.running_mean, torch.zeros(64))
        assert torch.equal(block.mlp.hidden_norm.weight, torch.ones(256))
        torch.testing.assert_close(block.mlp.fc1.weight, source.mlp.fc1.weight, atol=0, rtol=0)
        torch.testing.assert_close(block.mlp.ls.gamma, source.ls2.gamma, atol=0, rtol=0)
        torch.testing.assert_close(block.attn.qkv.weight, source.attn.qkv.weight, atol=0, rtol=0)


@pytest.mark.parametrize("mlp_ratio, active", [(4.0, 64), (2.0, 64), (6.0, 64), (8 / 3, 64)])
def test_default_idle_ratio_is_the_papers_one_minus_one_over_rho(mlp_ratio, active):
    # RePaViT sec. 3.2: "μ is set to 1 by default ... leading to the default θ = 1 − 1/ρ (e.g., θ = 0.75 when
    # ρ = 4)": as many active channels as the width (64 here).  A fixed 0.75 gave mlp_ratio 2 half of them.
    model = _vit(mlp_ratio=mlp_ratio)
    assert vitfast.convert.default_idle_ratio(model) == pytest.approx(1 - 64 / model.blocks[0].mlp.fc1.out_features)
    converted = from_timm(model)
    assert [b.mlp.active_features for b in converted.blocks] == [active] * 3


def test_heuristic_options_the_chosen_form_ignores_are_refused():
    # A per-block list with heuristic="linear", or a spread with heuristic="static", was silently ignored.
    with pytest.raises(ValueError, match=r"^heuristic: only applies to one channel_idle ratio"):
        from_timm(_vit(depth=2), channel_idle=[0.5, 0.25], heuristic="linear")
    with pytest.raises(ValueError, match=r"^spread: only used with heuristic='linear'"):
        from_timm(_vit(depth=2), channel_idle=0.5, spread=0.1)
    ramp = from_timm(_vit(depth=3), channel_idle=0.5, heuristic="linear", spread=0.1)
    assert [b.mlp.idle_ratio for b in ramp.blocks] == pytest.approx([0.4, 0.5, 0.6], abs=1 / 256)


def test_channel_idle_out_of_range_is_named_as_the_argument():
    for bad in (1.5, -0.1, float("nan")):  # named "theta" (idle_ratios' parameter) before
        with pytest.raises(ValueError, match=r"^channel_idle: expected a number in \[0, 1\]"):
            from_timm(_vit(depth=2), channel_idle=bad)


def test_linear_heuristic_and_per_block_ratios(vit, swin):
    converted = from_timm(vit, channel_idle=0.5, heuristic="linear")
    expected = [math.ceil(256 * (1 - r)) for r in idle_ratios(3, 0.5, "linear")]
    assert [b.mlp.active_features for b in converted.blocks] == expected == [192, 128, 64]
    swin_converted = from_timm(swin, channel_idle=[0.0, 0.25, 0.5, 1.0], norm="layer")
    blocks = [b for stage in swin_converted.layers for b in stage.blocks]
    assert [b.mlp.idle_ratio for b in blocks] == [0.0, 0.25, 0.5, 1.0]
    _check_fused_equals_train_time(swin_converted)


def test_fuse_uses_eval_statistics_and_keeps_input(vit):
    model = _calibrate_batchnorms(from_timm(vit, channel_idle=0.75)).train()
    fused = vitfast.fuse(model)
    assert model.training and not fused.training
    assert type(model.blocks[0]) is ChannelIdleBlock  # the input is not modified
    with torch.no_grad():
        assert_close_scaled(fused(IMAGES), model.eval()(IMAGES))


def test_fuse_refuses_non_finite_statistics(vit):
    model = _calibrate_batchnorms(from_timm(vit, channel_idle=0.75))
    with torch.no_grad():
        model.blocks[1].mlp.hidden_norm.running_var[3] = float("nan")
    with pytest.raises(ValueError, match=r"blocks\.1\.mlp\.hidden_norm\.running_var: expected finite values"):
        vitfast.fuse(model)


def test_fuse_standalone_mlp_and_reference_backend():
    mlp = nn.Sequential(ChannelIdleMlp(16, 64, idle_ratio=0.5)).eval()
    fused = vitfast.fuse(mlp)
    assert isinstance(fused[0], FusedChannelIdleFFN)
    x = torch.randn(2, 4, 16)
    previous = vitfast.get_backend()
    try:
        vitfast.set_backend("reference")
        with torch.no_grad():
            reference = fused(x)
    finally:
        vitfast.set_backend(previous)
    with torch.no_grad():
        assert_close_scaled(fused(x), reference)
        assert_close_scaled(reference, mlp(x))


def test_fused_model_is_smaller(vit):
    converted = from_timm(vit, channel_idle=0.75)
    fused = vitfast.fuse(converted)
    ffn_train = sum(b.mlp.fc1.weight.numel() + b.mlp.fc2.weight.numel() for b in converted.blocks)
    ffn_fused = sum(p.numel() for b in fused.blocks for n, p in b.mlp.named_parameters() if n.startswith("w_"))
    assert ffn_fused * 8 == ffn_train * 3  # 3C² of 8C² per FFN (RePaViT §3.4, θ = 0.75, ρ = 4)


# ------------------------------------------------------------------------------------------------ errors
def test_from_timm_errors(vit):
    with pytest.raises(TypeError, match=r"model: expected a timm VisionTransformer .* got torch\.nn\.modules\.linear\.Linear"):
        from_timm(nn.Linear(3, 3))
    with pytest.raises(ValueError, match=r"norm: expected one of \('batch', 'layer'\), got 'rms'"):
        from_timm(vit, norm="rms")
    with pytest.raises(ValueError, match=r"heuristic: expected one of \('static', 'linear'\), got 'cos'"):
        from_timm(vit, heuristic="cos")
    with pytest.raises(ValueError, match=r"channel_idle: expected a number in \[0, 1\], got 1.5"):
        from_timm(vit, channel_idle=1.5)
    with pytest.raises(ValueError, match=r"channel_idle: expected one idle ratio per block \(3 blocks\), got 2"):
        from_timm(vit, channel_idle=[0.5, 0.5])
    with pytest.raises(ValueError, match=r"channel_idle\[1\]: expected a number in \[0, 1\], got -1"):
        from_timm(vit, channel_idle=[0.5, -1, 0.5])
    with pytest.raises(ValueError, match=r"channel_idle: expected an idle ratio"):
        from_timm(vit, channel_idle="0.5")
    tanh = _vit(depth=1, act_layer=lambda: nn.GELU(approximate="tanh"))
    with pytest.raises(ValueError, match=r"model block 0\.mlp\.act: expected the exact GELU .* got GELU\(approximate='tanh'\)"):
        from_timm(tanh)
    converted = from_timm(vit)
    with pytest.raises(ValueError, match=r"model block 0: expected timm\.models\.vision_transformer\.Block, got ChannelIdleBlock"):
        from_timm(converted)


def test_train_time_block_constructs_from_scratch():
    # block_fn injection: a RePaViT trained from scratch, as in the paper.
    from functools import partial

    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10,
                              block_fn=partial(ChannelIdleBlock, idle_ratio=0.75, ffn_norm="batch"))
    assert all(type(b) is ChannelIdleBlock for b in model.blocks)
    model = _calibrate_batchnorms(model)
    loss = model(IMAGES).square().mean()
    model.train()
    model(IMAGES).square().mean().backward()  # autograd through the reference path
    assert model.blocks[0].mlp.fc1.weight.grad is not None and torch.isfinite(loss)
    _check_fused_equals_train_time(model.eval())


def _relative_error(actual, expected):
    return float((actual - expected).norm() / expected.norm())


def test_calibration_images_bring_batchnorm_model_close_to_pretrained(vit):
    calibration = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        pretrained = vit.forward_features(IMAGES)
        neutral = from_timm(vit, channel_idle=0.0).eval().forward_features(IMAGES)
        calibrated_model = from_timm(vit, channel_idle=0.0, calibration_images=calibration)
        calibrated = calibrated_model.forward_features(IMAGES)
        # θ = 0.75: what remains is the idle channels' missing GELU, which the LN variant has too
        idle_bn = from_timm(vit, channel_idle=0.75, calibration_images=calibration).forward_features(IMAGES)
        idle_ln = from_timm(vit, channel_idle=0.75, norm="layer").forward_features(IMAGES)
    assert _relative_error(calibrated, pretrained) < 0.5 * _relative_error(neutral, pretrained)
    assert _relative_error(idle_bn, pretrained) < 1.1 * _relative_error(idle_ln, pretrained)
    hidden_norm = calibrated_model.blocks[0].mlp.hidden_norm  # identity in eval mode
    h = torch.randn(5, hidden_norm.num_features)
    torch.testing.assert_close(hidden_norm.eval()(h), h)
    _check_fused_equals_train_time(calibrated_model)
    with pytest.raises(ValueError, match=r"calibration_images: only used with norm='batch'"):
        from_timm(vit, norm="layer", calibration_images=calibration)
    with pytest.raises(ValueError, match=r"calibration_images: expected a \[B, C, H, W\] image tensor, got \[3, 32, 32\]"):
        from_timm(vit, calibration_images=calibration[0])


@pytest.mark.parametrize("kwargs, match", [
    # a method's options without the method were silently ignored (a model without the asked-for change)
    (dict(schedule="cosine"), r"^schedule: only used with branches"),
    (dict(join_values=True, diversity_weight=0.5), r"^join_values, diversity_weight: only used with branches"),
    (dict(gate_level="batch"), r"^gate_level: only used with gates=True"),
    (dict(gate_search=False, gate_kind="G3"), r"^gate_search, gate_kind: only used with gates=True"),
    (dict(gates=True, schedule="exp"), r"^schedule: only used with branches"),
    (dict(dwconv_ensemble=True, dwconv_kernel_size=5), r"^dwconv_kernel_size, dwconv_ensemble: only used with dwconv"),
    # values named as from_timm's arguments, with the value given (not a derived one)
    (dict(branches=2, diversity_weight=-0.1), r"^diversity_weight: expected a finite number >= 0, got -0.1$"),
    (dict(branches=2, diversity_weight=float("nan")), r"^diversity_weight: expected a finite number >= 0, got nan"),
    (dict(branches=2, schedule="bogus"), r"^schedule: expected a JoinSchedule or one of"),
    (dict(gates=True, gate_level="bogus"), r"^gate_level: expected one of"),
    (dict(gates=True, gate_search=False, gate_kind="G9"), r"^gate_kind: expected one of"),
])
def test_method_options_are_checked_under_their_own_names(kwargs, match):
    with pytest.raises(ValueError, match=match):
        from_timm(_vit(depth=2), **kwargs)
