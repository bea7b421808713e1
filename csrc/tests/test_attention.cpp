// Attention from packed qkv (attention_head) and the row softmaxes (normalised, and the unnormalised two-pass
// one of flash attention) of every ISA path, against naive double-precision evaluations: odd token counts and
// head dims around the 6 × 16 register block and the 8/4-lane vectors, query-row blocks (the binding's thread
// split) and row chunks giving the same bits, a prefetch hint changing none, large score ranges (softmax
// stability, exp underflow), and no write outside the head's output columns.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "kernels/attention.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm.h"
#include "tests/test_util.h"

using namespace vitfast;
using namespace vitfast_test;

namespace {

void check_softmax(CpuIsa isa, std::mt19937& rng, int64_t rows, int64_t n, float spread, float scale) {
  const int64_t ld = n + 3;
  const float sentinel = -777.0f;
  std::vector<float> s = random_vector(rng, size_t(rows * ld), spread);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = n; j < ld; ++j) s[r * ld + j] = sentinel;
  const std::vector<float> in = s;
  gemm::softmax_rows(s.data(), rows, n, ld, scale, isa);
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, double(in[r * ld + j]) * scale);
    for (int64_t j = 0; j < n; ++j) sum += std::exp(double(in[r * ld + j]) * scale - mx);
    for (int64_t j = 0; j < n; ++j) {
      const double ref = std::exp(double(in[r * ld + j]) * scale - mx) / sum;
      worst = std::max(worst, std::fabs(s[r * ld + j] - ref) / (1e-6 * (1e-6 + ref)));
    }
    for (int64_t j = n; j < ld; ++j)
      VT_CHECK(s[r * ld + j] == sentinel, "[%s] softmax wrote column %lld of %lld", cpu_isa_name(isa),
               (long long)j, (long long)n);
  }
  VT_CHECK(worst <= 1.0, "[%s] softmax rows=%lld n=%lld spread=%g scale=%g: error %.3g x tolerance "
           "(1e-6 relative)", cpu_isa_name(isa), (long long)rows, (long long)n, spread, scale, worst);
}

// The unnormalised two-pass softmax (gemm::softmax_exp_rows): m = max(running max, max s·scale),
// s = exp(s·scale − m), the row sums; a running max above or below the row's own, or -inf (a fresh row).
void check_softmax_exp(CpuIsa isa, std::mt19937& rng, int64_t rows, int64_t n, float spread, float scale,
                       float init_max) {
  const int64_t ld = n + 3;
  const float sentinel = -777.0f;
  std::vector<float> s = random_vector(rng, size_t(rows * ld), spread);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = n; j < ld; ++j) s[r * ld + j] = sentinel;
  const std::vector<float> in = s;
  std::vector<float> row_max(size_t(rows), init_max), row_sum(size_t(rows), -1.0f);
  gemm::softmax_exp_rows(s.data(), rows, n, ld, scale, row_max.data(), row_sum.data(), isa);
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    double mx = init_max, sum = 0.0;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, double(float(in[r * ld + j] * scale)));
    VT_CHECK(row_max[size_t(r)] == float(mx), "[%s] softmax_exp row max %g, expected %g", cpu_isa_name(isa),
             row_max[size_t(r)], mx);
    for (int64_t j = 0; j < n; ++j) {
      const double ref = std::exp(double(in[r * ld + j]) * scale - mx);
      sum += ref;
      worst = std::max(worst, std::fabs(s[r * ld + j] - ref) / (1e-6 * (1e-6 + ref)));  // as check_softmax
    }
    worst = std::max(worst, std::fabs(row_sum[size_t(r)] - sum) / (1e-6 * sum));
    for (int64_t j = n; j < ld; ++j)
      VT_CHECK(s[r * ld + j] == sentinel, "[%s] softmax_exp wrote column %lld of %lld", cpu_isa_name(isa),
               (long long)j, (long long)n);
  }
  VT_CHECK(worst <= 1.0, "[%s] softmax_exp rows=%lld n=%lld spread=%g scale=%g init=%g: error %.3g x tolerance "
           "(1e-6 relative)", cpu_isa_name(isa), (long long)rows, (long long)n, spread, scale, init_max, worst);
}

