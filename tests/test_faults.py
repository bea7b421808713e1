"""Faults leave nothing behind (vitfast/io/atomic.py, vitfast/cli/__init__.py).

* A writer killed with SIGKILL mid-save leaves its temporary file; the next save to that path removes it, and
  nothing else: not a live writer's temporary, not other files.
* Every command that writes, on a full disk (a real ENOSPC on a tiny tmpfs; EFBIG from RLIMIT_FSIZE, which needs
  no root), a read-only file system, a directory it may not write (chattr +i as root, chmod elsewhere), a missing
  directory, a directory given as the output: one line on stderr, the status of its kind, the previous file at
  the target untouched, no temporary file left.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from vitfast.cli import main
from vitfast.io.atomic import UNLOCKED_TEMP_AGE_S
from vitfast.io.trainer_checkpoint import load_trainer_checkpoint, save_trainer_checkpoint

ROOT = Path(__file__).resolve().parent.parent
TINY = ["vit_tiny_patch16_224", "--img-size", "16", "--num-classes", "10",
        "--model-kwargs", json.dumps({"depth": 1, "embed_dim": 32, "num_heads": 2, "patch_size": 4})]
PREVIOUS = b"the previous file, which a failed write must leave as it was\n"
QUICK_BENCH = ["--batch-sizes", "1", "--repeats", "1", "--warmup", "1", "--providers", "vitfast", "--quiet"]

# Every command that writes a file: (name, argv for output directory D and the models M, the file it fails to
# write first, relative to D).  `vitfast --help` lists the commands; verify writes nothing.
WRITERS = [
    ("convert", lambda d, m: ["convert", *TINY, "--channel-idle", "0.75", "-o", f"{d}/t.safetensors"], "t.safetensors"),
    ("fuse", lambda d, m: ["fuse", m["train"], "-o", f"{d}/f.safetensors"], "f.safetensors"),
    ("export", lambda d, m: ["export", m["fused"], "-o", f"{d}/m.onnx", "--no-check"], "m.onnx"),
    ("train", lambda d, m: ["train", m["train"], "--steps", "1", "--batch-size", "32", "--out", f"{d}/run",
                            "--no-progress"], "run/trainer.pt"),
    ("select-heads", lambda d, m: ["select-heads", m["train"], "--num-samples", "4", "--batch-size", "4", "-o",
                                   f"{d}/r.json", "--no-progress"], "r.json"),
    ("bench", lambda d, m: ["bench", m["fused"], *QUICK_BENCH, "--json", f"{d}/b.json"], "b.json"),
    ("bench", lambda d, m: ["bench", m["fused"], *QUICK_BENCH, "--png", f"{d}/b.png"], "b.png"),
    ("usdc", lambda d, m: ["usdc", "--quick", "--levels", "group", "--batch-sizes", "1", "--pretrain-steps", "1",
                           "--stage1-steps", "1", "--stage2-steps", "1", "--out", f"{d}/usdc", "--no-progress"],
     "usdc/usdc_group.safetensors"),
    ("distill-demo", lambda d, m: ["distill-demo", "--quick", "--teacher-steps", "1", "--student-steps", "1", "--json",
                                   f"{d}/dd.json", "--no-progress"], "dd.json"),
    ("demo", lambda d, m: ["demo", "--quick", "--steps", "1", "--repeats", "1", "--out", f"{d}/demo", "--no-progress"],
     "demo/train.safetensors"),
]
IDS = [f"{name}-{os.path.basename(target)}" for name, _, target in WRITERS]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny train-time model and its fused file, the inputs of the commands."""
    d = tmp_path_factory.mktemp("models")
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["convert", *TINY, "--channel-idle", "0.75", "-o", str(d / "t.safetensors")]) == 0
        assert main(["fuse", str(d / "t.safetensors"), "-o", str(d / "f.safetensors"), "--no-check"]) == 0
    finally:
        torch.set_num_threads(old)
    return {"train": str(d / "t.safetensors"), "fused": str(d / "f.safetensors")}


