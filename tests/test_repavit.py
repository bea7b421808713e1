"""`vitfast.convert.from_repavit`: official RePaViT ViT/DeiT checkpoints → vitfast, checked against an
independent re-implementation of the official architecture.

`OfficialRePaViT` below is written from the architecture description (RePaViT's `repavit.py` layout), not from
the converter: its own attention maths (explicit softmax, no SDPA), BatchNorm1d on [B, C, N] as the official
code applies it, its own token assembly.  A state dict taken from it is what an official checkpoint holds.
"""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import vitfast
from vitfast.methods.repavit.convert import REPAVIT_HEADS, from_repavit
from vitfast.methods.repavit import ChannelIdleBlock
from vitfast.nn import FusedChannelIdleFFN

from helpers import assert_close_scaled, randomize


class OfficialAttention(nn.Module):
    """Pre-norm (LayerNorm, torch default eps) inside the attention module; adds its own shortcut."""

    def __init__(self, dim, heads, bias=True, layer_scale=False):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        if layer_scale:
            self.ls = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        b, n, c = x.shape
        d = c // self.heads
        q, k, v = self.qkv(self.norm(x)).reshape(b, n, 3, self.heads, d).permute(2, 0, 3, 1, 4)
        weights = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(d), dim=-1)
        out = self.proj((weights @ v).transpose(1, 2).reshape(b, n, c))
        if hasattr(self, "ls"):
            out = out * self.ls
        return x + out


class OfficialMlp(nn.Module):
    """norm1 = BatchNorm1d(C) → fc1 → GELU on the first `active` channels → norm2 = BatchNorm1d(hidden) → fc2."""

    def __init__(self, dim, hidden, active, bias=True, layer_scale=False):
        super().__init__()
        self.active = active
        self.norm1 = nn.BatchNorm1d(dim)
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.fc2 = nn.Linear(hidden, dim, bias=bias)
        self.norm2 = nn.BatchNorm1d(hidden)
        if layer_scale:
            self.ls = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        h = self.fc1(self.norm1(x.transpose(-1, -2)).transpose(-1, -2))
        mask = torch.zeros(h.shape[-1], dtype=torch.bool)
        mask[: self.active] = True
        h = torch.where(mask, F.gelu(h), h)
        out = self.fc2(self.norm2(h.transpose(-1, -2)).transpose(-1, -2))
        if hasattr(self, "ls"):
            out = out * self.ls
        return x + out


class OfficialBlock(nn.Module):
    def __init__(self, dim, heads, hidden, active, bias, layer_scale):
        super().__init__()
        self.attn = OfficialAttention(dim, heads, bias, layer_scale)
        self.mlp = OfficialMlp(dim, hidden, active, bias, layer_scale)

    def forward(self, x):
        return self.mlp(self.attn(x))


class PatchEmbed(nn.Module):
    def __init__(self, dim, patch, in_chans):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, patch, patch, bias=False)  # no bias in RePaViT


