"""The `vitfast` command line: help texts, convert -> train -> fuse -> verify round trips, bench, clean errors."""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vitfast.cli import main

from helpers import official_repavit_state_dict

TINY = ["vit_tiny_patch16_224", "--img-size", "16", "--num-classes", "10",
        "--model-kwargs", json.dumps({"depth": 1, "embed_dim": 32, "num_heads": 2, "patch_size": 4})]

pytestmark = pytest.mark.usefixtures("one_thread")


def vitfast_script() -> str:
    """The installed console script next to this interpreter (what `pip install -e .` created)."""
    script = Path(sys.executable).with_name("vitfast")
    assert script.exists(), f"the `vitfast` entry point is not installed next to {sys.executable}"
    return str(script)


@pytest.mark.parametrize("command, expected", [
    ([], ["convert", "train", "fuse", "verify", "bench", "demo", "examples:"]),
    (["convert"], ["--channel-idle", "--norm", "--heuristic", "--repavit", "--pretrained", "--checkpoint",
                   "nothing is downloaded", "--list-models"]),
    (["train"], ["--steps", "--epochs", "--lr", "--batch-size", "--resume", "--out", "--channel-idle", "digits"]),
    (["fuse"], ["SOURCE", "--output", "exactly"]),
    (["verify"], ["--source", "--inputs", "--atol", "exit status 1"]),
    (["bench"], ["--threads", "--batch-sizes", "median", "timm eager"]),
    (["demo"], ["--steps", "--threads", "--out", "--quick", "must be equal"]),
])
def test_help(capsys, command, expected):
    assert main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    for word in expected:
        assert word in out, (command, word)