// A NaN score poisons its row (exp gives NaN, and so does the row sum), as exp(NaN) does in torch; the other
// rows stay finite.  The SIMD exps once clamped NaN to the underflow bound first (maxps returns its second
// operand when either is NaN), so a NaN key got weight exp(-87) ≈ 0: silently dropped.  Every position of the
// row (vector body and tail lanes), both rows of an AVX-512 pair.
void test_softmax_exp_nan(CpuIsa isa) {
  const int64_t rows = 3, n = 37, ld = 40;
  for (int64_t pos = 0; pos < n; ++pos) {
    std::vector<float> s(size_t(rows * ld));
    for (size_t i = 0; i < s.size(); ++i) s[i] = 0.01f * float(i % 17);
    s[size_t(1 * ld + pos)] = std::nanf("");
    std::vector<float> row_max(size_t(rows), -INFINITY), row_sum(size_t(rows), 0.0f);
    gemm::softmax_exp_rows(s.data(), rows, n, ld, 0.5f, row_max.data(), row_sum.data(), isa);
    VT_CHECK(std::isnan(s[size_t(1 * ld + pos)]) && std::isnan(row_sum[1]),
             "[%s] softmax_exp: a NaN score at column %lld gave %g (row sum %g), expected NaN", cpu_isa_name(isa),
             (long long)pos, s[size_t(1 * ld + pos)], row_sum[1]);
    // The running max skips the NaN (std::fmax): NEON's vmaxq once returned NaN for the vector part, and the row's
    // max was then dropped for -inf (the other scores came out as exp(t) without the max subtracted).
    float want_max = -INFINITY;
    for (int64_t j = 0; j < n; ++j)
      if (j != pos) want_max = std::fmax(want_max, 0.01f * float((1 * ld + j) % 17) * 0.5f);
    VT_CHECK(row_max[1] == want_max, "[%s] softmax_exp: a NaN score at column %lld gave row max %g, expected %g",
             cpu_isa_name(isa), (long long)pos, row_max[1], want_max);
    VT_CHECK(std::isfinite(row_sum[0]) && std::isfinite(row_sum[2]),
             "[%s] softmax_exp: a NaN in row 1 reached rows 0/2 (sums %g, %g)", cpu_isa_name(isa), row_sum[0],
             row_sum[2]);
  }
}

// Returns 1; checks attention_head for every head and compares it with a double-precision evaluation.
// ld_pad: qkv's row stride beyond 3·H·D (a stride that is a multiple of 2 KiB takes the copied-Q path).
int check_attention(CpuIsa isa, std::mt19937& rng, int64_t tokens, int64_t heads, int64_t d, int64_t q_block,
                    int64_t ld_pad = 2) {
  const int64_t attn = heads * d, ld_qkv = 3 * attn + ld_pad, ld_out = attn + 3;
  std::vector<float> qkv = random_vector(rng, size_t(tokens * ld_qkv));
  const float scale = 1.0f / std::sqrt(float(d));
  const float sentinel = -777.0f;
  std::vector<float> out(size_t(tokens * ld_out), sentinel);
  gemm::AlignedFloats ws(attention_workspace_floats(tokens, d, q_block));  // the packed panels need alignment
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t q0 = 0; q0 < tokens; q0 += q_block)
      attention_head(qkv.data(), ld_qkv, tokens, heads, d, h, q0, std::min(tokens, q0 + q_block), scale,
                     out.data(), ld_out, ws.data(), isa);
  double worst = 0.0;
  std::vector<double> p(static_cast<size_t>(tokens));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < tokens; ++i) {
      double mx = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < tokens; ++j) {
        double acc = 0.0;
        for (int64_t c = 0; c < d; ++c) acc += double(qkv[i * ld_qkv + h * d + c]) * qkv[j * ld_qkv + attn + h * d + c];
        p[j] = acc * scale;
        mx = std::max(mx, p[j]);
      }
      for (int64_t j = 0; j < tokens; ++j) sum += (p[j] = std::exp(p[j] - mx));
      for (int64_t c = 0; c < d; ++c) {
        double acc = 0.0;
        for (int64_t j = 0; j < tokens; ++j) acc += p[j] / sum * qkv[j * ld_qkv + 2 * attn + h * d + c];
        worst = std::max(worst, std::fabs(out[i * ld_out + h * d + c] - acc) / (2e-5 * (1.0 + std::fabs(acc))));
      }
    }
  }
  for (int64_t i = 0; i < tokens; ++i)
    for (int64_t j = attn; j < ld_out; ++j)
      VT_CHECK(out[i * ld_out + j] == sentinel, "[%s] attention wrote column %lld of %lld", cpu_isa_name(isa),
               (long long)j, (long long)attn);
  VT_CHECK(worst <= 1.0, "[%s] attention tokens=%lld heads=%lld d=%lld q_block=%lld: error %.3g x tolerance",
           cpu_isa_name(isa), (long long)tokens, (long long)heads, (long long)d, (long long)q_block, worst);
  return 1;
}

