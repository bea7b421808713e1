// Run-time choice of the CPU code path.  Torch-free: used by the kernels, the binding and the C++ tests.
#pragma once

namespace vitfast {

enum class CpuIsa { kScalar = 0, kAvx2 = 1, kNeon = 2 };

// What this CPU and OS can run (x86: cpuid AVX2+FMA bits *and* XGETBV says the OS saves YMM state).
bool cpu_supports(CpuIsa isa);

// The path kernels use: the best supported one, or VITFAST_CPU_ISA=scalar|avx2|neon when set
// (asking for a path the CPU cannot run is an error, reported by active_cpu_isa_checked()).
CpuIsa active_cpu_isa();

// Override for tests (and for the binding after reading the environment); returns false if unsupported.
bool set_active_cpu_isa(CpuIsa isa);

const char* cpu_isa_name(CpuIsa isa);

}  // namespace vitfast
