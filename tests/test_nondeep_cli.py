"""The command line for non-deep ViTs: `vitfast train --branches n` with the join-schedule options (progressive
joining on the digits), resume, fuse + verify of the result, attention distillation from a teacher, `vitfast
bench MODEL --branches n`, `vitfast demo --nondeep`, and clean errors.  Few steps: these check the paths, not the
accuracy (README: the recipe for the accuracy comparison)."""
import json

import pytest
import torch

from vitfast.cli import main
from vitfast.methods.nondeep.modules import NonDeepBlock
from vitfast.io.trainable import load_trainable

# L = 2 timm blocks -> 1 non-deep block of 2 branches.
TINY = ["vit_tiny_patch16_224", "--img-size", "16",
        "--model-kwargs", json.dumps({"depth": 2, "embed_dim": 32, "num_heads": 2, "patch_size": 4})]

pytestmark = pytest.mark.usefixtures("one_thread")


def _blocks(path):
    model, recipe = load_trainable(path)
    return [m for m in model.modules() if isinstance(m, NonDeepBlock)], recipe


def test_help_lists_the_nondeep_options(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--branches", "--join-schedule", "--join-start", "--join-steps", "--adjust-steps",
                 "--diversity-weight", "--distill-teacher", "--join-values"):
        assert flag in out, flag
    assert main(["bench", "--help"]) == 0
    assert "--branches" in capsys.readouterr().out


def test_train_progressive_joining_then_fuse_and_verify(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--branches", "2", "--steps", "8", "--join-start", "2", "--join-steps", "4",
                 "--join-schedule", "cosine", "--diversity-weight", "0.1", "--eval-every", "4",
                 "--checkpoint-every", "4", "--out", str(run), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "non-deep: 1 blocks x 2 branches" in out and "kind='cosine', warmup_steps=4" in out and "val acc" in out
    blocks, recipe = _blocks(run / "model.safetensors")
    assert len(blocks) == 1 and blocks[0].num_branches == 2 and recipe["branches"] == 2
    assert float(blocks[0].lam) == 1.0  # joining finished (the Trainer's final set_step)
    sched = blocks[0].schedule
    assert (sched.kind, sched.warmup_steps, sched.start_step) == ("cosine", 4, 2)
    assert blocks[0].extra_loss_weight == pytest.approx(0.1)
    # λ at a mid-joining step follows the schedule: step 4 is t = (4 - 2) / 4 = 0.5 -> cosine 0.5
    assert sched(4, 8) == pytest.approx(0.5)

    fused = str(tmp_path / "fused.safetensors")
    assert main(["fuse", str(run / "model.safetensors"), "-o", fused]) == 0
    assert main(["verify", fused, "--source", str(run / "model.safetensors"), "--inputs", "digits"]) == 0
    assert "OK: the fused model matches its source" in capsys.readouterr().out

    # resume keeps the schedule settings; changing one is refused, naming both values
    assert main(["train", "--resume", str(run / "trainer.pt"), "--join-steps", "3", "--no-progress"]) == 2
    assert "--join-steps was 4, got 3" in capsys.readouterr().err
    # --branches on a file: the hint used to send the user to `vitfast convert --branches`, which does not exist
    assert main(["train", str(run / "model.safetensors"), "--branches", "2", "--steps", "1", "--out",
                 str(tmp_path / "again"), "--no-progress"]) == 2
    assert "`vitfast train MODEL_NAME --branches n`; `vitfast convert` has no --branches" in capsys.readouterr().err


def test_adjust_steps_sets_the_joining_length(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--branches", "2", "--steps", "6", "--adjust-steps", "2", "--join-values",
                 "--out", str(run), "--no-progress"]) == 0
    blocks, recipe = _blocks(run / "model.safetensors")
    assert blocks[0].schedule.warmup_steps == 4 and blocks[0].attn.join_values and recipe["join_values"]


