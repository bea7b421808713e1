"""DW-conv paper options: Σ_h over the patch tokens only (`cls="exclude"`); γ's weight decay (the paper's rule by
default, the earlier exclusion as an option, kept by the train-time file); the full-convolution variant of eq. 9-10
(against the literal convolution, exact fusion, both files); the frozen-backbone second stage (appendix A.3.1)."""
import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close_scaled, layerscale_vit as vit, model_images as images

import vitfast
from vitfast.io.trainable import describe_trainable, load_trainable, save_trainable
from vitfast.methods.dwconv import DWConvAttention, freeze_backbone, set_gamma_weight_decay
from vitfast.methods.dwconv.head_selection import attention_maps, attention_std_scores
from vitfast.nn import FusedDWConvBlock
from vitfast.training.schedules import param_groups

pytestmark = pytest.mark.usefixtures("one_thread")


def _trained_kernels(model):
    for m in model.modules():  # kernels and γ away from their initial values, as after training
        if isinstance(m, DWConvAttention):
            with torch.no_grad():
                m.conv_kernel.normal_(0, 0.5)
                if m.gamma is not None:
                    m.gamma.normal_()
    return model


# ---------------------------------------------------------------------------------------------- Σ_h, class token
def test_sigma_over_patch_tokens_only():
    model = vit(img_size=16, patch=4, depth=2)
    x = torch.randn(9, 3, 16, 16)
    include = attention_std_scores(model, x, batch_size=4, progress=False)
    exclude = attention_std_scores(model, x, batch_size=4, progress=False, cls="exclude")
    maps = []
    handle = model.blocks[1].attn.register_forward_hook(lambda m, a, o: maps.append(attention_maps(m, a[0])))
    with torch.no_grad():
        model.eval()(x)
    handle.remove()
    stacked = maps[0].double()  # [N_s, H, N, N], token 0 the class token
    for ranking, part in ((include, stacked), (exclude, stacked[..., 1:, 1:])):
        expected = part.std(0, unbiased=False).flatten(1).sum(1)
        torch.testing.assert_close(torch.tensor(ranking.head_scores[1], dtype=torch.float64), expected,
                                   rtol=1e-6, atol=1e-9)
    assert all(e < i for row_e, row_i in zip(exclude.head_scores, include.head_scores) for e, i in zip(row_e, row_i))
    # a model without a class token: the two are the same statistic
    plain = vit(img_size=16, patch=4, depth=2, class_token=False, global_pool="avg")
    a = attention_std_scores(plain, x, progress=False)
    b = attention_std_scores(plain, x, progress=False, cls="exclude")
    assert a.head_scores == b.head_scores
    with pytest.raises(ValueError, match=r"^cls: expected 'include' or 'exclude', got 'drop'"):
        attention_std_scores(model, x, progress=False, cls="drop")


def test_cli_select_heads_cls_exclude(tmp_path, capsys):
    from vitfast.cli import main

    out = tmp_path / "r.json"
    assert main(["select-heads", "vit_tiny_patch16_224", "--img-size", "16", "--model-kwargs",
                 '{"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 4}', "--num-samples", "8",
                 "--cls", "exclude", "-o", str(out), "--no-progress"]) == 0
    assert out.exists()
    capsys.readouterr()


