"""benchmarks/cpuid_mask.py (csrc/bench/cpuid_mask.cpp): a process under the mask sees the smaller CPU in every
library (vitfast's dispatch, PyTorch's), in the threads it starts, keeps a SIGSEGV handler of its own working for
real faults, and refuses an unknown profile in one line.  Skipped where the host has no CPUID faulting."""
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import cpuid_mask

pytestmark = pytest.mark.skipif(cpuid_mask.unsupported() is not None, reason=str(cpuid_mask.unsupported()))

def _cpuid_program() -> str:
    """A Python program printing (AVX512F = leaf 7 EBX bit 16, AMX-TILE = 7 EDX bit 24, AVX-VNNI = 7.1 EAX bit 4,
    AVX2 = 7 EBX bit 5) as the main thread and a thread it starts see them, read with the instruction itself (a
    ctypes code page: cpuid(leaf, subleaf, out[4]); out's pointer kept in r8, as cpuid overwrites edx)."""
    code = [0x53,                    # push rbx
            0x49, 0x89, 0xd0,        # mov r8, rdx
            0x89, 0xf8,              # mov eax, edi
            0x89, 0xf1,              # mov ecx, esi
            0x0f, 0xa2,              # cpuid
            0x41, 0x89, 0x00,        # mov [r8], eax
            0x41, 0x89, 0x58, 0x04,  # mov [r8 + 4], ebx
            0x41, 0x89, 0x48, 0x08,  # mov [r8 + 8], ecx
            0x41, 0x89, 0x50, 0x0c,  # mov [r8 + 12], edx
            0x5b,                    # pop rbx
            0xc3]                    # ret
    return f"""
import ctypes, mmap, threading
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(bytes({code}))
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
cpuid = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32))(addr)

def bits(out):
    r = (ctypes.c_uint32 * 4)(); cpuid(7, 0, r); s = (ctypes.c_uint32 * 4)(); cpuid(7, 1, s)
    out.append(((r[1] >> 16) & 1, (r[3] >> 24) & 1, (s[0] >> 4) & 1, (r[1] >> 5) & 1))

seen = []
bits(seen)
t = threading.Thread(target=bits, args=(seen,)); t.start(); t.join()
print(seen[0], seen[1])
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return cpuid_mask.build(str(tmp_path_factory.mktemp("cpuid-mask")))


def _run(code: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_avx2_profile_clears_every_wider_extension_in_all_threads(library):
    native = _run(_cpuid_program(), dict(os.environ))
    masked = _run(_cpuid_program(), cpuid_mask.environment(library, "avx2"))
    assert native.returncode == 0 and masked.returncode == 0, native.stderr + masked.stderr
    # (AVX512F, AMX-TILE, AVX-VNNI, AVX2) in the main thread and in a new one: AVX2 kept, the wider ones gone
    assert masked.stdout.strip() == "(0, 0, 0, 1) (0, 0, 0, 1)", masked.stdout
    assert native.stdout.strip().endswith("1)")  # this host has AVX2 itself


def test_libraries_choose_the_masked_cpus_kernels(library):
    probe = ("import torch, vitfast; print(vitfast.ops.cpu_isa(), vitfast.ops.int8_kernel(), "
             "vitfast.ops.bf16_kernel(), torch.backends.cpu.get_cpu_capability())")
    out = _run(probe, cpuid_mask.environment(library, "avx2"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["avx2", "avx2", "none", "AVX2"]
    import vitfast

    if "avx_vnni" in cpuid_mask.host_flags():  # the mask only removes: AVX-VNNI kept where the host has it
        out = _run(probe, cpuid_mask.environment(library, "avx_vnni"))
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["avx2", "avx_vnni", "none", "AVX2"]
    if vitfast.ops.cpu_isa() == "avx512":
        out = _run(probe, cpuid_mask.environment(library, "avx512"))
        assert out.returncode == 0, out.stderr
        isa, int8, bf16, torch_cap = out.stdout.split()
        assert isa == "avx512" and not int8.startswith("amx") and not bf16.startswith("amx"), out.stdout


def test_a_programs_own_sigsegv_handler_still_sees_real_faults(library):
    # Python's faulthandler installs a SIGSEGV handler after the library's; cpuid keeps working through ours, and a
    # real fault (reading address 0) still reaches faulthandler, which reports it and lets the process die of it.
    code = "import ctypes, vitfast; print(vitfast.ops.cpu_isa(), flush=True); ctypes.string_at(0)"
    out = _run(code, cpuid_mask.environment(library, "avx2"), "-X", "faulthandler")
    assert out.stdout.strip() == "avx2"
    assert out.returncode == -11 and "Segmentation fault" in out.stderr, (out.returncode, out.stderr[-500:])


def test_unknown_profile_is_refused_in_one_line(library):
    env = cpuid_mask.environment(library, "avx2")
    env["VITFAST_CPUID_MASK"] = "sse2"
    out = _run("print('ran')", env)
    assert out.returncode == 3 and out.stdout == ""
    assert out.stderr.strip() == "cpuid_mask: VITFAST_CPUID_MASK: expected avx2, avx_vnni or avx512, got 'sse2'"
    with pytest.raises(ValueError, match="profile: expected one of avx2, avx_vnni, avx512, got 'sse2'"):
        cpuid_mask.environment(library, "sse2")
