// GEMM core and GELU of every ISA path against naive double-precision loops: odd shapes around the 6 × 16
// register block, K blocks that do not divide K, each epilogue, and no write outside the valid columns.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/next_pair_prefetch.h"
#include "tests/test_util.h"

using namespace vitfast;
using namespace vitfast_test;

namespace {

struct Case {
  bool bias, gelu, addend, accumulate, c_padded;
  bool row_scale = false;  // the whole sum × a per-row factor, before the bias (never with accumulate: gemm.h)
};

void check_gemm(CpuIsa isa, std::mt19937& rng, int64_t m, int64_t n, int64_t k, int64_t kc, const Case& cs,
                int64_t lda = -1) {
  if (lda < 0) lda = k + 2;  // row strides larger than the row: the kernels must honour lda/ldc
  std::vector<float> a = random_vector(rng, size_t(m * lda));
  std::vector<float> w = random_vector(rng, size_t(n * k), 0.3f);
  std::vector<float> bias = random_vector(rng, size_t(n));
  gemm::PackedB b = gemm::PackedB::pack_linear(w.data(), n, k, k, cs.bias ? bias.data() : nullptr);
  const int64_t ldc = cs.c_padded ? b.padded_n() + 1 : n + 3;
  std::vector<float> addend = random_vector(rng, size_t(m * n));
  const float sentinel = 12345.0f;
  std::vector<float> c(size_t(m * ldc), sentinel);
  std::vector<float> c0 = random_vector(rng, size_t(m * n));
  std::vector<float> row_scale = random_vector(rng, size_t(m), 2.0f);
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
  ep.row_scale = cs.row_scale ? row_scale.data() : nullptr;
  gemm::gemm(m, a.data(), lda, b, c.data(), ldc, ep, isa, kc);

  double worst = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0, mag = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        acc += double(a[i * lda + p]) * w[j * k + p];
        mag += std::fabs(double(a[i * lda + p]) * w[j * k + p]);
      }
      if (cs.accumulate) acc += c0[i * n + j];
      if (cs.row_scale) {
        acc *= row_scale[i];
        mag *= std::fabs(row_scale[i]);
      }
      if (cs.bias) acc += bias[j];
      if (cs.gelu) acc = gelu_ref(acc);
      if (cs.addend) acc += addend[i * n + j];
      const double got = c[i * ldc + j];
      // fp32 accumulation of k products: error bounded by ~k·eps·Σ|terms|; 2e-5 abs+rel covers K <= 64.
      const double err = std::fabs(got - acc);
      const double tol = 2e-5 * (1.0 + std::fabs(acc)) + 1e-6 * mag;
      worst = std::max(worst, err / tol);
    }
    // Nothing past column n (unpadded C) or past the padded panels (padded C) may be written.
    const int64_t written = cs.c_padded ? b.padded_n() : n;
    for (int64_t j = written; j < ldc; ++j)
      VT_CHECK(c[i * ldc + j] == sentinel, "[%s] wrote column %lld of %lld (m=%lld n=%lld k=%lld)",
               cpu_isa_name(isa), (long long)j, (long long)n, (long long)m, (long long)n, (long long)k);
  }
  VT_CHECK(worst <= 1.0, "[%s] m=%lld n=%lld k=%lld kc=%lld bias=%d gelu=%d addend=%d acc=%d padded=%d row_scale=%d: "
           "error %.3g x tolerance", cpu_isa_name(isa), (long long)m, (long long)n, (long long)k, (long long)kc,
           cs.bias, cs.gelu, cs.addend, cs.accumulate, cs.c_padded, cs.row_scale, worst);
}

