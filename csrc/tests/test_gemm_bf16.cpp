// bf16 GEMM core (gemm_bf16.h): the rounding of convert_rows and of the pack, the scalar kernel against double
// loops over the same bf16 values, and every hardware kernel this CPU has against the scalar one (same exact
// products, so only the order of the fp32 sums may differ), over odd shapes, odd K, each epilogue, and no write
// outside the valid columns.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/gemm_bf16.h"
#include "kernels/scalar_math.h"
#include "tests/test_util.h"

using namespace vitfast;
using namespace vitfast_test;
using gemm16::Bf16Kernel;

namespace {

struct Case {
  bool bias, gelu, addend, accumulate, c_padded;
};

void test_rounding() {
  // Round to nearest even at the bf16 boundary, specials kept.
  const float one_plus_half_ulp = 1.0f + std::ldexp(1.0f, -8);                  // tie -> even (1.0)
  const float one_plus_3half_ulp = 1.0f + 3.0f * std::ldexp(1.0f, -8);          // tie -> even (1 + 2^-6)
  const float above_tie = 1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20);  // -> 1 + 2^-7
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float in[] = {one_plus_half_ulp, one_plus_3half_ulp, above_tie, -2.5f, inf, -inf, nan, 3.4e38f, 0.0f};
  const float expect[] = {1.0f, 1.0f + std::ldexp(1.0f, -6), 1.0f + std::ldexp(1.0f, -7), -2.5f, inf, -inf, nan,
                          inf, 0.0f};
  const int64_t n = sizeof(in) / sizeof(in[0]);
  std::vector<uint16_t> out(n + 1, 0xffff);
  gemm16::convert_rows(in, n, 1, n, out.data(), n + 1);
  for (int64_t i = 0; i < n; ++i) {
    const float got = gemm16::from_bf16(out[i]), want = expect[i];
    const bool ok = std::isnan(want) ? std::isnan(got) : got == want;
    VT_CHECK(ok, "convert_rows(%.9g): expected %.9g, got %.9g", in[i], want, got);
    VT_CHECK(out[i] == gemm16::to_bf16(in[i]), "convert_rows and to_bf16 differ at %.9g", in[i]);
  }
  VT_CHECK(out[n] == 0, "convert_rows: odd k must zero the pad element, got 0x%04x", out[n]);
}

// Every kernel's convert_rows gives the portable bits, on random values, specials, denormals and ties.
void test_convert_parity(Bf16Kernel kernel) {
  std::mt19937 rng(7);
  const int64_t rows = 3, k = 37, ld = 40;
  std::vector<float> x = random_vector(rng, size_t(rows * k));
  const float specials[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 1e-40f, -3e-39f, 3.4e38f,
                            1.0f + std::ldexp(1.0f, -8), 0.0f, -0.0f};
  for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); ++i) x[i * 3] = specials[i];
  std::vector<uint16_t> want(size_t(rows * ld), 0xffff), got(size_t(rows * ld), 0xffff);
  gemm16::convert_rows(x.data(), k, rows, k, want.data(), ld, Bf16Kernel::kScalar);
  gemm16::convert_rows(x.data(), k, rows, k, got.data(), ld, kernel);
  for (size_t i = 0; i < want.size(); ++i)
    VT_CHECK(want[i] == got[i], "[%s] convert_rows differs at %zu: 0x%04x vs 0x%04x", gemm16::bf16_kernel_name(kernel),
             i, got[i], want[i]);
}

// C from the bf16 operands in double: the oracle of the scalar kernel.
void reference(const std::vector<uint16_t>& a, int64_t lda, const std::vector<float>& wr, int64_t m, int64_t n,
               int64_t k, const Case& cs, const std::vector<float>& bias, const std::vector<float>& addend,
               const std::vector<float>& c0, std::vector<double>& out, std::vector<double>& mag) {
  out.assign(size_t(m * n), 0.0);
  mag.assign(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0, s = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double t = double(gemm16::from_bf16(a[i * lda + p])) * wr[j * k + p];
        acc += t;
        s += std::fabs(t);
      }
      if (cs.accumulate) acc += c0[i * n + j], s += std::fabs(c0[i * n + j]);
      if (cs.bias) acc += bias[j], s += std::fabs(bias[j]);
      if (cs.gelu) acc = gelu_ref(acc);
      if (cs.addend) acc += addend[i * n + j];
      out[i * n + j] = acc;
      mag[i * n + j] = s + std::fabs(acc);
    }
}

