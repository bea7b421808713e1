"""Builds and describes csrc/bench/cpuid_mask.cpp, the LD_PRELOAD library that makes a process see a CPU with fewer
vector extensions (an AVX2-only one, AVX2 with AVX-VNNI, or AVX-512 without AMX) through Linux's CPUID faulting; the source explains the
mechanism and its limits.  `lowp_cells.py --emulate` runs its benchmark processes under it.

    python benchmarks/cpuid_mask.py avx2      # builds it, then prints what vitfast, PyTorch and OpenVINO see
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCE = os.path.join(ROOT, "csrc", "bench", "cpuid_mask.cpp")
PROFILES = ("avx2", "avx_vnni", "avx512")

PROBE = ("import vitfast, torch; print('vitfast', vitfast.ops.cpu_isa(), vitfast.ops.int8_kernel(), "
         "vitfast.ops.bf16_kernel()); print('torch', torch.backends.cpu.get_cpu_capability())\n"
         "try:\n import openvino as ov\n c = ov.Core(); print('openvino', c.get_property('CPU', "
         "'INFERENCE_PRECISION_HINT'), ' '.join(c.get_property('CPU', 'OPTIMIZATION_CAPABILITIES')))\n"
         "except ImportError:\n print('openvino', 'not installed')")


def host_flags() -> list[str]:
    """The kernel's CPU flags (/proc/cpuinfo; empty where there is none)."""
    from vitfast._env import host_cpu_flags

    return host_cpu_flags()


def unsupported() -> str | None:
    """Why this host cannot run the mask (a one-line reason), or None."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"cpuid_mask: needs Linux on x86-64, this is {sys.platform} on {platform.machine()}"
    if "cpuid_fault" not in host_flags():
        return "cpuid_mask: this CPU or hypervisor has no CPUID faulting (no cpuid_fault flag in /proc/cpuinfo)"
    if not (shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")):
        return "cpuid_mask: no C++ compiler (c++ or g++, or $CXX) to build it"
    return None


def build(dest_dir: str) -> str:
    """Compiles the library into dest_dir (again only when the source is newer); returns its path."""
    out = os.path.join(dest_dir, "cpuid_mask.so")
    if os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(SOURCE):
        return out
    os.makedirs(dest_dir, exist_ok=True)
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    subprocess.run([cxx, "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-o", out, SOURCE, "-ldl"], check=True)
    return out


def environment(library: str, profile: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default os.environ) with the library preloaded for `profile`."""
    if profile not in PROFILES:
        raise ValueError(f"profile: expected one of {', '.join(PROFILES)}, got {profile!r}")
    env = dict(os.environ if base is None else base)
    env["LD_PRELOAD"] = " ".join(filter(None, [library, env.get("LD_PRELOAD", "")]))
    env["VITFAST_CPUID_MASK"] = profile
    return env


def describe(profile: str) -> str:
    """The sentence a results table's conditions carry for a run under `profile`."""
    shown = {"avx2": "AVX2 + FMA only (no AVX-512, AVX-VNNI, BF16 or AMX)",
             "avx_vnni": "AVX2 + FMA + AVX-VNNI (no AVX-512, BF16 or AMX: an Alder Lake-class client CPU)",
             "avx512": "AVX-512 without AMX"}
    return (f"Emulated CPU: the process ran with cpuid masked to {shown[profile]} (benchmarks/cpuid_mask.py, "
            f"VITFAST_CPUID_MASK={profile}), so vitfast, PyTorch, ONNX Runtime and OpenVINO chose that CPU's kernels; "
            f"they ran on this host's cores, so the times are this core's, not another microarchitecture's. ")


def reexec(profile: str) -> None:
    """Runs this Python command again under the mask (returns only when already under it; exits 2 where the host
    cannot): for scripts whose own process must see the masked CPU (ONNX Runtime timed in-process)."""
    if os.environ.get("VITFAST_CPUID_MASK") == profile and "cpuid_mask" in os.environ.get("LD_PRELOAD", ""):
        return
    reason = unsupported()
    if reason:
        print(reason, file=sys.stderr)
        sys.exit(2)
    env = environment(build(os.path.join(ROOT, "build", "cpuid-mask")), profile)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile", choices=PROFILES)
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build", "cpuid-mask"))
    args = p.parse_args(argv)
    reason = unsupported()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    lib = build(args.build_dir)
    print(lib)
    return subprocess.run([sys.executable, "-c", PROBE], env=environment(lib, args.profile)).returncode


if __name__ == "__main__":
    sys.exit(main())
