"""The recipes wired to the method options: γ's weight decay reaches every optimizer path (plain AdamW groups,
timm's optimizers, layer-wise lr decay), and `vitfast train --recipe` applies the non-deep pooling and joining,
DW-conv's γ decay and frozen stage, and USDC's single learning rate."""
import json

import pytest
import torch

from helpers import recipe_tiny_vit as tiny_vit, run_cli
import vitfast
from vitfast.methods.dwconv import set_gamma_weight_decay
from vitfast.training.data import digits_loaders
from vitfast.training.schedules import no_decay_names, param_groups
from vitfast.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = ["vit_tiny_patch16_224", "--img-size", "16", "--model-kwargs",
         '{"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 4}']


def print_lines(argv, capsys):
    code, out, err = run_cli(["train", *argv, "--print"], capsys)
    assert code == 0, err
    return {line.split()[0]: line for line in out.splitlines()[1:]}


def ensembled():
    """A DW-conv model with γ (head ensembling) in one block."""
    return vitfast.convert.from_timm(tiny_vit(), dwconv_blocks=[1], dwconv_ensemble=True)


def decay_of(optimizer, p):
    (group,) = [g for g in optimizer.param_groups if any(q is p for q in g["params"])]
    return group["weight_decay"]


# ---------------------------------------------------------------------------------------------- γ weight decay
def test_gamma_is_decayed_by_default_in_every_optimizer_path():
    model = ensembled()
    attn = model.blocks[1].attn
    assert attn.gamma is not None and attn.gamma.ndim == 1
    assert "blocks.1.attn.gamma" not in no_decay_names(model)  # decayed although 1-D (App. A.2.1)
    assert "blocks.1.attn.conv_kernel" in no_decay_names(model) and "blocks.1.norm1.weight" in no_decay_names(model)
    decayed = {id(p) for g in param_groups(model, 0.05) if g["weight_decay"] == 0.05 for p in g["params"]}
    assert id(attn.gamma) in decayed and id(attn.conv_kernel) not in decayed

    train, _ = digits_loaders(img_size=16, batch_size=32)
    plain = Trainer(model, train, total_steps=2, progress=False)
    lamb = Trainer(model, train, total_steps=2, optimizer="lamb", lr_schedule="timm", progress=False)
    layered = Trainer(model, train, total_steps=2, optimizer="lamb", layer_decay=0.85, progress=False)
    for trainer in (plain, lamb, layered):
        assert decay_of(trainer.optimizer, attn.gamma) == 0.05
        assert decay_of(trainer.optimizer, attn.conv_kernel) == 0.0
        assert decay_of(trainer.optimizer, model.blocks[1].norm1.weight) == 0.0
    # layer decay: γ keeps its layer's lr scale when it moves to the decay group
    scale = {id(p): g["lr_scale"] for g in layered.optimizer.param_groups for p in g["params"]}
    assert scale[id(attn.gamma)] == scale[id(attn.conv_kernel)] == scale[id(attn.value.weight)]
    assert sum(len(g["params"]) for g in layered.optimizer.param_groups) == sum(
        1 for p in model.parameters() if p.requires_grad)

    assert set_gamma_weight_decay(model, False) == 1  # vitfast's earlier rule: γ excluded again
    assert "blocks.1.attn.gamma" in no_decay_names(model)
    for trainer in (Trainer(model, train, total_steps=2, progress=False),
                    Trainer(model, train, total_steps=2, optimizer="lamb", layer_decay=0.85, progress=False)):
        assert decay_of(trainer.optimizer, attn.gamma) == 0.0


