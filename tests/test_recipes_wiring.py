"""The recipes wired to the method options: γ's weight decay reaches every optimizer path (plain AdamW groups,
timm's optimizers, layer-wise lr decay), and `vitfast train --recipe` applies the non-deep pooling and joining,
DW-conv's γ decay and frozen stage, and USDC's single learning rate."""
import json

import pytest
import torch

import vitfast
from vitfast.methods.dwconv import DWConvAttention, set_gamma_weight_decay
from vitfast.training.data import digits_loaders
from vitfast.training.schedules import no_decay_names, param_groups
from vitfast.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = ["vit_tiny_patch16_224", "--img-size", "16", "--model-kwargs",
         '{"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 4}']


def tiny_vit(seed=0, **kw):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    cfg = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    cfg.update(kw)
    return VisionTransformer(**cfg)


def run_cli(argv, capsys):
    from vitfast.cli import main

    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


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