void test_softmax(CpuIsa isa) {
  std::mt19937 rng(17);
  for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 197})
    for (float spread : {0.1f, 3.0f, 60.0f})  // 60: most terms underflow below e^-87 and must become 0
      check_softmax(isa, rng, 3, n, spread, 0.125f);
  check_softmax(isa, rng, 2, 50, 1.0f, -2.0f);  // a negative scale: the max is taken after scaling
  for (int64_t n : {1, 5, 16, 17, 33, 197})
    for (float init : {-INFINITY, -5.0f, 5.0f})  // a fresh row; a running max below / above the row's
      check_softmax_exp(isa, rng, 3, n, 3.0f, 0.5f, init);
  check_softmax_exp(isa, rng, 2, 50, 60.0f, 1.0f, -INFINITY);  // underflowing terms
  check_softmax_exp(isa, rng, 2, 50, 1.0f, -2.0f, -INFINITY);  // a negative scale
  std::printf("[%s] softmax: ok\n", cpu_isa_name(isa));
}

void test_attention(CpuIsa isa) {
  std::mt19937 rng(23);
  int count = 0;
  for (int64_t tokens : {1, 2, 5, 7, 16, 17, 33, 50})
    for (int64_t d : {1, 3, 8, 16, 17, 64})
      for (int64_t heads : {1, 3}) {
        count += check_attention(isa, rng, tokens, heads, d, tokens);
        count += check_attention(isa, rng, tokens, heads, d, 6);
      }
  count += check_attention(isa, rng, 197, 2, 64, 197);  // a ViT image (N = 197, D = 64)
  count += check_attention(isa, rng, 197, 1, 64, 102);  // the 2-thread split of it
  count += check_attention(isa, rng, 100, 2, 20, 45);   // blocks of several row chunks, split mid-chunk
  count += check_attention(isa, rng, 100, 2, 64, 100, 128);  // row stride 512 floats = 2 KiB: Q copied first
  count += check_attention(isa, rng, 61, 1, 17, 29, 512 - 51);  // ... with an odd head dim and a block split
  std::printf("[%s] attention parity: %d cases\n", cpu_isa_name(isa), count);
}