def test_convert_train_fuse_verify_round_trip(tmp_path, capsys):
    src = str(tmp_path / "tiny.safetensors")
    assert main(["convert", *TINY, "--channel-idle", "0.75", "-o", src]) == 0
    assert "channel-idle FFNs (active/hidden per block: 32/128)" in capsys.readouterr().out

    run = tmp_path / "run"
    assert main(["train", src, "--steps", "6", "--batch-size", "64", "--checkpoint-every", "3", "--out", str(run),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "val acc" in out and (run / "model.safetensors").exists() and (run / "trainer.pt").exists()

    fused = str(tmp_path / "fused.safetensors")
    assert main(["fuse", str(run / "model.safetensors"), "-o", fused]) == 0
    assert "max |Δlogits|" in capsys.readouterr().out
    assert main(["verify", fused, "--source", str(run / "model.safetensors"), "--inputs", "digits"]) == 0
    out = capsys.readouterr().out
    assert "OK: the fused model matches its source" in out and "argmax agreement = 360/360" in out
    # the trainer checkpoint is an accepted source too (it carries the model description)
    fused2 = str(tmp_path / "fused2.safetensors")
    assert main(["fuse", str(run / "trainer.pt"), "-o", fused2, "--no-check"]) == 0
    assert main(["verify", fused2, "--source", str(run / "model.safetensors")]) == 0

    # resuming a finished run with a different length is refused, naming both values
    capsys.readouterr()
    assert main(["train", "--resume", str(run / "trainer.pt"), "--steps", "9", "--no-progress"]) == 2
    assert "--steps was 6, got 9" in capsys.readouterr().err


def test_resume_restores_the_runs_thread_count(tmp_path, capsys):
    # The thread count changes torch's reduction order: a resume at another count was not bit-exact, and the
    # count was not stored, so `vitfast train --resume` (as the README shows it) ran at torch's default.
    import torch

    src = str(tmp_path / "tiny.safetensors")
    assert main(["convert", *TINY, "--channel-idle", "0.75", "-o", src]) == 0
    run = tmp_path / "run"
    assert main(["train", src, "--steps", "2", "--batch-size", "32", "--threads", "1", "--out", str(run),
                 "--no-progress"]) == 0
    capsys.readouterr()
    torch.set_num_threads(2)  # what a fresh process on this machine starts with (restored by one_thread)
    assert main(["train", "--resume", str(run / "trainer.pt"), "--no-progress"]) == 0
    assert "(1 threads)" in capsys.readouterr().out and torch.get_num_threads() == 1
    assert main(["train", "--resume", str(run / "trainer.pt"), "--threads", "2", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "(2 threads)" in captured.out and "--threads 2: the run used 1; the continuation will not be bit-exact" in captured.err


@pytest.mark.parametrize("argv, message", [
    (["--steps", "5", "--warmup", "5"], r"--warmup: expected 0 <= warmup_steps < total_steps \(5\), got 5"),
    (["--steps", "2", "--amp", "fp16", "--device", "cpu"], r"--amp: 'fp16' needs a CUDA device"),
    (["--steps", "2", "--batch-size", "2048"], r"--batch-size: expected at most 1437"),
    (["--steps", "2", "--batch-size", "2048", "--grad-accum", "2"],
     r"--batch-size/--grad-accum: one optimizer step needs 2 micro-batches of 1024 images, the training split gives 1"),
])
def test_train_errors_name_the_flag_and_leave_no_out_dir(tmp_path, capsys, argv, message):
    """The Trainer's own argument names (warmup_steps, amp, train_loader) were printed, after --out was created."""
    out = tmp_path / "run"
    assert main(["train", *TINY, *argv, "--out", str(out), "--no-progress"]) == 2
    assert re.search(message, capsys.readouterr().err) and not out.exists()


def test_train_resume_with_another_grad_accum_a_finished_run_and_divergence(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--steps", "4", "--batch-size", "64", "--out", str(run), "--no-progress",
                 "--checkpoint-every", "2"]) == 0
    capsys.readouterr()
    # the README's promise: a resume may change --grad-accum (the same global batch in other micro-batches)
    assert main(["train", "--resume", str(run / "trainer.pt"), "--grad-accum", "2", "--no-progress"]) == 0
    assert "nothing to train" in capsys.readouterr().out
    assert main(["train", "--resume", str(run / "trainer.pt"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "to train further start a new run from its model: `vitfast train" in out and "--steps N --out NEW_DIR`" in out
    # a diverging run: one error line naming the loss, status 1, no traceback
    assert main(["train", *TINY, "--steps", "3", "--lr", "1e30", "--grad-clip", "0", "--out", str(tmp_path / "d"),
                 "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "vitfast train: error: loss: expected a finite value" in err and "Traceback" not in err


def test_verify_detects_a_mismatch(tmp_path, capsys):
    a, b = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
    assert main(["convert", *TINY, "--seed", "1", "-o", a]) == 0
    assert main(["convert", *TINY, "--seed", "2", "-o", b]) == 0
    fused = str(tmp_path / "fa.safetensors")
    assert main(["fuse", a, "-o", fused, "--no-check"]) == 0
    capsys.readouterr()
    assert main(["verify", fused, "--source", b]) == 1  # a's fused weights are not b's
    assert "MISMATCH" in capsys.readouterr().out


def test_bench_on_a_fused_file(tmp_path, capsys):
    src, fused = str(tmp_path / "s.safetensors"), str(tmp_path / "f.safetensors")
    assert main(["convert", *TINY, "-o", src]) == 0
    assert main(["fuse", src, "-o", fused, "--no-check"]) == 0
    capsys.readouterr()
    # ort-timm checks the baseline's ONNX export against the baseline: a baseline built without timm's init
    # (uninitialised cls_token/pos_embed, NaN outputs) failed it, and every "timm" row timed a NaN model.
    assert main(["bench", fused, "--batch-sizes", "1,4", "--repeats", "3", "--warmup", "1", "--threads", "1",
                 "--providers", "timm,ort-timm,vitfast,reference"]) == 0
    out = capsys.readouterr().out
    for row in ("timm eager", "ORT timm", "vitfast fused (kernels)", "vitfast fused (reference ops)"):
        # one table row per batch size (the header lines also start with "ORT timm:")
        assert sum(bool(re.match(rf"{re.escape(row)}\s+\d", line)) for line in out.splitlines()) == 2, row
    # recipe options rebuild a timm name; with a file they were silently ignored
    for extra in (["--norm", "layer"], ["--branches", "2"], ["--heuristic", "linear"]):
        assert main(["bench", fused, *extra]) == 2
        assert f"{extra[0]}: only applies when TARGET is a timm model name" in capsys.readouterr().err


def test_bench_baseline_of_a_file_is_initialised(monkeypatch):
    """build_timm leaves tensors as allocated (a load overwrites them); the bench baseline must not be timed on
    that memory.  Poisoned here with NaN so the test does not depend on what the allocator returns."""
    import timm

    import vitfast.arch
    from vitfast.cli.bench import skeleton_baseline

    architecture = vitfast.arch.describe_timm(timm.create_model("vit_tiny_patch16_224", img_size=16, num_classes=10,
                                                                depth=1, embed_dim=32, num_heads=2, patch_size=4))
    build = vitfast.arch.build_timm

    def poisoned(desc, device=None):
        model = build(desc, device=device)
        with torch.no_grad():
            for t in model.state_dict().values():
                if t.is_floating_point():
                    t.fill_(float("nan"))
        return model

    monkeypatch.setattr(vitfast.arch, "build_timm", poisoned)
    baseline = skeleton_baseline(architecture)
    assert not baseline.training
    assert all(torch.isfinite(t).all() for t in baseline.state_dict().values() if t.is_floating_point())
    with torch.no_grad():
        assert torch.isfinite(baseline(torch.randn(1, 3, 16, 16))).all()


def test_entry_point_subprocess(tmp_path):
    """One real process through the installed `vitfast` script: convert then fuse, files really written."""
    src, fused = tmp_path / "s.safetensors", tmp_path / "f.safetensors"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([vitfast_script(), "convert", *TINY, "-o", str(src)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([vitfast_script(), "fuse", str(src), "-o", str(fused)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert fused.exists() and "wrote" in r.stdout
    # and a bad argument in a real process: one line naming it, status 2, no traceback
    r = subprocess.run([vitfast_script(), "convert", *TINY, "--channel-idle", "1.5", "-o", str(src)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2
    assert "--channel-idle" in r.stderr and "expected a number in [0, 1], got 1.5" in r.stderr
    assert "Traceback" not in r.stderr


def test_an_output_in_a_missing_directory_is_a_file_system_error(tmp_path, capsys):
    """Like a read-only or full disk (the request may be fine, the file system cannot take it): `PATH: REASON`,
    status 1, before any work."""
    out = tmp_path / "missing_dir" / "x.safetensors"
    assert main(["convert", *TINY, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"vitfast convert: error: {out}: No such file or directory (the directory ") and \
        err.count("\n") == 1, err
    assert "-o/--output expects a path in an existing directory" in err


@pytest.mark.parametrize("argv, message", [
    (["fuse", "no/such/file.safetensors", "-o", "x.safetensors"], "expected an existing file, got 'no/such/file.safetensors'"),
    (["convert", "vit_tiny_patch16_224", "--channel-idle", "-0.1", "-o", "x.safetensors"], "expected a number in [0, 1], got -0.1"),
    (["convert", "vit_tiny_patch16_22", "-o", "{tmp}/x.safetensors"], "did you mean vit_tiny_patch16_224"),
    (["convert", "-o", "{tmp}/x.safetensors"], "MODEL: expected a timm model name"),
    (["convert", *TINY, "--model-kwargs", "[1]", "-o", "{tmp}/x.safetensors"], "expected a JSON object"),
    (["train", "--steps", "0"], "expected a positive integer, got 0"),
    (["train", "{tmp}/not_a_model.txt", "--out", "{tmp}/run"], "expected a vitfast file"),
    (["verify", "{tmp}/not_a_model.txt", "--source", "{tmp}/not_a_model.txt"], "expected a vitfast file"),
    (["bench", "{tmp}/not_a_model.txt"], "expected a vitfast file"),
    (["demo", "--threads", "0"], "expected a positive integer, got 0"),
    (["train", "run/modle.safetensors", "--out", "{tmp}/run"], "SOURCE: expected an existing file or a timm model name"),
    (["bench", "deit_tiny_patch16"], "TARGET: expected a timm model name, got 'deit_tiny_patch16'; did you mean"),
    (["nonsense"], "invalid choice"),
    (["bench", "{tmp}/not_a_model.txt", "--device", "gpu0"], "--device: expected a torch device such as cpu or cuda, got 'gpu0'"),
    # once a FileExistsError traceback from os.makedirs
    (["train", *TINY, "--steps", "1", "--out", "{tmp}/not_a_model.txt"], "--out: expected a directory (created if missing), got the file"),
    (["train", *TINY, "--lr", "inf", "--out", "{tmp}/run"], "expected a finite number > 0, got inf"),  # once NaN at step 1
    (["bench", "{tmp}/not_a_model.txt", "--device", "meta"], "--device: expected cpu or cuda, got 'meta'"),
    (["train", *TINY, "--label-smoothing", "2", "--out", "{tmp}/run"], "--label-smoothing: expected a number in [0, 1), got 2"),
    # gate options without --gates were silently dropped (a plain θ model came out)
    (["convert", *TINY, "--flops-target", "0.6", "-o", "{tmp}/x.safetensors"], "--flops-target: only with --gates"),
    (["convert", *TINY, "--gate-kind", "G3", "-o", "{tmp}/x.safetensors"], "--gate-kind: only with --gates"),
    # --img-size / --num-classes silently won over the same key in --model-kwargs
    (["convert", "vit_tiny_patch16_224", "--img-size", "16", "--model-kwargs", '{"img_size": 32}', "-o",
      "{tmp}/x.safetensors"], "--img-size: 16 disagrees with img_size=32 in --model-kwargs"),
    (["convert", "vit_tiny_patch16_224", "--num-classes", "3", "--model-kwargs", '{"num_classes": 10}', "-o",
      "{tmp}/x.safetensors"], "--num-classes: 3 disagrees with num_classes=10 in --model-kwargs"),
    (["train", *TINY, "--norm", "layer", "--out", "{tmp}/run"], "--norm: only used with --channel-idle"),  # was ignored
    (["train", "vit_tiny_patch16_224", "--img-size", "16", "--model-kwargs", '{"num_classes": 5}', "--out", "{tmp}/run"],
     "--data (its classes): 10 disagrees with num_classes=5 in --model-kwargs"),  # digits: 10 classes, not --num-classes
])
def test_bad_arguments_give_a_clean_error(tmp_path, capsys, argv, message):
    (tmp_path / "not_a_model.txt").write_text("hello")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert message in captured.err, captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not (tmp_path / "x.safetensors").exists()  # nothing written half-way


def _tiny_timm():
    import timm

    kw = json.loads(TINY[TINY.index("--model-kwargs") + 1])
    return timm.create_model(TINY[0], pretrained=False, img_size=16, num_classes=10, **kw).eval()


def test_convert_loads_local_pretrained_weights(tmp_path):
    from vitfast.io.trainable import load_trainable

    torch.manual_seed(7)
    reference = _tiny_timm()
    weights = tmp_path / "w.pth"
    torch.save(reference.state_dict(), weights)
    out = tmp_path / "c.safetensors"
    # norm=layer with θ=0 is the timm model itself, so the pretrained function must survive exactly
    assert main(["convert", *TINY, "--checkpoint", str(weights), "--norm", "layer", "--channel-idle", "0",
                 "-o", str(out)]) == 0
    converted, recipe = load_trainable(out)
    assert recipe["pretrained"] == "w.pth" and recipe["channel_idle"] == 0.0
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(converted(x), reference(x), atol=1e-5, rtol=1e-5)


def test_convert_random_weights_follow_seed(tmp_path):
    """Random weights (no --checkpoint) and USDC's gate logits come from --seed: a rerun writes the same tensors."""
    from safetensors.torch import load_file

    paths = {name: tmp_path / f"{name}.safetensors" for name in ("a", "b", "c")}
    for name, seed in (("a", []), ("b", ["--seed", "0"]), ("c", ["--seed", "1"])):
        assert main(["convert", *TINY, "--gates", "--flops-target", "0.7", *seed, "-o", str(paths[name])]) == 0
    a, b, c = (load_file(paths[n]) for n in "abc")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # default seed 0
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_convert_repavit_then_verify(tmp_path, capsys):
    import vitfast
    from vitfast.io.trainable import load_trainable

    sd = official_repavit_state_dict(patch=4, classes=10)
    path = tmp_path / "repavit.pth"
    torch.save({"model": sd}, path)
    out, fused = tmp_path / "r.safetensors", tmp_path / "rf.safetensors"
    assert main(["convert", "--repavit", str(path), "--num-heads", "2", "-o", str(out)]) == 0
    converted, _ = load_trainable(out)
    direct = vitfast.convert.from_repavit(sd, num_heads=2).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():  # the file rebuilt the same model, mixed LayerNorm eps included
        torch.testing.assert_close(converted(x), direct(x), atol=0, rtol=0)
    assert main(["fuse", str(out), "-o", str(fused), "--no-check"]) == 0
    assert main(["verify", str(fused), "--source", str(out), "--inputs", "digits"]) == 0
    assert "OK" in capsys.readouterr().out


def test_bench_a_timm_name_with_a_recipe(capsys):
    assert main(["bench", *TINY, "--channel-idle", "0.5", "--batch-sizes", "2", "--repeats", "2", "--warmup", "1",
                 "--providers", "vitfast"]) == 0
    out = capsys.readouterr().out
    assert "θ=0.5" in out and "vitfast fused (kernels)" in out


def test_pretrained_weights_of_another_head_size_are_adapted_offline(tmp_path, capsys):
    weights = tmp_path / "w.safetensors"
    from safetensors.torch import save_file

    save_file(_tiny_timm().state_dict(), str(weights))
    argv = [a if a != "10" else "5" for a in TINY]  # ask for 5 classes: the 10-class head cannot load as is
    # `--pretrained PATH`, the older spelling of --checkpoint PATH, still loads the file (with a note)
    assert main(["convert", *argv, "--pretrained", str(weights), "-o", str(tmp_path / "c.safetensors")]) == 0
    captured = capsys.readouterr()
    assert "adapted by timm" in captured.out and "is now `--checkpoint PATH`" in captured.err


def test_pretrained_weights_that_do_not_fit_are_refused(tmp_path, capsys):
    """timm's adapted load is non-strict: an unrelated file (or a model missing blocks) once "loaded" into a
    random model with exit status 0."""
    from safetensors.torch import save_file

    argv = [a if a != "10" else "5" for a in TINY]  # another head size: the adapted (non-strict) path
    unrelated = tmp_path / "u.safetensors"
    save_file({"a": torch.zeros(3)}, str(unrelated))
    partial = tmp_path / "p.safetensors"
    save_file({k: v for k, v in _tiny_timm().state_dict().items() if not k.startswith("blocks.0.mlp")}, str(partial))
    for path, names in ((unrelated, "patch_embed.proj.weight"), (partial, "blocks.0.mlp.fc1.weight")):
        out = tmp_path / "c.safetensors"
        assert main(["convert", *argv, "--checkpoint", str(path), "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert "--checkpoint:" in err and "were not in it" in err and names in err, err
        assert not out.exists()


def test_models_of_other_input_channels_are_refused_before_training(tmp_path, capsys):
    """The data are RGB: a 1-channel model once failed in its first forward with a conv traceback."""
    kwargs = json.loads(TINY[TINY.index("--model-kwargs") + 1])
    argv = TINY[: TINY.index("--model-kwargs")] + ["--model-kwargs", json.dumps({**kwargs, "in_chans": 1})]
    assert main(["train", *argv, "--steps", "1", "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    assert "--data: the data are RGB images (3 channels), the model takes 1 input channels" in capsys.readouterr().err
    assert main(["select-heads", *argv, "-o", str(tmp_path / "r.json"), "--no-progress"]) == 2
    assert "--data: the data are RGB images (3 channels), the model takes 1 input channels" in capsys.readouterr().err


def test_outputs_never_replace_their_input(tmp_path, capsys):
    src, fused = str(tmp_path / "s.safetensors"), str(tmp_path / "f.safetensors")
    assert main(["convert", *TINY, "-o", src]) == 0
    assert main(["fuse", src, "-o", fused, "--no-check"]) == 0
    before = (open(src, "rb").read(), open(fused, "rb").read())
    capsys.readouterr()
    assert main(["fuse", src, "-o", src]) == 2
    assert "-o/--output: expected another path than SOURCE" in capsys.readouterr().err
    assert main(["export", fused, "-o", fused]) == 2
    assert "-o/--output: expected another path than FUSED" in capsys.readouterr().err
    assert (open(src, "rb").read(), open(fused, "rb").read()) == before


def test_val_data_needs_an_image_folder(tmp_path, capsys):
    assert main(["train", *TINY, "--steps", "1", "--val-data", str(tmp_path), "--out", str(tmp_path / "run"),
                 "--no-progress"]) == 2
    assert "--val-data: only with --data DIR" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # a run refused by its checks leaves no empty --out behind


def test_train_stopped_by_a_signal_is_not_status_zero(tmp_path, capsys, monkeypatch):
    """A SIGTERM'd run writes its checkpoint, then exits 130: `vitfast train ... && vitfast fuse ...` must stop."""
    from vitfast.training.trainer import Trainer

    fit = Trainer.fit

    class Term:
        def on_step(self, trainer, metrics):
            if trainer.step == 1:
                os.kill(os.getpid(), signal.SIGTERM)  # the CLI's trainer handles it: stop after this step

    def stop_after_the_first_step(self):
        assert self.handle_signals  # else the SIGTERM below would kill the test process
        self.callbacks.append(Term())
        return fit(self)

    monkeypatch.setattr(Trainer, "fit", stop_after_the_first_step)
    run = tmp_path / "run"
    assert main(["train", *TINY, "--steps", "3", "--out", str(run), "--no-progress"]) == 130
    assert "stopped at step 1/3 (signal)" in capsys.readouterr().out
    assert (run / "trainer.pt").exists() and (run / "model.safetensors").exists()


@pytest.mark.parametrize("length", [["--steps", "4"], ["--epochs", "1"]], ids=["steps", "epochs"])
def test_resume_mid_run_with_another_grad_accum(tmp_path, capsys, monkeypatch, length):
    """--resume --grad-accum 2 was accepted but ignored (the stored settings won); with --epochs the resumed
    Trainer recounted the length from the new accumulation and refused its own checkpoint."""
    from vitfast.training.trainer import Trainer

    fit, seen = Trainer.fit, []

    class Term:
        def on_step(self, trainer, metrics):
            if trainer.step == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    def run_or_stop(self):
        seen.append((self.grad_accum, self.total_steps))
        if self.step == 0:
            self.callbacks.append(Term())
        return fit(self)

    monkeypatch.setattr(Trainer, "fit", run_or_stop)
    run = tmp_path / "run"
    assert main(["train", *TINY, *length, "--batch-size", "256", "--out", str(run), "--no-progress"]) == 130
    assert main(["train", "--resume", str(run / "trainer.pt"), "--grad-accum", "2", "--no-progress"]) == 0
    (first_accum, first_total), (resumed_accum, resumed_total) = seen
    assert (first_accum, resumed_accum) == (1, 2) and resumed_total == first_total
    assert json.loads(torch.load(run / "trainer.pt", weights_only=True)["extra"]["train_settings"])["grad_accum"] == 2


def test_verify_refuses_models_of_different_input_sizes(tmp_path, capsys):
    """Once timm's AssertionError traceback from the first forward."""
    src16, src20, fused16 = (str(tmp_path / n) for n in ("s16.safetensors", "s20.safetensors", "f16.safetensors"))
    assert main(["convert", *TINY, "-o", src16]) == 0
    assert main(["convert", *[a if a != "16" else "20" for a in TINY], "-o", src20]) == 0
    assert main(["fuse", src16, "-o", fused16, "--no-check"]) == 0
    capsys.readouterr()
    assert main(["verify", fused16, "--source", src20]) == 2
    err = capsys.readouterr().err
    assert "FUSED/--source: expected models of one input size, got 16 px (fused) and 20 px (source)" in err, err


def test_train_a_timm_name_on_an_image_folder(tmp_path, capsys):
    from test_trainer import make_image_folder

    from vitfast.io.trainable import load_trainable

    root = make_image_folder(tmp_path / "imgs", classes=("a", "b", "c"))
    argv = [a for a in TINY if a not in ("--num-classes", "10")]  # the class count comes from the folder
    assert main(["train", *argv, "--channel-idle", "0.5", "--data", str(root), "--steps", "2", "--batch-size", "4",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    model, recipe = load_trainable(tmp_path / "run" / "model.safetensors")
    assert model.num_classes == 3 and recipe["channel_idle"] == 0.5


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a machine without CUDA")
def test_cuda_device_without_cuda_is_a_clean_error(tmp_path, capsys):
    (tmp_path / "f.txt").write_text("x")
    assert main(["bench", str(tmp_path / "f.txt"), "--device", "cuda"]) == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err
