"""Drop-in depthwise-convolution heads as modules: conversion, training, fusion, checkpoints, composition.

The method's promises checked here: a replaced head computes eq. 11 (V_h = X W^V_h, then a k×k depthwise
convolution over the token grid, then W^O_h); un-replaced heads and blocks are untouched (no replaced head =
the timm model exactly); the ensembled form is eq. 12-13; fusing is exact (eval mode) for blockwise, mixed,
ensembled, channel-idle-composed, cls-kept and cls-removed models on square and non-square grids; the fused
model round-trips through vitfast.save / vitfast.load; kernels start Gaussian, are excluded from weight decay
and learn through the Trainer.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close_scaled, layerscale_vit as vit, model_images as images, randomize
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast.io.head_ranking import HeadRanking
from vitfast.methods.dwconv import DWConvAttention, DWConvBlock
from vitfast.nn import set_grid_size
from vitfast.nn import FusedDWConvBlock
from vitfast.training.trainer import Trainer
from vitfast.training.schedules import param_groups

pytestmark = pytest.mark.usefixtures("one_thread")


def eq11_head(x_norm, attn, head, grid, prefix):
    """Eq. 11 for one replaced head, written out: V_h = X W^V_h + b, zero-padded k×k depthwise conv, then W^O_h."""
    hd = attn.head_dim
    k = attn.kernel_size
    pos = attn.conv_heads.index(head)
    v = x_norm @ attn.value.weight[pos * hd:(pos + 1) * hd].t() + attn.value.bias[pos * hd:(pos + 1) * hd]
    batch = v.shape[0]
    vg = v[:, prefix:].reshape(batch, grid[0], grid[1], hd)
    padded = F.pad(vg, (0, 0, k // 2, k // 2, k // 2, k // 2))
    u = torch.zeros_like(vg)
    kern = attn.conv_kernel[pos * hd:(pos + 1) * hd]  # [hd, k, k]
    for r in range(k):
        for s in range(k):
            u += kern[:, r, s] * padded[:, r:r + grid[0], s:s + grid[1]]
    u = u.reshape(batch, -1, hd)
    if prefix:
        u = torch.cat([v[:, prefix:].mean(1, keepdim=True).expand(batch, prefix, hd), u], 1)
    return u @ attn.proj.weight[:, head * hd:(head + 1) * hd].t()


# ---------------------------------------------------------------------------------------------- the method
def test_replaced_heads_compute_eq11_and_the_others_stay_attention():
    model = vit()
    converted = vitfast.convert.from_timm(model, dwconv_heads={1: [0, 2]}).eval()
    attn, timm_attn = converted.blocks[1].attn, model.blocks[1].attn
    assert isinstance(converted.blocks[1], DWConvBlock) and attn.conv_heads == (0, 2) and attn.attn_heads == (1, 3)
    x = torch.randn(2, 1 + 4 * 5, 32)
    hd = timm_attn.head_dim
    # The timm attention's per-head outputs, through proj's columns, for the kept heads 1 and 3.
    q, k, v = timm_attn.qkv(x).reshape(2, 21, 3, 4, hd).permute(2, 0, 3, 1, 4)
    a = F.scaled_dot_product_attention(q, k, v)  # [B, H, N, hd]
    expected = timm_attn.proj.bias.clone()
    for h in (1, 3):
        expected = expected + a[:, h] @ timm_attn.proj.weight[:, h * hd:(h + 1) * hd].t()
    for h in (0, 2):
        expected = expected + eq11_head(x, attn, h, (4, 5), 1)
    with torch.no_grad():
        assert_close_scaled(attn(x), expected)


def test_no_replaced_head_is_the_timm_model_and_values_are_copied():
    model = vit()
    x = images(model)
    same = vitfast.convert.from_timm(model, dwconv_heads=[]).eval()
    with torch.no_grad():
        torch.testing.assert_close(same(x), model(x), atol=0, rtol=0)
    converted = vitfast.convert.from_timm(model, dwconv_blocks=[0])
    w = model.blocks[0].attn.qkv.weight
    torch.testing.assert_close(converted.blocks[0].attn.value.weight, w[64:])  # the v rows of every head
    assert converted.blocks[0].attn.qkv is None  # q/k discarded (appendix A.2.1)
    assert type(converted.blocks[1]).__name__ == "ChannelIdleBlock"  # untouched blocks: θ = 0, timm's FFN


def test_ensembled_form_is_eq12_13():
    model = vit()
    converted = vitfast.convert.from_timm(model, dwconv_blocks=[2], dwconv_ensemble=True).eval()
    attn = converted.blocks[2].attn
    assert attn.conv_kernel.shape == (8, 3, 3) and attn.gamma.shape == (4,)
    with torch.no_grad():
        attn.gamma.copy_(torch.tensor([0.3, -1.0, 2.0, 0.1]))
    s = torch.softmax(attn.gamma, 0)
    hd, w = 8, model.blocks[2].attn.qkv.weight
    w_ve = sum(s[h] * w[64 + h * hd:64 + (h + 1) * hd] for h in range(4))  # eq. 12
    w_oe = sum(s[h] * model.blocks[2].attn.proj.weight[:, h * hd:(h + 1) * hd] for h in range(4))
    b_ve = sum(s[h] * model.blocks[2].attn.qkv.bias[64 + h * hd:64 + (h + 1) * hd] for h in range(4))
    x = torch.randn(2, 21, 32)
    v = x @ w_ve.t() + b_ve
    grid = v[:, 1:].transpose(1, 2).reshape(2, hd, 4, 5)
    u = F.conv2d(grid, attn.conv_kernel.unsqueeze(1), padding=1, groups=hd).flatten(2).transpose(1, 2)
    u = torch.cat([v[:, 1:].mean(1, keepdim=True), u], 1)
    expected = u @ w_oe.t() + model.blocks[2].attn.proj.bias  # eq. 13
    with torch.no_grad():
        assert_close_scaled(attn(x), expected)


def test_kernel_init_is_gaussian_and_excluded_from_weight_decay():
    model = vit(dim=64, heads=4)
    converted = vitfast.convert.from_timm(model, dwconv_blocks=[0, 1, 2], dwconv_kernel_size=5)
    kernels = torch.cat([b.attn.conv_kernel.detach().flatten() for b in converted.blocks])
    assert kernels.numel() == 3 * 64 * 25
    assert abs(float(kernels.mean())) < 0.02 and abs(float(kernels.std()) - 1 / 5) < 0.02  # N(0, (1/k)²)
    no_decay = {id(p) for g in param_groups(converted, 0.05) if g["weight_decay"] == 0.0 for p in g["params"]}
    for block in converted.blocks:
        assert id(block.attn.conv_kernel) in no_decay
        assert id(block.attn.value.weight) not in no_decay  # the projections decay as usual
    custom = vitfast.convert.from_timm(model, dwconv_blocks=[0], dwconv_kernel_init_std=0.5)
    assert abs(float(custom.blocks[0].attn.conv_kernel.detach().std()) - 0.5) < 0.05


def test_finetune_through_the_trainer_learns_the_kernels_and_gamma():
    from vitfast.training.data import digits_loaders

    # depth 3: the last block's grid tokens never reach the cls-token classifier, so its kernels get no gradient.
    model = vit(img_size=16, patch=4, depth=3, num_classes=10)
    converted = vitfast.convert.from_timm(model, dwconv_blocks=[0], dwconv_heads={1: [1]})
    converted.blocks[0] = DWConvBlock.from_block(model.blocks[0], [0, 1, 2, 3], (4, 4), ensemble=True)
    before = {n: p.detach().clone() for n, p in converted.named_parameters() if "conv_kernel" in n or "gamma" in n}
    train, val = digits_loaders(img_size=16, batch_size=16)
    trainer = Trainer(converted, train, val, total_steps=4, lr=1e-2, progress=False)
    trainer.fit()
    for name, p in converted.named_parameters():
        if name in before:
            assert not torch.equal(p, before[name]), f"{name} did not train"
    fused = vitfast.fuse(converted)
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        assert_close_scaled(fused(x), converted.eval()(x))


# ---------------------------------------------------------------------------------------------- fusion + checkpoint
CASES = {
    "blockwise": dict(dwconv_blocks=[0, 2]),
    "mixed": dict(dwconv_heads={0: [3], 1: [0, 1, 2]}),
    "blocks+heads": dict(dwconv_blocks=[2], dwconv_heads=[(0, 1)]),
    "ensembled": dict(dwconv_blocks=[1], dwconv_ensemble=True),
    "channel_idle_batch": dict(dwconv_blocks=[1], channel_idle=0.75),
    "channel_idle_layer_mixed": dict(dwconv_heads={2: [0]}, channel_idle=0.5, norm="layer"),
    "cls_removed": dict(dwconv_blocks=[0, 1], remove_cls_token=True),
    "k5": dict(dwconv_blocks=[1], dwconv_kernel_size=5),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fuse_is_exact_and_round_trips_through_save_load(case, tmp_path):
    model = vit()
    converted = vitfast.convert.from_timm(model, **CASES[case])
    randomize(converted, seed=4)  # BatchNorm statistics / norms of a trained model
    for m in converted.modules():  # the kernels and γ too
        if isinstance(m, DWConvAttention):
            with torch.no_grad():
                m.conv_kernel.normal_(0, 0.5)
                if m.gamma is not None:
                    m.gamma.normal_()
    x = images(model, batch=3)
    fused = vitfast.fuse(converted)
    with torch.no_grad():
        expected = converted.eval()(x)
        assert_close_scaled(fused(x), expected)
    assert any(isinstance(m, FusedDWConvBlock) for m in fused.modules())
    path = tmp_path / "fused.safetensors"
    vitfast.save(fused, path)
    loaded = vitfast.load(path)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), fused(x), atol=0, rtol=0)
    config = vitfast.io.read_config(path)
    kinds = {cfg["kind"] for cfg in config["modules"].values()}
    assert "dwconv_block" in kinds
    if case == "cls_removed":
        assert config["architecture"]["kwargs"]["class_token"] is False
        assert config["architecture"]["kwargs"]["global_pool"] == "avg"


def test_mixed_block_without_qkv_bias_fuses():
    """qkv_bias=False: norm1's β still gives the folded qkv a bias; the fused mixed block once refused its own
    "qkv.bias" (its qkv_bias flag came from the timm model, not from the folded tensors)."""
    model = vit(qkv_bias=False)
    converted = vitfast.convert.from_timm(model, dwconv_heads={0: [1]}).eval()
    x = images(model)
    with torch.no_grad():
        assert_close_scaled(vitfast.fuse(converted)(x), converted(x))


def test_fused_ensembled_block_is_the_plain_op_with_one_head():
    model = vit()
    fused = vitfast.fuse(vitfast.convert.from_timm(model, dwconv_blocks=[1], dwconv_ensemble=True))
    block = fused.blocks[1]
    assert block.conv_width == model.blocks[1].attn.head_dim and block.attn_heads == 0 and block.qkv is None


def test_non_square_grid_336x448():
    # 336×448 images with 16-pixel patches: a 21×28 token grid (the paper's ADE20K resolution).
    model = vit(img_size=(336, 448), patch=16, dim=32, depth=2, heads=2)
    converted = vitfast.convert.from_timm(model, dwconv_blocks=[1], dwconv_heads={0: [0]})
    assert converted.blocks[1].attn.grid_size == (21, 28)
    x = images(model, batch=1)
    fused = vitfast.fuse(converted)
    with torch.no_grad():
        assert_close_scaled(fused(x), converted.eval()(x))
    assert fused.blocks[1].grid_size == (21, 28)


def without_grid_hook(model):
    """The model as if its DW-conv blocks had been put in by hand: no follow_patch_grid hook."""
    model.patch_embed._forward_hooks.clear()
    return model


def test_grid_mismatch_is_a_clear_error_and_set_grid_size_fixes_it():
    model = vit(img_size=32, patch=8, dynamic_img_size=True)
    converted = without_grid_hook(vitfast.convert.from_timm(model, dwconv_blocks=[0]).eval())
    x = torch.randn(1, 3, 16, 24)  # 2×3 grid, not the converted 4×4
    with pytest.raises(ValueError, match=r"x: expected 17 tokens \(1 prefix \+ a 4×4 patch grid\), got 7"):
        with torch.no_grad():
            converted(x)
    assert set_grid_size(converted, (2, 3)) == 1
    with torch.no_grad():
        out = converted(x)
    assert out.shape == (1, 5)
    fused = vitfast.fuse(converted)
    with torch.no_grad():
        assert_close_scaled(fused(x), out)
    with pytest.raises(ValueError, match="grid_size: expected"):
        set_grid_size(converted, (0, 3))


def dynamic_model_in(stage, converted, tmp_path):
    if stage == "fused":
        return vitfast.fuse(converted)
    if stage == "loaded":
        vitfast.save(vitfast.fuse(converted), tmp_path / "f.safetensors")
        return vitfast.load(tmp_path / "f.safetensors")
    if stage == "resumed":
        from vitfast.io.trainable import load_trainable, save_trainable
        save_trainable(converted, tmp_path / "t.safetensors")
        return load_trainable(tmp_path / "t.safetensors")[0].eval()
    return converted


@pytest.mark.parametrize("stage", ["converted", "fused", "loaded", "resumed"])
def test_dynamic_img_size_follows_each_inputs_patch_grid(stage, tmp_path):
    # Built on 32×40 images (a 4×5 grid, 20 patches).  A 40×32 image has 20 patches too, on a 5×4 grid: counting
    # tokens could not tell, and the model ran it on the 4×5 grid, silently wrong.  Every form of a dynamic_img_size
    # model now takes the grid from its patch embedding at each forward; a 48×40 image (6×5) runs as well.
    model = vit(img_size=(32, 40), patch=8, dynamic_img_size=True)
    converted = vitfast.convert.from_timm(model, dwconv_blocks=[0], dwconv_heads={1: [2]}).eval()
    truth = without_grid_hook(copy.deepcopy(converted))  # the train-time modules, grid set by hand below
    net = dynamic_model_in(stage, converted, tmp_path)
    grids = lambda m: {x.grid_size for x in m.modules() if isinstance(x, (DWConvAttention, FusedDWConvBlock))}  # noqa: E731
    for shape, grid in [((40, 32), (5, 4)), ((48, 40), (6, 5)), ((16, 80), (2, 10)), ((32, 40), (4, 5))]:
        x = torch.randn(1, 3, *shape)
        set_grid_size(truth, grid)
        with torch.no_grad():
            expected = truth(x)
            assert_close_scaled(net(x), expected)
        assert grids(net) == {grid}, (shape, grids(net))


def test_follow_patch_grid_is_idempotent_and_needs_a_patch_embed():
    converted = vitfast.convert.from_timm(vit(dynamic_img_size=True), dwconv_blocks=[0]).eval()
    assert len(converted.patch_embed._forward_hooks) == 1
    assert vitfast.nn.follow_patch_grid(converted) is True
    assert len(converted.patch_embed._forward_hooks) == 1  # replaced, not stacked
    assert vitfast.nn.follow_patch_grid(torch.nn.Linear(2, 2)) is False
    # Without dynamic_img_size the embedding is flattened: no hook is installed, the built grid stays.
    fixed = vitfast.convert.from_timm(vit(), dwconv_blocks=[0]).eval()
    assert not fixed.patch_embed._forward_hooks and vitfast.nn.follow_patch_grid(fixed) is False
    with torch.no_grad():
        fixed(images(fixed))
    assert fixed.blocks[0].attn.grid_size == (4, 5)


@pytest.mark.parametrize("stage", ["converted", "fused", "loaded", "resumed"])
def test_a_larger_input_is_refused_not_read_as_prefix_tokens(stage, tmp_path):
    # With dynamic_img_size a 48×40 image gives a 6×5 grid: 31 tokens.  Split by the converted 4×5 grid, the 10
    # extra patches used to become "prefix tokens" (given the grid mean instead of their convolution): a silently
    # wrong output.  The modules know their prefix-token count and refuse it, in every form of the model, when
    # nothing sets their grid (DW-conv blocks put into a model by hand, without follow_patch_grid).
    model = vit(img_size=(32, 40), patch=8, dynamic_img_size=True)
    converted = vitfast.convert.from_timm(model, dwconv_blocks=[0], dwconv_heads={1: [2]}).eval()
    truth = without_grid_hook(copy.deepcopy(converted))  # the train-time modules, grid set by hand below
    set_grid_size(truth, (6, 5))
    net = without_grid_hook(dynamic_model_in(stage, converted, tmp_path))
    assert [m.prefix_tokens for m in net.modules() if hasattr(m, "prefix_tokens")] == [1, 1]
    x = torch.randn(1, 3, 48, 40)
    with pytest.raises(ValueError, match=r"expected 21 tokens \(1 prefix \+ a 4×5 patch grid\), got 31.*set_grid_size"):
        with torch.no_grad():
            net(x)
    set_grid_size(net, (6, 5))
    with torch.no_grad():
        assert_close_scaled(net(x), truth(x))


def test_files_without_the_prefix_count_still_load():
    fused = vitfast.fuse(vitfast.convert.from_timm(vit(), dwconv_blocks=[0]))
    cfg = fused.blocks[0].vitfast_config()
    assert cfg["prefix_tokens"] == 1
    old = {k: v for k, v in cfg.items() if k != "prefix_tokens"}  # written before the key existed
    assert FusedDWConvBlock.from_vitfast_config(old).prefix_tokens is None
    with pytest.raises(ValueError, match=r"cfg\['prefix_tokens'\]: expected an int >= 0"):
        FusedDWConvBlock.from_vitfast_config({**cfg, "prefix_tokens": -1})
    with pytest.raises(ValueError, match="prefix_tokens: expected None"):
        DWConvAttention(32, 4, [0], (4, 5), prefix_tokens=True)


def test_conversion_from_a_ranking():
    model = vit(depth=3, heads=4)
    scores = [[3.0, 2.0, 1.0, 0.5], [0.1, 0.2, 0.3, 0.4], [5.0, 0.0, 6.0, 7.0]]
    ranking = HeadRanking(scores, num_samples=10)
    c = vitfast.convert.from_timm(model, dwconv_blocks=1, ranking=ranking)  # lowest Σ_b: block 1
    assert isinstance(c.blocks[1], DWConvBlock) and not isinstance(c.blocks[0], DWConvBlock)
    c = vitfast.convert.from_timm(model, dwconv_heads=3, ranking=ranking.to_dict())  # (2,1), (1,0), (1,1)
    assert c.blocks[1].attn.conv_heads == (0, 1) and c.blocks[2].attn.conv_heads == (1,)
    with pytest.raises(ValueError, match="dwconv_blocks: a count needs `ranking`"):
        vitfast.convert.from_timm(model, dwconv_blocks=1)
    with pytest.raises(ValueError, match="ranking: expected scores for 3 blocks × 4 heads"):
        vitfast.convert.from_timm(model, dwconv_blocks=1, ranking=HeadRanking([[1.0]], 1))


@pytest.mark.parametrize("kwargs,match", [
    (dict(dwconv_blocks=[3]), "dwconv_blocks: expected block indices in \\[0, 3\\)"),
    (dict(dwconv_heads={0: [4]}), "dwconv_heads: expected head indices in \\[0, 4\\)"),
    (dict(dwconv_heads=[(0,)]), "dwconv_heads: expected \\(block, head\\) pairs"),
    (dict(dwconv_blocks=[0], dwconv_kernel_size=4), "kernel_size: expected an odd int"),
    (dict(dwconv_blocks=[0], branches=3), "not supported together with branches"),
    # remove_cls_token and the θ rule were silently ignored by the USDC / non-deep conversions (the non-deep one
    # now removes it: global_pool="avg", tests/test_method_options_nondeep.py)
    (dict(gates=True, remove_cls_token=True), r"^remove_cls_token: not supported together with gates=True"),
    (dict(gates=True, heuristic="linear"), r"^heuristic: only used with channel_idle"),
    (dict(dwconv_blocks=[0], spread=0.1), r"^spread: only used with channel_idle"),
    (dict(branches=2, heuristic="linear"), r"^heuristic: only used with channel_idle"),
])
def test_bad_conversion_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        vitfast.convert.from_timm(vit(), **kwargs)


def test_cls_token_removal_pools_the_mean_of_the_tokens():
    model = vit()
    c = vitfast.convert.remove_prefix_tokens(vitfast.convert.from_timm(model, channel_idle=0.0, norm="layer"))
    assert c.cls_token is None and c.num_prefix_tokens == 0 and c.global_pool == "avg"
    assert c.pos_embed.shape[1] == 20
    x = images(model)
    with torch.no_grad():
        feats = c.forward_features(x)
        assert feats.shape[1] == 20
        torch.testing.assert_close(c.forward_head(feats, pre_logits=True), feats.mean(1))


def test_cls_token_removal_repoints_a_prr_attention_pool(tmp_path):
    """global_pool='prr': its AttentionPoolPrr reads the cls token itself (pool 'token'); after removal it read
    token 0, a patch, and the fused model could not be saved ("the rebuilt model has 'avg'")."""
    model = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=5,
                              global_pool="prr").eval()
    randomize(model)
    converted = vitfast.convert.from_timm(model, dwconv_blocks=[1], remove_cls_token=True).eval()
    assert converted.attn_pool.pool == "avg"
    x = images(model)
    with torch.no_grad():
        fused = vitfast.fuse(converted)
        vitfast.save(fused, tmp_path / "prr.safetensors")
        torch.testing.assert_close(vitfast.load(tmp_path / "prr.safetensors")(x), converted(x), atol=1e-5, rtol=1e-5)
    # a 'map' pool's 'token' is its own latent query, not the cls token: left alone (it once became 'avg' too, which
    # the rebuilt model did not reproduce, and save refused)
    latent = vitfast.convert.from_timm(VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2,
                                                         num_classes=5, global_pool="map").eval(),
                                       dwconv_blocks=[1], remove_cls_token=True).eval()
    assert latent.attn_pool.pool == "token"
    vitfast.save(vitfast.fuse(latent), tmp_path / "map.safetensors")


def test_remove_prefix_tokens_after_conversion_updates_what_counts_them():
    """remove_prefix_tokens on a model that already has DW-conv heads left them expecting the cls token (every
    input refused as "the wrong resolution"), and timm's patch dropout kept its first patch as if it were cls."""
    model = vit(patch_drop_rate=0.0)
    converted = vitfast.convert.from_timm(model, dwconv_blocks=[1])
    expected = vitfast.convert.from_timm(model, dwconv_blocks=[1], remove_cls_token=True)
    state = converted.state_dict()
    state.pop("cls_token")
    state["pos_embed"] = state["pos_embed"][:, 1:]  # what removing the cls token does to it
    expected.load_state_dict(state)  # same kernels
    vitfast.convert.remove_prefix_tokens(converted)
    assert converted.blocks[1].attn.prefix_tokens == 0
    x = images(model)
    with torch.no_grad():
        torch.testing.assert_close(converted.eval()(x), expected.eval()(x), atol=1e-6, rtol=1e-6)
        fused = vitfast.fuse(vitfast.convert.from_timm(model, dwconv_blocks=[1]))
        vitfast.convert.remove_prefix_tokens(fused)  # the fused block counts them too
        assert fused.blocks[1].prefix_tokens == 0
        fused(x)
    dropping = vitfast.convert.remove_prefix_tokens(VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=1,
                                                                      num_heads=2, patch_drop_rate=0.5))
    assert dropping.patch_drop.num_prefix_tokens == 0


