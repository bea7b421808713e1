"""vitfast.recipes (each paper's settings with sources), `vitfast train --recipe/--print`, and the Trainer on timm's
parts (optimizer, cosine scheduler per update, Mixup, transforms) with exact resume."""
import math
import os
import re

import pytest
import torch
import torch.nn as nn

from helpers import recipe_tiny_vit as tiny_vit, run_cli
from vitfast.recipes import RECIPES, get_recipe, recipe_names, resolve
from vitfast.training.data import digits_loaders
from vitfast.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

PAPERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "papers")


# ---------------------------------------------------------------------------------------------- registry
def test_every_recipe_setting_names_its_source():
    assert set(RECIPES) == {"repavit", "nondeep", "dwconv", "usdc", "distill"}
    for name in recipe_names():
        recipe = get_recipe(name)
        assert recipe["paper"]
        for key, (value, source) in recipe["settings"].items():
            # a paper reference, or a plain statement that the paper does not give it and whose value stands in
            assert isinstance(source, str) and re.search(r"Table|sec\.|App\.|A\.\d|supplementary|not in", source), \
                (name, key, source)


def test_recipes_hold_the_papers_published_values():
    """The values the issue lists from the papers (RePaViT Table 7, USDC's supplementary, distillation sec. IV-A,
    non-deep Table 9), read back through get_recipe."""
    value = lambda name, key: get_recipe(name)["settings"][key][0]  # noqa: E731
    assert (value("repavit", "optimizer"), value("repavit", "lr"), value("repavit", "batch_size"),
            value("repavit", "min_lr"), value("repavit", "drop_path")) == ("lamb", 4e-3, 4096, 5e-5, 0.1)
    assert value("repavit:vit_large", "lr") == 1e-3 and value("repavit:vit_large", "min_lr") == 5e-5
    assert (value("usdc", "lr"), value("usdc", "arch_lr_scale")) == (5e-4, 1.0)
    assert (value("distill", "optimizer"), value("distill", "weight_decay"), value("distill", "lr"),
            value("distill", "warmup_epochs"), value("distill", "epochs")) == ("adamw", 0.01, 2e-4, 5, 60)
    assert (value("nondeep:finetune", "mixup"), value("nondeep:finetune", "layer_decay")) == (0.2, 0.85)
    assert value("nondeep", "join_steps") == pytest.approx(1 / 6)  # 10k of 60k joining steps (A.2)


@pytest.mark.skipif(not os.path.isdir(PAPERS), reason="the papers' text is not beside the repository")
def test_paper_numbers_are_in_the_papers_text():
    """Spot checks against the papers themselves: the cited numbers appear where the sources say."""
    text = {n: open(os.path.join(PAPERS, f)).read() for n, f in (
        ("repavit", "repavit-channel-idle-ffn.txt"), ("usdc", "usdc-static-dynamic-compression.txt"),
        ("distill", "swin-distillation-compression.txt"), ("nondeep", "non-deep-vit-progressive-reparam.txt"))}
    assert "RePa-DeiT-Tiny 300 4096 Lamb" in text["repavit"]
    assert "learning rate of  $5e^{-4}$" in text["usdc"] and "set to 5.0" in text["usdc"]
    assert "weight decay factor of 0.01" in text["distill"] and "0.0002" in text["distill"]
    assert "layer-wise lr decay\t0.85" in text["nondeep"] and "mixup Zhang et al. (2017)\t0.2" in text["nondeep"]