std::vector<float> run(Bf16Kernel kernel, const std::vector<uint16_t>& a, int64_t lda, const gemm16::PackedBf16B& b,
                       int64_t m, int64_t n, const Case& cs, const std::vector<float>& addend,
                       const std::vector<float>& c0, int64_t ldc, int64_t p0, int64_t p1) {
  const float sentinel = 12345.0f;
  std::vector<float> c(size_t(m * ldc), sentinel);
  if (cs.accumulate)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = c0[i * n + j];
  gemm::Epilogue ep;
  ep.bias = cs.bias;
  ep.gelu = cs.gelu;
  ep.addend = cs.addend ? addend.data() : nullptr;
  ep.ld_addend = n;
  ep.accumulate = cs.accumulate;
  ep.c_padded = cs.c_padded;
  // Panels [p0, p1): C, bias and addend are addressed from panel 0, so pass C at column 0.
  gemm16::gemm_bf16_panels(m, a.data(), lda, b, p0, p1, c.data(), ldc, ep, kernel);
  return c;
}

int g_cases = 0;

void check_case(Bf16Kernel kernel, std::mt19937& rng, int64_t m, int64_t n, int64_t k, const Case& cs) {
  const int64_t k2 = gemm16::padded_k(k), lda = k2 + 4;
  std::vector<float> x = random_vector(rng, size_t(m * k));
  std::vector<float> w = random_vector(rng, size_t(n * k), 0.3f);
  std::vector<float> bias = random_vector(rng, size_t(n));
  std::vector<float> addend = random_vector(rng, size_t(m * n));
  std::vector<float> c0 = random_vector(rng, size_t(m * n));
  std::vector<uint16_t> a(size_t(m * lda), 0x7fc0);  // NaN past the row's pad: must never be read
  gemm16::convert_rows(x.data(), k, m, k, a.data(), lda);
  gemm16::PackedBf16B b = gemm16::PackedBf16B::pack_linear(w.data(), n, k, k, cs.bias ? bias.data() : nullptr);
  std::vector<float> wr(w.size());
  for (size_t i = 0; i < w.size(); ++i) wr[i] = gemm16::from_bf16(gemm16::to_bf16(w[i]));
  const int64_t ldc = cs.c_padded ? b.padded_n() + 1 : n + 3;
  const std::vector<float> ref = run(Bf16Kernel::kScalar, a, lda, b, m, n, cs, addend, c0, ldc, 0, b.panels());
  const std::vector<float> got = run(kernel, a, lda, b, m, n, cs, addend, c0, ldc, 0, b.panels());
  std::vector<double> exact, mag;
  reference(a, lda, wr, m, n, k, cs, bias, addend, c0, exact, mag);
  const char* name = gemm16::bf16_kernel_name(kernel);
  // fp32 sums of k + 3 terms: |error| <= (k + 3) · 2^-24 · Σ|terms| (and GELU's slope is <= 1.13); 2× margin.
  const double eps = std::ldexp(1.0, -24);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const double g = got[i * ldc + j];
      if (j >= n) {
        const bool padded_store = cs.c_padded && j < b.padded_n();
        if (!padded_store)
          VT_CHECK(g == 12345.0, "[%s] wrote column %lld >= n = %lld", name, (long long)j, (long long)n);
        continue;
      }
      // + gelu_for_bf16's own error, <= 1.2e-6 · |its argument| (erf_poly.h), the argument at most mag.
      const double tol = 2.0 * 1.13 * double(k + 4) * eps * mag[i * n + j] + 1e-6 + (cs.gelu ? 1.2e-6 : 0.0) *
                         mag[i * n + j];
      VT_CHECK(std::fabs(g - exact[i * n + j]) <= tol, "[%s] m=%lld n=%lld k=%lld (%d%d%d%d%d) C[%lld][%lld] = %.9g, "
               "exact %.9g (tol %.3g)", name, (long long)m, (long long)n, (long long)k, cs.bias, cs.gelu, cs.addend,
               cs.accumulate, cs.c_padded, (long long)i, (long long)j, g, exact[i * n + j], tol);
      const double r = ref[i * ldc + j];
      VT_CHECK(std::fabs(g - r) <= 2.0 * tol, "[%s] differs from scalar at [%lld][%lld]: %.9g vs %.9g", name,
               (long long)i, (long long)j, g, r);
    }
  }
  // A panel range computes exactly the same columns as the whole call, and nothing else.
  if (b.panels() >= 3) {
    const std::vector<float> part = run(kernel, a, lda, b, m, n, cs, addend, c0, ldc, 1, 2);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const bool inside = j >= gemm::kNr && j < 2 * gemm::kNr;
        if (inside)
          VT_CHECK(part[i * ldc + j] == got[i * ldc + j], "[%s] panel range differs at [%lld][%lld]", name,
                   (long long)i, (long long)j);
        else if (!cs.accumulate)
          VT_CHECK(part[i * ldc + j] == 12345.0f, "[%s] panel range wrote column %lld", name, (long long)j);
      }
  }
  ++g_cases;
}

