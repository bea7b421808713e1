"""Threads and OpenMP's wait policy: `threads=` / `--threads` set torch's count; the `vitfast` commands that train
make idle OpenMP workers sleep (OMP_WAIT_POLICY=PASSIVE, set at `import vitfast`, before torch) unless the user
chose a policy or a spin count; a plain `import vitfast` (inference) leaves OpenMP's default; a Trainer asked for
more than one thread with spinning workers says once how to start the process.  The policy is per process, read
when torch loads: subprocesses."""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import vitfast
from vitfast import _threads
from vitfast.cli import build_parser, main
from vitfast.cli._common import THREADS_HELP
from vitfast.cli._common import THREADS_HELP_TIMED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python(code: str, **env: str) -> dict:
    """Run `code` in a fresh interpreter (OMP_WAIT_POLICY and GOMP_SPINCOUNT unset unless given); it prints JSON."""
    environ = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    environ["PYTHONPATH"] = ROOT + os.pathsep + environ.get("PYTHONPATH", "")
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


REPORT = ("import json, os, vitfast._threads as t; print(json.dumps({'env': os.environ.get('OMP_WAIT_POLICY'), "
          "'policy': t.wait_policy(), 'spin': t.workers_spin()}))")


TRAIN_ARGV = "import sys; sys.argv = {!r}\n"


@pytest.mark.parametrize("argv", [["vitfast", "train", "x.safetensors"], ["/venv/bin/vitfast", "usdc", "--quick"],
                                  ["-m", "usdc"], ["-m", "distill-demo", "--threads", "2"]])
def test_the_commands_that_train_make_waiting_passive(argv):
    got = python(TRAIN_ARGV.format(argv) + "import vitfast, torch; " + REPORT)
    assert got == {"env": "PASSIVE", "policy": "PASSIVE (set by vitfast)", "spin": False}


@pytest.mark.parametrize("argv", [["-c"], ["vitfast", "bench", "--threads", "1,2"], ["vitfast", "--help"],
                                  ["-m", "verify"], ["myscript.py", "train"], ["vitfast", "demo"]])  # demo times inference
def test_inference_keeps_openmps_default(argv):
    got = python(TRAIN_ARGV.format(argv) + "import vitfast; " + REPORT)
    assert got == {"env": None, "policy": "default", "spin": True}


@pytest.mark.parametrize("policy", ["ACTIVE", "passive", ""])
def test_a_policy_the_user_set_is_kept(policy):
    got = python(TRAIN_ARGV.format(["vitfast", "train"]) + "import vitfast; " + REPORT, OMP_WAIT_POLICY=policy)
    assert got["env"] == policy and "vitfast" not in got["policy"]
    assert got["spin"] == (policy.upper() != "PASSIVE")


def test_a_spin_count_the_user_set_is_a_choice_too():
    got = python(TRAIN_ARGV.format(["vitfast", "train"]) + "import vitfast; " + REPORT, GOMP_SPINCOUNT="0")
    assert got["env"] is None and got["spin"] is False and "GOMP_SPINCOUNT=0" in got["policy"]


def test_after_torch_nothing_is_set():
    got = python(TRAIN_ARGV.format(["vitfast", "train"]) + "import torch, vitfast; " + REPORT)
    assert got["env"] is None and got["spin"] is True


def test_a_trainer_on_more_than_one_spinning_thread_warns_once():
    got = python(
        "import warnings, torch, vitfast, json, os\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    model = torch.nn.Linear(4, 2)\n"
        "    vitfast.training.Trainer(model, [(torch.randn(2, 4), torch.tensor([0, 1]))], total_steps=1, threads=1,"
        " progress=False)\n"
        "    one = torch.get_num_threads()\n"
        "    for _ in range(2):\n"
        "        vitfast.training.Trainer(model, [(torch.randn(2, 4), torch.tensor([0, 1]))], total_steps=1,"
        " threads=2, progress=False)\n"
        "print(json.dumps({'env': os.environ.get('OMP_WAIT_POLICY'), 'one': one, 'two': torch.get_num_threads(),"
        " 'warnings': [str(x.message) for x in w]}))")
    assert got["env"] is None and (got["one"], got["two"]) == (1, 2)
    assert len(got["warnings"]) == 1 and "OMP_WAIT_POLICY=PASSIVE" in got["warnings"][0]