def test_a_resumed_dwconv_run_keeps_gammas_optimizer_group(tmp_path, capsys):
    """The train-time description records γ's choice: a run resumes with the optimizer groups it saved (a file from
    before the option rebuilds with γ excluded, as it was trained)."""
    base = [*MODEL, "--dwconv-blocks", "[1]", "--ensemble", "--batch-size", "32", "--no-progress", "--steps", "4"]
    code, _, err = run_cli(["train", *base, "--checkpoint-every", "2", "--out", str(tmp_path / "r")], capsys)
    assert code == 0, err
    stored = torch.load(tmp_path / "r" / "trainer.pt", weights_only=True)
    desc = json.loads(stored["extra"]["model_description"])
    assert desc["dwconv"]["blocks"][0]["decay_gamma"] is True
    groups = stored["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0]
    # the optimizer state loads into the rebuilt model's groups (a mismatch raises in load_state_dict)
    code, out, err = run_cli(["train", "--resume", str(tmp_path / "r" / "trainer.pt"), "--no-progress"], capsys)
    assert code == 0, err
    assert "nothing to train" in out
    from vitfast.io.trainable import build_trainable

    del desc["dwconv"]["blocks"][0]["decay_gamma"]
    old = build_trainable(desc)
    assert "blocks.1.attn.gamma" in no_decay_names(old)


# ---------------------------------------------------------------------------------------------- --print
@pytest.mark.parametrize("recipe,keys", [
    ("nondeep", {"global_pool": "avg", "join_start_fraction": "0.5", "join_steps": "0.166667",
                 "join_schedule": "linear", "diversity_weight": "0.05"}),
    ("dwconv", {"gamma_weight_decay": "True", "remove_cls": "True", "dwconv_cls": "exclude",
                "freeze_backbone": "False"}),
    ("dwconv:frozen", {"freeze_backbone": "True", "gamma_weight_decay": "True"}),
    ("usdc", {"arch_lr_scale": "1"}),
])
def test_print_shows_the_method_settings_applied_with_their_sources(recipe, keys, capsys):
    lines = print_lines(["--recipe", recipe], capsys)
    for key, value in keys.items():
        fields = lines[key].split()
        assert fields[1] == value and "recipe:" in lines[key], lines[key]
        assert "not applied yet" not in lines[key], lines[key]
    assert "repeated_aug" not in lines or "not applied" not in lines["repeated_aug"]  # every recipe key applies
    if recipe == "nondeep":
        assert "sec. 4" in lines["global_pool"] and "--global-pool" in lines["global_pool"]
        assert "pretrain_then_join" in lines["join_start_fraction"]
    if recipe.startswith("dwconv"):
        assert "App. A.2.1" in lines["gamma_weight_decay"]
        assert "vitfast select-heads --cls exclude" in lines["dwconv_cls"]
    if recipe == "dwconv:frozen":
        assert "Table A.1" in lines["freeze_backbone"] and "freeze_backbone" in lines["freeze_backbone"]
    if recipe == "usdc":
        assert "--arch-lr-scale" in lines["arch_lr_scale"] and "one learning rate" in lines["arch_lr_scale"]


def test_an_explicit_global_pool_overrides_the_recipe(capsys):
    lines = print_lines(["--recipe", "nondeep", "--global-pool", "token"], capsys)
    assert lines["global_pool"].split()[1] == "token" and "explicit" in lines["global_pool"]
    lines = print_lines(["--recipe", "nondeep", "--join-start", "0.25"], capsys)
    assert "not used: --join-start 0.25 given" in lines["join_start_fraction"]


# ---------------------------------------------------------------------------------------------- runs
def test_nondeep_recipe_builds_the_avg_pool_model_and_joins_after_half_the_run(tmp_path, capsys):
    from vitfast.io.trainable import load_trainable
    from vitfast.methods.nondeep.schedule import JoinSchedule

    code, out, err = run_cli(["train", *MODEL, "--branches", "2", "--recipe", "nondeep", "--steps", "4",
                              "--batch-size", "32", "--no-progress", "--out", str(tmp_path / "r")], capsys)
    assert code == 0, err
    assert "not applied from the recipe" not in out
    settings = json.loads(torch.load(tmp_path / "r" / "trainer.pt", weights_only=True)["extra"]["train_settings"])
    assert settings["global_pool"] == "avg" and settings["join_start"] == 0.5
    model, recipe = load_trainable(str(tmp_path / "r" / "model.safetensors"))
    assert recipe["global_pool"] == "avg"
    assert model.cls_token is None and model.global_pool == "avg"  # no class token: the mean of the patch tokens
    assert model.patch_embed.num_patches == model.pos_embed.shape[1]
    paper = JoinSchedule.pretrain_then_join(0.5)
    for total in (4, 60, 600):
        assert [model.blocks[0].schedule(s, total) for s in range(total + 1)] == \
               [paper(s, total) for s in range(total + 1)]
    # an explicit --global-pool wins; on a file source the recipe's pooling is reported, not applied
    code, _, err = run_cli(["train", *MODEL, "--branches", "2", "--recipe", "nondeep", "--global-pool", "token",
                            "--steps", "2", "--batch-size", "32", "--no-progress", "--out", str(tmp_path / "t")],
                           capsys)
    assert code == 0, err
    assert load_trainable(str(tmp_path / "t" / "model.safetensors"))[0].cls_token is not None
    code, out, err = run_cli(["train", str(tmp_path / "r" / "model.safetensors"), "--recipe", "nondeep", "--steps",
                              "2", "--batch-size", "32", "--no-progress", "--out", str(tmp_path / "f")], capsys)
    assert code == 0, err
    assert "note: not applied from the recipe: global_pool='avg' (only for a non-deep model built from a timm name" \
        in out


def test_dwconv_frozen_recipe_from_a_timm_name_trains_only_the_heads(tmp_path, capsys):
    """--recipe dwconv:frozen on a model built here: the optimizer holds only the heads' parameters, and the
    stored optimizer state has γ (ensembled) in the decayed group."""
    from vitfast.cli import _paper_recipe

    built = {}
    real = _paper_recipe._freeze_backbone

    def spy(model):
        real(model)
        built["model"] = model
        built["before"] = {n: p.detach().clone() for n, p in model.named_parameters()}

    import unittest.mock as mock

    with mock.patch.object(_paper_recipe, "_freeze_backbone", spy):
        code, out, err = run_cli(["train", *MODEL, "--dwconv-blocks", "[0]", "--ensemble", "--recipe",
                                  "dwconv:frozen", "--steps", "3", "--batch-size", "32", "--no-progress", "--out",
                                  str(tmp_path / "r")], capsys)
    assert code == 0, err
    model, before = built["model"], built["before"]
    assert model.cls_token is None  # the recipe's class-token removal (App. A.3.2)
    heads = ("blocks.0.attn.value.", "blocks.0.attn.proj.", "blocks.0.attn.conv_kernel", "blocks.0.attn.gamma")
    for name, p in model.named_parameters():
        same = torch.equal(before[name], p.detach().cpu())
        assert same != name.startswith(heads), name  # the heads moved, every other parameter is bit-identical
    groups = torch.load(tmp_path / "r" / "trainer.pt", weights_only=True)["optimizer"]["param_groups"]
    assert sum(len(g["params"]) for g in groups) == sum(1 for p in model.parameters() if p.requires_grad)
    assert decay_of_index(groups, model, "blocks.0.attn.gamma") == 0.05


def decay_of_index(groups, model, name):
    """The weight decay of parameter `name` in a saved optimizer state (params numbered over the trainable ones in
    `param_groups` order: decayed, then no-decay)."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    skip = no_decay_names(model)
    order = [n for n, _ in trainable if n not in skip] + [n for n, _ in trainable if n in skip]
    index = order.index(name)
    (group,) = [g for g in groups if index in g["params"]]
    return group["weight_decay"]


def test_gamma_weight_decay_false_from_a_recipe_excludes_gamma(capsys):
    from vitfast.cli._paper_recipe import method_keys_after_model

    model = ensembled()
    method_keys_after_model(model, {"recipe_method": {"gamma_weight_decay": False}}, 10)
    assert model.blocks[1].attn.decay_gamma is False and "blocks.1.attn.gamma" in no_decay_names(model)
    method_keys_after_model(model, {"recipe_method": {"gamma_weight_decay": True}}, 10)
    assert model.blocks[1].attn.decay_gamma is True  # a file converted before the option follows the paper too
    plain = tiny_vit()
    method_keys_after_model(plain, {"recipe_method": {"gamma_weight_decay": False}}, 10)
    assert "not applied from the recipe: γ's weight decay (the model has no DW-conv heads)" in capsys.readouterr().out


def test_usdc_recipe_trains_with_one_learning_rate(tmp_path, capsys):
    from vitfast.cli import main

    d = str(tmp_path)
    assert main(["convert", "vit_tiny_patch16_224", "--img-size", "16", "--num-classes", "10", "--model-kwargs",
                 '{"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 4}', "--gates", "--flops-target", "0.6",
                 "-o", f"{d}/g.safetensors"]) == 0
    for flags, scale in (([], 1.0), (["--arch-lr-scale", "10"], 10.0)):
        out = f"{d}/r{int(scale)}"
        code, _, err = run_cli(["train", f"{d}/g.safetensors", "--recipe", "usdc", *flags, "--steps", "2",
                                "--batch-size", "16", "--no-progress", "--out", out], capsys)
        assert code == 0, err
        stored = torch.load(f"{out}/trainer.pt", weights_only=True)
        assert json.loads(stored["extra"]["train_settings"])["arch_lr_scale"] == scale
        peaks = sorted({g["initial_lr"] for g in stored["optimizer"]["param_groups"] if "initial_lr" in g}
                       or {g["lr"] for g in stored["optimizer"]["param_groups"]})
        assert len(peaks) == (1 if scale == 1.0 else 2), peaks
        if scale != 1.0:
            assert peaks[1] == pytest.approx(scale * peaks[0])


def test_a_run_stored_before_the_rules_resumes_on_its_own_groups(tmp_path, capsys, monkeypatch):
    """A dwconv:frozen run written before γ's `_weight_decay` was honoured and before the frozen stage trained W^O
    (no `param_rules` in its settings): its optimizer state holds those groups, and --resume rebuilds them."""
    from vitfast.cli import _paper_recipe
    from vitfast.io.trainer_checkpoint import load_trainer_checkpoint, save_trainer_checkpoint
    from vitfast.training import schedules

    new_rules = schedules.no_decay_names
    real_freeze = _paper_recipe._freeze_backbone
    with monkeypatch.context() as m:  # the earlier code: every 1-D parameter excluded, W^O frozen
        m.setattr(schedules, "no_decay_names", lambda model: new_rules(model) | {
            n for n, p in model.named_parameters() if p.ndim <= 1})
        m.setattr(_paper_recipe, "_freeze_backbone", lambda model: real_freeze(model, legacy=True))
        code, _, err = run_cli(["train", *MODEL, "--dwconv-blocks", "[0]", "--ensemble", "--recipe", "dwconv:frozen",
                                "--steps", "2", "--batch-size", "32", "--no-progress", "--out", str(tmp_path / "r")],
                               capsys)
    assert code == 0, err
    path = str(tmp_path / "r" / "trainer.pt")
    state = load_trainer_checkpoint(path)
    settings = json.loads(state["extra"]["train_settings"])
    assert settings.pop("param_rules") == _paper_recipe.PARAM_RULES
    # with today's rules the stored groups do not fit: the optimizer refuses the state
    code, _, err = run_cli(["train", "--resume", path, "--no-progress"], capsys)
    assert code == 2 and "doesn't match the size of optimizer's group" in err
    state["extra"]["train_settings"] = json.dumps(settings)
    save_trainer_checkpoint(state, path)
    code, out, err = run_cli(["train", "--resume", path, "--no-progress"], capsys)
    assert code == 0, err
    assert "nothing to train" in out