@pytest.mark.parametrize("options", [["--join-start", "4", "--join-steps", "100"], ["--adjust-steps", "-1"]],
                         ids=["joins-after-the-run", "negative-adjust"])
def test_joining_must_end_within_the_run(tmp_path, capsys, options):
    """λ < 1 at the last step: the run once "finished" (status 0, "next: vitfast fuse") and fuse then refused."""
    run = tmp_path / "run"
    assert main(["train", *TINY, "--branches", "2", "--steps", "6", *options, "--out", str(run), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "the model fuses only once λ = 1" in err or "--adjust-steps" in err, err
    assert not (run / "model.safetensors").exists()


def test_attention_distillation_from_a_teacher(tmp_path, capsys):
    teacher_run = tmp_path / "teacher"
    assert main(["train", *TINY, "--steps", "2", "--out", str(teacher_run), "--no-progress"]) == 0
    run = tmp_path / "student"
    assert main(["train", *TINY, "--branches", "2", "--steps", "3", "--distill-teacher",
                 str(teacher_run / "model.safetensors"), "--distill-weight", "0.5", "--out", str(run),
                 "--no-progress"]) == 0
    ckpt = torch.load(run / "trainer.pt", weights_only=True)
    assert json.loads(ckpt["extra"]["train_settings"])["distill_weight"] == 0.5


@pytest.mark.parametrize("argv, message", [
    (["--steps", "4", "--join-schedule", "sqrt"], "--join-schedule: only applies to a non-deep model"),
    (["--branches", "2", "--steps", "4", "--join-steps", "2", "--adjust-steps", "1"], "expected one of them"),
    (["--branches", "2", "--steps", "4", "--adjust-steps", "9"], "--adjust-steps: expected at most 4"),
    (["--branches", "3", "--steps", "4"], "--branches: branches: expected a divisor of the model depth 2"),
    (["--branches", "2", "--steps", "4", "--distill-weight", "1"], "--distill-weight: only applies with"),
    (["--branches", "2", "--steps", "4", "--join-steps", "1.5"], "--join-steps: expected a step count"),
    (["--branches", "2", "--steps", "4", "--heuristic", "linear"], "--heuristic: only used with --channel-idle"),
])
def test_bad_nondeep_arguments(tmp_path, capsys, argv, message):
    assert main(["train", *TINY, *argv, "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_bench_accepts_the_recipe(capsys):
    assert main(["bench", *TINY, "--branches", "2", "--batch-sizes", "1", "--repeats", "2", "--warmup", "1",
                 "--threads", "1", "--providers", "timm,vitfast"]) == 0
    out = capsys.readouterr().out
    assert "--branches 2 (1 layers)" in out and "vitfast fused (kernels)" in out and "score form" in out


def test_demo_nondeep_quick(tmp_path, capsys):
    assert main(["demo", "--nondeep", "--quick", "--steps", "4", "--lr", "1.5e-3", "--out", str(tmp_path),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "single" in out and "non-deep (fused)" in out and "lr 0.0015" in out and (tmp_path / "nondeep_fused.safetensors").exists()


def test_demo_nondeep_trains_apart_then_joins(tmp_path):
    # the paper's phases: λ = 0 (branches trained apart) for join_start of the steps, warm-up, adjustment at λ = 1
    from vitfast.demos.nondeep_demo import run_nondeep_comparison

    lines = []
    report = run_nondeep_comparison(quick=True, steps=12, join_start=0.5, join_fraction=1 / 3, progress=False,
                                    out_dir=str(tmp_path), log=lines.append)
    assert "λ = 0 for 6 steps, then linear joining over 0.333 of the rest" in lines[0]
    assert report["join_start"] == 0.5 and report["lambda_end"] == [1.0, 1.0]
    assert report["nondeep_fused"] == report["nondeep"]
    with pytest.raises(ValueError, match="join_start: expected a fraction"):
        run_nondeep_comparison(quick=True, steps=4, join_start=1.0, progress=False, out_dir=str(tmp_path))
