// layer_norm_rows on every ISA path this CPU runs, against a double-precision oracle: widths around every
// vector width and its tails (1..33) and the ViT widths, 1-5 rows (the AVX-512 path pairs rows), with and without
// gamma/beta, and rows whose mean is 1000× their spread (a one-pass E[x²] − mean² would lose every digit there).
// layer_norm_rows_bf16 (the bf16 GEMMs' LayerNorm) against its definition, bit for bit: widen_bf16, layer_norm_rows,
// then convert_rows' portable rounding.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/layer_norm.h"
#include "test_util.h"

using namespace vitfast;
using namespace vitfast_test;

namespace {

// Also returns, per row, the error an fp32 computation cannot avoid: the mean is only known to a few ulps of
// max|x|, and y = (x − mean)/std scales that by 1/std (a row of two close values at 1000 has a tiny std).
void reference(const std::vector<float>& x, std::vector<double>& y, std::vector<double>& row_tol, int64_t rows,
               int64_t c, const float* gamma, const float* beta, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < c; ++j) mean += x[size_t(r * c + j)];
    mean /= double(c);
    for (int64_t j = 0; j < c; ++j) var += (x[size_t(r * c + j)] - mean) * (x[size_t(r * c + j)] - mean);
    const double rstd = 1.0 / std::sqrt(var / double(c) + eps);
    double amax = 0.0;
    for (int64_t j = 0; j < c; ++j) amax = std::max(amax, std::fabs(double(x[size_t(r * c + j)])));
    row_tol[size_t(r)] = 2e-5 + 8.0 * std::ldexp(amax, -24) * rstd;
    for (int64_t j = 0; j < c; ++j) {
      double v = (x[size_t(r * c + j)] - mean) * rstd;
      if (gamma) v *= gamma[j];
      if (beta) v += beta[j];
      y[size_t(r * c + j)] = v;
    }
  }
}

void test_parity(CpuIsa isa) {
  std::mt19937 rng(11);
  int cases = 0;
  double worst = 0.0;
  for (int64_t c : {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 100, 192, 384, 768}) {
    for (int64_t rows : {1, 2, 3, 5}) {
      for (int affine = 0; affine < 3; ++affine) {  // none, gamma only, gamma and beta
        for (double offset : {0.5, 1000.0}) {
          std::vector<float> x = random_vector(rng, size_t(rows * c), 2.0f);
          for (float& v : x) v += float(offset);
          const std::vector<float> g = random_vector(rng, size_t(c)), b = random_vector(rng, size_t(c));
          const float* gamma = affine >= 1 ? g.data() : nullptr;
          const float* beta = affine >= 2 ? b.data() : nullptr;
          const float eps = 1e-6f;
          std::vector<float> y(size_t(rows * c), 12345.0f);
          std::vector<double> want(size_t(rows * c));
          std::vector<double> row_tol(static_cast<size_t>(rows));
          layer_norm_rows(x.data(), y.data(), rows, c, gamma, beta, eps, isa);
          reference(x, want, row_tol, rows, c, gamma, beta, eps);
          size_t bad = 0;
          for (size_t i = 0; i < y.size(); ++i) {
            const double scale = gamma ? std::fabs(double(g[i % size_t(c)])) + 1.0 : 1.0;
            const double err = std::fabs(double(y[i]) - want[i]) / scale;
            if (offset < 1.0) worst = std::max(worst, err);
            bad += !(err <= row_tol[i / size_t(c)]);
          }
          VT_CHECK(bad == 0, "[%s] layer_norm c=%lld rows=%lld affine=%d offset=%g: %zu of %zu beyond the fp32 bound",
                   cpu_isa_name(isa), (long long)c, (long long)rows, affine, offset, bad, y.size());
          ++cases;
        }
      }
    }
  }
  std::printf("[%s] layer_norm parity: %d cases, worst |err| at mean 0.5: %.2g\n", cpu_isa_name(isa), cases, worst);
}

