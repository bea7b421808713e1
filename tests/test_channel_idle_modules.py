"""Train-time `ChannelIdleMlp` (RePaViT eq. 2), its fused form `FusedChannelIdleFFN` (eq. 3-6), the idle-ratio
heuristics, and the registry contract of the fused modules (config round trip)."""
import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import vitfast
from vitfast.nn import FusedBlock, FusedChannelIdleFFN, FusedSwinBlock, active_channels, fused_kinds, fused_module_from_config, is_fused_module
from vitfast.methods.repavit import ChannelIdleMlp, idle_ratios

from helpers import NORMS, THETAS, assert_close_scaled, randomize_norms


# ------------------------------------------------------------------------------------------------ heuristics
def test_active_channels_is_ceil_without_float_noise():
    assert active_channels(768, 0.75) == 192
    assert active_channels(3072, 0.75) == 768  # μ = 1 at ρ = 4 (paper's default)
    assert active_channels(10, 0.25) == 8  # ceil(7.5)
    assert active_channels(256, 0.0) == 256 and active_channels(256, 1.0) == 0
    with pytest.raises(ValueError, match=r"idle_ratio: expected a number in \[0, 1\], got 1.5"):
        active_channels(256, 1.5)


def test_idle_ratios_static_and_linear():
    assert idle_ratios(4, 0.75) == [0.75] * 4
    linear = idle_ratios(5, 0.75, "linear")
    assert linear[0] == pytest.approx(0.5) and linear[-1] == pytest.approx(1.0)
    assert all(b > a for a, b in zip(linear, linear[1:]))  # shallow layers keep more GELU channels
    assert sum(linear) / len(linear) == pytest.approx(0.75)  # same budget as "static"
    narrow = idle_ratios(3, 0.1, "linear")  # δ = min(spread, θ, 1 − θ) keeps every θ_i in [0, 1]
    assert narrow == pytest.approx([0.0, 0.1, 0.2])
    assert idle_ratios(4, 1.0, "linear") == [1.0] * 4 and idle_ratios(1, 0.5, "linear") == [0.5]
    assert idle_ratios(3, 0.5, "linear", spread=0.0) == [0.5] * 3


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((0, 0.5), {}, r"depth: expected an int >= 1, got 0"),
        ((4, -0.1), {}, r"theta: expected a number in \[0, 1\], got -0.1"),
        ((4, 0.5, "cosine"), {}, r"heuristic: expected one of \('static', 'linear'\), got 'cosine'"),
        ((4, 0.5, "linear"), {"spread": 0.7}, r"spread: expected a number in \[0, 0.5\], got 0.7"),
    ],
)
def test_idle_ratios_errors(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        idle_ratios(*args, **kwargs)


# ------------------------------------------------------------------------------------------------ train-time
def test_channel_idle_mlp_matches_eq2_in_train_and_eval_mode():
    mlp = randomize_norms(ChannelIdleMlp(16, 64, idle_ratio=0.75, norm="batch"))
    x = torch.randn(3, 5, 16)
    a = 16  # ceil(64 · 0.25)

    def eq2(x, bn1_stats, bn2_stats):
        flat = x.reshape(-1, 16)
        training = bn1_stats[0] is None  # batch statistics over all B·N tokens when no running stats are given
        y = F.batch_norm(flat, *bn1_stats, mlp.pre_norm.weight, mlp.pre_norm.bias, training, eps=mlp.pre_norm.eps)
        h = F.linear(y, mlp.fc1.weight, mlp.fc1.bias)
        h = torch.cat([F.gelu(h[:, :a]), h[:, a:]], dim=1)
        h = F.batch_norm(h, *bn2_stats, mlp.hidden_norm.weight, mlp.hidden_norm.bias, training,
                         eps=mlp.hidden_norm.eps)
        return x + F.linear(h, mlp.fc2.weight, mlp.fc2.bias).reshape(x.shape)

    mlp.eval()
    with torch.no_grad():
        expected = eq2(x, (mlp.pre_norm.running_mean, mlp.pre_norm.running_var),
                       (mlp.hidden_norm.running_mean, mlp.hidden_norm.running_var))
        torch.testing.assert_close(mlp(x), expected)
    mlp.train()
    with torch.no_grad():  # train mode: statistics over all B·N tokens, per channel
        expected = eq2(x, (None, None), (None, None))
        torch.testing.assert_close(mlp(x), expected)


def test_idle_channels_are_linear():
    # θ = 1: no activation at all → x ↦ mlp(x) is affine (eval mode); θ = 0: it is not.
    x1, x2 = torch.randn(2, 4, 16), torch.randn(2, 4, 16)
    for theta, affine in ((1.0, True), (0.0, False)):
        mlp = randomize_norms(ChannelIdleMlp(16, 64, idle_ratio=theta)).eval()
        with torch.no_grad():
            lhs = mlp(0.3 * x1 + 0.7 * x2)
            rhs = 0.3 * mlp(x1) + 0.7 * mlp(x2)
        assert torch.allclose(lhs, rhs, atol=1e-5) == affine


def test_only_active_channels_see_gelu():
    mlp = ChannelIdleMlp(8, 32, idle_ratio=0.5, norm="layer").eval()
    seen = {}
    def record(module, inputs, output):
        seen["width"] = inputs[0].shape[-1]

    mlp.act.register_forward_hook(record)
    with torch.no_grad():
        mlp(torch.randn(2, 3, 8))
    assert seen["width"] == mlp.active_features == 16


# ------------------------------------------------------------------------------------------------ fused FFN
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("theta", THETAS)
def test_fused_ffn_equals_train_time(theta, norm):
    mlp = randomize_norms(ChannelIdleMlp(24, 96, idle_ratio=theta, norm=norm, init_values=0.5), seed=3)
    with torch.no_grad():
        mlp.ls.gamma.copy_(torch.rand(24) + 0.5)
    mlp.eval()
    fused = mlp.to_fused()
    x = torch.randn(2, 7, 24) * 3
    with torch.no_grad():
        assert_close_scaled(fused(x), mlp(x))
    active = math.ceil(96 * (1 - theta))
    assert fused.active_features == active
    idle = 96 - active
    assert tuple(fused.w_in.shape) == (active + (24 if idle else 0), 24)
    assert tuple(fused.w_out.shape) == (24, active)
    # BN variant folds the shortcut into W̃ (eq. 5) whenever there is a linear path; LN keeps it explicit.
    assert fused.residual == (norm == "layer" or idle == 0)
    assert (fused.norm is not None) == (norm == "layer")


def test_fused_ffn_without_biases_and_on_2d_input():
    mlp = randomize_norms(ChannelIdleMlp(12, 48, idle_ratio=0.5, bias=False)).eval()
    fused = mlp.to_fused()
    x = torch.randn(9, 12)
    with torch.no_grad():
        assert_close_scaled(fused(x), mlp(x))


def test_fused_parameter_count_matches_section_3_4():
    # θ = 0.75, ρ = 4: (2μ + 1)·C² weights = 3C² instead of 2ρC² = 8C² (37.5 %).
    c = 32
    fused = ChannelIdleMlp(c, 4 * c, idle_ratio=0.75).eval().to_fused()
    assert fused.w_in.numel() + fused.w_out.numel() == 3 * c * c


def test_fused_ffn_reference_backend_agrees():
    mlp = randomize_norms(ChannelIdleMlp(16, 64, idle_ratio=0.5)).eval()
    fused = mlp.to_fused()
    x = torch.randn(2, 5, 16)
    previous = vitfast.get_backend()
    try:
        vitfast.set_backend("reference")
        with torch.no_grad():
            reference = fused(x)
    finally:
        vitfast.set_backend(previous)
    with torch.no_grad():
        assert_close_scaled(fused(x), reference)


@pytest.mark.parametrize(
    "tensor, value, message",
    [
        ("pre_norm.running_var", float("nan"), r"mlp\.pre_norm\.running_var: expected finite values, got 1 non-finite"),
        ("hidden_norm.running_mean", float("inf"), r"mlp\.hidden_norm\.running_mean: expected finite values"),
        ("hidden_norm.weight", float("nan"), r"mlp\.hidden_norm\.weight: expected finite values"),
        ("pre_norm.running_var", -1.0, r"mlp\.pre_norm\.running_var: expected running_var \+ eps > 0"),
        ("fc1.weight", float("nan"), r"mlp\.fc1\.weight: expected finite values"),
    ],
)
def test_folding_refuses_bad_statistics(tensor, value, message):
    mlp = ChannelIdleMlp(8, 32, idle_ratio=0.5).eval()
    target = mlp.get_buffer(tensor) if "running" in tensor else mlp.get_parameter(tensor)
    with torch.no_grad():
        target.view(-1)[0] = value
    with pytest.raises(ValueError, match=message):
        mlp.to_fused()


def test_folding_refuses_batchnorm_without_running_stats():
    mlp = ChannelIdleMlp(8, 32, idle_ratio=0.5)
    mlp.pre_norm = nn.BatchNorm1d(8, track_running_stats=False)
    with pytest.raises(ValueError, match=r"mlp\.pre_norm: expected a BatchNorm with running statistics"):
        mlp.to_fused()


def test_constructor_errors():
    with pytest.raises(ValueError, match=r"norm: expected one of \('batch', 'layer'\), got 'group'"):
        ChannelIdleMlp(8, 32, norm="group")
    with pytest.raises(ValueError, match=r"active_features: expected an int in \[0, 32\], got 40"):
        ChannelIdleMlp(8, 32, active_features=40)
    with pytest.raises(ValueError, match=r"norm: expected None or 'layer', got 'batch'"):
        FusedChannelIdleFFN(8, 4, True, norm="batch")
    with pytest.raises(ValueError, match=r"expected at least one path"):
        FusedChannelIdleFFN(8, 0, False)


# ------------------------------------------------------------------------------------------------ registry contract
def _roundtrip(module: nn.Module) -> nn.Module:
    cfg = json.loads(json.dumps(module.vitfast_config()))  # must survive JSON
    rebuilt = fused_module_from_config(cfg)
    assert type(rebuilt) is type(module)
    rebuilt.load_state_dict(module.state_dict(), strict=True)
    assert rebuilt.vitfast_config() == cfg
    return rebuilt.eval()


def test_registered_kinds():
    assert {"channel_idle_ffn", "block", "swin_block"} <= set(fused_kinds())
    assert FusedChannelIdleFFN.vitfast_kind == "channel_idle_ffn"
    assert FusedBlock.vitfast_kind == "block" and FusedSwinBlock.vitfast_kind == "swin_block"


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("theta", [0.0, 0.5, 1.0])
def test_ffn_config_roundtrip(theta, norm):
    fused = randomize_norms(ChannelIdleMlp(16, 64, idle_ratio=theta, norm=norm)).eval().to_fused()
    rebuilt = _roundtrip(fused)
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), fused(x), atol=0, rtol=0)


