"""Optimizer steps reach the packed-weight cache (vitfast/ops/_optimizer_versions.py).

The C++ ops repack a weight when its autograd version counter moves.  torch's fused optimizers (`fused=True`)
and optimizers that write through `p.data` do not move it: before the step hook, every call after the first
step ran on the weights as first packed (outputs off by ~1 after three Adam steps at lr 0.1), fine-tuning
through the fused ops included.
"""
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast import _env, ops
from vitfast.ops import _optimizer_versions

from helpers import assert_close_scaled, randomize

pytestmark = pytest.mark.skipif(not vitfast.ops.extension_loaded(), reason="needs the C++ extension (vitfast._C)")

FUSED = ["SGD", "Adam", "AdamW", "Adagrad"]


def _optimizer(name, params, **kwargs):
    try:
        return getattr(torch.optim, name)(params, lr=0.1, **kwargs)
    except (RuntimeError, ValueError, TypeError) as exc:  # torch 2.4 lacks some fused CPU optimizers
        pytest.skip(f"torch.optim.{name}({kwargs}) unavailable here: {exc}")


class DataWritingSGD(torch.optim.Optimizer):
    """The pre-`torch.no_grad` idiom of many third-party optimizers: update through `p.data`."""

    def __init__(self, params, lr):
        super().__init__(params, dict(lr=lr))

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.data.add_(p.grad, alpha=-group["lr"])


def _steps_track_the_weights(optimizer, x, w):
    for step in range(3):
        out = ops.linear(x, w)  # training path: autograd records the call, the kernel runs the forward
        assert_close_scaled(out.detach(), x @ w.detach().T)
        out.square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():  # inference path, straight after the step
            assert_close_scaled(ops.linear(x, w), x @ w.T)


@pytest.mark.parametrize("name", FUSED)
def test_fused_optimizer_steps_repack(name):
    x, w = torch.randn(16, 8), torch.nn.Parameter(torch.randn(4, 8))
    _steps_track_the_weights(_optimizer(name, [w], fused=True), x, w)


def test_data_writing_optimizer_steps_repack():
    x, w = torch.randn(16, 8), torch.nn.Parameter(torch.randn(4, 8))
    _steps_track_the_weights(DataWritingSGD([w], lr=0.1), x, w)


def test_fused_model_fine_tuned_with_fused_adamw_matches_the_reference(monkeypatch):
    timm_vit = randomize(VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                                           num_classes=10, qkv_bias=True)).eval()
    model = vitfast.fuse(vitfast.convert.from_timm(timm_vit, channel_idle=0.75).eval())
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([1, 2, 3, 4])
    optimizer = _optimizer("AdamW", model.parameters(), fused=True)
    for _ in range(2):
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        got = model(images)
        monkeypatch.setattr(_env, "_backend", "reference")
        want = model(images)
    assert_close_scaled(got, want)


def test_clear_weight_cache_after_a_write_the_cache_cannot_see():
    x, w = torch.randn(16, 8), torch.randn(4, 8)
    ops.linear(x, w)
    w.data.mul_(2.0)  # `.data` has its own version counter: documented as undetectable
    ops.clear_weight_cache()
    assert_close_scaled(ops.linear(x, w), x @ w.T)
    assert vitfast._C._weight_cache_stats()["entries"] == 1


def test_hook_is_registered_once():
    handle = _optimizer_versions._handle
    assert handle is not None
    _optimizer_versions.install()
    assert _optimizer_versions._handle is handle
