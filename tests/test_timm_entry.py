"""timm-native entry points: from_timm by name, list_models, the CLI's --pretrained/--checkpoint/--version, and
`vitfast.load` naming the files it cannot open (trainer checkpoints, torch zips and pickles) and what opens them."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import vitfast
from vitfast.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_from_timm_builds_a_named_model_with_timm_kwargs():
    from vitfast.arch import source_architecture

    model = vitfast.convert.from_timm("deit_tiny_patch16_224", img_size=32, num_classes=10, channel_idle=0.75)
    assert model.num_classes == 10 and tuple(model.patch_embed.img_size) == (32, 32)
    assert all(b.mlp.active_features == 192 for b in model.blocks)
    assert source_architecture(model) is not None  # remembered as for a built model
    with torch.no_grad():
        assert model.eval()(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_from_timm_names_its_argument_errors():
    with pytest.raises(ValueError, match="did you mean deit_tiny_patch16_224"):
        vitfast.convert.from_timm("deit_tiny_patch16_22")
    import timm

    built = timm.create_model("vit_tiny_patch16_224", img_size=16, depth=2, num_classes=3)
    with pytest.raises(TypeError, match="unexpected keyword arguments chanel_idle"):
        vitfast.convert.from_timm(built, chanel_idle=0.5)
    with pytest.raises(TypeError, match="pretrained: only used with a timm model name"):
        vitfast.convert.from_timm(built, pretrained=True)


_OFFLINE = """
import vitfast
try:
    vitfast.convert.from_timm({name!r}, pretrained=True, img_size=32)
except ConnectionError as exc:
    print("ERROR", exc)
"""


@pytest.mark.parametrize("name", ["deit_tiny_patch16_224", "hf-hub:timm/deit_tiny_patch16_224.fb_in1k"])
def test_offline_pretrained_is_one_line_naming_the_model(name):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _OFFLINE.format(name=name)], env=env, capture_output=True,
                         text=True, timeout=300).stdout
    line = [x for x in out.splitlines() if x.startswith("ERROR")]
    assert len(line) == 1 and name in line[0] and "no network" in line[0] and "checkpoint_path=PATH" in line[0], out


def test_list_models_per_method():
    found = vitfast.list_models("deit_tiny*")
    assert set(found) == {"repavit", "nondeep", "dwconv", "usdc", "distill"}
    assert "deit_tiny_patch16_224" in found["usdc"] and "deit_tiny_distilled_patch16_224" in found["repavit"]
    swin = vitfast.list_models("swin_tiny_patch4_window7_224")
    assert swin["repavit"] == swin["distill"] == ["swin_tiny_patch4_window7_224"] and not swin["nondeep"]
    # refused by the conversion itself: tanh-GELU (SigLIP), parallel blocks, hybrid CNN stems
    assert not vitfast.list_models("vit_so400m_patch16_siglip_256", method="repavit")
    assert not vitfast.list_models("vit_small_patch16_18x2_224", method="repavit")
    assert not vitfast.list_models("vit_small_r26_s32_224", method="repavit")
    with pytest.raises(ValueError, match="method: expected one of"):
        vitfast.list_models(method="nope")


def test_cli_version_and_list_models(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip().startswith(f"vitfast {vitfast.__version__} (torch ")
    assert main(["convert", "--list-models", "deit_tiny*"]) == 0
    assert "repavit (2): deit_tiny_distilled_patch16_224 deit_tiny_patch16_224" in capsys.readouterr().out


def test_cli_pretrained_is_a_switch_and_checkpoint_a_path(tmp_path, capsys):
    argv = ["convert", "deit_tiny_patch16_224", "--img-size", "32", "-o", str(tmp_path / "c.safetensors")]
    assert main([*argv, "--pretrained", "--checkpoint", __file__]) == 2
    assert "--pretrained, --checkpoint: timm's weights or local ones, got both" in capsys.readouterr().err
    assert main([*argv, "--pretrained", "no_such_file.pth"]) == 2
    assert "--pretrained: a switch" in capsys.readouterr().err


def test_load_map_location_is_device(tmp_path):
    from vitfast.io.fused import load

    with pytest.raises(ValueError, match="map_location: another name for device, got both"):
        load(tmp_path / "x", device="cpu", map_location="meta")
    with pytest.raises(ValueError, match="map_location: expected a torch device"):
        load(tmp_path / "x", map_location="nonsense")
    with pytest.raises(FileNotFoundError):  # accepted: the path is checked next
        load(tmp_path / "x", map_location="cpu")


def test_load_names_torch_files_and_what_opens_them(tmp_path):
    from vitfast.io.trainer_checkpoint import save_trainer_checkpoint

    trainer = tmp_path / "trainer.pt"
    save_trainer_checkpoint({"format": "vitfast-trainer", "version": 1, "model": {"w": torch.ones(2)}}, trainer)
    plain = tmp_path / "plain.pt"
    torch.save({"w": torch.ones(2)}, plain)
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(2)}, legacy, _use_new_zipfile_serialization=False)
    cases = [(trainer, "a vitfast trainer checkpoint", "vitfast.io.load_trainer_checkpoint"),
             (plain, "a torch zip archive", "torch.load(path, weights_only=True)"),
             (legacy, "a legacy torch pickle", "torch.load(path, weights_only=True)")]
    for path, what, opener in cases:
        for reader in (vitfast.load, vitfast.io.read_config, vitfast.io.load_trainable):
            with pytest.raises(ValueError) as info:
                reader(path)
            assert what in str(info.value) and opener in str(info.value) and "corrupt" not in str(info.value)