void test_gemm_parity(CpuIsa isa) {
  std::mt19937 rng(1234);
  const Case cases[] = {
      {false, false, false, false, false}, {true, false, false, false, false}, {true, true, false, false, true},
      {true, true, false, false, false},   {true, false, true, false, false},  {false, false, false, true, false},
      {true, false, true, true, false},
      // row_scale alone (AVX-512: the row-scaled store), on a padded C, and with every epilogue it may go with
      {false, false, false, false, false, true}, {false, false, false, false, true, true},
      {true, true, true, false, false, true},
  };
  int count = 0;
  // m and n around both register blocks: 6 × 16 (AVX2/NEON/scalar) and 14 × 32 (AVX-512: pairs of panels,
  // so 33 = a pair + a partial single panel, 48 = a pair + a whole single panel).
  for (int64_t m : {1, 2, 3, 5, 6, 7, 13, 14, 29})
    for (int64_t n : {1, 3, 8, 15, 16, 17, 33, 48})
      for (int64_t k : {0, 1, 5, 16, 17, 33})
        for (int64_t kc : {int64_t(4), int64_t(7), gemm::kDefaultKc})
          for (const Case& cs : cases) {
            if (kc != gemm::kDefaultKc && k < kc) continue;  // small kc only matters when K is blocked
            check_gemm(isa, rng, m, n, k, kc, cs);
            ++count;
          }
  // A realistic size with a tail panel, unblocked and in three K blocks.
  for (int64_t kc : {gemm::kDefaultKc, int64_t(200)}) {
    check_gemm(isa, rng, 23, 200, 600, kc, cases[2]);
    check_gemm(isa, rng, 23, 200, 600, kc, cases[6]);
    count += 2;
  }
  // A row stride of 1024 floats (4 KiB: the AVX-512 path copies A to a padded stride, gemm.cpp), over more rows
  // than one copied chunk (448), with the residual and accumulate epilogues that the chunks must offset too.
  for (const Case& cs : {cases[4], cases[6], cases[7], cases[9]}) {
    check_gemm(isa, rng, 460, 33, 1000, gemm::kDefaultKc, cs, 1024);
    ++count;
  }
  std::printf("[%s] gemm parity: %d cases\n", cpu_isa_name(isa), count);
}

void test_gemm_panel_range(CpuIsa isa) {
  // gemm_panels computes only its columns: two halves give the whole product.
  std::mt19937 rng(7);
  const int64_t m = 7, n = 50, k = 19;
  std::vector<float> a = random_vector(rng, size_t(m * k)), w = random_vector(rng, size_t(n * k));
  gemm::PackedB b = gemm::PackedB::pack_linear(w.data(), n, k, k, nullptr);
  std::vector<float> whole(size_t(m * n)), split(size_t(m * n), -1.0f);
  gemm::gemm(m, a.data(), k, b, whole.data(), n, gemm::Epilogue(), isa);
  gemm::gemm_panels(m, a.data(), k, b, 0, 2, split.data(), n, gemm::Epilogue(), isa);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 32; j < n; ++j) VT_CHECK(split[i * n + j] == -1.0f, "panel range wrote column %lld", (long long)j);
  gemm::gemm_panels(m, a.data(), k, b, 2, b.panels(), split.data(), n, gemm::Epilogue(), isa);
  check_same_bits(isa, whole, split, "panel split");
}

// The GELU *epilogue* of the micro-kernel (each path has its own, e.g. AVX-512's gelu16 is not gemm::gelu):
// C = GELU(A · 1 + bias) over the same dense grid, with K = 1, against the double-precision oracle.
void test_gelu_epilogue(CpuIsa isa) {
  std::vector<float> xs;
  for (int i = -60000; i <= 60000; ++i) xs.push_back(float(i) * 2e-4f);  // [-12, 12] step 2e-4
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 30.0f, -30.0f, 1e10f, -1e10f}) xs.push_back(v);
  const int64_t m = int64_t(xs.size()), n = 33;  // a pair of panels and a partial one (every tile shape)
  std::vector<float> w(size_t(n), 1.0f), bias(size_t(n), 0.0f);
  gemm::PackedB b = gemm::PackedB::pack_linear(w.data(), n, 1, 1, bias.data());
  std::vector<float> c(size_t(m * n));
  gemm::Epilogue ep;
  ep.bias = true;
  ep.gelu = true;
  gemm::gemm(m, xs.data(), 1, b, c.data(), n, ep, isa);
  double worst = 0.0, worst_x = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    const double ref = gelu_ref(xs[size_t(i)]);
    for (int64_t j = 0; j < n; ++j) {
      const double err = std::fabs(c[size_t(i * n + j)] - ref) - 0.5 * std::fabs(ref) * std::numeric_limits<float>::epsilon();
      const double scaled = err / std::max(1.0, std::fabs(double(xs[size_t(i)])));
      if (scaled > worst) {
        worst = scaled;
        worst_x = xs[size_t(i)];
      }
    }
  }
  std::printf("[%s] gelu epilogue: max |err| / max(1,|x|) beyond half an ulp = %.3g (at x = %g)\n",
              cpu_isa_name(isa), worst, worst_x);
  VT_CHECK(worst <= 1e-7, "[%s] gelu epilogue error %.3g at x = %g", cpu_isa_name(isa), worst, worst_x);
  std::vector<float> nan1 = {std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> out1 = std::vector<float>(size_t(n), 0.0f);
  gemm::gemm(1, nan1.data(), 1, b, out1.data(), n, ep, isa);
  VT_CHECK(std::isnan(out1[0]) && std::isnan(out1[size_t(n - 1)]), "[%s] gelu epilogue(NaN) is not NaN",
           cpu_isa_name(isa));
}

