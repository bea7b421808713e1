"""Configure, build and run the torch-free CMake tree (CMakeLists.txt: csrc/kernels, csrc/cache, csrc/tests) from
the tests (`from cmake_tree import ...`: pytest puts tests/ on sys.path); test_cpp_kernels.py and
test_sanitizers.py build their flavours with it.

Build trees are kept between runs (pytest's cache dir, or the system temp dir with `-p no:cacheprovider`), one per
flavour, so a rerun only recompiles what changed.
"""
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tool(name):
    """A tool from the venv (pip's cmake/ninja) first, then PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


def build_dir(request, flavour):
    cache = getattr(request.config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir(f"vitfast-cpp-{flavour}"))
    key = hashlib.sha1(str(ROOT).encode()).hexdigest()[:10]
    path = Path(tempfile.gettempdir()) / f"vitfast-cpp-{flavour}-{key}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def run(cmd, cwd=None, timeout=600, env=None):
    proc = subprocess.run(cmd, check=False, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def configure_build_test(build, extra_args=(), targets=(), tests=None, env=None, launcher=()):
    """Configures `build` once, builds `targets` (all by default), runs CTest (only tests matching the regex `tests`
    if given) with `env` added to the environment, under `launcher` (a command prefix such as `setarch -R`), and
    returns CTest's verbose output."""
    cmake = tool("cmake")
    assert cmake, "cmake not found (pip install cmake, or apt-get install cmake)"
    ctest = tool("ctest") or shutil.which("ctest")
    gen = ["-G", "Ninja"] if tool("ninja") else []
    if gen and tool("ninja") != shutil.which("ninja"):
        gen += [f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}"]
    if not (build / "CMakeCache.txt").exists():
        run([cmake, "-S", str(ROOT), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release", *extra_args])
    jobs = str(os.cpu_count() or 2)
    run([cmake, "--build", str(build), "--parallel", jobs, *(["--target", *targets] if targets else [])])
    select = ["-R", tests] if tests else []
    # -V: the test programs print which ISA paths they forced and ran; the callers check that.
    return run([*launcher, ctest, "--test-dir", str(build), "--output-on-failure", "-V", *select],
               env=dict(os.environ, **(env or {})))


def assert_every_isa_ran(out):
    """The CTest kernel programs forced and ran the scalar path and every SIMD path this CPU has."""
    machine = platform.machine().lower()
    assert "[scalar] channel_idle_ffn parity" in out and "[scalar] gemm parity" in out, out
    assert "[scalar] linear parity" in out and "[scalar] attention parity" in out, out
    assert "[scalar] layer_norm parity" in out, out
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