// The raw packings (attention's K and V) give PackedBf16B's panels, and gemm_bf16_raw the packed GEMM's bits.  The
// first row holds a denormal, a NaN, an infinity and a rounding tie (the AVX-512 packings round such a vector by
// integer arithmetic, the others with vcvtne2ps2bf16), the other rows random values.
void test_raw_packing(Bf16Kernel kernel) {
  std::mt19937 rng(11);
  const char* name = gemm16::bf16_kernel_name(kernel);
  const float specials[] = {1e-40f, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(),
                            1.0f + std::ldexp(1.0f, -8), -3e-39f};
  for (int64_t n : {1, 16, 37}) {
    for (int64_t k : {1, 8, 33, 64, 80, 97}) {
      const int64_t ldw = k + 5;
      std::vector<float> w = random_vector(rng, size_t(n * ldw));
      for (int64_t i = 0; i < 5 && 2 * i < k; ++i) w[size_t(2 * i)] = specials[i];
      const gemm16::PackedBf16B b = gemm16::PackedBf16B::pack_linear(w.data(), n, k, ldw, nullptr);
      const size_t size = size_t(gemm16::packed_bf16(n, k));
      std::vector<uint16_t> t(size + 32, 0xffff), r(size + 32, 0xffff);
      // 64-byte aligned destinations (the AVX-512 packing stores whole lines).
      uint16_t* tp = t.data() + (32 - (reinterpret_cast<uintptr_t>(t.data()) % 64) / 2) % 32;
      uint16_t* rp = r.data() + (32 - (reinterpret_cast<uintptr_t>(r.data()) % 64) / 2) % 32;
      gemm16::pack_b_transposed_bf16(w.data(), n, k, ldw, tp, kernel);
      // W as a row-major [k × n] matrix for pack_b_bf16: B = Wᵀ.
      std::vector<float> wt(size_t(k * n));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j) wt[j * n + i] = w[i * ldw + j];
      gemm16::pack_b_bf16(wt.data(), k, n, n, rp, kernel);
      bool same_t = true, same_r = true;
      for (size_t i = 0; i < size; ++i) {
        same_t = same_t && tp[i] == b.panel_data()[i];
        same_r = same_r && rp[i] == b.panel_data()[i];
      }
      VT_CHECK(same_t, "[%s] pack_b_transposed_bf16 n=%lld k=%lld differs from pack_linear", name, (long long)n,
               (long long)k);
      VT_CHECK(same_r, "[%s] pack_b_bf16 n=%lld k=%lld differs from pack_linear", name, (long long)n, (long long)k);
      // The same packings from the values already rounded to bf16 (a bf16 qkv's K and V): a row stride that is
      // not the row's length, and a quiet-NaN pattern after each row's k values (an odd k's pad must not read it).
      const int64_t ld16 = k + 3;
      std::vector<uint16_t> w16(size_t(n * ld16), 0x7fc1), wt16(size_t(k * (n + 1)), 0x7fc1);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j) w16[i * ld16 + j] = wt16[j * (n + 1) + i] = gemm16::to_bf16(w[i * ldw + j]);
      std::fill(t.begin(), t.end(), uint16_t(0xffff));
      std::fill(r.begin(), r.end(), uint16_t(0xffff));
      gemm16::pack_b_transposed_bf16(w16.data(), n, k, ld16, tp, kernel);
      gemm16::pack_b_bf16(wt16.data(), k, n, n + 1, rp, kernel);
      bool same_t16 = true, same_r16 = true;
      for (size_t i = 0; i < size; ++i) {
        same_t16 = same_t16 && tp[i] == b.panel_data()[i];
        same_r16 = same_r16 && rp[i] == b.panel_data()[i];
      }
      VT_CHECK(same_t16, "[%s] pack_b_transposed_bf16 from bf16 n=%lld k=%lld differs from pack_linear", name,
               (long long)n, (long long)k);
      VT_CHECK(same_r16, "[%s] pack_b_bf16 from bf16 n=%lld k=%lld differs from pack_linear", name, (long long)n,
               (long long)k);
      for (int64_t i = 0; i < 5 && 2 * i < k; ++i) w[size_t(2 * i)] = 0.5f;  // finite again for the GEMM check
      const gemm16::PackedBf16B b2 = gemm16::PackedBf16B::pack_linear(w.data(), n, k, ldw, nullptr);
      gemm16::pack_b_transposed_bf16(w.data(), n, k, ldw, tp, kernel);
      const int64_t m = 9, lda = gemm16::padded_k(k) + 2;
      std::vector<float> x = random_vector(rng, size_t(m * k));
      std::vector<uint16_t> a(size_t(m * lda), 0);
      gemm16::convert_rows(x.data(), k, m, k, a.data(), lda);
      std::vector<float> c1(size_t(m * n)), c2(size_t(m * n));
      gemm16::gemm_bf16(m, a.data(), lda, b2, c1.data(), n, gemm::Epilogue(), kernel);
      gemm16::gemm_bf16_raw(m, a.data(), lda, tp, n, k, c2.data(), n, gemm::Epilogue(), kernel);
      VT_CHECK(c1 == c2, "[%s] gemm_bf16_raw n=%lld k=%lld differs from gemm_bf16", name, (long long)n, (long long)k);
    }
  }
}