def test_patch_dropout_and_bad_kernel_init_are_refused_by_name():
    with pytest.raises(ValueError, match=r"dwconv_blocks/dwconv_heads: depthwise-convolution heads need every patch .* "
                                         r"\(patch_drop_rate = 0.25\)"):
        vitfast.convert.from_timm(vit(patch_drop_rate=0.25), dwconv_blocks=[0])
    vitfast.convert.from_timm(vit(patch_drop_rate=0.25), remove_cls_token=True)  # no conv heads: allowed
    with pytest.raises(ValueError, match=r"model: depthwise-convolution heads need every patch"):
        vitfast.methods.dwconv.attach_dsp(vit(patch_drop_rate=0.25), 1)
    for bad in (float("nan"), -1.0, "0.1"):
        with pytest.raises(ValueError, match=r"kernel_init_std: expected None \(1/k\) or a finite number >= 0"):
            vitfast.convert.from_timm(vit(), dwconv_blocks=[0], dwconv_kernel_init_std=bad)
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match=r"batch_size: expected an int >= 1"):
            vitfast.methods.dwconv.attention_std_scores(vit(), torch.randn(2, 3, 32, 40), batch_size=bad)


def test_fused_block_config_is_validated():
    model = vit()
    fused = vitfast.fuse(vitfast.convert.from_timm(model, dwconv_blocks=[0]))
    cfg = fused.blocks[0].vitfast_config()
    rebuilt = FusedDWConvBlock.from_vitfast_config(cfg)
    assert rebuilt.vitfast_config() == cfg
    for key, bad in (("kernel_size", 4), ("grid_size", [0, 3]), ("conv_width", -1)):
        with pytest.raises(ValueError, match=f"cfg\\['{key}'\\]"):
            FusedDWConvBlock.from_vitfast_config({**cfg, key: bad})
    with pytest.raises(ValueError, match="unexpected keys"):
        FusedDWConvBlock.from_vitfast_config({**cfg, "extra": 1})


def test_fused_forward_uses_the_op_and_the_reference_backend_agrees():
    model = vit()
    fused = vitfast.fuse(vitfast.convert.from_timm(model, dwconv_heads={1: [0, 3]}))
    x = images(model)
    with torch.no_grad():
        auto = fused(x)
        vitfast.set_backend("reference")
        try:
            ref = fused(x)
        finally:
            vitfast.set_backend("auto")
    assert_close_scaled(auto, ref)
