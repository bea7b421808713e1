// Int8 GEMM core (gemm_int8.h): every kernel this CPU can run, each forced in turn, against an exact integer
// reference (int64 Σ qa·qw) followed by the fp32 epilogue in the contract's order.  Without GELU the reference
// is the kernels' own fp32 arithmetic, so those results must be bit-identical; with GELU (a polynomial in the
// SIMD kernels, std::erf in the scalar one) within 1e-5 of the terms' magnitude.  Shapes with tails in m, n and
// k, every epilogue, panel subranges, ±127 extremes at K = 4096 (no saturation anywhere), weights in [−64, 64] (the
// AVX2 kernel's narrow form, ±127 × ±64 extremes), its unsigned-A form (attention's P), the refusal of −128
// weights and of a pack made for another kernel; quantize_rows of every path bit-exact against the scalar one
// (ties, zero, tiny, NaN and Inf rows, column scales).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/gemm_int8.h"
#include "kernels/gemm_int8_isa.h"
#include "tests/test_util.h"

using namespace vitfast;
using namespace vitfast::gemm8;
using namespace vitfast_test;

namespace {

struct Case {
  bool bias, gelu, addend, accumulate, c_padded;
};

std::vector<int8_t> random_int8(std::mt19937& rng, size_t n, int limit = 127) {
  std::uniform_int_distribution<int> d(-limit, limit);
  std::vector<int8_t> v(n);
  for (int8_t& x : v) x = int8_t(d(rng));
  return v;
}

// Quantized activations as the kernels take them: [m × lda] with zero padding past k, and their row sums.
struct QA {
  std::vector<int8_t> q;
  std::vector<int32_t> rowsum;
  int64_t lda;
};

QA make_qa(std::vector<int8_t> vals, int64_t m, int64_t k, int64_t lda) {
  QA a;
  a.lda = lda;
  a.q.assign(size_t(m * lda), 0);
  a.rowsum.assign(size_t(m), 0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; ++c) {
      a.q[r * lda + c] = vals[r * k + c];
      a.rowsum[r] += vals[r * k + c];
    }
  return a;
}

// One GEMM against the reference.  exact_scales: sa = 1, sw = 1 (the output is float(dot) + epilogue exactly).
bool check_gemm8(Int8Kernel kern, std::mt19937& rng, int64_t m, int64_t n, int64_t k, const Case& cs,
                 const std::vector<int8_t>* qa_vals = nullptr, const std::vector<int8_t>* qw_vals = nullptr,
                 bool exact_scales = false, int64_t panel_begin = 0, int64_t panel_end = -1) {
  const int failures_before = failures();
  const int64_t lda = padded_k(k) + 8;  // larger than the row: the kernels must honour lda
  std::vector<int8_t> av = qa_vals ? *qa_vals : random_int8(rng, size_t(m * k));
  std::vector<int8_t> wv = qw_vals ? *qw_vals : random_int8(rng, size_t(n * k));
  QA a = make_qa(av, m, k, lda);
  std::uniform_real_distribution<float> sd(0.001f, 0.02f);
  std::vector<float> sa(static_cast<size_t>(m)), sw(static_cast<size_t>(n));
  for (float& s : sa) s = exact_scales ? 1.0f : sd(rng);
  for (float& s : sw) s = exact_scales ? 1.0f : sd(rng);
  std::vector<float> bias = random_vector(rng, size_t(n));
  const int64_t ldw = k + 3;
  std::vector<int8_t> w(size_t(n * ldw), 7);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < k; ++c) w[j * ldw + c] = wv[j * k + c];
  PackedInt8B b = PackedInt8B::pack(w.data(), n, k, ldw, sw.data(), cs.bias ? bias.data() : nullptr, kern);
  if (panel_end < 0) panel_end = b.panels();
  const int64_t ldc = cs.c_padded ? b.padded_n() + 1 : n + 3;
  std::vector<float> addend = random_vector(rng, size_t(m * n), 2.0f);
  const float sentinel = 12345.0f;
  std::vector<float> c(size_t(m * ldc), sentinel);
  std::vector<float> c0 = random_vector(rng, size_t(m * n), 2.0f);
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
  gemm_int8_panels(m, a.q.data(), lda, sa.data(), a.rowsum.data(), b, panel_begin, panel_end, c.data(), ldc, ep,
                   kern);