def test_unknown_recipe_is_one_line_naming_the_valid_ones(capsys):
    with pytest.raises(ValueError, match=r"recipe: expected one of repavit, .*distill.*, got 'resnet'"):
        get_recipe("resnet")
    code, out, err = run_cli(["train", "--recipe", "repavit:tiny", "--print"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("vitfast train: error: --recipe: expected one of repavit,")
    assert "nondeep:finetune" in err and "'repavit:tiny'" in err


# ---------------------------------------------------------------------------------------------- resolution
def test_lr_follows_the_batch_by_the_recipes_rule():
    lr = lambda name, batch, **explicit: resolve(name, explicit, batch_size=batch)["lr"]  # noqa: E731
    # linear (non-deep, App. A.3): lr x batch / base
    assert lr("nondeep", 256).value == pytest.approx(1e-3 * 256 / 1024)
    assert "linear rule" in lr("nondeep", 256).note
    # sqrt (timm's rule for the Adam family; the USDC paper gives none)
    assert lr("usdc", 1024).value == pytest.approx(5e-4 * math.sqrt(1024 / 256))
    assert "sqrt rule" in lr("usdc", 1024).note
    # none (RePaViT: the authors' command passes --unscale-lr): as given at any batch, and --print says so
    assert lr("repavit", 64).value == 4e-3 and "used as given for batch 64" in lr("repavit", 64).note
    assert lr("repavit", 4096).value == 4e-3 and lr("repavit", 4096).origin == "recipe"
    # no batch in the paper: unchanged
    assert lr("distill", 32).value == 2e-4
    # an explicit lr is the user's: never scaled
    assert lr("repavit", 64, lr=1e-3).value == 1e-3 and lr("repavit", 64, lr=1e-3).origin == "explicit"
    # a scaled lr below the recipe's floor takes the floor down with it (the cosine must not rise)
    tiny = resolve("nondeep", {}, batch_size=1)  # 1e-3 x 1/1024 < min lr 1e-5
    assert tiny["min_lr"].value <= tiny["lr"].value


def test_explicit_options_override_the_recipe():
    r = resolve("distill", {"weight_decay": 0.05, "lr": None}, batch_size=64)
    assert (r["weight_decay"].value, r["weight_decay"].origin) == (0.05, "explicit")
    assert (r["lr"].value, r["lr"].origin) == (2e-4, "recipe")  # None: not given
    assert r["warmup"].value == pytest.approx(5 / 60)  # the paper's warm-up share of the run
    assert resolve(None, {}, batch_size=64)["optimizer"].origin == "default"


def test_print_shows_values_sources_and_what_is_not_applied(capsys):
    code, out, _ = run_cli(["train", "--recipe", "repavit", "--print", "--batch-size", "256", "--weight-decay",
                            "0.1"], capsys)
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert out.splitlines()[0].startswith("recipe repavit: RePaViT")
    assert "lamb" in lines["optimizer"] and "Table 7" in lines["optimizer"]
    assert "0.004" in lines["lr"] and "used as given for batch 256" in lines["lr"]  # lr_scaling none
    assert "0.1" in lines["weight_decay"] and "explicit" in lines["weight_decay"]
    assert "explicit" in lines["batch_size"] and "4096" in lines["batch_size"]
    assert lines["repeated_aug"].split()[1] == "3" and "RASampler" in lines["repeated_aug"]
    assert "not applied" not in lines["repeated_aug"]  # DeiT's repeated augmentation: SeededSampler(repeats=3)
    assert "not applicable" in lines["auto_augment"]  # the digits: no RandAugment
    code, out, _ = run_cli(["train", "--recipe", "nondeep", "--print", "--data", "/tmp"], capsys)
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "applied to a non-deep model" in lines["global_pool"] and "not applied" not in lines["global_pool"]
    assert "applied" not in lines["auto_augment"].split("recipe")[0]
    code, out, _ = run_cli(["train", "--recipe", "usdc", "--print"], capsys)
    assert "built in" in out and "the paper's value" in out  # Gumbel τ: vitfast's constants equal the paper's


# ---------------------------------------------------------------------------------------------- Trainer
def test_trainer_recipe_builds_timms_optimizer_and_scheduler():
    from timm.optim import Lamb
    from timm.scheduler import CosineLRScheduler

    train, _ = digits_loaders(img_size=16, batch_size=64)
    trainer = Trainer(tiny_vit(), train, recipe="repavit", total_steps=20, progress=False)
    assert isinstance(trainer.optimizer, Lamb) and isinstance(trainer.scheduler, CosineLRScheduler)
    assert trainer.lr == 4e-3 and trainer.min_lr == 5e-5  # RePaViT's lr is not scaled with the batch
    assert trainer.mixup_fn is not None and trainer.settings["mixup"].origin == "recipe"
    assert {"drop_path", "auto_augment", "reprob"} <= set(trainer.unapplied)  # the loader and model are built
    # explicit wins; the recipe's epochs apply when no length is given
    t2 = Trainer(tiny_vit(), train, recipe="distill", lr=1e-3, progress=False)
    assert t2.lr == 1e-3 and t2.total_steps == 60 * len(train) and isinstance(t2.optimizer, torch.optim.AdamW)
    lrs = []
    trainer.callbacks.append(type("R", (), {"on_step": lambda self, t, m: lrs.append(m["lr"])})())
    trainer.fit()
    assert lrs[0] == pytest.approx(1e-6)  # timm's warm-up starts at the recipe's warmup_lr
    assert max(lrs) == pytest.approx(trainer.lr) and trainer.min_lr <= lrs[-1] < 0.2 * trainer.lr


def test_layer_decay_groups_keep_the_methods_no_decay_marks():
    model = tiny_vit()
    model.blocks[0].gate = nn.Parameter(torch.zeros(2, 2))
    model.blocks[0].gate._no_weight_decay = True
    train, _ = digits_loaders(img_size=16, batch_size=64)
    trainer = Trainer(model, train, total_steps=3, layer_decay=0.85, progress=False)
    group_of = {id(p): g for g in trainer.optimizer.param_groups for p in g["params"]}
    assert group_of[id(model.blocks[0].gate)]["weight_decay"] == 0.0
    assert group_of[id(model.blocks[0].attn.qkv.weight)]["weight_decay"] == 0.05
    scale = lambda p: group_of[id(p)]["lr_scale"]  # noqa: E731
    assert scale(model.blocks[0].attn.qkv.weight) < scale(model.blocks[1].attn.qkv.weight) < scale(model.head.weight)
    with pytest.raises(ValueError, match="layer_decay: needs lr_schedule='timm'"):
        Trainer(tiny_vit(), train, total_steps=3, layer_decay=0.85, lr_schedule="legacy", progress=False)


def test_mixup_trains_and_needs_an_even_batch():
    train, val = digits_loaders(img_size=16, batch_size=32)
    trainer = Trainer(tiny_vit(), train, val, total_steps=6, mixup=0.8, cutmix=1.0, label_smoothing=0.1,
                      progress=False)
    summary = trainer.fit()
    assert all(math.isfinite(m["loss"]) for m in trainer.history)
    assert 0.0 <= summary["last_eval"]["acc"] <= 1.0 and math.isfinite(summary["last_eval"]["loss"])
    odd, _ = digits_loaders(img_size=16, batch_size=33)
    with pytest.raises(ValueError, match="batch_size: mixup/cutmix need an even batch, got 33"):
        Trainer(tiny_vit(), odd, total_steps=2, mixup=0.8, progress=False).fit()


def _recipe_run(total, *, until=None, resume=None, ckpt=None):
    model = tiny_vit(seed=1, drop_path_rate=0.1)
    # 11 batches/epoch, random erasing, DeiT's repeated augmentation (3 copies of each drawn image)
    train, val = digits_loaders(img_size=16, batch_size=128, reprob=0.25, repeats=3)
    trainer = Trainer(model, train, val, recipe="repavit", total_steps=total, progress=False, eval_every=5,
                      checkpoint_path=ckpt, checkpoint_every=4 if ckpt else None)
    if resume:
        trainer.load_checkpoint(resume)
    trainer.fit(until)
    return model, trainer


def test_resume_with_a_recipe_equals_the_uninterrupted_run(tmp_path):
    """LAMB, timm's scheduler, Mixup/CutMix (NumPy's RNG), drop-path and erasing: interrupted + resumed gives the
    same weights bit for bit."""
    total, half = 16, 8  # crosses an epoch boundary
    full, full_trainer = _recipe_run(total)
    ckpt = str(tmp_path / "trainer.pt")
    _recipe_run(total, until=half, ckpt=ckpt)
    state = torch.load(ckpt, weights_only=True)
    assert state["lr_schedule"] == "timm" and state["step"] == half
    train, _ = digits_loaders(img_size=16, batch_size=128)
    with pytest.raises(ValueError, match="checkpoint: made with recipe='repavit', this Trainer has recipe=None"):
        Trainer(tiny_vit(seed=1), train, total_steps=total, progress=False).load_checkpoint(ckpt)
    resumed, resumed_trainer = _recipe_run(total, resume=ckpt)
    for (name, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    assert [m["loss"] for m in full_trainer.history[half:]] == [m["loss"] for m in resumed_trainer.history]
    assert [m["lr"] for m in full_trainer.history[half:]] == [m["lr"] for m in resumed_trainer.history]


def test_a_checkpoint_without_a_schedule_kind_resumes_on_the_legacy_schedule(tmp_path):
    """Checkpoints written before timm's schedule (no "lr_schedule" field) continue on the schedule they were
    trained with, even in a Trainer that would start a new run on timm's."""
    def run(until=None, resume=None, ckpt=None, kind=None):
        model = tiny_vit(seed=2)
        train, _ = digits_loaders(img_size=16, batch_size=128)
        trainer = Trainer(model, train, total_steps=10, lr=2e-3, progress=False, lr_schedule=kind,
                          checkpoint_path=ckpt, checkpoint_every=3 if ckpt else None)
        if resume:
            trainer.load_checkpoint(resume)
        trainer.fit(until)
        return model, trainer

    full, full_trainer = run()
    assert full_trainer.lr_schedule == "legacy"
    ckpt = tmp_path / "old.pt"
    run(until=6, ckpt=str(ckpt))
    state = torch.load(ckpt, weights_only=True)
    del state["lr_schedule"]  # as written before the field existed
    torch.save(state, ckpt)
    resumed, resumed_trainer = run(resume=str(ckpt), kind="timm")
    assert resumed_trainer.lr_schedule == "legacy"
    assert all(torch.equal(a, b) for a, b in zip(full.state_dict().values(), resumed.state_dict().values()))


# ---------------------------------------------------------------------------------------------- data, CLI
def test_digits_image_folder_and_timm_transforms_are_seeded(tmp_path):
    from PIL import Image

    from vitfast.training.data import image_folder_loaders, write_digits_image_folder

    train_dir, val_dir = write_digits_image_folder(tmp_path / "digits", size=16)
    tr, va = digits_loaders(img_size=16, batch_size=64)
    assert sum(len(files) for _, _, files in os.walk(train_dir)) == len(tr.dataset)
    assert sorted(os.listdir(val_dir)) == [str(c) for c in range(10)]
    train, val = image_folder_loaders(train_dir, img_size=16, batch_size=8, val_root=val_dir, transform=dict(
        auto_augment="rand-m9-mstd0.5-inc1", color_jitter=0.4, reprob=0.25, interpolation="bicubic"))
    a, b = train.dataset[(5, 11)][0], train.dataset[(5, 11)][0]
    assert torch.equal(a, b) and not torch.equal(a, train.dataset[(5, 12)][0])
    import random

    import numpy as np

    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    train.dataset[(5, 11)]
    after = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    assert before[0] == after[0] and np.array_equal(before[1], after[1]) and torch.equal(before[2], after[2])
    assert next(iter(val))[0].shape == (len(val.dataset) if len(val.dataset) < 8 else 8, 3, 16, 16)
    # a recipe without a setting (USDC gives no augmentation) passes None: off, as the default
    from vitfast.training.data import timm_transforms

    train_tf, _ = timm_transforms(16, auto_augment=None, color_jitter=None, reprob=None)
    assert train_tf(Image.new("RGB", (20, 20))).shape == (3, 16, 16)


def test_dwconv_frozen_recipe_trains_only_the_replaced_heads():
    import vitfast
    from vitfast.cli._paper_recipe import _freeze_backbone

    model = vitfast.convert.from_timm(tiny_vit(), dwconv_blocks=[1])
    _freeze_backbone(model)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    # Table A.1: the value rows, the kernels and the output projection of the replaced block (W^V, W^O, K)
    expected = {name for name, _ in model.named_parameters()
                if name.startswith(("blocks.1.attn.value.", "blocks.1.attn.proj."))
                or name == "blocks.1.attn.conv_kernel"}
    assert trainable == expected and "blocks.1.attn.proj.weight" in expected


def test_cli_recipe_run_on_a_digits_image_folder(tmp_path, capsys, monkeypatch):
    import vitfast.cli.train as train_cli
    from vitfast.training.data import write_digits_image_folder

    built = []  # the loaders the run built: the recipe's repeated augmentation reaches the sampler
    loaders = train_cli.image_folder_loaders
    monkeypatch.setattr(train_cli, "image_folder_loaders", lambda *a, **k: built.append(loaders(*a, **k)) or built[-1])
    train_dir, val_dir = write_digits_image_folder(tmp_path / "digits", size=16)
    common = ["vit_tiny_patch16_224", "--img-size", "16", "--model-kwargs",
              '{"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 4}', "--data", train_dir, "--val-data",
              val_dir, "--recipe", "nondeep", "--branches", "2", "--steps", "12", "--batch-size", "64", "--no-progress"]
    code, out, err = run_cli(["train", *common, "--out", str(tmp_path / "full")], capsys)
    assert code == 0, err
    stored = torch.load(tmp_path / "full" / "trainer.pt", weights_only=True)
    import json

    settings = json.loads(stored["extra"]["train_settings"])
    # the join start stays a fraction of the run (JoinSchedule.pretrain_then_join), the pooling the paper's
    assert settings["recipe"] == "nondeep" and settings["join_start"] == 0.5 and settings["mixup"] == 0.8
    assert settings["global_pool"] == "avg"
    assert settings["lr"] == pytest.approx(1e-3 * 64 / 1024)  # linear rule (App. A.3)
    assert settings["repeated_aug"] == 3 and built[0][0].sampler.repeats == 3  # DeiT's RASampler, 3 copies
    model_path = tmp_path / "full" / "model.safetensors"
    assert model_path.exists()


def test_drop_path_on_a_file_source_is_refused_or_reported(tmp_path, capsys):
    import vitfast
    from vitfast.io.trainable import save_trainable

    path = tmp_path / "m.safetensors"
    save_trainable(vitfast.convert.from_timm(tiny_vit(), channel_idle=0.5), path, recipe={})
    code, _, err = run_cli(["train", str(path), "--drop-path", "0.1", "--steps", "2", "--out", str(tmp_path / "r")],
                           capsys)
    assert code == 2 and "--drop-path: only applies when SOURCE is a timm model name" in err
    code, out, err = run_cli(["train", str(path), "--recipe", "repavit", "--steps", "2", "--batch-size", "32",
                              "--no-progress", "--out", str(tmp_path / "r2")], capsys)
    assert code == 0, err
    assert "the recipe's drop-path 0.1 is not applied" in out


def test_cli_dwconv_frozen_stage_changes_only_the_replaced_heads(tmp_path, capsys):
    """Table A.1's second stage as a recipe step: everything but the DW-conv heads (value rows, kernels, output
    projection) keeps its weights."""
    from safetensors.torch import load_file

    model = ["vit_tiny_patch16_224", "--img-size", "16", "--model-kwargs",
             '{"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 4}', "--dwconv-blocks", "[0]",
             "--batch-size", "32", "--no-progress"]
    code, _, err = run_cli(["train", *model, "--steps", "1", "--lr", "1e-9", "--out", str(tmp_path / "a")], capsys)
    assert code == 0, err
    start = str(tmp_path / "a" / "model.safetensors")
    code, out, err = run_cli(["train", start, "--recipe", "dwconv:frozen", "--steps", "3", "--batch-size", "32",
                              "--no-progress", "--out", str(tmp_path / "b")], capsys)
    assert code == 0, err
    before, after = load_file(start), load_file(str(tmp_path / "b" / "model.safetensors"))
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    # block 0: its kernels reach the class token through block 1 (a last block's would not).
    # Table A.1 trains W^V, the kernels and W^O of each replaced block; every other tensor is bit-identical
    assert changed and all(k.startswith(("blocks.0.attn.value.", "blocks.0.attn.proj.", "blocks.0.attn.conv_kernel"))
                           for k in changed), sorted(changed)
    assert "blocks.0.attn.proj.weight" in changed and "blocks.0.attn.conv_kernel" in changed


def test_recipe_method_settings_without_their_method_are_reported(tmp_path, capsys):
    code, out, err = run_cli(["train", "vit_tiny_patch16_224", "--img-size", "16", "--model-kwargs",
                              '{"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 4}', "--recipe", "nondeep",
                              "--steps", "2", "--batch-size", "32", "--no-progress", "--out", str(tmp_path / "r")],
                             capsys)
    assert code == 0, err
    assert "note: not applied from the recipe: the joining schedule (the model has no branches: --branches n)" in out
