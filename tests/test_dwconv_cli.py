"""Drop-in DW-conv models through the train-time file format and the command line.

`vitfast.io.save_trainable` / `load_trainable` keep a DW-conv train-time model exactly (blockwise, mixed,
ensembled, cls kept or removed, composed with channel-idle FFNs: the same outputs after a reload), a Trainer
checkpoint rebuilds it, and `vitfast select-heads` -> `convert --dwconv-*` -> `train` (a few steps on the
digits) -> `fuse` gives a fused model equal to the trained train-time model in eval mode.  Few steps: these check
the paths, not the accuracy.
"""
import json

import pytest
import torch
from helpers import assert_close_scaled, randomize
from test_dwconv_modules import CASES, images, vit

import vitfast
from vitfast.cli import main
from vitfast.methods.dwconv import DWConvAttention, DWConvBlock
from vitfast.nn import FusedDWConvBlock
from vitfast.io.trainable import build_trainable, describe_trainable, load_trainable, save_trainable

pytestmark = pytest.mark.usefixtures("one_thread")

# 2 blocks of 2 heads on a 4×4 token grid (16-pixel digits, 4-pixel patches).
TINY = ["vit_tiny_patch16_224", "--img-size", "16",
        "--model-kwargs", json.dumps({"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 4})]


def _trained_like(model):
    randomize(model, seed=4)  # BatchNorm statistics / norms of a trained model
    with torch.no_grad():
        for m in model.modules():  # the kernels and γ too
            if isinstance(m, DWConvAttention):
                m.conv_kernel.normal_(0, 0.5)
                if m.gamma is not None:
                    m.gamma.normal_()
    return model


# ---------------------------------------------------------------------------------------------- file format
# Every block replaced: the skeleton then has no timm Attention to read num_heads / qkv_bias from.
ROUND_TRIP = {**{k: ({}, v) for k, v in CASES.items()},
              "every_block_no_qkv_bias": (dict(qkv_bias=False), dict(dwconv_blocks=[0, 1, 2])),
              "every_block_mixed_ensembled": ({}, dict(dwconv_heads={0: [1], 1: [0, 3], 2: [2]}, dwconv_ensemble=True))}


@pytest.mark.parametrize("case", list(ROUND_TRIP))
def test_train_time_save_load_round_trip(case, tmp_path):
    model_kwargs, convert_kwargs = ROUND_TRIP[case]
    model = vit(**model_kwargs)
    converted = _trained_like(vitfast.convert.from_timm(model, **convert_kwargs))
    desc = describe_trainable(converted)
    assert desc["dwconv"]["blocks"], desc.get("dwconv")
    path = tmp_path / "dw.safetensors"
    save_trainable(converted, path, recipe={"case": case})
    loaded, recipe = load_trainable(path)
    assert recipe == {"case": case}
    x = images(model, batch=3)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), converted.eval()(x), atol=0, rtol=0)
    for name, m in converted.named_modules():
        if isinstance(m, DWConvAttention):
            got = loaded.get_submodule(name)
            assert (got.conv_heads, got.kernel_size, got.ensemble, got.grid_size) == (
                m.conv_heads, m.kernel_size, m.ensemble, m.grid_size)
    # the trained kernels are excluded from weight decay after a reload too
    assert set(type(loaded.get_submodule(b["path"])).__name__ for b in desc["dwconv"]["blocks"]) == {"DWConvBlock"}
    assert describe_trainable(loaded) == desc


def test_description_rebuilds_through_a_trainer_checkpoint_description():
    converted = vitfast.convert.from_timm(vit(), dwconv_heads={1: [0, 2]}, dwconv_ensemble=True)
    desc = json.loads(json.dumps(describe_trainable(converted)))  # what `vitfast train` stores in trainer.pt
    rebuilt = build_trainable(desc)
    rebuilt.load_state_dict(converted.state_dict())
    x = images(converted)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(x), converted.eval()(x), atol=0, rtol=0)
    assert rebuilt.blocks[1].attn.conv_heads == (0, 2) and rebuilt.blocks[1].attn.ensemble


def test_corrupt_dwconv_entry_is_a_clear_error():
    converted = vitfast.convert.from_timm(vit(), dwconv_blocks=[1])
    desc = describe_trainable(converted)
    desc["dwconv"]["blocks"][0]["path"] = "blocks.0.mlp"
    with pytest.raises(ValueError, match="expected a ChannelIdleBlock at 'blocks.0.mlp'"):
        build_trainable(desc)
    desc["dwconv"] = {"blocks": []}
    with pytest.raises(ValueError, match="\\['dwconv'\\]\\['blocks'\\]: expected at least one block"):
        build_trainable(desc)
    del desc["dwconv"]
    # without the entry the rebuilt model lacks the DW-conv block, and the type check says where
    with pytest.raises(ValueError, match="blocks.1 \\(DWConvBlock described, ChannelIdleBlock rebuilt\\)"):
        build_trainable(desc)


