// attention_int8_head (kernels/attention_int8.h) on every ISA path this CPU runs, NEON's `sdot` kernels included when
// the suite runs under qemu: against fp64 attention within the int8 error budget, against the scalar path (the same
// quantized codes and exact integer products: only the fp32 order of the epilogues and the exp's last ulps differ,
// which can move a P code by one), query-block splits with the bits of one call, and NaN propagation.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>
#include <random>
#include <vector>

#include "kernels/attention_int8.h"
#include "kernels/gemm_int8_isa.h"
#include "tests/test_util.h"

using namespace vitfast;
using namespace vitfast_test;

namespace {

// softmax(Q_h K_hᵀ · scale) V_h in double, rows [q0, q1) of every head.
std::vector<double> attention_ref(const std::vector<float>& qkv, int64_t tokens, int64_t heads, int64_t d, float scale) {
  const int64_t attn = heads * d, ld = 3 * attn;
  std::vector<double> out(size_t(tokens * attn), 0.0), p(static_cast<size_t>(tokens));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < tokens; ++i) {
      double mx = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < tokens; ++j) {
        double s = 0.0;
        for (int64_t c = 0; c < d; ++c) s += double(qkv[i * ld + h * d + c]) * qkv[j * ld + attn + h * d + c];
        p[j] = s * scale;
        mx = std::max(mx, p[j]);
      }
      for (int64_t j = 0; j < tokens; ++j) sum += (p[j] = std::exp(p[j] - mx));
      for (int64_t j = 0; j < tokens; ++j)
        for (int64_t c = 0; c < d; ++c) out[i * attn + h * d + c] += p[j] / sum * qkv[j * ld + 2 * attn + h * d + c];
    }
  return out;
}

std::vector<float> run(CpuIsa isa, const std::vector<float>& qkv, int64_t tokens, int64_t heads, int64_t d,
                       float scale, int64_t split) {
  const int64_t attn = heads * d;
  std::vector<float> out(size_t(tokens * attn), -1.0f);
  AttentionInt8Workspace ws;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t q0 = 0; q0 < tokens; q0 += split)
      attention_int8_head(qkv.data(), 3 * attn, tokens, heads, d, h, q0, std::min(tokens, q0 + split), scale,
                          out.data(), attn, ws, isa);
  return out;
}