void test_parity(Bf16Kernel kernel) {
  std::mt19937 rng(1234);
  const Case cases[] = {{false, false, false, false, false}, {true, false, false, false, false},
                        {true, true, false, false, true},    {true, false, true, false, false},
                        {false, false, false, true, false},  {true, true, true, true, false}};
  g_cases = 0;
  for (const Case& cs : cases)
    for (int64_t m : {1, 5, 13, 14, 15, 29, 32, 43})
      for (int64_t n : {1, 16, 17, 33, 48, 70})
        for (int64_t k : {0, 1, 7, 16, 64, 301}) check_case(kernel, rng, m, n, k, cs);
  // ViT-like shapes, deep K (accumulation error grows with K).
  check_case(kernel, rng, 197, 96, 384, cases[1]);
  check_case(kernel, rng, 50, 40, 1536, cases[5]);
  std::printf("[%s] gemm_bf16 parity: %s (%d cases)\n", gemm16::bf16_kernel_name(kernel),
              failures() == 0 ? "ok" : "FAILED", g_cases);
}

}  // namespace

// The CPU path a kernel belongs to (softmax_exp_rows_bf16 takes both).
CpuIsa isa_of(Bf16Kernel kernel) {
  return gemm16::uses_avx512_bf16(kernel) ? CpuIsa::kAvx512
         : kernel == Bf16Kernel::kNeonBf16 ? CpuIsa::kNeon
                                           : CpuIsa::kScalar;
}

