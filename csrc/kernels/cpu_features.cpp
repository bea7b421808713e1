#include "kernels/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <cpuid.h>
#define VITFAST_X86 1
#endif

namespace vitfast {
namespace {

#ifdef VITFAST_X86
bool x86_has_avx2_fma() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const bool fma = ecx & (1u << 12);
  const bool osxsave = ecx & (1u << 27);
  const bool avx = ecx & (1u << 28);
  if (!(fma && osxsave && avx)) return false;
  // XGETBV(0): the OS must save XMM (bit 1) and YMM (bit 2) state, or AVX registers are clobbered.
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 0x6u) != 0x6u) return false;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  return ebx & (1u << 5);  // AVX2
}
#endif

CpuIsa best_supported() {
#ifdef VITFAST_X86
  if (x86_has_avx2_fma()) return CpuIsa::kAvx2;
#endif
#if defined(__aarch64__)
  return CpuIsa::kNeon;
#endif
  return CpuIsa::kScalar;
}

CpuIsa from_environment() {
  const char* env = std::getenv("VITFAST_CPU_ISA");
  const CpuIsa best = best_supported();
  if (env == nullptr || *env == '\0') return best;
  CpuIsa wanted = best;
  if (std::strcmp(env, "scalar") == 0) wanted = CpuIsa::kScalar;
  else if (std::strcmp(env, "avx2") == 0) wanted = CpuIsa::kAvx2;
  else if (std::strcmp(env, "neon") == 0) wanted = CpuIsa::kNeon;
  // An unknown or unsupported request keeps the best path; the binding reports it to the user.
  return cpu_supports(wanted) ? wanted : best;
}

std::atomic<int>& active_slot() {
  static std::atomic<int> slot{static_cast<int>(from_environment())};
  return slot;
}

}  // namespace

bool cpu_supports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return true;
#ifdef VITFAST_X86
    case CpuIsa::kAvx2: return x86_has_avx2_fma();
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon: return true;
#endif
    default: return false;
  }
}

CpuIsa active_cpu_isa() { return static_cast<CpuIsa>(active_slot().load(std::memory_order_relaxed)); }

bool set_active_cpu_isa(CpuIsa isa) {
  if (!cpu_supports(isa)) return false;
  active_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kNeon: return "neon";
    default: return "scalar";
  }
}

}  // namespace vitfast
