"""Test-wide set-up.

Triton kernels run natively on a GPU machine and through the Triton interpreter everywhere else; the
interpreter must be chosen before triton is imported, so it is decided here from the presence of an NVIDIA
device node, not from torch (importing torch first is fine: it does not import triton).
"""
import glob
import os

if "TRITON_INTERPRET" not in os.environ and not glob.glob("/dev/nvidia[0-9]*"):
    os.environ["TRITON_INTERPRET"] = "1"
# Parity suites check results, not tile choices: one config per kernel instead of compiling every autotune
# candidate for every test shape (kernels/_autotune.py).  Benchmarks leave autotuning on.
os.environ.setdefault("VITFAST_TRITON_AUTOTUNE", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

# (dtype, atol, rtol), defined once for every parity test (STYLE.md).
TOLERANCES = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (2e-2, 2e-2),
    torch.bfloat16: (8e-2, 5e-2),
}


def _interpreter_broken_reason():
    """Why the Triton interpreter cannot run the Triton tests here, or None.  triton < 3.2's interpreter (torch
    2.4/2.5 ship 3.0/3.1) silently skips loads and stores under numpy >= 2 (a copy kernel returns zeros); triton
    3.6's (torch 2.11's) raises on `range(0, n, BLOCK)` over a runtime n under numpy 2.4 ("only 0-dimensional
    arrays can be converted to Python scalars").  Beyond the known version pair, a probe kernel with both (a strided
    loop over a runtime bound, masked loads and stores) must copy its input: the kernels' results mean nothing
    where it does not."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return None
    import numpy
    import triton

    from vitfast.kernels._common import triton_version

    if triton_version() < (3, 2) and int(numpy.__version__.split(".")[0]) >= 2:
        return (f"the Triton interpreter of triton {triton.__version__} (< 3.2) ignores loads/stores under numpy "
                f"{numpy.__version__}: install numpy<2 to run the Triton tests with this torch")
    from interpreter_probe import copy_probe

    try:
        ok = copy_probe()
    except Exception as exc:  # noqa: BLE001 - any failure of a trivially correct kernel is the interpreter's
        return (f"the Triton interpreter of triton {triton.__version__} fails a trivial copy kernel under numpy "
                f"{numpy.__version__} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): "
                f"run the Triton tests with another numpy or triton")
    if not ok:
        return (f"the Triton interpreter of triton {triton.__version__} copies wrongly under numpy "
                f"{numpy.__version__}: run the Triton tests with another numpy or triton")
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if item.get_closest_marker("triton") is None or item.get_closest_marker("gpu_compile") is not None:
            continue
        reason = reason or _interpreter_broken_reason()
        if reason is None:
            return
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def tol():
    return TOLERANCES


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def one_thread():
    """One torch thread for the test, restored after: on 2 shared cores one thread per test process is faster and
    keeps timings stable.  A module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _supported_cpu_isas():
    import vitfast

    if not vitfast.ops.extension_loaded():
        return []  # the kernel test files refuse to run without the build, with a message saying so
    from vitfast import _C

    return list(_C.supported_cpu_isas())


def _platform_cpu_isas():
    """Every CPU code path vitfast has for this architecture, supported by this CPU or not: a path the CPU lacks
    shows up as a skip with its reason, not as tests that silently vanish (a CPU without AVX-512 runs no AVX-512 code, and
    the count of collected tests alone did not say so)."""
    import platform

    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i386", "i686"):
        return ["scalar", "avx2", "avx512"]
    if machine in ("aarch64", "arm64"):
        return ["scalar", "neon"]
    return ["scalar"]


@pytest.fixture(params=_platform_cpu_isas() if _supported_cpu_isas() else [])
def isa(request):
    """Force one CPU code path (scalar / avx2 / avx512 / neon) for the test, then restore the previous one."""
    from vitfast import _C

    if request.param not in _C.supported_cpu_isas():
        pytest.skip(f"isa {request.param}: this CPU cannot run that code path, so it is not tested on this machine "
                    f"(runs here: {', '.join(_C.supported_cpu_isas())})")
    previous = _C.set_cpu_isa(request.param)
    assert _C.cpu_isa() == request.param
    yield request.param
    _C.set_cpu_isa(previous)


@pytest.fixture
def restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(params=["ext on", "ext off"])
def ext(request):
    """The low-precision extension of the path (VNNI / NEON dot product / BF16) on, then off (VITFAST_CPU_EXT's
    switch), for the int8 kernels' tests; yields the int8 kernel that runs."""
    from vitfast import _C

    on = request.param == "ext on"
    previous = _C.int8_kernel()
    if not on:
        _C.set_cpu_ext_enabled(False)
    yield _C.int8_kernel()
    _C.set_cpu_ext_enabled(True)
    assert _C.int8_kernel() == previous or not on


def _descendants(pid: int):
    """Pids of the processes below `pid`, children first (Linux /proc; empty elsewhere)."""
    parent = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                parent[int(stat.split("/")[2])] = int(f.read().rsplit(")", 1)[1].split()[1])  # "(comm) state ppid"
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for child, ppid in parent.items() if ppid in frontier]
        found += frontier
    return found


def _kill_descendants(say) -> None:
    """SIGKILL every process below this one; say(line) for each, naming its command."""
    import signal

    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        say(f"\nconftest: killed process {pid} left running by the tests: {cmd}\n")


def pytest_sessionfinish(session, exitstatus):
    """A child a failed test left hanging would hold the run's output pipe open, and the CI job would wait for it
    until its own time limit: end every process still alive below the run when it ends (and say so)."""
    import sys

    _kill_descendants(sys.stdout.write)


# A test that hangs (a deadlock in C++ code, where no Python-level timeout can fire) would otherwise hold the run
# until CI's own limit and say nothing.  One watchdog thread: a test running longer than VITFAST_TEST_TIMEOUT
# seconds (default 1200; the slowest case, the ASan+UBSan CTest run, takes ~90 s) gets every thread's stack
# printed, the processes below the run killed, and the run ended with status 3.
_TEST_TIMEOUT = float(os.environ.get("VITFAST_TEST_TIMEOUT", "1200"))
_running: dict = {}


def _watchdog() -> None:
    import faulthandler
    import sys
    import time

    while True:
        time.sleep(5)
        current = dict(_running)
        if current and time.monotonic() - current["since"] > _TEST_TIMEOUT:
            capture = current["config"].pluginmanager.getplugin("capturemanager")
            if capture is not None:  # the output goes to the terminal, not to the test's capture
                capture.suspend_global_capture(in_=True)
            sys.stderr.write(f"\nconftest: {current['nodeid']} ran over {_TEST_TIMEOUT:.0f} s "
                             "(VITFAST_TEST_TIMEOUT): every thread's stack, then the run ends\n")
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            _kill_descendants(sys.stderr.write)
            sys.stderr.flush()
            os._exit(3)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import time

    _running.update(nodeid=item.nodeid, since=time.monotonic(), config=item.config)
    try:
        yield
    finally:
        _running.clear()


def pytest_configure(config):
    import threading

    if _TEST_TIMEOUT > 0:
        threading.Thread(target=_watchdog, name="vitfast-test-watchdog", daemon=True).start()