// A row whose first value is an outlier: pass 1 sums deviations from it, so every term is ~ −x0 and that sum's
// rounding lands in the mean (0.47 off at c = 4096 with values ~5 after x0 = 1e5) unless pass 2 corrects it.
// The outlier last is the easy case, kept as the control.  The outlier's own output is not checked: its error is
// the variance's (a sum dominated by one d² ~ 1e10 that absorbs the others' ~600 in fp32), ~2e-5 relative here.
void test_outlier_first_value(CpuIsa isa) {
  std::mt19937 rng(5);
  for (int64_t c : {1000, 4096}) {
    const int64_t rows = 2;
    std::vector<float> x = random_vector(rng, size_t(rows * c), 2.0f);
    for (float& v : x) v += 5.0f;
    x[0] = 1e5f;                       // row 0: the outlier first
    x[size_t(2 * c - 1)] = 1e5f;       // row 1: the outlier last
    std::vector<float> y(size_t(rows * c));
    std::vector<double> want(static_cast<size_t>(rows * c)), row_tol(static_cast<size_t>(rows));
    layer_norm_rows(x.data(), y.data(), rows, c, nullptr, nullptr, 1e-6f, isa);
    reference(x, want, row_tol, rows, c, nullptr, nullptr, 1e-6);
    for (int64_t r = 0; r < rows; ++r) {
      double worst = 0.0;
      for (int64_t j = 0; j < c; ++j) {
        if (x[size_t(r * c + j)] == 1e5f) continue;
        worst = std::max(worst, std::fabs(double(y[size_t(r * c + j)]) - want[size_t(r * c + j)]));
      }
      VT_CHECK(worst <= row_tol[size_t(r)], "[%s] layer_norm c=%lld, outlier %s: |err| %.3g beyond the fp32 bound %.3g",
               cpu_isa_name(isa), (long long)c, r == 0 ? "first" : "last", worst, row_tol[size_t(r)]);
    }
  }
}

// The fused bf16 output (AVX-512: one pass per row pair) against the three steps it replaces, bit for bit, with
// fp32 and bf16 inputs, odd widths (the pad element), a row stride wider than the row (nothing written past the pad),
// and gammas small enough that outputs are fp32 denormals and round to bf16 denormals (the portable rounding keeps
// them) or NaN (a quiet NaN either way).
void test_bf16_output(CpuIsa isa) {
  using gemm16::Bf16Kernel;
  std::mt19937 rng(23);
  int cases = 0;
  for (int64_t c : {1, 2, 3, 15, 16, 17, 31, 33, 100, 384, 768}) {
    for (int64_t rows : {1, 2, 3, 5}) {
      for (int affine = 0; affine < 4; ++affine) {  // none, gamma, gamma and beta, denormal-scale gamma with a NaN
        for (int bf16_in = 0; bf16_in < 2; ++bf16_in) {
          std::vector<float> x = random_vector(rng, size_t(rows * c), 3.0f);
          for (float& v : x) v += 0.25f;
          std::vector<float> g = random_vector(rng, size_t(c)), b = random_vector(rng, size_t(c));
          if (affine == 3) {
            for (float& v : g) v *= 1e-38f;
            if (c > 2) g[1] = std::nanf("");
          }
          const float* gamma = affine >= 1 ? g.data() : nullptr;
          const float* beta = affine == 2 ? b.data() : nullptr;
          // bf16 rows c apart, as a block's input (+1: convert_rows writes an odd row's pad element after it).
          std::vector<uint16_t> x16(size_t(rows * c + 1));
          gemm16::convert_rows(x.data(), c, rows, c, x16.data(), c, Bf16Kernel::kScalar);
          const int64_t ld16 = c + 5;
          // The three steps.
          std::vector<float> want_wide(size_t(rows * c)), want_y(size_t(rows * c));
          std::vector<uint16_t> want16(size_t(rows * ld16), 0xABCD);
          const float* src = x.data();
          if (bf16_in) {
            gemm16::widen_bf16(x16.data(), rows * c, want_wide.data());
            src = want_wide.data();
          }
          layer_norm_rows(src, want_y.data(), rows, c, gamma, beta, 1e-6f, isa);
          gemm16::convert_rows(want_y.data(), c, rows, c, want16.data(), ld16, Bf16Kernel::kScalar);
          // The fused call.
          std::vector<float> wide(size_t(rows * c), -7.0f), scratch(size_t(rows * c));
          std::vector<uint16_t> got16(size_t(rows * ld16), 0xABCD);
          layer_norm_rows_bf16(x.data(), bf16_in ? x16.data() : nullptr, bf16_in ? wide.data() : nullptr,
                               got16.data(), ld16, rows, c, gamma, beta, 1e-6f, isa,
                               gemm16::bf16_kernel(isa), scratch.data());
          VT_CHECK(std::memcmp(got16.data(), want16.data(), got16.size() * 2) == 0,
                   "[%s] layer_norm_rows_bf16 c=%lld rows=%lld affine=%d bf16 input=%d: bf16 rows differ from "
                   "convert_rows(layer_norm_rows(x))", cpu_isa_name(isa), (long long)c, (long long)rows, affine,
                   bf16_in);
          if (bf16_in)
            VT_CHECK(std::memcmp(wide.data(), want_wide.data(), wide.size() * 4) == 0,
                     "[%s] layer_norm_rows_bf16 c=%lld rows=%lld: the widened input differs from widen_bf16",
                     cpu_isa_name(isa), (long long)c, (long long)rows);
          ++cases;
        }
      }
    }
  }
  std::printf("[%s] layer_norm_rows_bf16: %d cases bit-exact\n", cpu_isa_name(isa), cases);
}

}  // namespace

int main() { return run_on_every_isa("test_layer_norm", test_parity, test_outlier_first_value, test_bf16_output); }