def test_no_warning_when_the_user_chose_after_torch():
    got = python(
        "import warnings, torch, vitfast, json\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    vitfast._threads.set_threads(2)\n"
        "print(json.dumps({'warnings': len(w)}))", OMP_WAIT_POLICY="ACTIVE")
    assert got["warnings"] == 0


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or "OpenMP" not in torch.__config__.parallel_info(),
                    reason="needs 2 cores and torch's OpenMP backend")
def test_passive_workers_really_sleep():
    """The behaviour, not only the variable: between 2-thread ops 2 ms apart, spinning workers burn about one
    core-second per second (1.0 measured, 0.6 under load); sleeping ones only the work (0.05)."""
    loop = ("import resource, time, json\ntorch.set_num_threads(2)\nx = torch.randn(256, 256)\nx.exp()\n"
            "def cpu():\n    r = resource.getrusage(resource.RUSAGE_SELF)\n    return r.ru_utime + r.ru_stime\n"
            "c, t = cpu(), time.perf_counter()\nfor _ in range(200):\n    (x * 1.0001).exp_()\n    time.sleep(0.002)\n"
            "print(json.dumps({'ratio': (cpu() - c) / (time.perf_counter() - t)}))")
    assert python(TRAIN_ARGV.format(["vitfast", "train"]) + "import vitfast, torch\n" + loop)["ratio"] < 0.3


def test_trainer_threads_sets_and_checks():
    old = torch.get_num_threads()
    try:
        data = [(torch.randn(2, 4), torch.tensor([0, 1]))]
        vitfast.training.Trainer(torch.nn.Linear(4, 2), data, total_steps=1, threads=1, progress=False)
        assert torch.get_num_threads() == 1
        for bad in (0, -1, 1.5, True, "2"):
            with pytest.raises(ValueError, match="threads: expected a positive integer"):
                vitfast.training.Trainer(torch.nn.Linear(4, 2), data, total_steps=1, threads=bad, progress=False)
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("command", ["train", "demo", "usdc", "distill-demo"])
def test_cli_commands_share_the_threads_option(command, capsys):
    action = next(a for a in build_parser()._subparsers._group_actions[0].choices[command]._actions
                  if "--threads" in a.option_strings)
    assert action.help == (THREADS_HELP_TIMED if command == "demo" else THREADS_HELP)
    assert main([command, "--threads", "0"]) == 2
    assert "--threads: expected a positive integer, got 0" in capsys.readouterr().err


def test_cli_threads_sets_torch_threads(tmp_path, capsys):
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        # no SOURCE: refused after --threads is applied, so nothing is trained
        assert main(["train", "--threads", "1", "--out", str(tmp_path / "run")]) == 2
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("entry", ["console script", "python -m vitfast"])
def test_the_real_entry_points_see_their_command(entry, tmp_path):
    """`vitfast train --help` / `python -m vitfast train --help` as a user runs them; a sitecustomize reports the
    variable at exit."""
    script = os.path.join(os.path.dirname(sys.executable), "vitfast")
    if entry == "console script" and not os.path.exists(script):
        pytest.skip("the `vitfast` console script is not installed next to this interpreter")
    (tmp_path / "sitecustomize.py").write_text(
        "import atexit, os, sys\natexit.register(lambda: sys.stderr.write("
        "'POLICY=%s\\n' % os.environ.get('OMP_WAIT_POLICY')))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), ROOT, env.get("PYTHONPATH", "")])
    start = [script] if entry == "console script" else [sys.executable, "-m", "vitfast"]
    for command, expected in (("train", "PASSIVE"), ("bench", "None")):
        out = subprocess.run([*start, command, "--help"], env=env, capture_output=True, text=True, timeout=300, check=False)
        assert out.returncode == 0, out.stderr
        assert f"POLICY={expected}" in out.stderr.splitlines(), out.stderr


def test_set_threads_none_leaves_torch_alone():
    old = torch.get_num_threads()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _threads.set_threads(None)
    assert torch.get_num_threads() == old