  const int64_t col_begin = panel_begin * 16;
  const int64_t col_end = std::min(n, panel_end * 16);
  const int64_t written_end = cs.c_padded ? panel_end * 16 : col_end;
  double worst = 0.0;
  int64_t mismatches = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = c[i * ldc + j];
      if (j < col_begin || j >= written_end) {
        const float before = (cs.accumulate && j < n) ? c0[i * n + j] : sentinel;
        if (got != before) ++mismatches;  // nothing outside the panels' columns may change
        continue;
      }
      if (j >= n) continue;  // padding columns of a padded C: any value
      int64_t dot = 0;
      for (int64_t p = 0; p < k; ++p) dot += int64_t(av[i * k + p]) * wv[j * k + p];
      if (!cs.gelu) {
        // The kernels' own fp32 order: fma(float(dot) · sa, sw, C or 0) (+ bias) (+ addend), bit for bit.
        const float p = float(dot) * sa[i];
        float v = std::fma(p, sw[j], cs.accumulate ? c0[i * n + j] : 0.0f);
        if (cs.bias) v += bias[j];
        if (cs.addend) v += addend[i * n + j];
        if (!(got == v)) ++mismatches;
        continue;
      }
      double v = double(dot) * sa[i] * sw[j], mag = std::fabs(v);
      if (cs.accumulate) v += c0[i * n + j], mag += std::fabs(c0[i * n + j]);
      if (cs.bias) v += bias[j], mag += std::fabs(bias[j]);
      v = gelu_ref(v);
      if (cs.addend) v += addend[i * n + j], mag += std::fabs(addend[i * n + j]);
      worst = std::max(worst, std::fabs(got - v) / (1e-5 * (1.0 + mag)));
    }
  }
  VT_CHECK(mismatches == 0 && worst <= 1.0,
           "[%s] m=%lld n=%lld k=%lld panels [%lld, %lld) bias=%d gelu=%d addend=%d acc=%d padded=%d: %lld wrong "
           "values, GELU error %.3g x tolerance",
           int8_kernel_name(kern), (long long)m, (long long)n, (long long)k, (long long)panel_begin,
           (long long)panel_end, cs.bias, cs.gelu, cs.addend, cs.accumulate, cs.c_padded, (long long)mismatches,
           worst);
  return failures() == failures_before;
}

// Epilogue combinations the tests cycle through.
const Case kCases[] = {
    {false, false, false, false, false}, {true, false, false, false, false}, {true, true, false, false, true},
    {true, true, false, false, false},   {true, false, true, false, false},  {false, false, false, true, false},
    {true, true, true, true, false},     {false, false, false, false, true},
};

// qa = ±127 against qw = ±w at K = 4096 (and K − 3): same signs, opposite signs, and random signs; unit scales, so
// the output is float(Σ qa·qw) exactly.
void check_extremes(Int8Kernel kern, std::mt19937& rng, int w) {
  const int64_t kx = 4096, mx = 15, nx = 33;
  for (int pattern = 0; pattern < 4; ++pattern) {
    std::vector<int8_t> av(size_t(mx * kx)), wv(size_t(nx * kx));
    std::uniform_int_distribution<int> coin(0, 1);
    for (size_t i = 0; i < av.size(); ++i)
      av[i] = pattern == 3 ? int8_t(coin(rng) ? 127 : -127) : int8_t(pattern == 2 ? -127 : 127);
    for (size_t i = 0; i < wv.size(); ++i)
      wv[i] = pattern == 3 ? int8_t(coin(rng) ? w : -w) : int8_t(pattern == 0 ? w : -w);
    check_gemm8(kern, rng, mx, nx, kx, kCases[0], &av, &wv, true);
    check_gemm8(kern, rng, mx, nx, kx - 3, kCases[5], &av, &wv, false);
  }
}

