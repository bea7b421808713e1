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

// a and b hold the same bits: splitting the work (rows, panels, query blocks) or a hint must change nothing.
inline void check_same_bits(vitfast::CpuIsa isa, const std::vector<float>& a, const std::vector<float>& b,
                            const char* what) {
  VT_CHECK(a.size() == b.size(), "[%s] %s: %zu vs %zu values", vitfast::cpu_isa_name(isa), what, a.size(), b.size());
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    VT_CHECK(a[i] == b[i], "[%s] %s differs at %zu", vitfast::cpu_isa_name(isa), what, i);
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

// The body of a test's main(): every test function, in order, on every ISA path this CPU runs (forced_isas),
// then the verdict.
template <class... Tests>
int run_on_every_isa(const char* name, Tests... tests) {
  const std::vector<vitfast::CpuIsa> isas = forced_isas();
  std::printf("ISA paths under test:");
  for (vitfast::CpuIsa isa : isas) std::printf(" %s", vitfast::cpu_isa_name(isa));
  std::printf("\n");
  for (vitfast::CpuIsa isa : isas) {
    VT_CHECK(vitfast::set_active_cpu_isa(isa) && vitfast::active_cpu_isa() == isa, "could not force %s",
             vitfast::cpu_isa_name(isa));
    (tests(vitfast::active_cpu_isa()), ...);
  }
  return finish(name);
}

}  // namespace vitfast_test
