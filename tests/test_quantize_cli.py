"""`vitfast quantize`: a fused file -> an int8 / bf16 file, its report, and its one-line errors."""
import json
import re

import pytest
import torch

import vitfast
from vitfast.cli import main
from vitfast.nn.int8 import Int8ChannelIdleFFN, Int8Linear, Int8PatchProjection

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["vit_tiny_patch16_224", "--img-size", "32", "--num-classes", "10",
        "--model-kwargs", json.dumps({"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 8})]


@pytest.fixture(scope="module")
def fused_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("q")
    assert main(["convert", *TINY, "--channel-idle", "0.75", "-o", str(d / "train.safetensors")]) == 0
    assert main(["fuse", str(d / "train.safetensors"), "-o", str(d / "fused.safetensors"), "--no-check"]) == 0
    return d / "fused.safetensors"


def test_help(capsys):
    assert main(["quantize", "--help"]) == 0
    out = capsys.readouterr().out
    for word in ("--calibration", "--activations", "--smooth", "--skip-budget", "--dtype", "docs/quantization.md"):
        assert word in out


def test_dynamic_int8_file(tmp_path, capsys, fused_file):
    out = tmp_path / "int8.safetensors"
    assert main(["quantize", str(fused_file), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "int8: the patch embedding, 2 channel-idle FFNs" in text and "dynamic per token" in text
    model = vitfast.load(out)
    assert sum(isinstance(m, (Int8Linear, Int8ChannelIdleFFN)) for m in model.modules()) == 6
    assert isinstance(model.patch_embed.proj, Int8PatchProjection)


def test_static_smoothed_with_digits_reports_accuracy(tmp_path, capsys, fused_file):
    out = tmp_path / "int8.safetensors"
    assert main(["quantize", str(fused_file), "-o", str(out), "--calibration", "digits", "--activations", "static",
                 "--smooth", "0.5", "--calibration-images", "64"]) == 0
    text = capsys.readouterr().out
    assert "static per tensor" in text and "largest per-layer errors" in text
    assert "digits validation (360 images): top-1 fp32" in text and "argmax agreement" in text


def test_weight_bits_hint_only_where_7_bit_weights_pay(tmp_path, capsys, fused_file, monkeypatch):
    from vitfast.cli.quantize import weight_bits_hint

    assert "--weight-bits 7" in weight_bits_hint("int8", 8, "avx2")
    for args in (("int8", 7, "avx2"), ("bf16", 8, "avx2"), ("int8", 8, "avx_vnni"), ("int8", 8, "amx_int8")):
        assert weight_bits_hint(*args) == ""
    monkeypatch.setattr(vitfast.ops, "int8_kernel", lambda: "avx2")
    assert main(["quantize", str(fused_file), "-o", str(tmp_path / "int8.safetensors")]) == 0
    assert "--weight-bits 7 runs its int8 GEMMs" in capsys.readouterr().out
    assert main(["quantize", str(fused_file), "-o", str(tmp_path / "w7.safetensors"), "--weight-bits", "7"]) == 0
    assert "--weight-bits 7 runs" not in capsys.readouterr().out


def test_bf16_file(tmp_path, fused_file):
    out = tmp_path / "bf16.safetensors"
    assert main(["quantize", str(fused_file), "-o", str(out), "--dtype", "bf16"]) == 0
    assert vitfast.io.read_config(out)["dtype"] == "bfloat16"
    assert next(vitfast.load(out).parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("argv, message", [
    (["--activations", "static"], "--calibration: --activations static needs calibration images"),
    (["--smooth", "x"], "--smooth: expected a migration strength in (0, 1) or 'auto', got 'x'"),
    (["--smooth", "1.5"], "--smooth: expected a migration strength in (0, 1) or 'auto', got 1.5"),
    (["--skip-budget", "0"], "--skip-budget: expected a relative error > 0"),
    (["--calibration", "/nonexistent", "--smooth", "0.5"], "--calibration: expected 'digits' or an image folder"),
    (["--skip", "a", "--skip-budget", "0.1", "--calibration", "digits"], "--skip, --skip-budget: give one"),
])
def test_errors_are_one_line(tmp_path, capsys, fused_file, argv, message):
    out = tmp_path / "x.safetensors"
    assert main(["quantize", str(fused_file), "-o", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not out.exists()


def test_verify_an_int8_file_against_its_fp32_source(tmp_path, capsys, fused_file):
    out = tmp_path / "int8.safetensors"
    assert main(["quantize", str(fused_file), "-o", str(out)]) == 0
    assert main(["verify", str(out), "--source", str(fused_file), "--inputs", "digits", "--min-agreement", "0.9",
                 "--max-drop", "5"]) == 0
    text = capsys.readouterr().out
    assert "relative logit error" in text and "top-1: source" in text and "OK: the int8 model agrees" in text
    # another model (the head negated) is not its source: agreement collapses, exit status 1
    other = tmp_path / "other.safetensors"
    model = vitfast.load(fused_file)
    with torch.no_grad():
        model.head.weight.neg_()
    vitfast.save(model, other)
    assert main(["verify", str(out), "--source", str(other), "--inputs", "digits"]) == 1
    text = capsys.readouterr().out
    assert "MISMATCH: the int8 model" in text
    # the flipped images are listed with their fp32 margins: the first five, then how many more
    agree = int(re.search(r"argmax agreement = (\d+)/360", text).group(1))
    flips = re.search(r"argmax flips: (.*); fp32 median margin", text).group(1)
    assert 360 - agree > 5 and flips.count("fp32 margin") == 5 and f"and {360 - agree - 5} more" in flips


def test_argmax_flips_reports_fp32_margins_and_ranks():
    from vitfast.measure import argmax_flips, flips_text

    ref = torch.tensor([[3.0, 1.0, 0.0], [1.0, 1.05, 0.0], [0.0, 5.0, 2.0], [2.0, 1.9, 0.0]])
    out = torch.tensor([[3.0, 1.0, 0.0], [1.1, 1.0, 0.0], [0.0, 5.0, 2.0], [1.0, 2.0, 0.0]])
    flips = argmax_flips(out, ref)
    # images 1 and 3 flipped; their fp32 margins 0.05 (the smallest: rank 0) and 0.1 (rank 1); median of
    # (2, 0.05, 3, 0.1) is torch's lower median, 0.1
    assert [(f["image"], f["margin_rank"]) for f in flips["flipped"]] == [(1, 0), (3, 1)]
    assert [f["fp32_margin"] for f in flips["flipped"]] == pytest.approx([0.05, 0.1], abs=1e-4)
    assert flips["fp32_median_margin"] == pytest.approx(0.1) and flips["fp32_smallest_margins"] == pytest.approx(
        [0.05, 0.1, 2.0], abs=1e-4)
    assert flips_text(flips, 4).startswith("argmax flips: #1 (fp32 margin 0.050, rank 0 of 4), #3 (fp32 margin 0.100")
    assert flips_text(argmax_flips(ref, ref), 4) == "no argmax flips"
    assert argmax_flips(torch.zeros(2, 1), torch.ones(2, 1))["flipped"] == []  # one class: nothing can flip