def _prepare(root: Path) -> None:
    """One directory per command, each with a previous file at the command's target."""
    for i, (_, _, target) in enumerate(WRITERS):
        path = root / str(i) / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(PREVIOUS)


def _listing(root: Path) -> list:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _run(argv) -> tuple:
    out, err = io.StringIO(), io.StringIO()
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(argv)
    finally:
        torch.set_num_threads(old)
    return status, err.getvalue()


def _check(i: int, root: Path, status: int, err: str, reason: str, before: list) -> None:
    """One line naming the target and `reason`, status 1, the previous file as it was, nothing new in the directory."""
    name, _, target = WRITERS[i]
    path = root / str(i) / target
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"vitfast {name}: error: {path}: {reason}"], err
    assert status == 1
    assert path.read_bytes() == PREVIOUS
    assert _listing(root) == before  # no temporary file, no new directory


def _mount(*args) -> None:
    r = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount here ({' '.join(args)}: {r.stderr.strip()}); needs root and a mount namespace")


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


# ---------------------------------------------------------------------------------------------- full disk
@pytest.fixture(scope="module")
def full_disk(tmp_path_factory):
    """A tmpfs filled to the last byte after the previous files were written: a real ENOSPC."""
    root = tmp_path_factory.mktemp("full") / "mnt"
    root.mkdir()
    _mount("-t", "tmpfs", "-o", "size=256k", "tmpfs", str(root))
    try:
        _prepare(root)
        fd = os.open(root / "filler", os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 4096):
                pass
        os.close(fd)
        yield root, _listing(root)
    finally:
        _umount(root)


@pytest.mark.parametrize("i", range(len(WRITERS)), ids=IDS)
def test_full_disk(full_disk, models, i):
    root, before = full_disk
    status, err = _run(WRITERS[i][1](root / str(i), models))
    _check(i, root, status, err, "No space left on device", before)