void test_kernel(Int8Kernel kern) {
  const int failures_before = failures();
  std::mt19937 rng(4321);
  // Tails: k not a multiple of 4, n not a multiple of 16 / 32, m from 1 to 30 (every row-tile remainder).
  for (int64_t m = 1; m <= 30; ++m) check_gemm8(kern, rng, m, 37, 13, kCases[m % 8]);
  // Past 30 rows: the AMX kernel's 32-row blocks, whole and with a partial last one, with a K tail (133 = 2 · 64 + 5).
  for (int64_t m : {31, 32, 33, 48, 49, 64, 70}) check_gemm8(kern, rng, m, 37, 133, kCases[m % 8]);
  for (const Case& cs : kCases) {
    for (int64_t k : {1, 3, 4, 5, 64, 67, 130})
      for (int64_t n : {1, 15, 16, 17, 32, 33, 48, 70}) check_gemm8(kern, rng, 15, n, k, cs);
    check_gemm8(kern, rng, 29, 100, 300, cs);
    check_gemm8(kern, rng, 197, 64, 96, cs);
  }
  // Every combination of the five epilogue switches.
  for (int bits = 0; bits < 32; ++bits) {
    const Case cs = {(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0, (bits & 8) != 0, (bits & 16) != 0};
    check_gemm8(kern, rng, 19, 45, 23, cs);
    check_gemm8(kern, rng, 14, 64, 64, cs);
  }
  // Panel subranges (odd starts split the AVX-512 pairs differently).
  for (int64_t pb = 0; pb < 5; ++pb)
    for (int64_t pe = pb + 1; pe <= 5; ++pe)
      check_gemm8(kern, rng, 17, 75, 41, kCases[(pb + pe) % 8], nullptr, nullptr, false, pb, pe);
  // Extremes: ±127 × ±127 everywhere at K = 4096 (|Σ| = 4096 · 127² = 66 064 384: no s16 saturation in the AVX2
  // pairs, no wrong s32 in the VNNI offset form).
  check_extremes(kern, rng, 127);
  // Random values with unit scales: the output is float(Σ qa·qw) exactly.
  check_gemm8(kern, rng, 30, 50, 1001, kCases[0], nullptr, nullptr, true);

  // A pack for another kernel is refused.
  {
    const Int8Kernel other = kern == Int8Kernel::kScalar ? Int8Kernel::kAvx2 : Int8Kernel::kScalar;
    std::vector<int8_t> w(16 * 8, 1);
    std::vector<float> s(16, 1.0f);
    PackedInt8B b = PackedInt8B::pack(w.data(), 16, 8, 8, s.data(), nullptr, other);
    std::vector<int8_t> qa(8, 1);
    float sa = 1.0f, c[16];
    int32_t rs = 8;
    bool threw = false;
    try {
      gemm_int8(1, qa.data(), 8, &sa, &rs, b, c, 16, gemm::Epilogue(), kern);
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    VT_CHECK(threw, "[%s] accepted a pack made for %s", int8_kernel_name(kern), int8_kernel_name(other));
  }
  if (failures() == failures_before) std::printf("[%s] gemm_int8 parity: ok\n", int8_kernel_name(kern));
}

// Weights in [−64, 64] (vitfast.quantize(weight_bits=7)): the AVX2 kernel's narrow form (u8 qw + 64 against qa, the
// row offset 64·rowsum removed in the epilogue), every other kernel's usual one; the same exact sums either way.
void test_narrow(Int8Kernel kern) {
  const int failures_before = failures();
  std::mt19937 rng(2468);
  // Which form the pack chose: narrow for the AVX2 kernel iff every weight is in [−64, 64] (padding past k aside).
  for (int bad : {0, 65, -65}) {
    std::vector<int8_t> w(20 * 9, -64);
    w[3 * 9 + 8] = 100;  // in the ldw padding (k = 8): not a weight
    if (bad != 0) w[17 * 9 + 5] = int8_t(bad);
    std::vector<float> sc(20, 1.0f);
    PackedInt8B b = PackedInt8B::pack(w.data(), 20, 8, 9, sc.data(), nullptr, kern);
    const bool want = kern == Int8Kernel::kAvx2 && bad == 0;
    VT_CHECK(b.narrow() == want,
             "[%s] weights in [-64, 64]%s: narrow form %d, expected %d", int8_kernel_name(kern),
             bad != 0 ? " but one" : "", int(b.narrow()), int(want));
    VT_CHECK(b.group_bytes() == (kern == Int8Kernel::kAvx2 && !want ? 128 : 64), "[%s] group_bytes %lld",
             int8_kernel_name(kern), (long long)b.group_bytes());
  }
  auto narrow_w = [&](int64_t n, int64_t k) { return random_int8(rng, size_t(n * k), 64); };
  for (int64_t m = 1; m <= 30; ++m) {
    const std::vector<int8_t> wv = narrow_w(37, 13);
    check_gemm8(kern, rng, m, 37, 13, kCases[m % 8], nullptr, &wv);
  }
  for (const Case& cs : kCases)
    for (int64_t k : {1, 3, 4, 5, 67, 130})
      for (int64_t n : {1, 16, 17, 33, 70}) {
        const std::vector<int8_t> wv = narrow_w(n, k);
        check_gemm8(kern, rng, 15, n, k, cs, nullptr, &wv);
      }
  for (int bits = 0; bits < 32; ++bits) {
    const Case cs = {(bits & 1) != 0, (bits & 2) != 0, (bits & 4) != 0, (bits & 8) != 0, (bits & 16) != 0};
    const std::vector<int8_t> wv = narrow_w(45, 23);
    check_gemm8(kern, rng, 19, 45, 23, cs, nullptr, &wv);
  }
  for (int64_t pb = 0; pb < 5; ++pb)
    for (int64_t pe = pb + 1; pe <= 5; ++pe) {
      const std::vector<int8_t> wv = narrow_w(75, 41);
      check_gemm8(kern, rng, 17, 75, 41, kCases[(pb + pe) % 8], nullptr, &wv, false, pb, pe);
    }
  // Extremes at K = 4096: qa = ±127 against qw = ±64 (u8 128 and 0), pair sums at the bound ±2·128·127 = ±32512.
  check_extremes(kern, rng, 64);
  {
    const std::vector<int8_t> wv = narrow_w(50, 1001);
    check_gemm8(kern, rng, 30, 50, 1001, kCases[0], nullptr, &wv, true);
  }
  if (failures() == failures_before) std::printf("[%s] gemm_int8 narrow weights: ok\n", int8_kernel_name(kern));
}

#if defined(__x86_64__) || defined(__i386__)
// The AVX2 kernel's unsigned-A form (Int8BlockArgs::a_unsigned: attention_int8's P·V): A codes in [0, 127] against
// the plain s8 B layout (a kScalar pack), unit scales, so each output is float(Σ qa·qw) exactly; extremes 127 × ±127
// (pair sums ±32258, below vpmaddubsw's saturation) and every row-tile and panel tail.
void test_unsigned_a() {
  const int failures_before = failures();
  std::mt19937 rng(97531);
  std::uniform_int_distribution<int> pd(0, 127), coin(0, 1);
  for (int pattern = 0; pattern < 3; ++pattern)
    for (int64_t m : {1, 2, 3, 4, 5, 7, 30})
      for (int64_t n : {1, 16, 17, 33})
        for (int64_t k : {1, 4, 5, 67, 197, 4096}) {
          if (k == 4096 && (m > 5 || n > 17)) continue;
          const int64_t lda = padded_k(k) + 8;
          std::vector<int8_t> a(size_t(m * lda), 0), w(size_t(n * k));
          std::vector<int32_t> rowsum(size_t(m), 0);
          for (int64_t r = 0; r < m; ++r)
            for (int64_t c = 0; c < k; ++c) {
              a[r * lda + c] = int8_t(pattern == 0 ? pd(rng) : 127);
              rowsum[r] += a[r * lda + c];
            }
          for (int8_t& x : w) x = int8_t(pattern == 0 ? pd(rng) * (coin(rng) ? 1 : -1) : pattern == 1 ? 127 : -127);
          std::vector<float> ones(size_t(n), 1.0f), sa(size_t(m), 1.0f);
          PackedInt8B b = PackedInt8B::pack(w.data(), n, k, k, ones.data(), nullptr, Int8Kernel::kScalar);
          const int64_t ldc = n + 1;
          std::vector<float> c(size_t(m * ldc), 12345.0f);
          Int8BlockArgs g{};
          g.m = m, g.n = n, g.k4 = b.k4(), g.a = a.data(), g.lda = lda, g.sa = sa.data(), g.rowsum = rowsum.data();
          g.b = b.panel_data(), g.b_panel_stride = b.panel_stride(), g.a_unsigned = true;
          g.panel_begin = 0, g.panel_end = b.panels(), g.w_scale = b.scale(), g.c = c.data(), g.ldc = ldc;
          gemm_int8_block_avx2(g);
          int64_t wrong = 0;
          for (int64_t r = 0; r < m; ++r)
            for (int64_t j = 0; j < ldc; ++j) {
              int64_t dot = 0;
              for (int64_t p = 0; p < k && j < n; ++p) dot += int64_t(a[r * lda + p]) * w[j * k + p];
              if (c[r * ldc + j] != (j < n ? float(dot) : 12345.0f)) ++wrong;
            }
          VT_CHECK(wrong == 0, "[avx2] unsigned A, pattern %d, m=%lld n=%lld k=%lld: %lld wrong values", pattern,
                   (long long)m, (long long)n, (long long)k, (long long)wrong);
        }
  if (failures() == failures_before) std::printf("[avx2] gemm_int8 unsigned A (attention's P): ok\n");
}
#endif

void test_refuses_minus_128() {
  std::vector<int8_t> w(20 * 9, 3);
  w[7 * 9 + 4] = -128;
  std::vector<float> s(20, 1.0f);
  bool threw = false;
  try {
    PackedInt8B::pack(w.data(), 20, 9, 9, s.data(), nullptr, Int8Kernel::kScalar);
  } catch (const std::invalid_argument& e) {
    threw = std::strstr(e.what(), "[7][4]") != nullptr;
  }
  VT_CHECK(threw, "pack did not refuse -128 at [7][4] (or did not name it)");
  // Past k (in the ldw padding) −128 is not a weight: accepted.
  w[7 * 9 + 4] = 3;
  w[3 * 9 + 8] = -128;
  threw = false;
  try {
    PackedInt8B::pack(w.data(), 20, 8, 9, s.data(), nullptr, Int8Kernel::kScalar);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  VT_CHECK(!threw, "pack refused a -128 outside the k columns");
}

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> sa;
  std::vector<int32_t> rowsum;
};

Quantized quantize(const std::vector<float>& x, int64_t rows, int64_t k, int64_t ldx, const float* cs, CpuIsa isa) {
  Quantized out;
  const int64_t lda = padded_k(k) + 4;
  out.q.assign(size_t(rows * lda), int8_t(0x5A));  // garbage: the padding bytes must be written as zeros
  out.sa.assign(size_t(rows), -1.0f);
  out.rowsum.assign(size_t(rows), -1);
  quantize_rows(x.data(), ldx, rows, k, cs, out.q.data(), lda, out.sa.data(), out.rowsum.data(), isa);
  for (int64_t r = 0; r < rows; ++r)  // bytes past padded_k are the caller's: reset them for the comparison
    for (int64_t c = padded_k(k); c < lda; ++c) out.q[r * lda + c] = 0;
  return out;
}

void test_quantize(CpuIsa isa) {
  const int failures_before = failures();
  std::mt19937 rng(99);
  // The scalar definition itself on ties: a row with amax = 127 has inv = 1, so x · inv = x exactly.
  {
    const std::vector<float> x = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 126.5f, -3.49f, 0.0f};
    Quantized s = quantize(x, 1, 9, 9, nullptr, CpuIsa::kScalar);
    const int8_t want[] = {127, 0, 2, 2, 0, -2, 126, -3, 0};
    for (int c = 0; c < 9; ++c)
      VT_CHECK(s.q[c] == want[c], "scalar tie rounding: x=%g gave %d, want %d", x[c], s.q[c], want[c]);
    VT_CHECK(s.sa[0] == 1.0f && s.rowsum[0] == 127 + 2 + 2 - 2 + 126 - 3, "scalar tie row: sa %g rowsum %d", s.sa[0],
             s.rowsum[0]);
  }
  for (int64_t k : {1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 100, 384, 1001}) {
    const int64_t rows = 12, ldx = k + 5;
    std::vector<float> x = random_vector(rng, size_t(rows * ldx), 3.0f);
    std::vector<float> cs = random_vector(rng, size_t(k), 1.0f);
    // Row 1: zeros; row 2: a NaN; row 3: +Inf; row 4: −Inf; row 5: tiny (127 / amax overflows); row 6: ties
    // (amax = 127 so x · inv = x, values n + 0.5); row 7: subnormal-free small values; row 8: one huge value.
    for (int64_t c = 0; c < k; ++c) {
      x[1 * ldx + c] = 0.0f;
      x[5 * ldx + c] = (c % 2 ? -1.0f : 1.0f) * 1e-38f;
      x[6 * ldx + c] = float(int(c % 250) - 125) + 0.5f;
      x[7 * ldx + c] *= 1e-20f;
    }
    x[6 * ldx + (k - 1)] = 127.0f;
    x[2 * ldx + k / 2] = std::numeric_limits<float>::quiet_NaN();
    x[3 * ldx + k - 1] = std::numeric_limits<float>::infinity();
    x[4 * ldx] = -std::numeric_limits<float>::infinity();
    x[8 * ldx + k / 3] = 3e38f;
    for (const float* col : {static_cast<const float*>(nullptr), static_cast<const float*>(cs.data())}) {
      Quantized ref = quantize(x, rows, k, ldx, col, CpuIsa::kScalar);
      Quantized got = quantize(x, rows, k, ldx, col, isa);
      int64_t bad_q = 0, bad_s = 0;
      for (size_t i = 0; i < ref.q.size(); ++i) bad_q += ref.q[i] != got.q[i];
      for (int64_t r = 0; r < rows; ++r) {
        const bool same_sa = std::isnan(ref.sa[r]) ? std::isnan(got.sa[r])
                                                   : std::memcmp(&ref.sa[r], &got.sa[r], sizeof(float)) == 0;
        bad_s += !same_sa || ref.rowsum[r] != got.rowsum[r];
      }
      VT_CHECK(bad_q == 0 && bad_s == 0,
               "[%s] quantize_rows k=%lld col_scale=%d: %lld bytes, %lld rows differ from scalar",
               cpu_isa_name(isa), (long long)k, col != nullptr, (long long)bad_q, (long long)bad_s);
      if (col == nullptr) {
        VT_CHECK(ref.sa[1] == 0.0f && ref.rowsum[1] == 0, "zero row: sa %g", ref.sa[1]);
        VT_CHECK(std::isnan(ref.sa[2]) && std::isnan(ref.sa[3]) && std::isnan(ref.sa[4]), "NaN/Inf rows: sa not NaN");
        VT_CHECK(ref.rowsum[2] == 0 && ref.rowsum[3] == 0 && ref.sa[5] == 0.0f, "NaN/tiny rows not zero");
      }
    }
  }
  if (failures() == failures_before) std::printf("[%s] quantize_rows parity: ok\n", cpu_isa_name(isa));
}

// softmax_quantize_rows (attention's P) against its definition: softmax_exp_rows_for_bf16_scalar from −inf (its exps
// are every path's bits), then quantize_rows of the exps on the same path.  Bytes [0, padded_k(n)), sa (NaN as NaN)
// and rowsum identical.  Rows that take the fused pass (ordinary scores, huge ones, a row with one finite score among
// −infs) and rows that must fall back (a NaN, all −inf, +Inf), odd row counts (the pairs' tail), widths with and
// without vector tails.
void test_softmax_quantize(CpuIsa isa) {
  const int failures_before = failures();
  std::mt19937 rng(11);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t n : {1, 3, 4, 7, 8, 9, 16, 17, 31, 64, 197}) {
    // 2048 rows at n = 197: ~4·10^5 exps, enough that an exp other than the definition's moves some code (a relative
    // difference of ~1e-6 moves one at ~1e-4 of them).
    for (int64_t rows : {int64_t(1), int64_t(2), int64_t(9), n == 197 ? int64_t(2048) : int64_t(0)}) {
      if (rows == 0) continue;
      const int64_t ld = n + 3, lda = padded_k(n) + 4;
      std::vector<float> s = random_vector(rng, size_t(rows * ld), 4.0f);
      if (rows == 9) {
        for (int64_t c = 0; c < n; ++c) {
          s[1 * ld + c] *= 1e28f;       // huge scores (the max's own t must still give exp(0) = 1)
          s[3 * ld + c] = -inf;         // all −inf: every exp 0, no max of 1 (falls back)
          s[5 * ld + c] = c == n / 2 ? 2.0f : -inf;  // one finite score: a single code 127
        }
        s[2 * ld + n / 2] = nan;        // a NaN (falls back: sa NaN, codes 0)
        s[4 * ld + n - 1] = inf;        // +Inf: inf − inf = NaN (falls back)
      }
      std::vector<float> s_ref = s, row_max(size_t(rows), -inf), row_sum(static_cast<size_t>(rows));
      std::vector<int8_t> q_ref(size_t(rows * lda), 99), q(size_t(rows * lda), 99);
      std::vector<float> sa_ref(static_cast<size_t>(rows)), sa(static_cast<size_t>(rows));
      std::vector<int32_t> rs_ref(static_cast<size_t>(rows)), rs(static_cast<size_t>(rows));
      gemm::softmax_exp_rows_for_bf16_scalar(s_ref.data(), rows, n, ld, 0.125f, row_max.data(), row_sum.data());
      quantize_rows(s_ref.data(), ld, rows, n, nullptr, q_ref.data(), lda, sa_ref.data(), rs_ref.data(), isa);
      softmax_quantize_rows(s.data(), rows, n, ld, 0.125f, q.data(), lda, sa.data(), rs.data(), isa);
      int64_t bad_q = 0, bad_s = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < padded_k(n); ++c) bad_q += q_ref[r * lda + c] != q[r * lda + c];
        for (int64_t c = padded_k(n); c < lda; ++c) bad_q += q[r * lda + c] != 99;  // nothing past padded_k(n)
        const bool same_sa = std::isnan(sa_ref[r]) ? std::isnan(sa[r])
                                                   : std::memcmp(&sa_ref[r], &sa[r], sizeof(float)) == 0;
        bad_s += !same_sa || rs_ref[r] != rs[r];
      }
      VT_CHECK(bad_q == 0 && bad_s == 0, "[%s] softmax_quantize_rows n=%lld rows=%lld: %lld bytes, %lld rows differ",
               cpu_isa_name(isa), (long long)n, (long long)rows, (long long)bad_q, (long long)bad_s);
      if (rows == 9) {
        VT_CHECK(std::isnan(sa[2]) && std::isnan(sa[4]) && rs[2] == 0, "[%s] NaN rows not NaN", cpu_isa_name(isa));
        VT_CHECK(rs[5] == 127 && sa[0] == 1.0f / 127.0f, "[%s] one-score row: rowsum %d", cpu_isa_name(isa), rs[5]);
      }
    }
  }
  if (failures() == failures_before) std::printf("[%s] softmax_quantize_rows parity: ok\n", cpu_isa_name(isa));
}