# ---------------------------------------------------------------------------------------------- γ weight decay
def test_gamma_is_decayed_by_default_and_the_old_exclusion_is_an_option(tmp_path):
    converted = vitfast.convert.from_timm(vit(), dwconv_blocks=[1], dwconv_ensemble=True)
    attn = converted.blocks[1].attn
    assert attn.decay_gamma is True and attn._no_weight_decay == ("conv_kernel",)
    assert attn._weight_decay == ("gamma",)  # decayed although 1-D (the paper excludes only the kernels)
    assert copy.deepcopy(attn)._weight_decay == ("gamma",)  # a module attribute: kept by a plain deepcopy
    no_decay = {id(p) for g in param_groups(converted, 0.05) if g["weight_decay"] == 0.0 for p in g["params"]}
    assert id(attn.conv_kernel) in no_decay
    assert describe_trainable(converted)["dwconv"]["blocks"][0]["decay_gamma"] is True

    assert set_gamma_weight_decay(converted, False) == 1
    assert attn._no_weight_decay == ("conv_kernel", "gamma") and attn._weight_decay == ()
    no_decay = {id(p) for g in param_groups(converted, 0.05) if g["weight_decay"] == 0.0 for p in g["params"]}
    assert id(attn.gamma) in no_decay
    path = tmp_path / "m.safetensors"
    save_trainable(converted, path)
    loaded, _ = load_trainable(path)
    assert loaded.blocks[1].attn.decay_gamma is False  # a resumed run keeps γ in its optimizer group

    desc = describe_trainable(converted)
    del desc["dwconv"]["blocks"][0]["decay_gamma"]  # a file from before the option: γ was excluded
    from vitfast.io.trainable import build_trainable

    assert build_trainable(desc).blocks[1].attn.decay_gamma is False
    with pytest.raises(ValueError, match=r"^decay: expected True or False, got 1"):
        set_gamma_weight_decay(converted, 1)


# ---------------------------------------------------------------------------------------------- full convolution
def test_full_convolution_is_eq9_10():
    """eq. 9-10 written out: Conv(X, W^Vh) with W^Vh_(r,s) = K^h_(r,s) W^V_h, a full k×k×d_i×d_h convolution of the
    (normalised) tokens, then W^O.  No value bias (eq. 9 has none) and no class token (the paper's setting)."""
    model = vit(class_token=False, global_pool="avg", qkv_bias=False)
    converted = vitfast.convert.from_timm(model, dwconv_blocks=[1], dwconv_kernel_form="full").eval()
    attn = converted.blocks[1].attn
    heads, hd, k = 4, 8, 3
    assert attn.kernel_form == "full" and attn.conv_kernel.shape == (heads, k, k)
    _trained_kernels(converted)
    x = torch.randn(2, 4 * 5, 32)
    grid = x.transpose(1, 2).reshape(2, 32, 4, 5)
    w_v = attn.value.weight.reshape(heads, hd, 32)  # W^V_h
    # the full kernel [heads·d_h, C, k, k]: out channel (h, c) tap (r, s) = K^h_(r,s) W^V_h[c, :]
    w_full = torch.einsum("hrs,hdc->hdcrs", attn.conv_kernel, w_v).reshape(heads * hd, 32, k, k)
    u = F.conv2d(grid, w_full, padding=k // 2).flatten(2).transpose(1, 2)  # eq. 9
    expected = u @ attn.proj.weight.t() + attn.proj.bias
    with torch.no_grad():
        assert_close_scaled(attn(x), expected)


@pytest.mark.parametrize("case", ["blockwise", "mixed_cls", "ensembled"])
def test_full_convolution_fuses_exactly_and_round_trips(case, tmp_path):
    kwargs = {"blockwise": dict(dwconv_blocks=[0, 2], remove_cls_token=True),
              "mixed_cls": dict(dwconv_heads={1: [0, 3]}),
              "ensembled": dict(dwconv_blocks=[1], dwconv_ensemble=True)}[case]
    model = vit()
    converted = _trained_kernels(vitfast.convert.from_timm(model, dwconv_kernel_form="full", **kwargs))
    if case == "ensembled":
        assert converted.blocks[1].attn.conv_kernel.shape == (1, 3, 3)  # one ensembled head, one kernel
    x = images(model, batch=3)
    fused = vitfast.fuse(converted)
    assert any(isinstance(m, FusedDWConvBlock) for m in fused.modules())
    with torch.no_grad():
        expected = converted.eval()(x)
        assert_close_scaled(fused(x), expected)
    path = tmp_path / "fused.safetensors"
    vitfast.save(fused, path)
    with torch.no_grad():
        torch.testing.assert_close(vitfast.load(path)(x), fused(x), atol=0, rtol=0)
    trainable = tmp_path / "trainable.safetensors"
    save_trainable(converted, trainable)
    loaded, _ = load_trainable(trainable)
    assert all(m.kernel_form == "full" for m in loaded.modules() if isinstance(m, DWConvAttention))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), expected, atol=0, rtol=0)