class OfficialRePaViT(nn.Module):
    def __init__(self, dim=192, depth=2, heads=3, img=32, patch=8, in_chans=3, classes=10, mlp_ratio=4,
                 idle_ratio=0.75, bias=True, layer_scale=False):
        super().__init__()
        hidden = dim * mlp_ratio
        active = math.ceil(hidden * (1 - idle_ratio))
        self.patch_embed = PatchEmbed(dim, patch, in_chans)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + (img // patch) ** 2, dim) * 0.5)
        self.norm_pre = nn.LayerNorm(dim, eps=1e-6)
        self.blocks = nn.Sequential(*[OfficialBlock(dim, heads, hidden, active, bias, layer_scale) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward_features(self, images):
        x = self.patch_embed.proj(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.norm(self.blocks(self.norm_pre(x)))

    def forward(self, images):
        return self.head(self.forward_features(images)[:, 0])


@pytest.mark.parametrize(
    "dim, heads, idle_ratio, bias, layer_scale",
    [
        (192, 3, 0.75, True, False),  # RePa-DeiT-Tiny width, official defaults
        (192, 3, 0.5, False, True),  # no biases, LayerScale on both sub-blocks
        (64, 4, 0.75, True, False),  # a width outside the table: heads passed explicitly
    ],
)
def test_fused_equals_official(dim, heads, idle_ratio, bias, layer_scale):
    official = randomize(OfficialRePaViT(dim=dim, heads=heads, idle_ratio=idle_ratio, bias=bias,
                                         layer_scale=layer_scale), seed=1)
    state = official.state_dict()
    kwargs = {} if dim in REPAVIT_HEADS else {"num_heads": heads}
    model = from_repavit(state, idle_ratio=idle_ratio, **kwargs)
    assert isinstance(model.blocks[0], ChannelIdleBlock)
    assert not model.training
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        expected = official(images)
        expected_features = official.forward_features(images)
        train_time = model(images)
        fused_model = vitfast.fuse(model)
        fused = fused_model(images)
        fused_features = fused_model.forward_features(images)
    assert_close_scaled(train_time, expected)
    assert_close_scaled(fused, expected)
    assert_close_scaled(fused_features, expected_features)
    ffn = fused_model.blocks[0].mlp
    assert isinstance(ffn, FusedChannelIdleFFN)
    assert ffn.active_features == math.ceil(4 * dim * (1 - idle_ratio))
    assert ffn.linear_path and not ffn.residual and ffn.norm is None  # BN variant: shortcut folded (eq. 5)


def test_inferred_architecture():
    official = randomize(OfficialRePaViT(dim=192, depth=3, img=48, patch=16, in_chans=1, classes=7), seed=1)
    model = from_repavit({"model": official.state_dict()})  # the official training script's wrapper
    assert len(model.blocks) == 3
    assert model.embed_dim == 192 and model.num_classes == 7
    assert model.blocks[0].attn.num_heads == 3
    assert tuple(model.patch_embed.patch_size) == (16, 16) and tuple(model.patch_embed.img_size) == (48, 48)
    assert model.patch_embed.proj.bias is None and model.patch_embed.proj.in_channels == 1
    assert model.blocks[0].mlp.active_features == 192  # ceil(768 · 0.25): the documented default
    images = torch.randn(2, 1, 48, 48)
    with torch.no_grad():
        assert_close_scaled(vitfast.fuse(model)(images), official(images))


def test_module_prefix_and_explicit_active_features():
    official = randomize(OfficialRePaViT(dim=192, idle_ratio=0.5), seed=1)
    state = {"module." + k: v for k, v in official.state_dict().items()}
    model = from_repavit(state, active_features=384)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert_close_scaled(vitfast.fuse(model)(images), official(images))


def test_wrong_idle_ratio_is_detectably_different():
    # The active count is not in the tensors: a wrong idle_ratio builds, but must not match the official model.
    official = randomize(OfficialRePaViT(dim=192, idle_ratio=0.5), seed=1)
    model = from_repavit(official.state_dict(), idle_ratio=0.75)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert not torch.allclose(model(images), official(images), atol=1e-3)


def test_errors_name_the_argument():
    state = randomize(OfficialRePaViT(dim=64, heads=4), seed=1).state_dict()
    with pytest.raises(ValueError, match=r"num_heads: expected an explicit value for embedding width 64"):
        from_repavit(state)
    with pytest.raises(ValueError, match=r"num_heads: expected a positive divisor of the width 64, got 5"):
        from_repavit(state, num_heads=5)
    with pytest.raises(ValueError, match=r"img_size: expected 32 .* got 64"):
        from_repavit(state, num_heads=4, img_size=64)
    with pytest.raises(ValueError, match=r"num_classes: expected 10 \(head.weight rows\), got 1000"):
        from_repavit(state, num_heads=4, num_classes=1000)
    extra = dict(state, **{"blocks.0.attn.gain1": torch.ones(1)})
    with pytest.raises(ValueError, match=r"unexpected keys .*blocks\.0\.attn\.gain1"):
        from_repavit(extra, num_heads=4)
    missing = {k: v for k, v in state.items() if k != "blocks.1.mlp.norm2.running_var"}
    with pytest.raises(ValueError, match=r"blocks\.1.*mlp\.hidden_norm\.running_var"):
        from_repavit(missing, num_heads=4)
    with pytest.raises(ValueError, match=r"expected key 'cls_token'"):
        from_repavit({k: v for k, v in state.items() if k != "cls_token"}, num_heads=4)
    with pytest.raises(TypeError, match=r"state_dict: expected a mapping"):
        from_repavit([1, 2, 3])
