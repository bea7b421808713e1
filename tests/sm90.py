"""What the GPU-legality tests share: running a compile script for an H100 (sm_90) in a subprocess without a GPU, and
ptxas's verdict on the PTX it produced.

    run_compile_script(script)   in a test: skips without triton's NVIDIA backend; runs `script` with the
                                 interpreter off and the repo and tests/ on the path; asserts it printed "ok"
    run_script(script, interpret=...)  the same runner, the interpreter on or off, without the backend check
    ptxas_report(k)              in a script: ptxas -v's report on a compiled kernel's PTX (None without ptxas):
                                 spills and serialised wgmma (warning C7515) are warnings there, not errors
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_compile_script(script: str, timeout: float = 600) -> str:
    import pytest

    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a triton build without the NVIDIA backend
        pytest.skip(f"triton has no NVIDIA backend here: {exc}")
    return run_script(script, interpret=False, timeout=timeout)


def run_script(script: str, *, interpret: bool, timeout: float = 600) -> str:
    """`script` in a subprocess with the repo and tests/ on the path and TRITON_INTERPRET=1 or unset; asserts that it
    exited 0 having printed "ok" last, and returns its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
    return proc.stdout


def ptxas_report(k):
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(k.asm["ptx"])
        proc = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", src, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True, check=True)
    return proc.stderr
