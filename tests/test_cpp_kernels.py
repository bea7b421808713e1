"""The torch-free C++ kernel tier (csrc/kernels) built and tested on its own with CMake/CTest (csrc/tests):
natively (every ISA path this CPU supports) and cross-built for aarch64 and run under qemu-user, where the
NEON path must really be selected and executed.

Build trees are kept between runs (tests/cmake_tree.py), so a rerun only recompiles what changed.
VITFAST_SKIP_CROSS=1 skips the aarch64 part on machines without the cross toolchain; otherwise a missing toolchain
is a failure that names the apt packages to install.  The same programs under ASan/UBSan and TSan:
test_sanitizers.py.
"""
import os
import platform
import shutil
from pathlib import Path

import pytest
from cmake_tree import ROOT, assert_every_isa_ran, build_dir, configure_build_test, run

APT_HINT = "apt-get install g++-aarch64-linux-gnu qemu-user-static"


def test_native_cmake_ctest(request):
    out = configure_build_test(build_dir(request, "native"))
    assert "100% tests passed" in out
    assert_every_isa_ran(out)
    assert "pack_cache: all checks passed" in out, out
    assert "gemm_int8: all checks passed" in out, out
    assert "huge_arena threads: ok" in out and "huge_arena: all checks passed" in out, out
    # The int8 GEMM kernels this host has, each forced and checked against the exact integer reference.
    for line in int8_kernel_lines():
        assert line in out, f"missing {line!r} in the native run:\n{out}"
    # The bf16 channel-idle FFN on the AVX512_BF16 kernel where this CPU has it (csrc/tests/test_channel_idle_ffn.cpp).
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if "avx512_bf16" in flags.split():
        assert "[avx512] channel_idle_ffn bf16 [" in out, out


def int8_kernel_lines():
    """The "[kernel] gemm_int8 parity: ok" / "[path] quantize_rows parity: ok" lines test_gemm_int8 must print here."""
    lines = ["[scalar] gemm_int8 parity: ok", "[scalar] quantize_rows parity: ok",
             "[scalar] softmax_quantize_rows parity: ok"]
    machine = platform.machine().lower()
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    words = set(flags.split())
    if machine in ("x86_64", "amd64"):
        if {"avx2", "fma"} <= words:
            lines += ["[avx2] gemm_int8 parity: ok", "[avx2] gemm_int8 narrow weights: ok",
                      "[avx2] gemm_int8 unsigned A (attention's P): ok", "[avx2] quantize_rows parity: ok",
                      "[avx2] softmax_quantize_rows parity: ok"]
        if {"avx512f", "avx512dq", "avx512bw", "avx512vl"} <= words:
            lines += ["[avx512] quantize_rows parity: ok", "[avx512] softmax_quantize_rows parity: ok"]
            if "avx512_vnni" in words:
                lines.append("[avx512_vnni] gemm_int8 parity: ok")
                if {"amx_tile", "amx_int8"} <= words:
                    lines.append("[amx_int8] gemm_int8 parity: ok")
    elif machine in ("aarch64", "arm64"):
        lines += ["[neon] quantize_rows parity: ok", "[neon] softmax_quantize_rows parity: ok"]
        if "asimddp" in words:
            lines.append("[neon_dot] gemm_int8 parity: ok")
    return lines


@pytest.mark.cross
def test_aarch64_cross_build_under_qemu(request):
    if os.environ.get("VITFAST_SKIP_CROSS") == "1":
        pytest.skip("VITFAST_SKIP_CROSS=1")
    missing = [t for t in ("aarch64-linux-gnu-g++", "qemu-aarch64-static") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: {APT_HINT} (or set VITFAST_SKIP_CROSS=1 to skip)")
    toolchain = ROOT / "cmake" / "aarch64-linux-gnu.cmake"
    out = configure_build_test(build_dir(request, "aarch64"), [f"-DCMAKE_TOOLCHAIN_FILE={toolchain}"])
    assert "100% tests passed" in out
    # The programs force each path and check active_cpu_isa() == kNeon before running it; the NEON lines
    # (parity of GEMM, GELU and the fused op) prove that code ran under qemu.  qemu-user's default CPU ("max")
    # reports HWCAP2_BF16 (qemu >= 7), so the bfdot kernel (arm/gemm_bf16_neon.cpp) runs too.
    for line in ("ISA paths under test: scalar neon", "[neon] gemm parity", "[neon] gelu",
                 "[neon] channel_idle_ffn parity", "[neon] linear parity",
                 "[neon] softmax: ok", "[neon] attention parity", "[neon] layer_norm parity",
                 # qemu-user's default CPU has the dot-product and BF16 extensions: the sdot and bfdot kernels ran,
                 # and the plain paths.
                 "[neon_dot] gemm_int8 parity: ok", "[scalar] gemm_int8 parity: ok",
                 "[neon] quantize_rows parity: ok", "gemm_int8: all checks passed",
                 "[neon_bf16] gemm_bf16 parity: ok",
                 # attention_int8 on the sdot kernels (csrc/tests/test_attention_int8.cpp).
                 "[neon] attention_int8: 15 cases", "[neon] attention_int8 on strided operands: 12 cases",
                 # the bf16 head on strided operands (csrc/tests/test_attention.cpp), the bfdot kernel and the scalar
                 "[neon] attention_head_bf16 on strided operands: 18 cases",
                 # the bf16 channel-idle FFN (its [h_act | x] GEMM) on the bfdot kernel
                 "[neon] channel_idle_ffn bf16 [neon_bf16]:",
                 "test_attention_int8: all checks passed"):
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
    run([compiler, "-O3", "-fno-math-errno", "-std=c++17", f"-I{ROOT / 'csrc'}", "-S",
          str(ROOT / "csrc" / "kernels" / "attention.cpp"), "-o", str(asm)])
    assert instruction in asm.read_text(), f"{compiler} emitted no {instruction} for attention's next-task prefetch"


@pytest.mark.parametrize("source", ["gemm_avx512.cpp", "gemm_int8_avx512.cpp", "gemm_avx2.cpp"])
def test_gemm_next_pair_prefetch_is_emitted(tmp_path, source):
    """The fp32 (AVX-512 and AVX2) and VNNI int8 GEMMs' row tiles ask L2 for the next panels' weights (`prefetcht1`,
    csrc/kernels/next_pair_prefetch.h): a kernel is as correct without it, only slower at batch 1, so nothing else
    would notice if a compiler dropped it.  Compiles each file as the build does (-O3) and looks for the instruction."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("x86 only")
    if shutil.which("c++") is None:
        pytest.skip("c++ not found")
    asm = tmp_path / (source + ".s")
    run(["c++", "-O3", "-fno-math-errno", "-std=c++17", f"-I{ROOT / 'csrc'}", "-S",
         str(ROOT / "csrc" / "kernels" / "x86" / source), "-o", str(asm)])
    assert "prefetcht1" in asm.read_text(), f"c++ emitted no prefetcht1 for {source}'s next-panel prefetch"