// softmax_exp_rows_bf16 at row lengths around the 16-lane body/tail split and with a -inf (masked) score: on every
// kernel P is the bf16 rounding of gemm::exp_for_bf16(t − max) (scalar_math.h; the vector paths' exps bit for bit),
// the row max that of softmax_exp_rows and the row sum that of the same fp32 exps (up to the rounding of its fp32
// additions), the pad element of an odd row zeroed; and P is within one bf16 ulp of the exact exp's rounding, the
// sum within 1e-5 of the exact one (exp_for_bf16's accuracy).  And a GEMM's row_scale gives the bits of multiplying
// its output rows afterwards.
// The bf16 GEMMs' GELU (erf_poly.h: kGeluBf16) against the exact GELU in double: the bounds erf_poly.h documents
// (relative 2.2e-6 for x >= 0 and 3.9e-6 for x >= −1, absolute 1.2e-6·|x| everywhere), the bf16 rounding at most
// one ulp from the exact GELU's and rarely that, and the special values.
void test_gelu_for_bf16() {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  double rel_pos = 0.0, rel_m1 = 0.0, abs_rel = 0.0;
  int64_t flips = 0, points = 0;
  auto check = [&](float x) {
    const double g = gemm::gelu_for_bf16(x), exact = gelu_ref(double(x));
    const double err = std::fabs(g - exact);
    if (x != 0.0f) abs_rel = std::max(abs_rel, err / std::fabs(double(x)));
    if (x > 0.0f) rel_pos = std::max(rel_pos, err / exact);
    if (x >= -1.0f && x != 0.0f) {
      rel_m1 = std::max(rel_m1, err / std::fabs(exact));
      const int ulps = std::abs(int(gemm16::to_bf16(float(g))) - int(gemm16::to_bf16(float(exact))));
      VT_CHECK(ulps <= 1, "gelu_for_bf16(%.9g) = %.9g: %d bf16 ulps from the exact %.9g", x, g, ulps, exact);
      flips += ulps != 0;
      ++points;
    }
  };
  for (int64_t i = 0; i <= 2000000; ++i) check(float(-9.0 + 18.0 * double(i) / 2000000.0));
  for (int i = 0; i < 1000000; ++i) check(normal(rng));
  for (int i = 1; i < 2000; ++i) check(std::ldexp(float(i), -20)), check(-std::ldexp(float(i), -20));
  VT_CHECK(rel_pos <= 2.2e-6 && rel_m1 <= 3.9e-6 && abs_rel <= 1.2e-6, "gelu_for_bf16: relative error %.3g (x > 0), "
           "%.3g (x >= -1), absolute %.3g·|x|: over erf_poly.h's 2.2e-6, 3.9e-6, 1.2e-6", rel_pos, rel_m1, abs_rel);
  VT_CHECK(double(flips) <= 1e-3 * double(points), "gelu_for_bf16: bf16 rounding off the exact GELU's at %lld of "
           "%lld values", (long long)flips, (long long)points);
  const float inf = std::numeric_limits<float>::infinity();
  VT_CHECK(gemm::gelu_for_bf16(0.0f) == 0.0f && gemm::gelu_for_bf16(6.0f) == 6.0f &&
               gemm::gelu_for_bf16(1e30f) == 1e30f && gemm::gelu_for_bf16(-6.0f) == 0.0f &&
               gemm::gelu_for_bf16(-1e30f) == 0.0f && gemm::gelu_for_bf16(inf) == inf &&
               std::isnan(gemm::gelu_for_bf16(-inf)) && std::isnan(gemm::gelu_for_bf16(std::nanf(""))),
           "gelu_for_bf16: special values (0, ±6, ±1e30, ±inf, NaN) not as erf_poly.h documents");
}

// Every kernel's GELU epilogue is gelu_for_bf16 of the value the same GEMM gives without it, bit for bit (in C and in
// the bf16 copy alone), over pre-activations that reach past ±kGeluBf16Max, and NaN / ±inf through the bias (a NaN
// only as a NaN).
void test_gelu_epilogue(Bf16Kernel kernel) {
  std::mt19937 rng(13);
  const char* name = gemm16::bf16_kernel_name(kernel);
  const int64_t m = 19, n = 45, k = 24, lda = gemm16::padded_k(k);
  std::vector<float> w = random_vector(rng, size_t(n * k), 1.5f), x = random_vector(rng, size_t(m * k), 1.5f);
  std::vector<float> bias = random_vector(rng, size_t(n), 2.0f);
  bias[3] = std::nanf(""), bias[4] = std::numeric_limits<float>::infinity(), bias[5] = -bias[4];
  const gemm16::PackedBf16B b = gemm16::PackedBf16B::pack_linear(w.data(), n, k, k, bias.data());
  std::vector<uint16_t> a(size_t(m * lda), 0);
  gemm16::convert_rows(x.data(), k, m, k, a.data(), lda);
  std::vector<float> pre(size_t(m * n)), act(size_t(m * n));
  std::vector<uint16_t> act16(size_t(m * n));
  gemm::Epilogue ep;
  ep.bias = true;
  gemm16::gemm_bf16(m, a.data(), lda, b, pre.data(), n, ep, kernel);
  ep.gelu = true;
  gemm16::gemm_bf16(m, a.data(), lda, b, act.data(), n, ep, kernel);
  ep.c16 = act16.data();
  ep.ldc16 = n;
  gemm16::gemm_bf16(m, a.data(), lda, b, nullptr, n, ep, kernel);
  bool same = true, wide = false;
  for (size_t i = 0; i < pre.size(); ++i) {
    const float want = gemm::gelu_for_bf16(pre[i]);
    if (std::isnan(want))  // a NaN's sign and payload are the platform's (GELU(−inf) makes one)
      same = same && std::isnan(act[i]) && (act16[i] & 0x7fff) > 0x7f80;
    else
      same = same && std::memcmp(&act[i], &want, 4) == 0 && act16[i] == gemm16::to_bf16(want);
    wide = wide || std::fabs(pre[i]) > gemm::kGeluBf16Max;
  }
  VT_CHECK(wide, "[%s] the GELU epilogue case never passes kGeluBf16Max", name);
  VT_CHECK(same, "[%s] the GELU epilogue is not gelu_for_bf16 of the GEMM's value, bit for bit", name);
}