_RLIMIT_CHILD = r"""
import contextlib, io, json, resource, signal, sys
import torch
from vitfast.cli import main
import joblib  # noqa: F401  (it tries a semaphore file at import: once, before the limit, as any process would)
torch.set_num_threads(1)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))  # soft limit only: raised again below, no root needed
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            status = main(argv)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    results.append([status, err.getvalue()])
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def file_size_limit(tmp_path_factory, models):
    """Every command in one child process whose file-size limit is 0 while it runs: EFBIG on the first byte, the
    full disk of a machine where nothing can be mounted."""
    root = tmp_path_factory.mktemp("fsize")
    _prepare(root)
    before = _listing(root)
    argvs = [make(root / str(i), models) for i, (_, make, _) in enumerate(WRITERS)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", _RLIMIT_CHILD, json.dumps(argvs)], capture_output=True, text=True,
                       env=env, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return root, before, json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("i", range(len(WRITERS)), ids=IDS)
def test_file_size_limit(file_size_limit, i):
    root, before, results = file_size_limit
    status, err = results[i]
    _check(i, root, status, err, "File too large", before)


# ---------------------------------------------------------------------------------------------- read-only
@pytest.fixture(scope="module")
def read_only(tmp_path_factory):
    root = tmp_path_factory.mktemp("ro") / "mnt"
    root.mkdir()
    _mount("-t", "tmpfs", "-o", "size=256k", "tmpfs", str(root))
    try:
        _prepare(root)
        _mount("-o", "remount,ro", str(root))
        yield root, _listing(root)
    finally:
        _umount(root)


@pytest.mark.parametrize("i", range(len(WRITERS)), ids=IDS)
def test_read_only(read_only, models, i):
    root, before = read_only
    status, err = _run(WRITERS[i][1](root / str(i), models))
    _check(i, root, status, err, "Read-only file system", before)


# ---------------------------------------------------------------------------------------------- permission
@pytest.fixture(scope="module")
def not_writable(tmp_path_factory):
    """Directories nobody may write in: chmod for a user; for root (whom modes do not stop) the immutable flag."""
    root = tmp_path_factory.mktemp("perm")
    _prepare(root)
    dirs = sorted({str((root / str(i) / target).parent) for i, (_, _, target) in enumerate(WRITERS)})
    if os.geteuid() != 0:
        for d in dirs:
            os.chmod(d, 0o555)
        reason, undo = "Permission denied", lambda: [os.chmod(d, 0o755) for d in dirs]
    else:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", *dirs], capture_output=True, check=False).returncode:
            pytest.skip("running as root, and chattr +i does not work here: nothing makes a directory unwritable")
        reason, undo = "Operation not permitted", lambda: subprocess.run(["chattr", "-i", *dirs], capture_output=True, check=False)
    try:
        yield root, _listing(root), reason
    finally:
        undo()


@pytest.mark.parametrize("i", range(len(WRITERS)), ids=IDS)
def test_not_writable(not_writable, models, i):
    root, before, reason = not_writable
    status, err = _run(WRITERS[i][1](root / str(i), models))
    _check(i, root, status, err, reason, before)


# ---------------------------------------------------------------------------------------------- missing dir, a dir
def test_missing_directory_and_a_directory_as_the_output(tmp_path, models):
    """Both are refused before any work as file-system errors, `PATH: REASON` with the flag named, status 1 (like
    a read-only or full disk); an --out directory is created with its parents, and removed again when the command
    fails."""
    for i, (name, make, target) in enumerate(WRITERS):
        if target.count("/"):  # --out DIR: created if missing
            continue
        d = tmp_path / str(i)
        status, err = _run(make(d / "missing", models))
        assert status == 1 and "Traceback" not in err and err.count("\n") == 1, err
        assert err.startswith(f"vitfast {name}: error: {d / 'missing' / target}: No such file or directory "
                              f"(the directory {d / 'missing'} does not exist; "), err
        (d / target).mkdir(parents=True)  # the output path is a directory
        status, err = _run(make(d, models))
        assert status == 1 and "Traceback" not in err and err.count("\n") == 1, err
        assert err.startswith(f"vitfast {name}: error: {d / target}: Is a directory ("), err
        assert _listing(d) == [target]
    # --out whose parents cannot be created: the one that failed is named, nothing of it stays
    blocker = tmp_path / "blocker" / "file"
    blocker.parent.mkdir()
    blocker.write_text("a file where a directory would go")
    status, err = _run(WRITERS[3][1](blocker / "sub", models))  # train --out blocker/sub/run
    assert status == 1 and err == f"vitfast train: error: {blocker / 'sub'}: Not a directory\n", err
    assert _listing(blocker.parent) == ["file"]


def test_out_directory_created_by_a_failing_command_is_removed(tmp_path, models, monkeypatch):
    import vitfast.io.trainer_checkpoint as tc

    def full(state, path):
        raise OSError(28, "No space left on device", path)

    monkeypatch.setattr(tc, "save_trainer_checkpoint", full)
    monkeypatch.setattr("vitfast.training.trainer.save_trainer_checkpoint", full)
    out = tmp_path / "a" / "b" / "run"
    status, err = _run(WRITERS[3][1](tmp_path / "a" / "b", models))
    assert status == 1 and err == f"vitfast train: error: {out / 'trainer.pt'}: No space left on device\n", err
    assert os.listdir(tmp_path) == []  # run/, b/ and a/ were created by the command, and are gone again


# ---------------------------------------------------------------------------------------------- killed writers
_KILLED_WRITER = r"""
import os, sys, time, torch
import vitfast.io.trainer_checkpoint as tc
write, calls = tc._Sink.write, []
def stalling(self, data):
    n = write(self, data)
    calls.append(n)
    if len(calls) == 3:  # mid-save: the header and some records are out, the rest never comes
        self.f.flush()
        # and a file of the writer's own next to it, as safetensors' save_file makes (.tmpXXXXXX, renamed at the end)
        with open(os.path.join(os.path.dirname(self.f.name), ".tmpAbC123"), "wb") as f:
            f.write(b"a writer's own temporary")
        print("mid-save", flush=True)
        time.sleep(600)
    return n