void test_query_block_split(CpuIsa isa) {
  // Query-row blocks (the binding's split between threads) give the same bits as one call.
  std::mt19937 rng(3);
  const int64_t tokens = 29, heads = 2, d = 20, attn = heads * d;
  std::vector<float> qkv = random_vector(rng, size_t(tokens * 3 * attn));
  std::vector<float> whole(size_t(tokens * attn)), split(size_t(tokens * attn));
  gemm::AlignedFloats ws(attention_workspace_floats(tokens, d, tokens));
  for (int64_t h = 0; h < heads; ++h) {
    attention_head(qkv.data(), 3 * attn, tokens, heads, d, h, 0, tokens, 0.2f, whole.data(), attn, ws.data(), isa);
    attention_head(qkv.data(), 3 * attn, tokens, heads, d, h, 0, 12, 0.2f, split.data(), attn, ws.data(), isa);
    attention_head(qkv.data(), 3 * attn, tokens, heads, d, h, 12, 12, 0.2f, split.data(), attn, ws.data(), isa);
    attention_head(qkv.data(), 3 * attn, tokens, heads, d, h, 12, tokens, 0.2f, split.data(), attn, ws.data(), isa);
  }
  check_same_bits(isa, whole, split, "query split");
  // Naming a next task (prefetched during this one, as the binding does) changes no bit.
  std::vector<float> hinted(size_t(tokens * attn));
  for (int64_t h = 0; h < heads; ++h) {
    AttentionNext next;
    next.qkv = qkv.data();
    next.out = hinted.data();
    next.h = (h + 1) % heads;
    next.q0 = 3;
    next.q1 = tokens;
    attention_head(qkv.data(), 3 * attn, tokens, heads, d, h, 0, tokens, 0.2f, hinted.data(), attn, ws.data(), isa,
                   next);
  }
  check_same_bits(isa, whole, hinted, "output with a prefetch hint");
}


// attention_head_bf16 against the plain sequence of its documented steps, bit for bit: K and V packed to bf16, each
// chunk's Q rounded, S = Q·Kᵀ (bf16 products, fp32 sums), softmax_exp_rows_bf16 with the scale (P; its own test in
// test_gemm_bf16.cpp), P·V, divided by the row sums.  Guards the fused forms (scale in the score GEMM's epilogue,
// the division as the P·V epilogue), which must not change a bit.  On this path's bf16 kernel and the scalar one.
void test_attention_bf16_steps(CpuIsa isa) {
  std::mt19937 rng(31);
  std::vector<gemm16::Bf16Kernel> kernels = {gemm16::Bf16Kernel::kScalar};
  if (gemm16::bf16_kernel(isa) != gemm16::Bf16Kernel::kScalar) kernels.push_back(gemm16::bf16_kernel(isa));
  int count = 0;
  for (gemm16::Bf16Kernel kernel : kernels)
    for (int64_t tokens : {1, 17, 50, 197})
      for (int64_t d : {8, 17, 64}) {
        const int64_t heads = 2, attn = heads * d, ld = 3 * attn, q0 = tokens > 5 ? 3 : 0;
        const float scale = 1.0f / std::sqrt(float(d));
        std::vector<float> qkv = random_vector(rng, size_t(tokens * ld), 2.0f);
        std::vector<float> got(size_t(tokens * attn), 0.0f), want(size_t(tokens * attn), 0.0f);
        gemm::AlignedFloats ws(attention_workspace_floats_bf16(tokens, d, tokens));
        const int64_t ld_s = (tokens + 15) / 16 * 16, ld_q = gemm16::padded_k(d);
        gemm16::AlignedBf16 kp(gemm16::packed_bf16(tokens, d)), vp(gemm16::packed_bf16(d, tokens));
        std::vector<uint16_t> q16(size_t(tokens * ld_q)), p16(size_t(tokens * gemm16::padded_k(tokens)));
        std::vector<float> s(size_t(tokens * ld_s)), mx(static_cast<size_t>(tokens)), sum(static_cast<size_t>(tokens));
        gemm::Epilogue padded;
        padded.c_padded = true;
        for (int64_t h = 0; h < heads; ++h) {
          attention_head_bf16(qkv.data(), ld, tokens, heads, d, h, q0, tokens, scale, got.data(), attn, ws.data(), isa,
                              kernel);
          const int64_t m = tokens - q0;
          gemm16::pack_b_transposed_bf16(qkv.data() + attn + h * d, tokens, d, ld, kp.data(), kernel);
          gemm16::pack_b_bf16(qkv.data() + 2 * attn + h * d, tokens, d, ld, vp.data(), kernel);
          gemm16::convert_rows(qkv.data() + q0 * ld + h * d, ld, m, d, q16.data(), ld_q, kernel);
          gemm16::gemm_bf16_raw(m, q16.data(), ld_q, kp.data(), tokens, d, s.data(), ld_s, padded, kernel);
          for (int64_t i = 0; i < m; ++i) mx[i] = -INFINITY;
          gemm16::softmax_exp_rows_bf16(s.data(), m, tokens, ld_s, scale, mx.data(), sum.data(), p16.data(),
                                        gemm16::padded_k(tokens), isa, kernel);
          float* o = want.data() + q0 * attn + h * d;
          gemm16::gemm_bf16_raw(m, p16.data(), gemm16::padded_k(tokens), vp.data(), d, tokens, o, attn,
                                gemm::Epilogue(), kernel);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < d; ++j) o[i * attn + j] *= 1.0f / sum[i];
        }
        check_same_bits(isa, want, got, "attention_head_bf16 vs its steps");
        ++count;
        if (d % 2 != 0) continue;
        // The entry on a qkv already rounded to bf16 gives the same bits: at the packed row stride (Q read in
        // place) and at a stride of 2 KiB (Q's rows copied side by side first).
        for (int64_t ld16 : {ld, int64_t(1024)}) {
          std::vector<uint16_t> qkv16(size_t(tokens * ld16), 0x7fc1);
          for (int64_t t = 0; t < tokens; ++t)
            for (int64_t j = 0; j < ld; ++j) qkv16[t * ld16 + j] = gemm16::to_bf16(qkv[t * ld + j]);
          std::vector<float> got16(size_t(tokens * attn), 0.0f);
          for (int64_t h = 0; h < heads; ++h)
            attention_head_bf16(qkv16.data(), ld16, tokens, heads, d, h, q0, tokens, scale, got16.data(), attn,
                                ws.data(), isa, kernel);
          check_same_bits(isa, want, got16, "attention_head_bf16 on a bf16 qkv vs its steps");
          ++count;
        }
      }
  std::printf("[%s] attention_head_bf16 = its steps: %d cases\n", cpu_isa_name(isa), count);
}

