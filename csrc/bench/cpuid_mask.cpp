// cpuid_mask: an LD_PRELOAD library that makes every `cpuid` in a process report a CPU with fewer vector extensions
// than the host has, so that all of the process's libraries (vitfast, PyTorch, ONNX Runtime's MLAS, OpenVINO's
// oneDNN) choose the kernels they would choose on that smaller CPU.  benchmarks/lowp_cells.py --emulate uses it to
// measure the low-precision cells of an AVX2-only host (anchors included) on a host that has AVX-512.
//
//     VITFAST_CPUID_MASK=avx2 LD_PRELOAD=/path/cpuid_mask.so python ...
//
// Profiles (VITFAST_CPUID_MASK):
//   avx2    AVX2 + FMA + F16C only: every AVX-512 feature, AVX-VNNI, AVX-IFMA, AVX-VNNI-INT8, the AVX512_BF16/FP16
//           and AMX bits cleared (an AVX2 host such as a Zen 3 or Haswell … Alder Lake without AVX-VNNI).
//   avx_vnni  avx2's CPU with AVX-VNNI (the 256-bit vpdpbusd): Intel's client cores since Alder Lake.
//   avx512  AVX-512 (F, CD, BW, DQ, VL, VNNI, BF16, …) without AMX (a Zen 4/5 or Ice Lake's extension set).
//
// How: Linux's CPUID faulting (arch_prctl(ARCH_SET_CPUID, 0); /proc/cpuinfo flag `cpuid_fault`) makes `cpuid`
// raise SIGSEGV in this thread and in the threads it creates; the handler runs the real instruction (faulting
// switched off around it), clears the profile's bits and resumes after the 2-byte instruction.  A SIGSEGV that is
// not a `cpuid` goes to the handler the program installed (sigaction/signal are wrapped so that installing one does
// not remove this one), or to the default action.  Only what a program asks cpuid changes: XGETBV still reports
// the AVX-512 and tile state enabled, which no library uses without the cpuid bit first, and glibc's own string
// functions were chosen by the dynamic loader before this library's constructor ran (they keep AVX-512 forms).
// The instructions still execute on the host's core: an AVX2 kernel's speed here is this core's, not a Zen 3's.
//
// Exit status 3 with a one-line message when the profile is unknown or the kernel refuses CPUID faulting.
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdint>

