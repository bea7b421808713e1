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
#if defined(VITFAST_X86) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
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

// AMX-TILE (cpuid 7.0 edx bit 24) with AMX-BF16 (bit 22) / AMX-INT8 (bit 25), XCR0 bits 17-18 (tile config and
// data state), and Linux's permission for this process to use the 8 KiB tile data state (arch_prctl
// ARCH_REQ_XCOMP_PERM, feature 18, since Linux 5.16): without it the first tile instruction raises SIGILL.  The
// permission is process-wide and covers threads started later.  Asked once; returns the extension bits.
unsigned x86_amx_extensions() {
#if defined(__linux__)
  unsigned eax, ebx, ecx, edx;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  if (!(edx & (1u << 24))) return 0;
  unsigned xcr0_lo, xcr0_hi;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & (3u << 17)) != (3u << 17)) return 0;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return 0;
  unsigned bits = 0;
  if (edx & (1u << 22)) bits |= 1u << int(CpuExt::kAmxBf16);
  if (edx & (1u << 25)) bits |= 1u << int(CpuExt::kAmxInt8);
  return bits;
#else
  return 0;
#endif
}
#endif

// The extensions the hardware and OS have (before VITFAST_CPU_EXT and the test hook), bit i = CpuExt i.
unsigned hardware_extensions() {
  unsigned bits = 0;
#ifdef VITFAST_X86
  if (x86_has_avx2_fma()) {
    unsigned eax, ebx, ecx, edx;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    if (eax >= 1) {
      __cpuid_count(7, 1, eax, ebx, ecx, edx);
      if (eax & (1u << 4)) bits |= 1u << int(CpuExt::kAvxVnni);
    }
  }
  if (x86_has_avx512()) {
    unsigned eax, ebx, ecx, edx;
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    const unsigned max_subleaf = eax;
    if (ecx & (1u << 11)) bits |= 1u << int(CpuExt::kAvx512Vnni);
    if (max_subleaf >= 1) {
      __cpuid_count(7, 1, eax, ebx, ecx, edx);
      if (eax & (1u << 5)) bits |= 1u << int(CpuExt::kAvx512Bf16);
    }
    // The AMX kernels keep their epilogues and packing on AVX-512 (BF16 for the bf16 one): AMX counts only with it.
    static const unsigned amx = x86_amx_extensions();
    if (bits & (1u << int(CpuExt::kAvx512Bf16))) bits |= amx & (1u << int(CpuExt::kAmxBf16));
    if (bits & (1u << int(CpuExt::kAvx512Vnni))) bits |= amx & (1u << int(CpuExt::kAmxInt8));
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
    if (env != nullptr && std::strcmp(env, "none") == 0) return 0u;
    const unsigned amx = (1u << int(CpuExt::kAmxBf16)) | (1u << int(CpuExt::kAmxInt8));
    if (env != nullptr && std::strcmp(env, "noamx") == 0) return hardware_extensions() & ~amx;
    return hardware_extensions();
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

bool cpu_ext_in_use(CpuExt ext, CpuIsa isa) {
  if (!cpu_has(ext)) return false;
  switch (ext) {
    case CpuExt::kAvxVnni: return isa == CpuIsa::kAvx2 || (isa == CpuIsa::kAvx512 && !cpu_has(CpuExt::kAvx512Vnni));
    case CpuExt::kNeonDotProd:
    case CpuExt::kNeonBf16: return isa == CpuIsa::kNeon;
    default: return isa == CpuIsa::kAvx512;
  }
}

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
    case CpuExt::kAmxBf16: return "amx_bf16";
    case CpuExt::kAmxInt8: return "amx_int8";
    case CpuExt::kAvxVnni: return "avx_vnni";
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