def test_block_and_swin_block_config_roundtrip():
    from timm.models.swin_transformer import SwinTransformerBlock
    from timm.models.vision_transformer import Block as TimmBlock

    timm_block = TimmBlock(32, 4, qkv_bias=True, qk_norm=True, init_values=0.1).eval()
    block = FusedBlock.from_timm(randomize_norms(timm_block))
    x = torch.randn(2, 6, 32)
    rebuilt = _roundtrip(block)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), block(x), atol=0, rtol=0)
    assert is_fused_module(rebuilt)

    swin = SwinTransformerBlock(32, (6, 6), num_heads=2, window_size=4, shift_size=2).eval()
    fused_swin = FusedSwinBlock.from_timm(randomize_norms(swin))
    rebuilt_swin = _roundtrip(fused_swin)
    x = torch.randn(2, 6, 6, 32)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt_swin(x), fused_swin(x), atol=0, rtol=0)


def test_config_kind_mismatch_is_refused():
    cfg = FusedChannelIdleFFN(8, 4, True).vitfast_config()
    with pytest.raises(ValueError, match=r"cfg\['kind'\]: expected 'block', got 'channel_idle_ffn'"):
        FusedBlock.from_vitfast_config(cfg)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.pop("features"), r"cfg\['features'\]: expected a value, not found"),
        (lambda c: c.update(features=-3), r"cfg\['features'\]: expected an int >= 1, got -3"),
        (lambda c: c.update(features="16"), r"cfg\['features'\]: expected an int >= 1, got '16'"),
        (lambda c: c.update(residual=1), r"cfg\['residual'\]: expected true or false, got 1"),
        (lambda c: c.update(norm="batch"), r"cfg\['norm'\]: expected one of \(None, 'layer'\), got 'batch'"),
        (lambda c: c.update(norm_eps=float("nan")), r"cfg\['norm_eps'\]: expected a finite number >= 0, got nan"),
        (lambda c: c.update(extra=1), r"cfg: unexpected keys \['extra'\] for kind 'channel_idle_ffn'"),
    ],
)
def test_corrupt_ffn_config_is_refused(edit, message):
    cfg = FusedChannelIdleFFN(16, 8, True, norm="layer", residual=True).vitfast_config()
    edit(cfg)
    with pytest.raises(ValueError, match=message):
        fused_module_from_config(cfg)


def test_corrupt_block_configs_are_refused():
    cfg = FusedBlock(32, 4).vitfast_config()
    with pytest.raises(ValueError, match=r"cfg\['mlp'\]: expected an object, got list"):
        fused_module_from_config(dict(cfg, mlp=[1]))
    with pytest.raises(ValueError, match=r"cfg\['num_heads'\]: expected an int >= 1, got 0"):
        fused_module_from_config(dict(cfg, num_heads=0))
    swin_cfg = FusedSwinBlock(32, (4, 4), num_heads=2, window_size=4).vitfast_config()
    with pytest.raises(ValueError, match=r"cfg\['window_size'\]: expected two ints >= 1, got \[4\]"):
        fused_module_from_config(dict(swin_cfg, window_size=[4]))