tc._Sink.write = stalling
tc.save_trainer_checkpoint({"format": "vitfast-trainer", "version": 1, "w": torch.randn(100_000)}, sys.argv[1])
"""

_LIVE_WRITERS = r"""
import fcntl, os, sys, time
from vitfast.io.atomic import atomic_write
path, locked_by_live = sys.argv[1], sys.argv[2]
def write(tmp):
    # like safetensors' save_file: the temporary file is replaced by another one
    with open(tmp + ".new", "wb") as f:
        f.write(b"a live writer's bytes")
    os.replace(tmp + ".new", tmp)
    # a temporary whose name holds no live pid (another pid namespace, another NFS client), locked by a live writer
    os.mkdir(locked_by_live)
    fd = os.open(locked_by_live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print(tmp, flush=True)
    time.sleep(600)
atomic_write(path, write)
"""


def _start(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env)


def _wait_line(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline().strip()
    assert line, f"the child ended before it was ready (status {proc.wait()})"
    return line


def test_killed_writer_temp_is_removed_by_the_next_save_and_nothing_else(tmp_path):
    path = tmp_path / "trainer.pt"
    save_trainer_checkpoint({"format": "vitfast-trainer", "version": 1, "step": 1}, path)
    dead_pid = 99_999_999  # above any pid_max: no process has it
    locked_by_live = tmp_path / f".trainer.pt.{dead_pid}.{'a' * 32}.tmp"
    old_unlocked, fresh_unlocked = (tmp_path / f".trainer.pt.{c * 32}.tmp" for c in "bc")  # vitfast before the lock
    old_unlocked.write_bytes(b"x")
    os.utime(old_unlocked, (time.time() - UNLOCKED_TEMP_AGE_S - 60,) * 2)
    fresh_unlocked.write_bytes(b"x")
    others = [tmp_path / ".trainer.pt.notes.tmp", tmp_path / f".other.pt.1.{'d' * 32}.tmp", tmp_path / "trainer.pt.bak"]
    for p in others:
        p.write_bytes(b"not a temporary of trainer.pt")

    live = _start(_LIVE_WRITERS, str(path), str(locked_by_live))
    killed = None
    try:
        live_tmp = Path(_wait_line(live))
        killed = _start(_KILLED_WRITER, str(path))
        assert _wait_line(killed) == "mid-save"
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        left = [p for p in tmp_path.iterdir() if p.name.startswith(f".trainer.pt.{killed.pid}.")]
        assert len(left) == 1 and sorted(os.listdir(left[0])) == [".tmpAbC123", "trainer.pt"]  # what SIGKILL leaves
        assert (left[0] / "trainer.pt").stat().st_size > 0

        save_trainer_checkpoint({"format": "vitfast-trainer", "version": 1, "step": 2}, path)
        assert load_trainer_checkpoint(path)["step"] == 2
        assert not left[0].exists() and not old_unlocked.exists()
        assert sorted(tmp_path.iterdir()) == sorted([path, live_tmp.parent, locked_by_live, fresh_unlocked, *others])
        assert live_tmp.read_bytes() == b"a live writer's bytes"
    finally:
        for proc in (live, killed):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    # the live writer is dead now: its temporaries are stale, and go with the next save
    save_trainer_checkpoint({"format": "vitfast-trainer", "version": 1, "step": 3}, path)
    assert sorted(tmp_path.iterdir()) == sorted([path, fresh_unlocked, *others])
    assert load_trainer_checkpoint(path)["step"] == 3