// quantize_rows then gemm_int8 approximates the fp32 product: |err| <= Σ_k |x||w| · (1/127 + 1/127) per value
// (each operand off by at most half a step of its scale), checked loosely on random data.
void test_end_to_end(CpuIsa isa) {
  const Int8Kernel kern = int8_kernel(isa);
  std::mt19937 rng(7);
  const int64_t m = 23, n = 40, k = 77, lda = padded_k(k);
  std::vector<float> x = random_vector(rng, size_t(m * k)), w = random_vector(rng, size_t(n * k), 0.2f);
  std::vector<int8_t> qw(size_t(n * k));
  std::vector<float> sw(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    float amax = 0.0f;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::fabs(w[j * k + c]));
    sw[j] = amax / 127.0f;
    for (int64_t c = 0; c < k; ++c) qw[j * k + c] = int8_t(std::nearbyint(w[j * k + c] * (127.0f / amax)));
  }
  PackedInt8B b = PackedInt8B::pack(qw.data(), n, k, k, sw.data(), nullptr, kern);
  std::vector<int8_t> qa(size_t(m * lda));
  std::vector<float> sa(static_cast<size_t>(m)), c(static_cast<size_t>(m * n));
  std::vector<int32_t> rs(static_cast<size_t>(m));
  quantize_rows(x.data(), k, m, k, nullptr, qa.data(), lda, sa.data(), rs.data(), isa);
  gemm_int8(m, qa.data(), lda, sa.data(), rs.data(), b, c.data(), n, gemm::Epilogue(), kern);
  double worst = 0.0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0.0, mag = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        ref += double(x[i * k + p]) * w[j * k + p];
        mag += std::fabs(double(x[i * k + p]) * w[j * k + p]);
      }
      worst = std::max(worst, std::fabs(c[i * n + j] - ref) / (mag * 2.0 / 127.0 + 1e-6));
    }
  VT_CHECK(worst <= 1.0, "[%s] quantize + gemm_int8 vs fp32: error %.3g x bound", int8_kernel_name(kern), worst);
}

}  // namespace