void test_gelu(CpuIsa isa) {
  // Dense grid over the whole interesting range plus the saturated tails and special values.
  std::vector<float> xs;
  for (int i = -120000; i <= 120000; ++i) xs.push_back(float(i) * 1e-4f);  // [-12, 12] step 1e-4
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 30.0f, -30.0f, 1e10f, -1e10f}) xs.push_back(v);
  std::vector<float> y = xs;
  gemm::gelu(y.data(), int64_t(y.size()), isa);
  double worst = 0.0, worst_x = 0.0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double ref = gelu_ref(xs[i]);
    // Absolute error of erf ~1e-7 scales by 0.5·|x| in GELU; the result itself carries half an ulp.
    const double err = std::fabs(y[i] - ref) - 0.5 * std::fabs(ref) * std::numeric_limits<float>::epsilon();
    const double scaled = err / std::max(1.0, std::fabs(double(xs[i])));
    if (scaled > worst) {
      worst = scaled;
      worst_x = xs[i];
    }
  }
  std::printf("[%s] gelu: max |err| / max(1,|x|) beyond half an ulp = %.3g (at x = %g)\n", cpu_isa_name(isa),
              worst, worst_x);
  VT_CHECK(worst <= 1e-7, "[%s] gelu error %.3g at x = %g", cpu_isa_name(isa), worst, worst_x);
  // Every length 0..40 (vector bodies and tails) gives the same values as one long call.
  for (int64_t len = 0; len <= 40; ++len) {
    std::vector<float> part(xs.begin() + 1000, xs.begin() + 1000 + len);
    gemm::gelu(part.data(), len, isa);
    for (int64_t i = 0; i < len; ++i)
      VT_CHECK(part[i] == y[1000 + i], "[%s] gelu tail length %lld differs at %lld", cpu_isa_name(isa),
               (long long)len, (long long)i);
  }
  std::vector<float> nan1 = {std::numeric_limits<float>::quiet_NaN()};
  gemm::gelu(nan1.data(), 1, isa);
  VT_CHECK(std::isnan(nan1[0]), "[%s] gelu(NaN) is not NaN", cpu_isa_name(isa));
  if (isa != CpuIsa::kScalar) {
    // Proof that this path's own code ran: its polynomial erf is not bit-identical to std::erf (scalar).
    std::vector<float> s = xs;
    gemm::gelu(s.data(), int64_t(s.size()), CpuIsa::kScalar);
    size_t differ = 0;
    for (size_t i = 0; i < s.size(); ++i) differ += s[i] != y[i];
    VT_CHECK(differ > 0, "[%s] gelu is bit-identical to the scalar path: was the SIMD code executed?",
             cpu_isa_name(isa));
  }
}

// The runtime packers (attention packs K_hᵀ and V_h of every head with them) against the layout written out
// element by element: panel p holds columns [16p, 16p + 16) as [k][16], padding columns zero.  Sizes around
// the 4 × 4 transpose blocks of the x86 path and the 16-column panels, row strides wider than a row, and a
// destination first filled with garbage (every padding float must be written, not assumed zero).
// Floats of a packed [panels][k][kNr] buffer that differ from B[kk][col] = element(kk, col) (0 past column n).
template <class Element>
size_t packed_mismatches(const std::vector<float>& got, int64_t n, int64_t k, Element element) {
  size_t bad = 0;
  for (int64_t p = 0; p < (n + gemm::kNr - 1) / gemm::kNr; ++p)
    for (int64_t kk = 0; kk < k; ++kk)
      for (int64_t j = 0; j < gemm::kNr; ++j) {
        const int64_t col = p * gemm::kNr + j;
        bad += got[size_t((p * k + kk) * gemm::kNr + j)] != (col < n ? element(kk, col) : 0.0f);
      }
  return bad;
}

