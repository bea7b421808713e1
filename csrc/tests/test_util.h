// Minimal test harness for the torch-free kernel tier (CTest runs each executable; exit status 0 = pass).
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_features.h"

namespace vitfast_test {

inline int& failures() {
  static int n = 0;
  return n;
}

#define VT_CHECK(cond, ...)                                                 \
  do {                                                                      \
    if (!(cond)) {                                                          \
      ++::vitfast_test::failures();                                         \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                    \
      std::fprintf(stderr, "\n");                                           \
      if (::vitfast_test::failures() > 20) std::exit(1);                    \
    }                                                                       \
  } while (0)

inline std::vector<float> random_vector(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Every ISA path this binary can run on this CPU, each *forced* in turn: set_active_cpu_isa must succeed
// and active_cpu_isa() must then report it, so a test that says it ran NEON did run the NEON code.
inline std::vector<vitfast::CpuIsa> forced_isas() {
  std::vector<vitfast::CpuIsa> out;
  for (vitfast::CpuIsa isa : {vitfast::CpuIsa::kScalar, vitfast::CpuIsa::kAvx2, vitfast::CpuIsa::kAvx512,
                              vitfast::CpuIsa::kNeon}) {
    if (!vitfast::cpu_supports(isa)) continue;
    const bool ok = vitfast::set_active_cpu_isa(isa);
    VT_CHECK(ok, "set_active_cpu_isa(%s) refused a supported path", vitfast::cpu_isa_name(isa));
    VT_CHECK(vitfast::active_cpu_isa() == isa, "active path is %s, forced %s",
             vitfast::cpu_isa_name(vitfast::active_cpu_isa()), vitfast::cpu_isa_name(isa));
    out.push_back(isa);
  }
#if defined(__aarch64__)
  // On aarch64 (natively or under qemu-user) the NEON path must exist and be selectable.
  VT_CHECK(vitfast::cpu_supports(vitfast::CpuIsa::kNeon), "aarch64 build without the NEON path");
#endif
  return out;
}

// Exact erf-GELU in double: the oracle for every path.
inline double gelu_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

inline int finish(const char* name) {
  if (failures() == 0) {
    std::printf("%s: all checks passed\n", name);
    return 0;
  }
  std::printf("%s: %d check(s) failed\n", name, failures());
  return 1;
}

}  // namespace vitfast_test