void test_softmax_and_row_scale(Bf16Kernel kernel) {
  std::mt19937 rng(5);
  const char* name = gemm16::bf16_kernel_name(kernel);
  const CpuIsa isa = isa_of(kernel);
  for (int64_t n : {1, 15, 16, 33, 197}) {
    for (int64_t rows : {1, 2, 5}) {
      const int64_t ld = (n + 15) / 16 * 16, ldp = gemm16::padded_k(n) + 4;
      std::vector<float> s = random_vector(rng, size_t(rows * ld), 8.0f);
      if (n > 3) s[2] = -std::numeric_limits<float>::infinity();
      const std::vector<float> s0 = s;
      std::vector<float> s_ref = s, max_a(rows, -INFINITY), max_b(rows, -INFINITY), sum_a(rows), sum_b(rows);
      std::vector<uint16_t> p(size_t(rows * ldp), 0xffff);
      gemm16::softmax_exp_rows_bf16(s.data(), rows, n, ld, 0.125f, max_a.data(), sum_a.data(), p.data(), ldp, isa,
                                    kernel);
      gemm::softmax_exp_rows(s_ref.data(), rows, n, ld, 0.125f, max_b.data(), sum_b.data(), isa);
      bool same = max_a == max_b, sums_close = true, accurate = true;
      for (int64_t r = 0; r < rows; ++r) {
        const float sub = max_b[r] == -INFINITY ? 0.0f : max_b[r];
        double sum_fast = 0.0, sum_exact = 0.0;
        for (int64_t j = 0; j < gemm16::padded_k(n); ++j) {
          const float t = j < n ? s0[r * ld + j] * 0.125f : 0.0f;
          const float e = j < n ? gemm::exp_for_bf16(t - sub) : 0.0f;
          const double exact = j < n ? std::exp(double(t - sub)) : 0.0;
          sum_fast += e;
          sum_exact += exact;
          same = same && p[r * ldp + j] == gemm16::to_bf16(e);
          accurate = accurate && std::abs(int(p[r * ldp + j]) - int(gemm16::to_bf16(float(exact)))) <= 1;
        }
        // fp32 summation of n positive terms in any order: within (n − 1)·2^-24 of the exact sum.
        sums_close = sums_close && std::abs(sum_a[r] - sum_fast) <= double(n) * std::ldexp(1.0, -24) * sum_fast;
        accurate = accurate && std::abs(sum_a[r] - sum_exact) <= 1e-5 * sum_exact;
      }
      VT_CHECK(same && sums_close, "[%s] softmax_exp_rows_bf16 n=%lld rows=%lld: P or the row max differ from "
               "exp_for_bf16's%s", name, (long long)n, (long long)rows, sums_close ? "" : " (or the row sum)");
      VT_CHECK(accurate, "[%s] softmax_exp_rows_bf16 n=%lld rows=%lld: P more than one bf16 ulp or the sum more than "
               "1e-5 from the exact exp's", name, (long long)n, (long long)rows);
    }
  }
  // row_scale: C = (A·B) · scale[i] exactly as a pass over C (one fp32 product either way).
  const int64_t m = 17, n = 37, k = 33, lda = gemm16::padded_k(k);
  std::vector<float> w = random_vector(rng, size_t(n * k)), x = random_vector(rng, size_t(m * k));
  std::vector<float> scale = random_vector(rng, size_t(m));
  const gemm16::PackedBf16B b = gemm16::PackedBf16B::pack_linear(w.data(), n, k, k, nullptr);
  std::vector<uint16_t> a(size_t(m * lda), 0);
  gemm16::convert_rows(x.data(), k, m, k, a.data(), lda);
  std::vector<float> c1(size_t(m * n)), c2(size_t(m * n));
  gemm16::gemm_bf16(m, a.data(), lda, b, c1.data(), n, gemm::Epilogue(), kernel);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) c1[i * n + j] *= scale[i];
  gemm::Epilogue ep;
  ep.row_scale = scale.data();
  gemm16::gemm_bf16(m, a.data(), lda, b, c2.data(), n, ep, kernel);
  VT_CHECK(c1 == c2, "[%s] gemm_bf16 with row_scale differs from scaling its rows afterwards", name);

  // c16: the bf16 copy of C holds to_bf16 of C's values (with C, and alone with C = nullptr), every epilogue, ragged
  // shapes, and nothing is written past the valid columns.
  for (int64_t mm : {1, 13, 30})
    for (int64_t nn : {5, 16, 40})
      for (int e = 0; e < 3; ++e) {
        const int64_t kk = 19, ldx = gemm16::padded_k(kk), ld16 = nn + 3;
        std::vector<float> wv = random_vector(rng, size_t(nn * kk)), xv = random_vector(rng, size_t(mm * kk));
        std::vector<float> bias = random_vector(rng, size_t(nn)), add = random_vector(rng, size_t(mm * nn));
        const gemm16::PackedBf16B bb = gemm16::PackedBf16B::pack_linear(wv.data(), nn, kk, kk, bias.data());
        std::vector<uint16_t> ax(size_t(mm * ldx), 0);
        gemm16::convert_rows(xv.data(), kk, mm, kk, ax.data(), ldx);
        gemm::Epilogue ep2;
        ep2.bias = e >= 1;
        ep2.gelu = e == 1;
        ep2.addend = e == 2 ? add.data() : nullptr;
        ep2.ld_addend = nn;
        std::vector<float> c(size_t(mm * nn)), c_both(size_t(mm * nn));
        gemm16::gemm_bf16(mm, ax.data(), ldx, bb, c.data(), nn, ep2, kernel);
        std::vector<uint16_t> only(size_t(mm * ld16), 0xffff), both(size_t(mm * ld16), 0xffff);
        ep2.c16 = only.data();
        ep2.ldc16 = ld16;
        gemm16::gemm_bf16(mm, ax.data(), ldx, bb, nullptr, nn, ep2, kernel);
        ep2.c16 = both.data();
        gemm16::gemm_bf16(mm, ax.data(), ldx, bb, c_both.data(), nn, ep2, kernel);
        bool ok = c == c_both;
        for (int64_t i = 0; i < mm; ++i)
          for (int64_t j = 0; j < ld16; ++j) {
            const uint16_t want = j < nn ? gemm16::to_bf16(c[i * nn + j]) : uint16_t(0xffff);
            ok = ok && only[i * ld16 + j] == want && both[i * ld16 + j] == want;
          }
        VT_CHECK(ok, "[%s] gemm_bf16 c16 m=%lld n=%lld epilogue %d: not to_bf16(C), or written past n", name,
                 (long long)mm, (long long)nn, e);
      }

  // c16 where C holds denormals (which vcvtneps2bf16 would read as zero: a kernel rounding its copy with it must
  // still give convert_rows' bits): rows of A that are zero make C = addend + C0 there, set to denormals, ±0 and
  // small normals, beside rows of ordinary values; with C, without it, and accumulating onto C.  Every copied value
  // must be to_bf16 of C's.  Modes 1, 3 and 4 take the bf16-only store (the AVX-512 kernel's once-per-row form,
  // vcvtneps2bf16 with a denormal test): the addend holds the denormals, or the bias does (C = bias on the zero
  // rows), or a row scale of 2e-39 makes them from ordinary sums.
  const float tiny[] = {1e-40f, -3e-39f, 1.1e-38f, -1.17e-38f, 5e-45f, -0.0f, 0.0f, 1.2e-38f, 2e-38f, -7.3e-39f};
  for (int64_t mm : {3, 14, 29})
    for (int64_t nn : {7, 32, 45})
      for (int mode = 0; mode < 5; ++mode) {  // 0: C and c16, 1: c16 alone, 2: accumulate onto C, with c16; 3, 4: above
        const int64_t kk = 9, ldx = gemm16::padded_k(kk), ld16 = nn + 1;
        std::vector<float> wv = random_vector(rng, size_t(nn * kk)), xv = random_vector(rng, size_t(mm * kk));
        std::vector<float> add(size_t(mm * nn)), c0(size_t(mm * nn), 0.0f), bias(static_cast<size_t>(nn)),
            scale(static_cast<size_t>(mm));
        for (int64_t j = 0; j < nn; ++j) bias[j] = tiny[(j * 3) % 10];
        for (int64_t i = 0; i < mm; ++i) {
          const bool zero_row = i % 3 != 1 && mode != 4;
          scale[i] = i % 3 != 1 ? 2e-39f : 1.0f;
          for (int64_t j = 0; j < nn; ++j) {
            add[i * nn + j] = zero_row ? tiny[(i * 7 + j) % 10] : 0.25f * float(j - nn / 2);
            if (mode == 2 && zero_row) c0[i * nn + j] = tiny[(i + j * 3) % 10], add[i * nn + j] = 0.0f;
          }
          if (zero_row)
            for (int64_t p = 0; p < kk; ++p) xv[i * kk + p] = 0.0f;
        }
        const gemm16::PackedBf16B bb =
            gemm16::PackedBf16B::pack_linear(wv.data(), nn, kk, kk, mode == 3 ? bias.data() : nullptr);
        std::vector<uint16_t> ax(size_t(mm * ldx), 0);
        gemm16::convert_rows(xv.data(), kk, mm, kk, ax.data(), ldx);
        gemm::Epilogue ep3;
        ep3.addend = mode < 3 ? add.data() : nullptr;
        ep3.ld_addend = nn;
        ep3.accumulate = mode == 2;
        ep3.bias = mode == 3;
        ep3.row_scale = mode == 4 ? scale.data() : nullptr;
        std::vector<float> c = c0;  // C's values (and C0 for mode 2), from the same call without a copy
        gemm16::gemm_bf16(mm, ax.data(), ldx, bb, c.data(), nn, ep3, kernel);
        std::vector<uint16_t> c16(size_t(mm * ld16), 0xffff);
        std::vector<float> c_with = c0;
        ep3.c16 = c16.data();
        ep3.ldc16 = ld16;
        const bool alone = mode == 1 || mode >= 3;
        gemm16::gemm_bf16(mm, ax.data(), ldx, bb, alone ? nullptr : c_with.data(), nn, ep3, kernel);
        bool ok = alone || c == c_with, seen = false;
        for (int64_t i = 0; i < mm; ++i)
          for (int64_t j = 0; j < ld16; ++j) {
            const uint16_t want = j < nn ? gemm16::to_bf16(c[i * nn + j]) : uint16_t(0xffff);
            ok = ok && c16[i * ld16 + j] == want;
            seen = seen || (j < nn && c[i * nn + j] != 0.0f && std::fabs(c[i * nn + j]) < 1.17549435e-38f);
          }
        VT_CHECK(seen, "[%s] the denormal c16 case holds no denormal C (m=%lld n=%lld mode %d)", name, (long long)mm,
                 (long long)nn, mode);
        VT_CHECK(ok, "[%s] gemm_bf16 c16 with denormal C, m=%lld n=%lld mode %d: not to_bf16(C)", name,
                 (long long)mm, (long long)nn, mode);
      }
}

