"""The torch-free C++ kernel tier (csrc/kernels) built and tested on its own with CMake/CTest (csrc/tests):
natively (every ISA path this CPU supports) and cross-built for aarch64 and run under qemu-user, where the
NEON path must really be selected and executed.

Build trees are kept between runs (pytest's cache dir, or the system temp dir with `-p no:cacheprovider`), so
a rerun only recompiles what changed.  VITFAST_SKIP_CROSS=1 skips the aarch64 part on machines without the
cross toolchain; otherwise a missing toolchain is a failure that names the apt packages to install.
"""
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APT_HINT = "apt-get install g++-aarch64-linux-gnu qemu-user-static"


def _tool(name):
    """A tool from the venv (pip's cmake/ninja) first, then PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


def _build_dir(request, flavour):
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir(f"vitfast-cpp-{flavour}"))
    key = hashlib.sha1(str(ROOT).encode()).hexdigest()[:10]
    path = Path(tempfile.gettempdir()) / f"vitfast-cpp-{flavour}-{key}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _run(cmd, cwd=None, timeout=600):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def _configure_build_test(build, extra_args=()):
    cmake = _tool("cmake")
    assert cmake, "cmake not found (pip install cmake, or apt-get install cmake)"
    ctest = _tool("ctest") or shutil.which("ctest")
    gen = ["-G", "Ninja"] if _tool("ninja") else []
    if gen and _tool("ninja") != shutil.which("ninja"):
        gen += [f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}"]
    if not (build / "CMakeCache.txt").exists():
        _run([cmake, "-S", str(ROOT), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release", *extra_args])
    jobs = str(os.cpu_count() or 2)
    _run([cmake, "--build", str(build), "--parallel", jobs])
    # -V: the test programs print which ISA paths they forced and ran; checked below.
    return _run([ctest, "--test-dir", str(build), "--output-on-failure", "-V"])


def test_native_cmake_ctest(request):
    out = _configure_build_test(_build_dir(request, "native"))
    assert "100% tests passed" in out
    machine = platform.machine().lower()
    assert "[scalar] channel_idle_ffn parity" in out and "[scalar] gemm parity" in out
    assert "[scalar] linear parity" in out and "[scalar] attention parity" in out
    assert "[scalar] layer_norm parity" in out
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if machine in ("x86_64", "amd64") and " avx2 " in flags and " fma " in flags:
        # This CPU can run AVX2/FMA: the C++ tests must have forced and executed that path too.
        assert "[avx2] channel_idle_ffn parity" in out and "[avx2] gemm parity" in out, out
        assert "[avx2] linear parity" in out and "[avx2] attention parity" in out, out
        assert "[avx2] softmax: ok" in out and "[avx2] layer_norm parity" in out, out
    if machine in ("x86_64", "amd64") and all(f" {f} " in flags for f in ("avx512f", "avx512dq", "avx512bw", "avx512vl")):
        # ... and the AVX-512 path (its own GEMM tiles and GELU epilogue) on a CPU that has it.
        assert "[avx512] channel_idle_ffn parity" in out and "[avx512] gemm parity" in out, out
        assert "[avx512] linear parity" in out and "[avx512] attention parity" in out, out
        assert "[avx512] gelu epilogue" in out and "[avx512] softmax: ok" in out, out
        assert "[avx512] layer_norm parity" in out, out
    if machine in ("aarch64", "arm64"):
        assert "[neon] channel_idle_ffn parity" in out and "[neon] linear parity" in out, out
        assert "[neon] attention parity" in out and "[neon] softmax: ok" in out, out
        assert "[neon] layer_norm parity" in out, out


@pytest.mark.cross
def test_aarch64_cross_build_under_qemu(request):
    if os.environ.get("VITFAST_SKIP_CROSS") == "1":
        pytest.skip("VITFAST_SKIP_CROSS=1")
    missing = [t for t in ("aarch64-linux-gnu-g++", "qemu-aarch64-static") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: {APT_HINT} (or set VITFAST_SKIP_CROSS=1 to skip)")
    toolchain = ROOT / "cmake" / "aarch64-linux-gnu.cmake"
    out = _configure_build_test(_build_dir(request, "aarch64"), [f"-DCMAKE_TOOLCHAIN_FILE={toolchain}"])
    assert "100% tests passed" in out
    # The programs force each path and check active_cpu_isa() == kNeon before running it; the NEON lines
    # (parity of GEMM, GELU and the fused op) prove that code ran under qemu.
    for line in ("ISA paths under test: scalar neon", "[neon] gemm parity", "[neon] gelu",
                 "[neon] channel_idle_ffn parity", "[neon] linear parity",
                 "[neon] softmax: ok", "[neon] attention parity", "[neon] layer_norm parity"):
        assert line in out, f"missing {line!r} in the qemu run:\n{out}"


@pytest.mark.parametrize("compiler, instruction", [("c++", None), ("aarch64-linux-gnu-g++", "prfm")])
def test_attention_next_task_prefetch_is_emitted(tmp_path, compiler, instruction):
    """GCC once deleted attention's next-task prefetch loop as dead code (prefetches have no side effect it must
    keep), silently: the kernel stayed correct, only slower.  The prefetch is now a volatile asm statement; this
    compiles attention.cpp as the build does (-O3) and checks the instruction is in the output."""
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} not found")
    if instruction is None:
        machine = platform.machine().lower()
        if machine in ("x86_64", "amd64"):
            instruction = "prefetcht0"
        elif machine in ("aarch64", "arm64"):
            instruction = "prfm"
        else:
            pytest.skip(f"no prefetch instruction to look for on {machine}")
    asm = tmp_path / "attention.s"
    _run([compiler, "-O3", "-fno-math-errno", "-std=c++17", f"-I{ROOT / 'csrc'}", "-S",
          str(ROOT / "csrc" / "kernels" / "attention.cpp"), "-o", str(asm)])
    assert instruction in asm.read_text(), f"{compiler} emitted no {instruction} for attention's next-task prefetch"
