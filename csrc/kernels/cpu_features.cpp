#include "kernels/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <cpuid.h>
#define VITFAST_X86 1
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
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

// AVX-512 F (ebx bit 16), DQ (17), BW (30), VL (31) on top of AVX2/FMA, and XCR0 bits 5-7 (opmask, upper
// halves of zmm0-15, zmm16-31) besides XMM/YMM: without them the OS does not preserve the registers.
bool x86_has_avx512() {
  if (!x86_has_avx2_fma()) return false;
  unsigned eax, ebx, ecx, edx;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const unsigned need = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
  if ((ebx & need) != need) return false;
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return (xcr0_lo & 0xE6u) == 0xE6u;
}
#endif

// The extensions the hardware and OS have (before VITFAST_CPU_EXT and the test hook), bit i = CpuExt i.
unsigned hardware_extensions() {
  unsigned bits = 0;
#ifdef VITFAST_X86
  if (x86_has_avx512()) {
    unsigned eax, ebx, ecx, edx;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    const unsigned max_subleaf = eax;
    if (ecx & (1u << 11)) bits |= 1u << int(CpuExt::kAvx512Vnni);
    if (max_subleaf >= 1) {
      __cpuid_count(7, 1, eax, ebx, ecx, edx);
      if (eax & (1u << 5)) bits |= 1u << int(CpuExt::kAvx512Bf16);
    }
  }
#endif
#if defined(__aarch64__) && defined(__linux__)
  const unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
  if (hwcap & (1ul << 20)) bits |= 1u << int(CpuExt::kNeonDotProd);  // HWCAP_ASIMDDP
  if (hwcap2 & (1ul << 14)) bits |= 1u << int(CpuExt::kNeonBf16);    // HWCAP2_BF16
#endif
  return bits;
}

std::atomic<unsigned>& extension_slot() {
  static std::atomic<unsigned> slot{[] {
    const char* env = std::getenv("VITFAST_CPU_EXT");
    return (env != nullptr && std::strcmp(env, "none") == 0) ? 0u : hardware_extensions();
  }()};
  return slot;
}

CpuIsa best_supported() {
#ifdef VITFAST_X86
  // AVX-512 first: its 14 × 32 tiles measured ~3% faster than AVX2's 6 × 16 even on a core that splits a 512-bit
  // FMA in two (same FMA peak, fewer loads and instructions per FMA; see x86/gemm_avx512.cpp), and more on CPUs
  // with two 512-bit FMA units.
  if (x86_has_avx512()) return CpuIsa::kAvx512;
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
  else if (std::strcmp(env, "avx512") == 0) wanted = CpuIsa::kAvx512;
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
    case CpuIsa::kAvx512: return x86_has_avx512();
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon: return true;
#endif
    default: return false;
  }
}

CpuIsa active_cpu_isa() { return static_cast<CpuIsa>(active_slot().load(std::memory_order_relaxed)); }

bool is_x86_simd(CpuIsa isa) { return isa == CpuIsa::kAvx2 || isa == CpuIsa::kAvx512; }

bool set_active_cpu_isa(CpuIsa isa) {
  if (!cpu_supports(isa)) return false;
  active_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
  return true;
}

bool cpu_has(CpuExt ext) { return (extension_slot().load(std::memory_order_relaxed) >> int(ext)) & 1u; }

bool set_cpu_ext_enabled(CpuExt ext, bool enabled) {
  const unsigned bit = 1u << int(ext);
  if (!(hardware_extensions() & bit)) return false;
  if (enabled) extension_slot().fetch_or(bit, std::memory_order_relaxed);
  else extension_slot().fetch_and(~bit, std::memory_order_relaxed);
  return true;
}

const char* cpu_ext_name(CpuExt ext) {
  switch (ext) {
    case CpuExt::kAvx512Vnni: return "avx512_vnni";
    case CpuExt::kAvx512Bf16: return "avx512_bf16";
    case CpuExt::kNeonDotProd: return "neon_dotprod";
    default: return "neon_bf16";
  }
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kNeon: return "neon";
    default: return "scalar";
  }
}

}  // namespace vitfast
