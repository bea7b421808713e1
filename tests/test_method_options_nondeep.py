"""Non-deep ViT paper options: global average pooling instead of the class token (`from_timm(branches=n,
global_pool="avg")`) through train-time forward, exact fusion, the train-time file and the fused file; the
pre-train-then-join schedule (`JoinSchedule.pretrain_then_join`, a fractional start) and its file round trip."""
import pytest
import torch
import torch.nn as nn
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast.convert import from_timm
from vitfast.io.trainable import describe_trainable, load_trainable, save_trainable
from vitfast.methods.nondeep import JoinSchedule
from vitfast.nn import FusedXWXBlock

from helpers import assert_close_scaled, randomize

pytestmark = pytest.mark.usefixtures("one_thread")

IMAGES = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(11))


def _vit(**overrides) -> VisionTransformer:
    kwargs = dict(img_size=32, patch_size=8, embed_dim=48, depth=4, num_heads=3, num_classes=10, qkv_bias=True)
    kwargs.update(overrides)
    return randomize(VisionTransformer(**kwargs), seed=0)


def _joined(model: nn.Module) -> nn.Module:
    for block in model.blocks:
        block.set_lambda(1.0)
    return model.eval()


def _patch_mean_reference(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The head applied to the mean of the patch tokens, computed by hand from the blocks (no timm pooling)."""
    x = model.patch_embed(images)
    x = x + model.pos_embed  # no class token: one position row per patch
    for block in model.blocks:
        x = block(x)
    x = model.norm(x)
    return model.head(x.mean(1))


def test_global_avg_pool_drops_the_class_token_and_pools_patches():
    source = _vit()
    model = _joined(from_timm(source, branches=2, global_pool="avg"))
    assert model.cls_token is None and model.global_pool == "avg" and model.num_prefix_tokens == 0
    assert model.pos_embed.shape[1] == source.patch_embed.num_patches  # the class token's row went with it
    # the position rows of the patches are the source's, unchanged
    torch.testing.assert_close(model.pos_embed, source.pos_embed[:, 1:], atol=0, rtol=0)
    assert source.cls_token is not None  # the argument is not modified
    with torch.no_grad():
        assert_close_scaled(model(IMAGES), _patch_mean_reference(model, IMAGES))
    default = from_timm(source, branches=2)
    assert default.cls_token is not None and default.global_pool == "token"  # the default keeps the class token


@pytest.mark.parametrize("join_values", [False, True])
def test_global_avg_pool_fuses_exactly_and_round_trips(join_values, tmp_path):
    model = _joined(from_timm(_vit(), branches=2, global_pool="avg", join_values=join_values))
    fused = vitfast.fuse(model)
    assert all(isinstance(b, FusedXWXBlock) for b in fused.blocks) and fused.cls_token is None
    with torch.no_grad():
        assert_close_scaled(fused(IMAGES), model(IMAGES))
    path = str(tmp_path / "fused.safetensors")
    vitfast.save(fused, path)
    loaded = vitfast.load(path)
    assert loaded.cls_token is None and loaded.global_pool == "avg"
    with torch.no_grad():
        torch.testing.assert_close(loaded(IMAGES), fused(IMAGES), atol=0, rtol=0)


def test_global_avg_pool_train_time_file_round_trip(tmp_path):
    model = from_timm(_vit(), branches=2, global_pool="avg", schedule=JoinSchedule.pretrain_then_join(0.5))
    for block in model.blocks:
        block.set_lambda(0.25)  # mid-joining: the file keeps the train-time model, not a fused one
    desc = describe_trainable(model)
    assert desc["architecture"]["kwargs"]["class_token"] is False
    assert desc["architecture"]["kwargs"]["global_pool"] == "avg"
    path = tmp_path / "nd.safetensors"
    save_trainable(model, path)
    loaded, _ = load_trainable(path)
    assert loaded.cls_token is None and loaded.global_pool == "avg"
    assert loaded.blocks[0].schedule.start_fraction == 0.5
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(IMAGES), model(IMAGES), atol=0, rtol=0)


def test_global_pool_options_are_checked():
    with pytest.raises(ValueError, match=r"^global_pool: expected None, 'avg' or 'token', got 'max'"):
        from_timm(_vit(), branches=2, global_pool="max")
    with pytest.raises(ValueError, match=r"^global_pool: 'token' needs a model that pools its class token"):
        from_timm(_vit(class_token=False, global_pool="avg"), branches=2, global_pool="token")
    with pytest.raises(ValueError, match=r"^global_pool: 'avg' is not supported together with gates=True"):
        from_timm(_vit(), gates=True, global_pool="avg")
    # remove_cls_token=True is the DW-conv spelling of the same thing: now accepted with branches too
    assert from_timm(_vit(), branches=2, remove_cls_token=True).cls_token is None


# ------------------------------------------------------------------------------------------------ join schedule
def test_pretrain_then_join_schedule():
    s = JoinSchedule.pretrain_then_join(0.5)
    total = 120  # 60 steps apart, then joining: warm-up 1/6 of the 60 joining steps = 10, then λ = 1
    assert s.start(total) == 60 and s.warmup_length(total) == 10
    assert s(59, total) == 0.0 and s(60, total) == 0.0
    assert s(65, total) == pytest.approx(0.5)
    assert s(70, total) == 1.0 and s(total, total) == 1.0
    plain = JoinSchedule()  # the default: joining from step 0, warm-up 1/6 of the whole run
    assert plain.start(total) == 0 and plain.warmup_length(total) == 20
    assert JoinSchedule.from_dict(s.to_dict()).to_dict() == s.to_dict()
    assert "start_fraction" not in plain.to_dict()  # files written before it existed read the same
    with pytest.raises(ValueError, match=r"^start_step: expected 0 with start_fraction"):
        JoinSchedule(start_step=3, start_fraction=0.5)
    with pytest.raises(ValueError, match=r"^pretrain_fraction: expected a number in \[0, 1\), got 1.0"):
        JoinSchedule.pretrain_then_join(1.0)


# ------------------------------------------------------------------------------------------------ command line
def test_cli_global_pool_and_fractional_join_start(tmp_path, capsys):
    import json

    from vitfast.cli import main

    tiny = ["vit_tiny_patch16_224", "--img-size", "16",
            "--model-kwargs", json.dumps({"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 4})]
    run = tmp_path / "run"
    assert main(["train", *tiny, "--branches", "2", "--global-pool", "avg", "--join-start", "0.5", "--steps", "12",
                 "--out", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    model, recipe = load_trainable(run / "model.safetensors")
    assert model.cls_token is None and model.global_pool == "avg" and recipe["global_pool"] == "avg"
    sched = model.blocks[0].schedule
    assert sched.start_fraction == 0.5 and sched.start(12) == 6 and sched.warmup_length(12) == 1
    fused = str(tmp_path / "fused.safetensors")
    assert main(["fuse", str(run / "model.safetensors"), "-o", fused]) == 0
    assert main(["verify", fused, "--source", str(run / "model.safetensors"), "--inputs", "digits"]) == 0
    assert "OK: the fused model matches its source" in capsys.readouterr().out
    # a resume cannot change the pooling; without --branches the flag is refused by name
    assert main(["train", "--resume", str(run / "trainer.pt"), "--global-pool", "token", "--no-progress"]) == 2
    assert "--global-pool was 'avg', got 'token'" in capsys.readouterr().err
    assert main(["train", *tiny, "--global-pool", "avg", "--steps", "2", "--out", str(tmp_path / "r2"),
                 "--no-progress"]) == 2
    assert "--global-pool: only applies to a non-deep model" in capsys.readouterr().err