void test_runtime_packing() {
  std::mt19937 rng(7);
  for (int64_t n : {1, 3, 4, 5, 15, 16, 17, 33, 197}) {
    for (int64_t k : {1, 3, 4, 7, 8, 64}) {
      // pack_b_transposed: B[kk][col] = W[col][kk], W is n × k with row stride k + 5.
      const int64_t ldw = k + 5;
      const std::vector<float> w = random_vector(rng, size_t(n * ldw));
      std::vector<float> got(size_t(gemm::packed_floats(n, k)), 12345.0f);
      gemm::pack_b_transposed(w.data(), n, k, ldw, got.data());
      size_t bad = packed_mismatches(got, n, k, [&](int64_t kk, int64_t col) { return w[size_t(col * ldw + kk)]; });
      VT_CHECK(bad == 0, "pack_b_transposed n=%lld k=%lld: %zu floats differ", (long long)n, (long long)k, bad);
      // pack_b: B is k × n with row stride n + 3.
      const int64_t ldb = n + 3;
      const std::vector<float> b = random_vector(rng, size_t(k * ldb));
      std::fill(got.begin(), got.end(), 12345.0f);
      gemm::pack_b(b.data(), k, n, ldb, got.data());
      bad = packed_mismatches(got, n, k, [&](int64_t kk, int64_t col) { return b[size_t(kk * ldb + col)]; });
      VT_CHECK(bad == 0, "pack_b n=%lld k=%lld: %zu floats differ", (long long)n, (long long)k, bad);
    }
  }
}

// The thread split of token rows (gemm::RowShares): the shares tile [0, rows) in order, none empty, at most
// max_chunks of them, each starting on a whole register block of the ISA's tile (any row on AVX-512), and
// balanced to within one block.
void test_row_shares(CpuIsa isa) {
  const int64_t unit = isa == CpuIsa::kAvx512 ? 1 : gemm::kMr;
  for (int64_t rows : {0, 1, 5, 6, 7, 13, 14, 15, 28, 29, 197, 394, 1576}) {
    for (int64_t max_chunks : {0, 1, 2, 3, 7, 16, 64, 400}) {
      const gemm::RowShares shares(rows, max_chunks, isa);
      VT_CHECK(shares.chunks >= 1 && shares.chunks <= std::max<int64_t>(1, max_chunks),
               "rows=%lld max_chunks=%lld: %lld chunks", (long long)rows, (long long)max_chunks,
               (long long)shares.chunks);
      int64_t next = 0, smallest = rows, largest = 0;
      for (int64_t c = 0; c < shares.chunks; ++c) {
        const int64_t r0 = shares.begin(c), r1 = shares.end(c);
        VT_CHECK(r0 == next && r1 >= r0 && r0 % unit == 0, "rows=%lld chunks=%lld: share %lld is [%lld, %lld)",
                 (long long)rows, (long long)shares.chunks, (long long)c, (long long)r0, (long long)r1);
        VT_CHECK(rows == 0 || r1 > r0, "rows=%lld chunks=%lld: share %lld is empty", (long long)rows,
                 (long long)shares.chunks, (long long)c);
        VT_CHECK(r1 - r0 <= shares.max_share(), "rows=%lld chunks=%lld: share %lld has %lld rows > max_share %lld",
                 (long long)rows, (long long)shares.chunks, (long long)c, (long long)(r1 - r0),
                 (long long)shares.max_share());
        if (c + 1 < shares.chunks) {  // the last share takes the remainder of a partial block
          smallest = std::min(smallest, r1 - r0);
          largest = std::max(largest, r1 - r0);
        }
        next = r1;
      }
      VT_CHECK(next == rows, "rows=%lld max_chunks=%lld: shares end at %lld", (long long)rows, (long long)max_chunks,
               (long long)next);
      VT_CHECK(shares.chunks < 3 || largest - smallest <= unit, "rows=%lld chunks=%lld: shares of %lld..%lld rows",
               (long long)rows, (long long)shares.chunks, (long long)smallest, (long long)largest);
    }
  }
  // The case the split exists for: 197 tokens on two threads.
  const gemm::RowShares two(197, 2, isa);
  VT_CHECK(two.end(0) == (isa == CpuIsa::kAvx512 ? 98 : 96), "197 rows on 2 threads: first share %lld rows",
           (long long)two.end(0));
}

}  // namespace