int main() {
  test_rounding();
  test_gelu_for_bf16();
  std::vector<Bf16Kernel> kernels = {Bf16Kernel::kScalar};
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kNeon}) {
    if (!cpu_supports(isa)) continue;
    const Bf16Kernel k = gemm16::bf16_kernel(isa);
    if (k != Bf16Kernel::kScalar) kernels.push_back(k);
    // Where AMX is chosen, the AVX-512 kernel it replaces stays under test (VITFAST_CPU_EXT=noamx selects it).
    if (k == Bf16Kernel::kAmxBf16) kernels.push_back(Bf16Kernel::kAvx512Bf16);
  }
  std::printf("bf16 kernels under test:");
  for (Bf16Kernel k : kernels) std::printf(" %s", gemm16::bf16_kernel_name(k));
  std::printf("\n");
  for (Bf16Kernel k : kernels)
    test_convert_parity(k), test_raw_packing(k), test_parity(k), test_gelu_epilogue(k),
        test_softmax_and_row_scale(k);
  // With the extension switched off, the ops' choice falls back to scalar (= their fp32 path).
  for (CpuExt ext : {CpuExt::kAvx512Bf16, CpuExt::kNeonBf16}) {
    if (!cpu_has(ext)) continue;
    set_cpu_ext_enabled(ext, false);
    for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kNeon})
      VT_CHECK(gemm16::bf16_kernel(isa) == Bf16Kernel::kScalar, "%s disabled, bf16_kernel(%s) still %s",
               cpu_ext_name(ext), cpu_isa_name(isa), gemm16::bf16_kernel_name(gemm16::bf16_kernel(isa)));
    set_cpu_ext_enabled(ext, true);
  }
  if (cpu_has(CpuExt::kAmxBf16)) {
    set_cpu_ext_enabled(CpuExt::kAmxBf16, false);
    VT_CHECK(gemm16::bf16_kernel(CpuIsa::kAvx512) == Bf16Kernel::kAvx512Bf16, "amx_bf16 disabled, bf16_kernel is %s",
             gemm16::bf16_kernel_name(gemm16::bf16_kernel(CpuIsa::kAvx512)));
    set_cpu_ext_enabled(CpuExt::kAmxBf16, true);
  }
  return finish("test_gemm_bf16");
}
