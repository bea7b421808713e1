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

}  // namespace vitfast
