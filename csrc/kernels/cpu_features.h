// Run-time choice of the CPU code path.  Torch-free: used by the kernels, the binding and the C++ tests.
#pragma once

namespace vitfast {

// Values are stable (appended, never renumbered).  kAvx512 = AVX-512 F/DQ/BW/VL GEMM tiles (x86), which
// implies AVX2/FMA: code that has no AVX-512 variant of its own treats it as kAvx2 (see is_x86_simd).
enum class CpuIsa { kScalar = 0, kAvx2 = 1, kNeon = 2, kAvx512 = 3 };

// True for the x86 paths that can run AVX2/FMA code (kAvx2 and kAvx512): lets an op with only an AVX2
// variant serve both.  (Defined out of line: this header is reachable from files compiled under
// `#pragma GCC target`, where an inline definition would be the ODR hazard gemm_isa.h describes.)
bool is_x86_simd(CpuIsa isa);

// What this CPU and OS can run (x86: cpuid AVX2+FMA bits *and* XGETBV says the OS saves YMM state; AVX-512:
// cpuid F/DQ/BW/VL *and* XGETBV says the OS saves opmask and all ZMM state).
bool cpu_supports(CpuIsa isa);

// The path kernels use: the best supported one, or VITFAST_CPU_ISA=scalar|avx2|avx512|neon when set
// (asking for a path the CPU cannot run is an error, reported by active_cpu_isa_checked()).
CpuIsa active_cpu_isa();

// Override for tests (and for the binding after reading the environment); returns false if unsupported.
bool set_active_cpu_isa(CpuIsa isa);

const char* cpu_isa_name(CpuIsa isa);

// Instruction-set extensions used *inside* a path by the low-precision GEMMs (gemm_int8.h, gemm_bf16.h); not paths
// of their own.  x86: AVX512_VNNI (cpuid 7.0 ecx bit 11, `vpdpbusd`), AVX512_BF16 (cpuid 7.1 eax bit 5,
// `vdpbf16ps`), both on top of kAvx512; AMX-BF16 / AMX-INT8 (cpuid 7.0 edx bits 22 / 25 with AMX-TILE, XCR0 tile
// state and Linux's arch_prctl permission; `tdpbf16ps` / `tdpbssd` on 16-row tiles), each on top of the AVX-512
// extension its kernel's epilogue and packing use (BF16 / VNNI); AVX-VNNI (cpuid 7.1 eax bit 4: the VEX-encoded
// 256-bit `vpdpbusd`, on top of kAvx2, for the CPUs with AVX2 and no AVX-512 among them).  aarch64: the dot-product
// (HWCAP_ASIMDDP, `sdot`) and BF16 (HWCAP2_BF16, `bfdot`/`bfmmla`) extensions of NEON, read from the auxiliary vector.
// VITFAST_CPU_EXT=none turns all of them off (the low-precision GEMMs then take their AVX2 / plain-NEON / scalar
// kernels), VITFAST_CPU_EXT=noamx only the AMX ones (the AVX-512 kernels then), for tests and comparisons.
enum class CpuExt {
  kAvx512Vnni = 0, kAvx512Bf16 = 1, kNeonDotProd = 2, kNeonBf16 = 3, kAmxBf16 = 4, kAmxInt8 = 5, kAvxVnni = 6
};
bool cpu_has(CpuExt ext);
// Whether the kernels of `isa` use `ext` (which the CPU has): the AVX-512 extensions on the kAvx512 path, AVX-VNNI on
// kAvx2 (and on kAvx512 without AVX512_VNNI), the NEON ones on kNeon.
bool cpu_ext_in_use(CpuExt ext, CpuIsa isa);
// Test hook: enable/disable an extension the CPU has (returns false, and changes nothing, if it does not have it).
bool set_cpu_ext_enabled(CpuExt ext, bool enabled);
const char* cpu_ext_name(CpuExt ext);

}  // namespace vitfast