# ---------------------------------------------------------------------------------------------- command line
def _fused_equals_trained(fused_path, trained_path, img_size=16):
    fused = vitfast.load(fused_path)
    trained, _ = load_trainable(trained_path)
    x = torch.randn(3, 3, img_size, img_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_close_scaled(fused(x), trained(x))
    return fused, trained


def test_help_lists_the_dwconv_options(capsys):
    for command in ("convert", "train"):
        assert main([command, "--help"]) == 0
        out = capsys.readouterr().out
        for flag in ("--dwconv-blocks", "--dwconv-heads", "--ranking", "--dwconv-kernel", "--ensemble", "--remove-cls"):
            assert flag in out, (command, flag)


def test_select_heads_convert_train_fuse(tmp_path, capsys):
    ranking = tmp_path / "ranking.json"
    assert main(["select-heads", *TINY, "--num-classes", "10", "--num-samples", "16", "--batch-size", "8",
                 "-o", str(ranking), "--no-progress"]) == 0
    scores = json.loads(ranking.read_text())
    lowest = vitfast.methods.dwconv.HeadRanking.from_dict(scores).select_blocks(1)
    capsys.readouterr()

    src = tmp_path / "dw.safetensors"
    # the lowest-Σ_b block all conv, plus head 1 of the other block (a mixed block)
    other = 1 - lowest[0]
    assert main(["convert", *TINY, "--num-classes", "10", "--dwconv-blocks", "1", "--ranking", str(ranking),
                 "--dwconv-heads", json.dumps([[other, 1]]), "-o", str(src)]) == 0
    out = capsys.readouterr().out
    assert "DW-conv heads (k=3, grid 4x4)" in out, out
    model, recipe = load_trainable(src)
    assert isinstance(model.blocks[lowest[0]], DWConvBlock) and model.blocks[lowest[0]].attn.attn_heads == ()
    assert model.blocks[other].attn.conv_heads == (1,) and model.blocks[other].attn.attn_heads == (0,)
    assert recipe["dwconv_blocks"] == 1 and recipe["ranking"] == "ranking.json" and recipe["channel_idle"] is None
    # With the cls token kept and read by the head, the last block's conv kernels get no gradient: its replaced
    # heads give the cls token the kernel-free mean of their values (see the README).  The earlier blocks' train.
    last = f"blocks.{len(model.blocks) - 1}."
    kernels_before = {n: p.clone() for n, p in model.named_parameters()
                      if n.endswith("conv_kernel") and not n.startswith(last)}
    assert kernels_before

    run = tmp_path / "run"
    assert main(["train", str(src), "--steps", "3", "--batch-size", "16", "--out", str(run), "--no-progress"]) == 0
    trained, _ = load_trainable(run / "model.safetensors")
    for n, before in kernels_before.items():
        assert not torch.equal(trained.get_parameter(n), before), f"{n} did not train"
    fused_path = tmp_path / "fused.safetensors"
    assert main(["fuse", str(run / "model.safetensors"), "-o", str(fused_path)]) == 0
    fused, _ = _fused_equals_trained(fused_path, run / "model.safetensors")
    assert sum(isinstance(m, FusedDWConvBlock) for m in fused.modules()) == 2
    assert main(["verify", str(fused_path), "--source", str(run / "trainer.pt"), "--inputs", "digits"]) == 0
    assert "OK: the fused model matches its source" in capsys.readouterr().out


def test_ensembled_cls_removed_channel_idle_k5(tmp_path, capsys):
    src = tmp_path / "dw.safetensors"
    assert main(["convert", *TINY, "--num-classes", "10", "--dwconv-blocks", "[0, 1]", "--ensemble", "--remove-cls",
                 "--dwconv-kernel", "5", "--channel-idle", "0.5", "-o", str(src)]) == 0
    model, recipe = load_trainable(src)
    assert model.cls_token is None and model.global_pool == "avg"
    assert all(b.attn.ensemble and b.attn.kernel_size == 5 for b in model.blocks)
    assert model.blocks[0].mlp.active_features == 64 and model.blocks[0].mlp.norm_type == "batch"
    assert recipe["ensemble"] and recipe["remove_cls"] and recipe["channel_idle"] == 0.5
    run = tmp_path / "run"
    assert main(["train", str(src), "--steps", "2", "--batch-size", "16", "--out", str(run), "--no-progress"]) == 0
    fused_path = tmp_path / "fused.safetensors"
    assert main(["fuse", str(run / "model.safetensors"), "-o", str(fused_path)]) == 0
    fused, _ = _fused_equals_trained(fused_path, run / "model.safetensors")
    assert all(b.conv_width == 16 for b in fused.blocks)  # ensembled: one head of width d_h


def test_train_a_timm_name_with_dwconv_options_and_resume(tmp_path, capsys):
    run = tmp_path / "run"
    heads = json.dumps({"0": [0]})
    assert main(["train", *TINY, "--dwconv-heads", heads, "--steps", "4", "--checkpoint-every", "2",
                 "--batch-size", "16", "--out", str(run), "--no-progress"]) == 0
    model, recipe = load_trainable(run / "model.safetensors")
    assert model.blocks[0].attn.conv_heads == (0,) and not isinstance(model.blocks[1], DWConvBlock)
    assert recipe["dwconv_heads"] == {"0": [0]}
    settings = json.loads(torch.load(run / "trainer.pt", weights_only=True)["extra"]["train_settings"])
    assert settings["dwconv_heads"] == {"0": [0]}
    # resume keeps the recipe; giving the same option again is accepted, another value is refused
    assert main(["train", "--resume", str(run / "trainer.pt"), "--dwconv-heads", heads, "--no-progress"]) == 0
    assert main(["train", "--resume", str(run / "trainer.pt"), "--dwconv-heads", "[[1, 0]]", "--no-progress"]) == 2
    assert "--dwconv-heads was" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["convert", *TINY, "--ranking", "RANKING", "-o", "OUT"], "--ranking: only used with --dwconv-blocks"),
    (["convert", *TINY, "--dwconv-blocks", "1", "-o", "OUT"], "dwconv_blocks: a count needs `ranking`"),
    (["convert", *TINY, "--dwconv-blocks", "[5]", "-o", "OUT"], "expected block indices in \\[0, 2\\)"),
    (["convert", *TINY, "--dwconv-heads", "x", "-o", "OUT"], "--dwconv-heads: expected a head count"),
    (["convert", *TINY, "--dwconv-blocks", "[0]", "--dwconv-kernel", "4", "-o", "OUT"], "expected an odd kernel"),
    (["convert", *TINY, "--dwconv-blocks", "[0]", "--gates", "-o", "OUT"], "--gates: not supported together"),
    (["convert", *TINY, "--dwconv-blocks", "[0]", "--norm", "layer", "-o", "OUT"], "--norm: only used with"),
    (["convert", *TINY, "--dwconv-blocks", "[0]", "--heuristic", "linear", "-o", "OUT"],
     "--heuristic: only used with --channel-idle"),
    (["convert", *TINY, "--gates", "--heuristic", "linear", "-o", "OUT"], "--heuristic: only used with --channel-idle"),
    (["convert", *TINY, "--gates", "--remove-cls", "-o", "OUT"], "--gates: not supported together with --remove-cls yet"),
    (["train", "SRC", "--dwconv-blocks", "[0]", "--out", "RUN"], "--dwconv-blocks: only applies when SOURCE"),
    (["train", *TINY, "--dwconv-blocks", "[0]", "--branches", "2", "--out", "RUN"], "not supported together with --branches"),
])
def test_bad_dwconv_options_give_a_clean_error(tmp_path, capsys, argv, message):
    ranking = tmp_path / "r.json"
    ranking.write_text("{}")
    src = tmp_path / "src.safetensors"
    save_trainable(vitfast.convert.from_timm(vit(), dwconv_blocks=[0]), src)
    subst = {"RANKING": str(ranking), "OUT": str(tmp_path / "o.safetensors"), "SRC": str(src), "RUN": str(tmp_path / "run")}
    argv = [subst.get(a, a) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) <= 2, err
    assert __import__("re").search(message, err), err


