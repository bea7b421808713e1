// Portable int8 kernel (Int8Kernel::kScalar) and the reference quantize_rows: plain int32 loops, always compiled,
// the fallback on any CPU and the definition the SIMD variants reproduce bit for bit.  Baseline ISA only (no
// target pragma), so <cmath> is safe here.
#include <cmath>
#include <cfloat>

#include "kernels/gemm_int8_isa.h"
#include "kernels/scalar_math.h"

namespace vitfast {
namespace gemm8 {

namespace {
constexpr int kNr = 16;
}  // namespace

void gemm_int8_block_scalar(const Int8BlockArgs& g) {
  const int64_t groups = g.k4 / 4;
  for (int64_t p = g.panel_begin; p < g.panel_end; ++p) {
    const int8_t* bp = g.b + p * g.b_panel_stride;
    const int64_t col = p * kNr;
    const int64_t valid = g.n - col;
    const int n_store = (valid >= kNr || (g.c_padded && g.addend == nullptr)) ? kNr : int(valid);
    for (int64_t r = 0; r < g.m; ++r) {
      const int8_t* a = g.a + r * g.lda;
      int32_t acc[kNr] = {};
      for (int64_t q = 0; q < groups; ++q) {
        const int8_t* bq = bp + q * 4 * kNr;
        const int32_t a0 = a[4 * q], a1 = a[4 * q + 1], a2 = a[4 * q + 2], a3 = a[4 * q + 3];
        for (int j = 0; j < kNr; ++j)
          acc[j] += a0 * bq[4 * j] + a1 * bq[4 * j + 1] + a2 * bq[4 * j + 2] + a3 * bq[4 * j + 3];
      }
      float* ci = g.c + r * g.ldc + col;
      const float s = g.sa[r];
      for (int j = 0; j < n_store; ++j) {
        float v = std::fma(float(acc[j]) * s, g.w_scale[col + j], g.accumulate ? ci[j] : 0.0f);
        if (g.bias != nullptr) v += g.bias[col + j];
        if (g.gelu) v = gemm::gelu1(v);
        if (g.addend != nullptr) v += g.addend[r * g.ld_addend + col + j];
        ci[j] = v;
      }
    }
  }
}

void quantize_rows_scalar(const QuantizeArgs& q) {
  for (int64_t r = 0; r < q.rows; ++r) {
    const float* x = q.x + r * q.ldx;
    int8_t* out = q.qa + r * q.lda;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t c = 0; c < q.k; ++c) {
      const float v = q.col_scale != nullptr ? x[c] * q.col_scale[c] : x[c];
      const float av = std::fabs(v);
      finite = finite && av <= FLT_MAX;  // false for ±Inf and NaN
      amax = av > amax ? av : amax;
    }
    const float inv = 127.0f / amax;
    // A row whose 127 / amax overflows (amax < 127 / FLT_MAX ~ 3.7e-37, all-zero rows included) is a zero row:
    // x · inf would make 0 · inf = NaN out of its zeros.
    const bool zero = finite && !(inv <= FLT_MAX);
    int32_t sum = 0;
    for (int64_t c = 0; c < q.k; ++c) {
      int v8 = 0;
      if (finite && !zero) {
        const float v = q.col_scale != nullptr ? x[c] * q.col_scale[c] : x[c];
        float t = std::nearbyint(v * inv);  // round half to even (the default rounding mode)
        t = t > 127.0f ? 127.0f : (t < -127.0f ? -127.0f : t);
        v8 = int(t);
      }
      out[c] = int8_t(v8);
      sum += v8;
    }
    for (int64_t c = q.k; c < (q.k + 3) / 4 * 4; ++c) out[c] = 0;
    q.sa[r] = !finite ? NAN : (zero ? 0.0f : amax / 127.0f);
    q.rowsum[r] = sum;
  }
}

}  // namespace gemm8
}  // namespace vitfast
