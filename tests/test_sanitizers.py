"""The torch-free C++ tier under sanitizers: every CTest program (the kernels on every ISA path this CPU has, and the
packed-weight cache's core, csrc/cache/pack_cache.h) built with AddressSanitizer + UndefinedBehaviorSanitizer, and
the cache and the huge-page arena (their thread stress) with ThreadSanitizer.  CMake option VITFAST_SANITIZE (CMakeLists.txt); each flavour
has its own cached build tree (tests/cmake_tree.py).  Any sanitizer report stops the program (halt_on_error,
-fno-sanitize-recover), so it is a failed test with the report in its output.

Each flavour first compiles a program with a planted bug (a use-after-free, a data race) with the same compiler and
flags and requires the sanitizer to report it: this is how a sanitizer that cannot run here is told apart from a
clean result.  Only a runtime that cannot start in this environment (TSan's "unexpected memory mapping" on some
kernels, also after `setarch -R`) skips, with its own message as the reason; a runtime that starts but misses the
planted bug, or a missing sanitizer library, fails.
"""
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cmake_tree import assert_every_isa_ran, build_dir, configure_build_test

COMMON = ["-fno-omit-frame-pointer", "-fno-sanitize-recover=all", "-g", "-O1"]
ASAN_UBSAN_ENV = {
    "ASAN_OPTIONS": "halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:strict_init_order=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
}
TSAN_ENV = {"TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"}
# What a sanitizer prints when it finds something (in case one ever reported without stopping the program).
REPORT = re.compile(r"ERROR: (Address|Leak)Sanitizer|runtime error:|WARNING: ThreadSanitizer")

PLANTED_USE_AFTER_FREE = """
#include <cstdio>
int main() {
  int* p = new int[4];
  delete[] p;
  std::printf("%d\\n", p[1]);
}
"""
PLANTED_RACE = """
#include <cstdio>
#include <thread>
int counter = 0;
int main() {
  std::thread a([] { for (int i = 0; i < 1000; ++i) ++counter; });
  std::thread b([] { for (int i = 0; i < 1000; ++i) ++counter; });
  a.join();
  b.join();
  std::printf("%d\\n", counter);
}
"""


def _compiler():
    """The compiler CMake picks by default: $CXX, else c++."""
    cxx = os.environ.get("CXX") or "c++"
    if shutil.which(cxx) is None:
        pytest.fail(f"C++ compiler {cxx!r} not found")
    return cxx


def _launcher_for(tmp_path, sanitize, source, expected, env):
    """Compiles `source` (a planted bug) with `-fsanitize=sanitize` and runs it: the command prefix under which the
    sanitizer runs here ([] or setarch -R), after checking it reports `expected`.  Skips only if the runtime cannot
    start, with its own message."""
    src, exe = tmp_path / "planted.cpp", tmp_path / "planted"
    src.write_text(source)
    proc = subprocess.run([_compiler(), f"-fsanitize={sanitize}", *COMMON, "-std=c++17", "-pthread", str(src),
                           "-o", str(exe)], check=False, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        pytest.fail(f"cannot build with -fsanitize={sanitize} (the compiler's sanitizer runtime, e.g. Debian's "
                    f"libasan8 libubsan1 libtsan2, must be installed):\n{proc.stderr}")
    # An address-space layout the runtime cannot map its shadow into is a property of the kernel (ASLR entropy);
    # without randomization it may start.
    fatal = None
    for launcher in ([], ["setarch", platform.machine(), "-R"]):
        if launcher and shutil.which("setarch") is None:
            break
        run = subprocess.run([*launcher, str(exe)], check=False, capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, **env))
        out = run.stdout + run.stderr
        if expected in out and run.returncode != 0:
            return launcher
        fatal = next((line.strip() for line in out.splitlines() if "FATAL" in line or "Shadow memory range" in line),
                     None)
        if fatal is None:
            pytest.fail(f"-fsanitize={sanitize} ran a program with a planted bug without reporting {expected!r} "
                        f"(exit status {run.returncode}):\n{out}")
    pytest.skip(f"the {sanitize} sanitizer runtime cannot start here (also not under setarch -R): {fatal}")


def _assert_instrumented(build, sanitize, names):
    # A test that passes only means something if its program was built with the sanitizer: an instrumented binary
    # imports the runtime's entry points.
    marks = {"address": b"__asan_init", "undefined": b"__ubsan_handle_", "thread": b"__tsan_init"}
    for name in names:
        data = (Path(build) / name).read_bytes()
        for s in sanitize.split(","):
            assert marks[s] in data, f"{name} was not built with -fsanitize={s} (no {marks[s].decode()} in it)"


def _assert_clean(out):
    assert "100% tests passed" in out, out
    found = REPORT.search(out)
    assert found is None, f"sanitizer report in a passing run ({found.group(0)}):\n{out}"


@pytest.mark.slow  # cold: about a minute of compiling on 2 cores (warm: ~10 s)
def test_ctest_under_asan_ubsan(request, tmp_path):
    launcher = _launcher_for(tmp_path, "address,undefined", PLANTED_USE_AFTER_FREE, "heap-use-after-free",
                             ASAN_UBSAN_ENV)
    build = build_dir(request, "asan-ubsan")
    out = configure_build_test(build, ["-DVITFAST_SANITIZE=address,undefined"], env=ASAN_UBSAN_ENV,
                               launcher=launcher)
    _assert_clean(out)
    assert_every_isa_ran(out)
    assert "pack_cache: all checks passed" in out, out
    # ASan must see every allocation's bounds, so the arena is off in this build and its fallback is tested.
    assert "huge_arena: off in this build" in out and "huge_arena: all checks passed" in out, out
    programs = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "csrc" / "tests").glob("test_*.cpp"))
    _assert_instrumented(build, "address,undefined", programs)


def test_pack_cache_under_tsan(request, tmp_path):
    launcher = _launcher_for(tmp_path, "thread", PLANTED_RACE, "WARNING: ThreadSanitizer: data race", TSAN_ENV)
    build = build_dir(request, "tsan")
    # Only the cache and the huge-page arena (the two pieces with a lock): the kernels start no threads (callers
    # split the work), and it keeps this build to four files.
    programs = ["test_pack_cache", "test_huge_arena"]
    out = configure_build_test(build, ["-DVITFAST_SANITIZE=thread"], targets=programs,
                               tests="^(test_pack_cache|test_huge_arena)$", env=TSAN_ENV, launcher=launcher)
    _assert_clean(out)
    assert "pack_cache threads:" in out and "pack_cache: all checks passed" in out, out
    assert "huge_arena threads: ok" in out and "huge_arena: all checks passed" in out, out
    _assert_instrumented(build, "thread", programs)