def test_kernel_form_is_checked_and_needs_dwconv():
    with pytest.raises(ValueError, match=r"^kernel_form: expected one of \('depthwise', 'full'\), got 'sep'"):
        vitfast.convert.from_timm(vit(), dwconv_blocks=[0], dwconv_kernel_form="sep")
    with pytest.raises(ValueError, match=r"^dwconv_kernel_form: only used with dwconv_blocks/dwconv_heads"):
        vitfast.convert.from_timm(vit(), dwconv_kernel_form="full")


def test_cli_train_full_convolution(tmp_path, capsys):
    from vitfast.cli import main

    run = tmp_path / "run"
    assert main(["train", "vit_tiny_patch16_224", "--img-size", "16", "--model-kwargs",
                 '{"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 4}', "--dwconv-blocks", "[1]",
                 "--dwconv-form", "full", "--remove-cls", "--steps", "3", "--out", str(run), "--no-progress"]) == 0
    model, recipe = load_trainable(run / "model.safetensors")
    assert model.blocks[1].attn.kernel_form == "full" and recipe["dwconv_form"] == "full"
    fused = str(tmp_path / "fused.safetensors")
    assert main(["fuse", str(run / "model.safetensors"), "-o", fused]) == 0
    assert main(["verify", fused, "--source", str(run / "model.safetensors"), "--inputs", "digits"]) == 0
    assert "OK: the fused model matches its source" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- frozen backbone
def test_freeze_backbone_trains_only_the_conv_heads():
    from vitfast.training.data import digits_loaders
    from vitfast.training.trainer import Trainer

    model = vit(img_size=16, patch=4, depth=3, num_classes=10)
    converted = vitfast.convert.from_timm(model, dwconv_blocks=[0], dwconv_heads={1: [1]}, remove_cls_token=True)
    names = freeze_backbone(converted)
    assert names == sorted(["blocks.0.attn.value.weight", "blocks.0.attn.value.bias", "blocks.0.attn.conv_kernel",
                            "blocks.0.attn.proj.weight", "blocks.0.attn.proj.bias", "blocks.1.attn.value.weight",
                            "blocks.1.attn.value.bias", "blocks.1.attn.conv_kernel", "blocks.1.attn.proj.weight",
                            "blocks.1.attn.proj.bias"])
    assert {n for n, p in converted.named_parameters() if p.requires_grad} == set(names)
    before = {n: p.detach().clone() for n, p in converted.named_parameters()}
    train, val = digits_loaders(img_size=16, batch_size=16)
    Trainer(converted, train, val, total_steps=3, lr=1e-2, progress=False).fit()
    for n, p in converted.named_parameters():
        assert torch.equal(p, before[n]) != (n in names), n  # the heads trained, nothing else moved
    assert "head.weight" in freeze_backbone(converted, keep_trainable=["head"])
    with pytest.raises(ValueError, match=r"^keep_trainable: expected a prefix of the model's parameter names, got 'x'"):
        freeze_backbone(converted, keep_trainable=["x"])
    with pytest.raises(ValueError, match=r"^model: expected DW-conv heads"):
        freeze_backbone(vit())


def test_global_pool_avg_is_the_cls_removal_of_dwconv():
    model = vit()
    a = vitfast.convert.from_timm(model, dwconv_blocks=[1], global_pool="avg").eval()
    b = vitfast.convert.from_timm(model, dwconv_blocks=[1], remove_cls_token=True).eval()
    assert a.cls_token is None and a.global_pool == "avg" and a.blocks[1].attn.prefix_tokens == 0
    b.load_state_dict(a.state_dict())  # the kernels are drawn at random: compare the functions on equal weights
    x = images(model)
    with torch.no_grad():
        torch.testing.assert_close(a(x), b(x), atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"^global_pool: 'token' keeps the class token that remove_cls_token=True"):
        vitfast.convert.from_timm(model, dwconv_blocks=[1], global_pool="token", remove_cls_token=True)