namespace {

constexpr long kArchSetCpuid = 0x1012;  // asm/prctl.h ARCH_SET_CPUID

// Bits cleared per (leaf, subleaf, register).
struct Clear {
  uint32_t leaf, subleaf;
  int reg;  // 0 eax, 1 ebx, 2 ecx, 3 edx
  uint32_t bits;
};

constexpr uint32_t bit(int i) { return uint32_t(1) << i; }

// Leaf 7.0: EBX 16 AVX512F, 17 DQ, 21 IFMA, 26 PF, 27 ER, 28 CD, 30 BW, 31 VL; ECX 1 VBMI, 6 VBMI2, 11 VNNI,
// 12 BITALG, 14 VPOPCNTDQ; EDX 2 4VNNIW, 3 4FMAPS, 8 VP2INTERSECT, 22 AMX-BF16, 23 AVX512_FP16, 24 AMX-TILE,
// 25 AMX-INT8.  Leaf 7.1: EAX 4 AVX-VNNI, 5 AVX512_BF16, 21 AMX-FP16, 23 AVX-IFMA; EDX 4 AVX-VNNI-INT8,
// 5 AVX-NE-CONVERT, 8 AMX-COMPLEX, 10 AVX-VNNI-INT16; leaf 0x24 (AVX10) is hidden by clearing 7.1 EDX 19.
constexpr uint32_t kAmx70Edx = bit(22) | bit(24) | bit(25);
constexpr uint32_t kAmx71Eax = bit(21);
constexpr uint32_t kAmx71Edx = bit(8);
const Clear kAvx2[] = {
    {7, 0, 1, bit(16) | bit(17) | bit(21) | bit(26) | bit(27) | bit(28) | bit(30) | bit(31)},
    {7, 0, 2, bit(1) | bit(6) | bit(11) | bit(12) | bit(14)},
    {7, 0, 3, bit(2) | bit(3) | bit(8) | bit(23) | kAmx70Edx},
    {7, 1, 0, bit(4) | bit(5) | bit(23) | kAmx71Eax},
    {7, 1, 3, bit(4) | bit(5) | bit(10) | bit(19) | kAmx71Edx},
};
const Clear kAvxVnni[] = {
    {7, 0, 1, bit(16) | bit(17) | bit(21) | bit(26) | bit(27) | bit(28) | bit(30) | bit(31)},
    {7, 0, 2, bit(1) | bit(6) | bit(11) | bit(12) | bit(14)},
    {7, 0, 3, bit(2) | bit(3) | bit(8) | bit(23) | kAmx70Edx},
    {7, 1, 0, bit(5) | bit(23) | kAmx71Eax},
    {7, 1, 3, bit(4) | bit(5) | bit(10) | bit(19) | kAmx71Edx},
};
const Clear kAvx512[] = {
    {7, 0, 3, kAmx70Edx},
    {7, 1, 0, kAmx71Eax},
    {7, 1, 3, kAmx71Edx},
};

const Clear* g_clear = nullptr;
size_t g_clears = 0;
struct sigaction g_program_segv;  // the program's SIGSEGV disposition (SIG_DFL until it installs one)
// The process whose g_program_segv this is.  A vfork child (Python's subprocess, posix_spawn) shares the parent's
// memory until it execs and resets its signal handlers first: its sigaction calls must not write the parent's
// record (they go straight to the kernel, for the child alone).  A fork child has its own copy (pthread_atfork).
pid_t g_pid = 0;

using SigactionFn = int (*)(int, const struct sigaction*, struct sigaction*);
SigactionFn real_sigaction() {
  static SigactionFn fn = reinterpret_cast<SigactionFn>(dlsym(RTLD_NEXT, "sigaction"));
  return fn;
}

inline long set_cpuid_faulting(bool on) { return syscall(SYS_arch_prctl, kArchSetCpuid, on ? 0L : 1L); }

void on_segv(int sig, siginfo_t* info, void* context) {
  auto* uc = static_cast<ucontext_t*>(context);
  greg_t* r = uc->uc_mcontext.gregs;
  const auto* ip = reinterpret_cast<const unsigned char*>(r[REG_RIP]);
  if (ip[0] == 0x0F && ip[1] == 0xA2) {  // cpuid
    uint32_t v[4];
    const uint32_t leaf = uint32_t(r[REG_RAX]), subleaf = uint32_t(r[REG_RCX]);
    set_cpuid_faulting(false);
    __asm__ volatile("cpuid" : "=a"(v[0]), "=b"(v[1]), "=c"(v[2]), "=d"(v[3]) : "a"(leaf), "c"(subleaf));
    set_cpuid_faulting(true);
    for (size_t i = 0; i < g_clears; ++i)
      if (g_clear[i].leaf == leaf && g_clear[i].subleaf == subleaf) v[g_clear[i].reg] &= ~g_clear[i].bits;
    r[REG_RAX] = v[0], r[REG_RBX] = v[1], r[REG_RCX] = v[2], r[REG_RDX] = v[3];
    r[REG_RIP] += 2;
    return;
  }
  // Not ours: the program's handler, or the default action (re-raised on return from this handler).
  if (g_program_segv.sa_flags & SA_SIGINFO) {
    g_program_segv.sa_sigaction(sig, info, context);
  } else if (g_program_segv.sa_handler != SIG_DFL && g_program_segv.sa_handler != SIG_IGN) {
    g_program_segv.sa_handler(sig);
  } else {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    real_sigaction()(SIGSEGV, &dfl, nullptr);
  }
}

void install() {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  real_sigaction()(SIGSEGV, &sa, &g_program_segv);
}

__attribute__((constructor)) void cpuid_mask_init() {
  const char* profile = getenv("VITFAST_CPUID_MASK");
  if (profile == nullptr || *profile == 0) return;
  if (strcmp(profile, "avx2") == 0) {
    g_clear = kAvx2, g_clears = sizeof kAvx2 / sizeof kAvx2[0];
  } else if (strcmp(profile, "avx_vnni") == 0) {
    g_clear = kAvxVnni, g_clears = sizeof kAvxVnni / sizeof kAvxVnni[0];
  } else if (strcmp(profile, "avx512") == 0) {
    g_clear = kAvx512, g_clears = sizeof kAvx512 / sizeof kAvx512[0];
  } else {
    fprintf(stderr, "cpuid_mask: VITFAST_CPUID_MASK: expected avx2, avx_vnni or avx512, got '%s'\n", profile);
    _exit(3);
  }
  g_pid = getpid();
  pthread_atfork(nullptr, nullptr, [] { g_pid = getpid(); });
  install();
  if (set_cpuid_faulting(true) != 0) {
    fprintf(stderr, "cpuid_mask: arch_prctl(ARCH_SET_CPUID, 0) failed: this CPU or kernel has no CPUID faulting "
                    "(no cpuid_fault flag in /proc/cpuinfo)\n");
    _exit(3);
  }
}

}  // namespace

// The program installing a SIGSEGV handler (Python's faulthandler, a crash reporter) becomes the fallback of ours.
extern "C" int sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  if (sig != SIGSEGV || g_clear == nullptr || getpid() != g_pid) return real_sigaction()(sig, act, old);
  if (old != nullptr) *old = g_program_segv;
  if (act != nullptr) g_program_segv = *act;
  return 0;
}

extern "C" sighandler_t signal(int sig, sighandler_t handler) {
  struct sigaction act, old;
  memset(&act, 0, sizeof act);
  act.sa_handler = handler;
  act.sa_flags = SA_RESTART;
  sigemptyset(&act.sa_mask);
  if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
  return old.sa_handler;
}