double rel_norm(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

void test_attention_int8(CpuIsa isa) {
  std::mt19937 rng(17);
  int count = 0;
  double worst_ref = 0.0, worst_scalar = 0.0;
  for (int64_t tokens : {1, 5, 17, 50, 197})
    for (int64_t d : {8, 17, 64}) {
      const int64_t heads = 2, attn = heads * d;
      const float scale = 1.0f / std::sqrt(float(d));
      std::vector<float> qkv = random_vector(rng, size_t(tokens * 3 * attn));
      const std::vector<float> got = run(isa, qkv, tokens, heads, d, scale, tokens);
      const std::vector<double> want = attention_ref(qkv, tokens, heads, d, scale);
      const double e_ref = rel_norm(got, want);
      // The int8 budget: Q, K and V codes (~0.1-0.3% each) and P's 7-bit codes; random N(0, 1) qkv: 1.9% at worst.
      VT_CHECK(e_ref < 0.03, "[%s] attention_int8 tokens=%lld d=%lld: %.3g relative error against fp64",
               cpu_isa_name(isa), (long long)tokens, (long long)d, e_ref);
      worst_ref = std::max(worst_ref, e_ref);
      if (isa != CpuIsa::kScalar) {
        const std::vector<float> scalar = run(CpuIsa::kScalar, qkv, tokens, heads, d, scale, tokens);
        std::vector<double> s64(scalar.begin(), scalar.end());
        const double e_s = rel_norm(got, s64);
        VT_CHECK(e_s < 2e-3, "[%s] attention_int8 tokens=%lld d=%lld: %.3g relative difference from the scalar path",
                 cpu_isa_name(isa), (long long)tokens, (long long)d, e_s);
        worst_scalar = std::max(worst_scalar, e_s);
      }
      if (tokens > 14) {  // query blocks (the binding's thread split) give the bits of one call
        const std::vector<float> split = run(isa, qkv, tokens, heads, d, scale, 14);
        check_same_bits(isa, got, split, "attention_int8 query split");
      }
      ++count;
    }
  {  // A NaN in one query row: that row's output is NaN, the others finite.
    const int64_t tokens = 17, heads = 1, d = 16, attn = heads * d;
    std::vector<float> qkv = random_vector(rng, size_t(tokens * 3 * attn));
    qkv[3 * (3 * attn) + 2] = std::numeric_limits<float>::quiet_NaN();  // row 3's Q
    const std::vector<float> got = run(isa, qkv, tokens, heads, d, 0.25f, tokens);
    bool ok = true;
    for (int64_t i = 0; i < tokens; ++i)
      for (int64_t c = 0; c < d; ++c) ok = ok && (i == 3 ? std::isnan(got[i * attn + c]) : std::isfinite(got[i * attn + c]));
    VT_CHECK(ok, "[%s] attention_int8: a NaN in query row 3 must make exactly that output row NaN", cpu_isa_name(isa));
  }
  std::printf("[%s] attention_int8: %d cases, worst %.3g vs fp64, %.3g vs the scalar path\n", cpu_isa_name(isa), count,
              worst_ref, worst_scalar);
}

// The head on strided operands (HeadOperands: Q, K, V in separate row-major blocks with their own row strides,
// dk != dv, as xwx_heads_int8 reads a non-deep projection): against fp64 within the int8 budget, against the scalar
// path, and the same bits as the packed-qkv entry where dk = dv.
void test_attention_int8_operands(CpuIsa isa) {
  std::mt19937 rng(23);
  int count = 0;
  for (int64_t tokens : {1, 17, 197})
    for (auto dims : {std::pair<int64_t, int64_t>{129, 128}, {9, 20}, {65, 64}, {24, 24}}) {
      const int64_t dk = dims.first, dv = dims.second, ldq = dk + 3, ldk = dk + 7, ldv = dv + 5;
      std::vector<float> q = random_vector(rng, size_t(tokens * ldq)), k = random_vector(rng, size_t(tokens * ldk)),
                         v = random_vector(rng, size_t(tokens * ldv));
      const float scale = 1.0f / std::sqrt(float(dk));
      auto run_ops = [&](CpuIsa which) {
        HeadOperands o;
        o.q = q.data(), o.k = k.data(), o.v = v.data(), o.ldq = ldq, o.ldk = ldk, o.ldv = ldv, o.dk = dk, o.dv = dv;
        std::vector<float> out(size_t(tokens * (dv + 2)), -1.0f);
        AttentionInt8Workspace ws;
        attention_int8_head(o, tokens, 0, tokens, scale, out.data() + 1, dv + 2, ws, which);
        return out;
      };
      const std::vector<float> got = run_ops(isa);
      std::vector<double> want(got.size());
      std::vector<double> p(static_cast<size_t>(tokens));
      for (int64_t i = 0; i < tokens; ++i) {
        want[size_t(i * (dv + 2))] = -1.0, want[size_t(i * (dv + 2) + dv + 1)] = -1.0;  // untouched columns
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < tokens; ++j) {
          double s = 0.0;
          for (int64_t c = 0; c < dk; ++c) s += double(q[size_t(i * ldq + c)]) * k[size_t(j * ldk + c)];
          mx = std::max(mx, p[size_t(j)] = s * scale);
        }
        for (int64_t j = 0; j < tokens; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
        for (int64_t c = 0; c < dv; ++c) {
          double acc = 0.0;
          for (int64_t j = 0; j < tokens; ++j) acc += p[size_t(j)] / sum * v[size_t(j * ldv + c)];
          want[size_t(i * (dv + 2) + 1 + c)] = acc;
        }
      }
      const double e_ref = rel_norm(got, want);
      VT_CHECK(e_ref < 0.03, "[%s] attention_int8 operands tokens=%lld dk=%lld dv=%lld: %.3g relative error vs fp64",
               cpu_isa_name(isa), (long long)tokens, (long long)dk, (long long)dv, e_ref);
      if (isa != CpuIsa::kScalar) {
        const std::vector<float> scalar = run_ops(CpuIsa::kScalar);
        const double e_s = rel_norm(got, std::vector<double>(scalar.begin(), scalar.end()));
        VT_CHECK(e_s < 2e-3, "[%s] attention_int8 operands tokens=%lld dk=%lld dv=%lld: %.3g from the scalar path",
                 cpu_isa_name(isa), (long long)tokens, (long long)dk, (long long)dv, e_s);
      }
      if (dk == dv) {  // packed qkv rows [q | k | v] with one stride: the qkv entry's bits
        const int64_t ld = 3 * dk;
        std::vector<float> qkv(size_t(tokens * ld));
        for (int64_t t = 0; t < tokens; ++t)
          for (int64_t c = 0; c < dk; ++c) {
            qkv[size_t(t * ld + c)] = q[size_t(t * ldq + c)];
            qkv[size_t(t * ld + dk + c)] = k[size_t(t * ldk + c)];
            qkv[size_t(t * ld + 2 * dk + c)] = v[size_t(t * ldv + c)];
          }
        std::vector<float> packed(size_t(tokens * dv));
        AttentionInt8Workspace ws;
        attention_int8_head(qkv.data(), ld, tokens, 1, dk, 0, 0, tokens, scale, packed.data(), dv, ws, isa);
        std::vector<float> strided(size_t(tokens * dv));
        for (int64_t t = 0; t < tokens; ++t)
          std::copy(got.begin() + t * (dv + 2) + 1, got.begin() + t * (dv + 2) + 1 + dv, strided.begin() + t * dv);
        check_same_bits(isa, strided, packed, "attention_int8 operands vs packed qkv");
      }
      ++count;
    }
  std::printf("[%s] attention_int8 on strided operands: %d cases\n", cpu_isa_name(isa), count);
}

#if defined(__x86_64__)
// The AVX-512 V statistics and pack against their definitions (gemm_int8_isa.h), written here element by element:
// every code bit for bit, at head widths with partial panels, token counts with and without a partial group, both
// offsets (s8 and the VNNI kernel's u8 form), a NaN column, a zero column and a kept-back (keep = 0) column.
void test_v_pack_avx512(CpuIsa isa) {
  if (isa != CpuIsa::kAvx512) return;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  int cases = 0;
  for (int64_t d : {int64_t(64), int64_t(40), int64_t(80), int64_t(7)})
    for (int64_t tokens : {int64_t(197), int64_t(16), int64_t(3)})
      for (int32_t offset : {0, 128}) {
        const int64_t ld = 3 * d + 5, panels = (d + 15) / 16, d16 = panels * 16, k4 = (tokens + 3) / 4 * 4;
        std::vector<float> v(size_t(tokens * ld));
        for (float& x : v) x = nd(rng);
        for (int64_t t = 0; t < tokens; ++t) {
          if (d > 2) v[size_t(t * ld + 1)] = 0.0f;                   // a zero column
          if (d > 3 && t == tokens / 2) v[size_t(t * ld + 2)] = NAN;  // a NaN in column 2
        }
        std::vector<float> amax(size_t(d16), 0.0f), chk(size_t(d16), 0.0f), ref_amax(amax), ref_chk(chk);
        gemm8::attention_v_columns_avx512(v.data(), ld, tokens, d, amax.data(), chk.data());
        for (int64_t t = 0; t < tokens; ++t)
          for (int64_t j = 0; j < d; ++j) {
            const float x = v[size_t(t * ld + j)], ax = std::fabs(x);
            ref_amax[size_t(j)] = ax > ref_amax[size_t(j)] ? ax : ref_amax[size_t(j)];
            ref_chk[size_t(j)] += x * 0.0f;
          }
        for (int64_t j = 0; j < d16; ++j) {
          VT_CHECK(amax[size_t(j)] == ref_amax[size_t(j)], "v_columns d=%lld: amax[%lld] %g, expected %g",
                   (long long)d, (long long)j, amax[size_t(j)], ref_amax[size_t(j)]);
          VT_CHECK(std::isnan(chk[size_t(j)]) == std::isnan(ref_chk[size_t(j)]), "v_columns d=%lld: chk[%lld]",
                   (long long)d, (long long)j);
        }
        std::vector<float> inv(size_t(d16), 0.0f);
        std::vector<int32_t> keep(size_t(d16), 0);
        for (int64_t j = 0; j < d; ++j) {
          const bool bad = std::isnan(chk[size_t(j)]) || amax[size_t(j)] == 0.0f || j == d - 1;  // last: kept back
          inv[size_t(j)] = bad && !std::isnan(chk[size_t(j)]) ? 0.0f : 127.0f / amax[size_t(j)];
          keep[size_t(j)] = bad ? 0 : -1;
        }
        const int64_t group_bytes = 64, panel_stride = k4 / 4 * group_bytes + 64;
        std::vector<int8_t> got(size_t(panels * panel_stride), 0x55), want(got);
        gemm8::attention_v_pack_avx512(v.data(), ld, tokens, d, k4, panels, panel_stride, group_bytes, offset,
                                       inv.data(), keep.data(), got.data());
        for (int64_t p = 0; p < panels; ++p)
          for (int64_t t = 0; t < k4; ++t)
            for (int64_t c = 0; c < 16; ++c) {
              const int64_t j = p * 16 + c;
              int32_t code = offset;
              if (t < tokens && j < d) {
                float q = std::nearbyint(v[size_t(t * ld + j)] * inv[size_t(j)]);
                q = -127.0f < q ? q : -127.0f;
                q = q < 127.0f ? q : 127.0f;
                code = (int32_t(q) & keep[size_t(j)]) + offset;
              }
              want[size_t(p * panel_stride + t / 4 * group_bytes + c * 4 + t % 4)] = int8_t(uint8_t(code & 255));
            }
        for (size_t i = 0; i < got.size(); ++i)
          VT_CHECK(got[i] == want[i], "v_pack d=%lld tokens=%lld offset=%d: byte %zu is %d, expected %d",
                   (long long)d, (long long)tokens, offset, i, int(got[i]), int(want[i]));
        ++cases;
      }
  std::printf("[avx512] attention V columns and pack: %d cases bit for bit\n", cases);
}

// attention_int8's K panels (gemm_int8_isa.h: row t's word w at (t / 16) · panel_stride + w · 64 + (t % 16) · 4,
// XORed with flip; a partial last panel's missing rows = flip): the AVX2 and AVX-512 register transposes against
// the word-by-word definition, bit for bit, with ragged rows and words.
void test_k_pack_x86(CpuIsa isa) {
  if (isa != CpuIsa::kAvx2) return;  // once; each transpose where the CPU runs it
  std::mt19937 rng(11);
  int cases = 0;
  for (int64_t rows : {int64_t(1), int64_t(7), int64_t(8), int64_t(9), int64_t(16), int64_t(17), int64_t(197)})
    for (int64_t words : {int64_t(1), int64_t(5), int64_t(8), int64_t(9), int64_t(16), int64_t(20)})
      for (uint32_t flip : {0u, 0x80808080u}) {
        const int64_t ld = 4 * words + 12, panels = (rows + 15) / 16, stride = words * 64 + 64;
        std::vector<int8_t> src(size_t(rows * ld));
        for (int8_t& b : src) b = int8_t(int(rng() % 255) - 127);
        std::vector<int8_t> want(size_t(panels * stride), int8_t(0x5a));
        for (int64_t t = 0; t < panels * 16; ++t)
          for (int64_t w = 0; w < words; ++w) {
            uint32_t v = flip;
            if (t < rows) {
              std::memcpy(&v, src.data() + t * ld + 4 * w, 4);
              v ^= flip;
            }
            std::memcpy(want.data() + (t / 16) * stride + w * 64 + (t % 16) * 4, &v, 4);
          }
        std::vector<int8_t> got(want.size(), int8_t(0x5a));
        gemm8::pack_words_transposed_avx2(src.data(), ld, rows, words, flip, got.data(), stride);
        VT_CHECK(got == want, "pack_words_transposed_avx2 rows=%lld words=%lld flip=%x differs", (long long)rows,
                 (long long)words, flip);
        if (cpu_supports(CpuIsa::kAvx512)) {
          std::fill(got.begin(), got.end(), int8_t(0x5a));
          gemm8::pack_words_transposed_avx512(src.data(), ld, rows, words, flip, got.data(), stride);
          VT_CHECK(got == want, "pack_words_transposed_avx512 rows=%lld words=%lld flip=%x differs", (long long)rows,
                   (long long)words, flip);
        }
        ++cases;
      }
  std::printf("[x86] attention K panels: %d cases bit for bit\n", cases);
}
#else
void test_v_pack_avx512(CpuIsa) {}
void test_k_pack_x86(CpuIsa) {}
#endif

}  // namespace

// On the AVX-512 path, where the CPU has AMX-INT8, once more on the VNNI kernel: its K/V panels are the u8 form.
// On the AVX2 path, where the CPU has AVX-VNNI (u8 panels), once more on the plain AVX2 kernel (|qw| halves).
void test_attention_int8_kernels(CpuIsa isa) {
  test_attention_int8(isa);
  test_attention_int8_operands(isa);
  if (isa == CpuIsa::kAvx512 && cpu_has(CpuExt::kAmxInt8) && set_cpu_ext_enabled(CpuExt::kAmxInt8, false)) {
    test_attention_int8(isa);
    set_cpu_ext_enabled(CpuExt::kAmxInt8, true);
  }
  if (isa == CpuIsa::kAvx2 && cpu_has(CpuExt::kAvxVnni) && set_cpu_ext_enabled(CpuExt::kAvxVnni, false)) {
    test_attention_int8(isa);
    test_attention_int8_operands(isa);
    set_cpu_ext_enabled(CpuExt::kAvxVnni, true);
  }
}

int main() {
  return run_on_every_isa("test_attention_int8", test_attention_int8_kernels, test_v_pack_avx512, test_k_pack_x86);
}