int main() {
  const std::vector<CpuIsa> isas = forced_isas();
  std::printf("ISA paths under test:");
  for (CpuIsa isa : isas) std::printf(" %s", cpu_isa_name(isa));
  std::printf("\n");
  test_refuses_minus_128();
  std::vector<Int8Kernel> done;
  for (CpuIsa isa : isas) {
    VT_CHECK(set_active_cpu_isa(isa) && active_cpu_isa() == isa, "could not force %s", cpu_isa_name(isa));
    // Each kernel the path can take: with every extension (if the CPU has it: AMX where present), without AMX,
    // and with the extensions turned off.
    for (int level = 2; level >= 0; --level) {
      const int with_ext = level >= 1 ? 1 : 0;
      // (Enabling is refused, and changes nothing, for an extension the hardware lacks; it overrides
      // VITFAST_CPU_EXT=none, so every kernel the CPU can run is tested whatever the environment says.)
      for (CpuExt ext : {CpuExt::kAvx512Vnni, CpuExt::kAvxVnni, CpuExt::kNeonDotProd})
        set_cpu_ext_enabled(ext, with_ext == 1);
      set_cpu_ext_enabled(CpuExt::kAmxInt8, level == 2);
      if (level == 1 && isa == CpuIsa::kAvx512 && cpu_has(CpuExt::kAvx512Vnni))
        VT_CHECK(int8_kernel(isa) == Int8Kernel::kAvx512Vnni, "without AMX int8_kernel is %s",
                 int8_kernel_name(int8_kernel(isa)));
      if (with_ext == 1 && isa == CpuIsa::kAvx2 && cpu_has(CpuExt::kAvxVnni))
        VT_CHECK(int8_kernel(isa) == Int8Kernel::kAvxVnni, "[avx2] with AVX-VNNI int8_kernel is %s",
                 int8_kernel_name(int8_kernel(isa)));
      const Int8Kernel kern = int8_kernel(isa);
      if (with_ext == 0) {
        const Int8Kernel want = isa == CpuIsa::kAvx512 ? Int8Kernel::kAvx2
                                : isa == CpuIsa::kAvx2 ? Int8Kernel::kAvx2
                                                       : Int8Kernel::kScalar;
        VT_CHECK(kern == want, "[%s] without extensions int8_kernel is %s", cpu_isa_name(isa), int8_kernel_name(kern));
      }
      if (std::find(done.begin(), done.end(), kern) == done.end()) {
        test_kernel(kern);
        test_narrow(kern);
#if defined(__x86_64__) || defined(__i386__)
        if (kern == Int8Kernel::kAvx2) test_unsigned_a();
#endif
        done.push_back(kern);
      }
      test_end_to_end(isa);
    }
    for (CpuExt ext : {CpuExt::kAvx512Vnni, CpuExt::kAvxVnni, CpuExt::kNeonDotProd, CpuExt::kAmxInt8})
      set_cpu_ext_enabled(ext, true);
    test_quantize(isa);
    test_softmax_quantize(isa);
  }
  std::printf("int8 kernels under test:");
  for (Int8Kernel kern : done) std::printf(" %s", int8_kernel_name(kern));
  std::printf("\n");
  return finish("gemm_int8");
}