// AlignedFloats: zeroed and 64-byte aligned at every size (from 64 KiB carved from the huge-page arena, where the
// arena is on: csrc/tests/test_huge_arena.cpp).
void test_aligned_floats() {
  for (int64_t n : {int64_t(1), int64_t(1000), int64_t(1) << 19, (int64_t(1) << 19) + 7, int64_t(3) << 20}) {
    gemm::AlignedFloats a(n);
    const uintptr_t addr = reinterpret_cast<uintptr_t>(a.data());
    VT_CHECK(addr % 64 == 0, "AlignedFloats(%lld): %p is not 64-byte aligned", (long long)n, (void*)a.data());
    bool zero = true;
    for (int64_t i = 0; i < n; ++i) zero = zero && a.data()[i] == 0.0f;
    VT_CHECK(zero && a.size() == n, "AlignedFloats(%lld): not zeroed or wrong size", (long long)n);
  }
}

// The row tiles' shares of the next panels (next_pair_prefetch.h): tile 0 takes none; every share is whole lines
// inside one panel, at most steps / kNextPairStride of them (what the tile's loop issues); no line is in two shares;
// and when the tiles after the first can issue them all, every line of the next panels is in one.
void test_next_pair_share() {
  alignas(64) static char buf[2 * 1024 * 64];
  const int64_t stride = 1024 * 64;  // bytes between the panels (>= lines · 64)
  int cases = 0;
  for (int64_t np : {0, 1, 2})
    for (int64_t lines : {1, 3, 4, 64, 197, 384, 768})
      for (int64_t steps : {int64_t(0), int64_t(3), lines, 2 * lines})
        for (int64_t tiles : {1, 2, 6, 14, 57}) {
          std::vector<int> hits(size_t(2 * lines), 0);
          for (int64_t t = 0; t < tiles; ++t) {
            const NextPairShare sh = next_pair_share(np > 0 ? buf : nullptr, stride, np, lines, steps, t);
            if (sh.next == sh.next_end) continue;
            VT_CHECK(t > 0 && sh.next < sh.next_end, "tile %lld: a share for tile 0, or a reversed one", (long long)t);
            const int64_t b0 = sh.next - buf, b1 = sh.next_end - buf, q = b0 / stride;
            const int64_t l0 = (b0 - q * stride) / 64, l1 = (b1 - q * stride) / 64;
            VT_CHECK(b0 % 64 == 0 && b1 % 64 == 0 && q < np && (b1 - 1) / stride == q && l1 <= lines,
                     "tile %lld: share [%lld, %lld) is not whole lines of one of the %lld panels", (long long)t,
                     (long long)b0, (long long)b1, (long long)np);
            VT_CHECK(l1 - l0 <= steps / kNextPairStride, "tile %lld: share longer than its loop issues", (long long)t);
            for (int64_t l = l0; l < l1; ++l) ++hits[size_t(q * lines + l)];
          }
          const int64_t cap = steps / kNextPairStride;
          const bool all = np > 0 && cap > 0 && tiles - 1 >= np * ((lines + cap - 1) / cap);
          for (int64_t l = 0; l < np * lines; ++l)
            VT_CHECK(hits[size_t(l)] <= 1 && (!all || hits[size_t(l)] == 1),
                     "np=%lld lines=%lld steps=%lld tiles=%lld: line %lld in %d shares", (long long)np,
                     (long long)lines, (long long)steps, (long long)tiles, (long long)l, hits[size_t(l)]);
          ++cases;
        }
  // next_panels: the next group's panels below panel_end, none when off.
  VT_CHECK(next_panels(4, 10, 2, true) == 2 && next_panels(9, 10, 2, true) == 1 && next_panels(10, 10, 2, true) == 0 &&
               next_panels(3, 10, 1, true) == 1 && next_panels(4, 10, 2, false) == 0,
           "next_panels: wrong count");
  std::printf("next_pair_share: %d cases\n", cases);
}

int main() {
  test_aligned_floats();
  test_next_pair_share();
  test_runtime_packing();  // ISA-independent (plain C++, SSE2 on x86-64)
  return run_on_every_isa("test_gemm", test_gemm_parity, test_gemm_panel_range, test_gelu, test_gelu_epilogue,
                          test_row_shares);
}
