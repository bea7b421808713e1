// Collapsed non-deep attention (xwx_attention) on every ISA path against a naive double-precision evaluation:
// factored and full score forms, with and without key bias / output bias / residual, token counts around the
// 256-key tile of the online softmax and the 6 × 16 register block, an output width different from C, large
// score ranges (online rescaling), query-row blocks (the binding's thread split) giving the same bits as one
// call, and no write outside the output columns.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/xwx_attention.h"
#include "tests/test_util.h"

using namespace vitfast;
using namespace vitfast_test;

namespace {

struct Case {
  int64_t tokens, channels, heads, rank, value_dim, out_channels;  // rank 0 = full form
  bool key_bias, b_o, residual;
  float score_scale;
};

struct Args {
  XwxShape shape;
  std::vector<float> x, w_q, w_k, kb, w_v, w_o, b_o, res;
};

Args make_args(std::mt19937& rng, const Case& c) {
  Args a;
  const bool full = c.rank == 0;
  a.shape.heads = c.heads;
  a.shape.channels = c.channels;
  a.shape.rank = full ? c.channels : c.rank;
  a.shape.value_dim = c.value_dim;
  a.shape.out_channels = c.out_channels;
  a.shape.full = full;
  a.shape.key_bias = c.key_bias;
  const float wscale = c.score_scale / std::sqrt(float(c.channels));
  a.x = random_vector(rng, size_t(c.tokens * c.channels));
  a.w_q = random_vector(rng, size_t(c.heads * c.channels * a.shape.rank), wscale / std::sqrt(float(a.shape.rank)) * 2);
  if (!full) a.w_k = random_vector(rng, size_t(c.heads * c.channels * c.rank), 1.0f / std::sqrt(float(c.channels)));
  if (c.key_bias) a.kb = random_vector(rng, size_t(c.heads * c.channels), 0.3f);
  a.w_v = random_vector(rng, size_t(c.heads * c.channels * c.value_dim), 1.0f / std::sqrt(float(c.channels)));
  a.w_o = random_vector(rng, size_t(c.heads * c.value_dim * c.out_channels), 1.0f / std::sqrt(float(c.value_dim)));
  if (c.b_o) a.b_o = random_vector(rng, size_t(c.out_channels));
  if (c.residual) a.res = random_vector(rng, size_t(c.tokens * c.out_channels));
  return a;
}

const float* ptr(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

// out [tokens × C_out] in double, straight from the definition.
std::vector<double> naive(const Args& a, int64_t tokens) {
  const XwxShape& s = a.shape;
  const int64_t C = s.channels, R = s.rank, D = s.value_dim, CO = s.out_channels;
  std::vector<double> out(size_t(tokens * CO), 0.0);
  for (int64_t i = 0; i < tokens; ++i)
    for (int64_t co = 0; co < CO; ++co)
      out[size_t(i * CO + co)] = (a.b_o.empty() ? 0.0 : a.b_o[co]) + (a.res.empty() ? 0.0 : a.res[i * CO + co]);
  std::vector<double> left(static_cast<size_t>(tokens * R)), right(static_cast<size_t>(tokens * R));
  std::vector<double> kb(static_cast<size_t>(tokens), 0.0), v(static_cast<size_t>(tokens * D));
  std::vector<double> p(static_cast<size_t>(tokens));
  for (int64_t h = 0; h < s.heads; ++h) {
    for (int64_t j = 0; j < tokens; ++j) {
      for (int64_t r = 0; r < R; ++r) {
        double l = 0.0, rr = 0.0;
        for (int64_t c = 0; c < C; ++c) {
          l += double(a.x[j * C + c]) * a.w_q[(h * C + c) * R + r];
          rr += s.full ? (c == r ? double(a.x[j * C + c]) : 0.0) : double(a.x[j * C + c]) * a.w_k[(h * C + c) * R + r];
        }
        left[size_t(j * R + r)] = l;
        right[size_t(j * R + r)] = rr;
      }
      if (s.key_bias) {
        double b = 0.0;
        for (int64_t c = 0; c < C; ++c) b += double(a.x[j * C + c]) * a.kb[h * C + c];
        kb[size_t(j)] = b;
      }
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0.0;
        for (int64_t c = 0; c < C; ++c) acc += double(a.x[j * C + c]) * a.w_v[(h * C + c) * D + d];
        v[size_t(j * D + d)] = acc;
      }
    }
    for (int64_t i = 0; i < tokens; ++i) {
      double mx = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j < tokens; ++j) {
        double sc = kb[size_t(j)];
        for (int64_t r = 0; r < R; ++r) sc += left[size_t(i * R + r)] * right[size_t(j * R + r)];
        p[size_t(j)] = sc;
        mx = std::max(mx, sc);
      }
      for (int64_t j = 0; j < tokens; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
      for (int64_t d = 0; d < D; ++d) {
        double head = 0.0;
        for (int64_t j = 0; j < tokens; ++j) head += p[size_t(j)] / sum * v[size_t(j * D + d)];
        for (int64_t co = 0; co < CO; ++co) out[size_t(i * CO + co)] += head * a.w_o[(h * D + d) * CO + co];
      }
    }
  }
  return out;
}

int check_case(CpuIsa isa, std::mt19937& rng, const Case& c) {
  const Args a = make_args(rng, c);
  const XwxPacked w = xwx_pack(a.shape, a.w_q.data(), ptr(a.w_k), ptr(a.kb), a.w_v.data(), a.w_o.data(), ptr(a.b_o));
  const int64_t CO = c.out_channels, ldo = CO + 3;
  const float sentinel = -777.0f;
  std::vector<float> out(size_t(c.tokens * ldo), sentinel);
  xwx_attention_image(w, c.tokens, a.x.data(), c.channels, ptr(a.res), CO, out.data(), ldo, isa);
  const std::vector<double> ref = naive(a, c.tokens);
  double worst = 0.0, scale = 1.0;
  for (double r : ref) scale = std::max(scale, std::fabs(r));
  for (int64_t i = 0; i < c.tokens; ++i) {
    for (int64_t co = 0; co < CO; ++co)
      worst = std::max(worst, std::fabs(out[size_t(i * ldo + co)] - ref[size_t(i * CO + co)]) / (3e-5 * scale));
    for (int64_t co = CO; co < ldo; ++co)
      VT_CHECK(out[size_t(i * ldo + co)] == sentinel, "[%s] xwx wrote column %lld of %lld", cpu_isa_name(isa),
               (long long)co, (long long)CO);
  }
  VT_CHECK(worst <= 1.0, "[%s] xwx tokens=%lld C=%lld H=%lld R=%lld D=%lld C_out=%lld kb=%d bo=%d res=%d "
           "scale=%g: error %.3g x tolerance (3e-5 of the output scale)", cpu_isa_name(isa), (long long)c.tokens,
           (long long)c.channels, (long long)c.heads, (long long)c.rank, (long long)c.value_dim, (long long)CO,
           int(c.key_bias), int(c.b_o), int(c.residual), c.score_scale, worst);
  return 1;
}

void test_parity(CpuIsa isa) {
  std::mt19937 rng(5);
  int count = 0;
  for (int64_t tokens : {1, 2, 7, 17, 65, 127, 128, 129, 255, 256, 257})
    for (int64_t rank : {0, 3, 16})
      for (int flags = 0; flags < 8; flags += (tokens > 17 ? 7 : 1))
        count += check_case(isa, rng, {tokens, 24, 2, rank, 20, 24, bool(flags & 1), bool(flags & 2),
                                       bool(flags & 4), 1.0f});
  count += check_case(isa, rng, {33, 16, 3, 5, 7, 40, true, true, true, 1.0f});    // C_out != C, odd everything
  count += check_case(isa, rng, {150, 16, 1, 8, 16, 16, true, false, true, 30.0f});  // scores of ±hundreds
  count += check_case(isa, rng, {600, 16, 1, 8, 16, 16, true, false, true, 30.0f});  // ... over 3 key tiles
  count += check_case(isa, rng, {197, 64, 2, 32, 32, 64, true, true, true, 1.0f});   // a ViT image (N = 197)
  std::printf("[%s] xwx_attention parity: %d cases\n", cpu_isa_name(isa), count);
}

void test_query_split(CpuIsa isa) {
  // Query-row blocks (the binding's split between threads) give the same bits as one call over all rows.
  std::mt19937 rng(9);
  const Case c{70, 24, 2, 8, 12, 24, true, true, true, 1.0f};
  const Args a = make_args(rng, c);
  const XwxPacked w = xwx_pack(a.shape, a.w_q.data(), ptr(a.w_k), ptr(a.kb), a.w_v.data(), a.w_o.data(), ptr(a.b_o));
  const int64_t ldp = w.proj_cols(), per_head = xwx_keys_floats(w, c.tokens);
  gemm::AlignedFloats proj(c.tokens * ldp), keys(w.shape.heads * per_head);
  gemm::AlignedFloats scratch(std::max<int64_t>(1, xwx_pack_scratch_floats(w, c.tokens)));
  gemm::AlignedFloats ws(xwx_rows_workspace_floats(w, c.tokens));
  xwx_project(w, c.tokens, a.x.data(), c.channels, proj.data(), ldp, isa);
  for (int64_t h = 0; h < w.shape.heads; ++h)
    xwx_pack_keys(w, c.tokens, proj.data(), ldp, a.x.data(), c.channels, h, keys.data() + h * per_head, scratch.data());
  std::vector<float> whole(size_t(c.tokens * c.out_channels)), split(whole.size());
  xwx_attention_rows(w, c.tokens, proj.data(), ldp, keys.data(), 0, c.tokens, a.res.data(), c.out_channels,
                     whole.data(), c.out_channels, ws.data(), isa);
  for (int64_t q0 : {0, 12, 12, 36, 66}) {
    const int64_t q1 = q0 == 0 ? 12 : q0 == 12 ? 36 : q0 == 36 ? 66 : 70;
    xwx_attention_rows(w, c.tokens, proj.data(), ldp, keys.data(), q0, q1, a.res.data(), c.out_channels,
                       split.data(), c.out_channels, ws.data(), isa);
  }
  check_same_bits(isa, whole, split, "xwx query split");
}

}  // namespace

int main() { return run_on_every_isa("test_xwx_attention", test_parity, test_query_split); }