// The head on strided operands (HeadOperands: Q, K, V with their own row strides, dk != dv, as the non-deep heads
// read them) against the same plain sequence of steps, bit for bit; and pack + rows in two query blocks (the bf16
// xwx_attention's use: keys packed once per head, rows per task, bf16 output) against the rounded one-call output.
void test_attention_bf16_operands(CpuIsa isa) {
  std::mt19937 rng(37);
  std::vector<gemm16::Bf16Kernel> kernels = {gemm16::Bf16Kernel::kScalar};
  if (gemm16::bf16_kernel(isa) != gemm16::Bf16Kernel::kScalar) kernels.push_back(gemm16::bf16_kernel(isa));
  int count = 0;
  for (gemm16::Bf16Kernel kernel : kernels)
    for (int64_t tokens : {1, 17, 197})
      for (auto dims : {std::pair<int64_t, int64_t>{129, 128}, {9, 20}, {24, 24}}) {
        const int64_t dk = dims.first, dv = dims.second, ldq = dk + 3, ldk = dk + 5, ldv = dv + 7;
        std::vector<float> q = random_vector(rng, size_t(tokens * ldq), 2.0f),
                           k = random_vector(rng, size_t(tokens * ldk), 2.0f),
                           v = random_vector(rng, size_t(tokens * ldv), 2.0f);
        HeadOperands o;
        o.q = q.data(), o.k = k.data(), o.v = v.data(), o.ldq = ldq, o.ldk = ldk, o.ldv = ldv, o.dk = dk, o.dv = dv;
        const float scale = 0.3f;
        std::vector<float> got(size_t(tokens * dv), 0.0f), want(size_t(tokens * dv), 0.0f);
        gemm::AlignedFloats ws(attention_workspace_floats_bf16(tokens, dk, dv, tokens));
        attention_head_bf16(o, tokens, 0, tokens, scale, got.data(), dv, ws.data(), isa, kernel);
        // the steps
        const int64_t ld_s = (tokens + 15) / 16 * 16, ld_q = gemm16::padded_k(dk);
        gemm16::AlignedBf16 kp(gemm16::packed_bf16(tokens, dk)), vp(gemm16::packed_bf16(dv, tokens));
        std::vector<uint16_t> q16(size_t(tokens * ld_q)), p16(size_t(tokens * gemm16::padded_k(tokens)));
        std::vector<float> s(size_t(tokens * ld_s)), mx(static_cast<size_t>(tokens)), sum(static_cast<size_t>(tokens));
        gemm::Epilogue padded;
        padded.c_padded = true;
        gemm16::pack_b_transposed_bf16(k.data(), tokens, dk, ldk, kp.data(), kernel);
        gemm16::pack_b_bf16(v.data(), tokens, dv, ldv, vp.data(), kernel);
        gemm16::convert_rows(q.data(), ldq, tokens, dk, q16.data(), ld_q, kernel);
        gemm16::gemm_bf16_raw(tokens, q16.data(), ld_q, kp.data(), tokens, dk, s.data(), ld_s, padded, kernel);
        for (int64_t i = 0; i < tokens; ++i) mx[i] = -INFINITY;
        gemm16::softmax_exp_rows_bf16(s.data(), tokens, tokens, ld_s, scale, mx.data(), sum.data(), p16.data(),
                                      gemm16::padded_k(tokens), isa, kernel);
        gemm16::gemm_bf16_raw(tokens, p16.data(), gemm16::padded_k(tokens), vp.data(), dv, tokens, want.data(), dv,
                              gemm::Epilogue(), kernel);
        for (int64_t i = 0; i < tokens; ++i)
          for (int64_t j = 0; j < dv; ++j) want[i * dv + j] *= 1.0f / sum[i];
        check_same_bits(isa, want, got, "attention_head_bf16 on strided operands vs its steps");
        // pack once, rows in two blocks, bf16 output: the one call's output rounded to bf16
        gemm::AlignedFloats packed(attention_packed_floats_bf16(tokens, dk, dv));
        gemm::AlignedFloats rows_ws(attention_rows_workspace_floats_bf16(tokens, dk, tokens));
        attention_pack_bf16(o, tokens, packed.data(), kernel);
        std::vector<uint16_t> out16(size_t(tokens * dv));
        const int64_t split = tokens / 2;
        attention_rows_bf16(o, packed.data(), tokens, 0, split, scale, nullptr, 0, out16.data(), dv, rows_ws.data(),
                            isa, kernel);
        attention_rows_bf16(o, packed.data(), tokens, split, tokens, scale, nullptr, 0, out16.data() + split * dv, dv,
                            rows_ws.data(), isa, kernel);
        std::vector<uint16_t> rounded(size_t(tokens * dv));
        gemm16::convert_rows(got.data(), dv, tokens, dv, rounded.data(), dv, kernel);
        bool same = rounded == out16;
        VT_CHECK(same, "[%s] attention_rows_bf16 tokens=%lld dk=%lld dv=%lld: bf16 rows differ from the one call's",
                 cpu_isa_name(isa), (long long)tokens, (long long)dk, (long long)dv);
        ++count;
      }
  std::printf("[%s] attention_head_bf16 on strided operands: %d cases\n", cpu_isa_name(isa), count);
}

}  // namespace

int main() {
  return run_on_every_isa("test_attention", test_softmax, test_softmax_exp_nan, test_attention, test_query_block_split,
                          test_attention_bf16_steps, test_attention_bf16_operands);
}