def test_non_square_model_through_the_command_line(tmp_path, capsys):
    """A 32×48 model: the CLI took only the height of `patch_embed.img_size`, so fuse's quick check, select-heads
    and train fed it square images (timm: "Input width (32) doesn't match model (48)")."""
    kwargs = ["--model-kwargs", json.dumps({"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 8,
                                            "img_size": [32, 48]})]
    ranking, model = tmp_path / "r.json", tmp_path / "ns.safetensors"
    assert main(["select-heads", "vit_tiny_patch16_224", "--num-classes", "10", *kwargs, "--num-samples", "8",
                 "-o", str(ranking), "--no-progress"]) == 0
    assert main(["convert", "vit_tiny_patch16_224", "--num-classes", "10", *kwargs, "--dwconv-blocks", "1",
                 "--ranking", str(ranking), "-o", str(model)]) == 0
    assert main(["train", str(model), "--steps", "1", "--batch-size", "8", "--out", str(tmp_path / "run"),
                 "--no-progress"]) == 0
    trained, fused = tmp_path / "run" / "model.safetensors", tmp_path / "f.safetensors"
    assert main(["fuse", str(trained), "-o", str(fused)]) == 0
    assert main(["verify", str(fused), "--source", str(trained)]) == 0
    assert "images of 3x32x48" in capsys.readouterr().out
