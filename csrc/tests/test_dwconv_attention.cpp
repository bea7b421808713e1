// The fused dwconv_attention kernel of every ISA path against a naive double-precision evaluation of
// dropin-depthwise-conv-attention eq. 11 with the value / output projections: square and non-square grids, one
// row / one column, k = 1, 3, 5, several bands per image (small token tiles) and K blocks, row ranges split
// between callers (as the binding does per thread), with and without each optional input and prefix tokens.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/dwconv_attention.h"
#include "tests/test_util.h"

using namespace vitfast;
using namespace vitfast_test;

namespace {

struct Shape {
  int64_t prefix, gh, gw, c_in, width, ksize, c_out;
};

// out[t] = (Conv_DW(x·w_vᵀ + b_v))[t] · w_oᵀ + b_o + residual[t]; prefix rows: mean of V over the grid.
std::vector<double> reference(const Shape& s, const std::vector<float>& x, const std::vector<float>& w_v,
                              const float* b_v, const std::vector<float>& kernel, const std::vector<float>& w_o,
                              const float* b_o, const float* residual) {
  const int64_t hw = s.gh * s.gw, n = s.prefix + hw, pad = s.ksize / 2;
  std::vector<double> v(size_t(hw * s.width)), u(size_t(n * s.width), 0.0);
  for (int64_t t = 0; t < hw; ++t)
    for (int64_t d = 0; d < s.width; ++d) {
      double acc = b_v ? b_v[d] : 0.0;
      for (int64_t c = 0; c < s.c_in; ++c) acc += double(x[(s.prefix + t) * s.c_in + c]) * w_v[d * s.c_in + c];
      v[t * s.width + d] = acc;
    }
  for (int64_t p = 0; p < s.prefix; ++p)
    for (int64_t d = 0; d < s.width; ++d) {
      double acc = 0.0;
      for (int64_t t = 0; t < hw; ++t) acc += v[t * s.width + d];
      u[p * s.width + d] = acc / double(hw);
    }
  for (int64_t i = 0; i < s.gh; ++i)
    for (int64_t j = 0; j < s.gw; ++j)
      for (int64_t d = 0; d < s.width; ++d) {
        double acc = 0.0;
        for (int64_t r = 0; r < s.ksize; ++r)
          for (int64_t c = 0; c < s.ksize; ++c) {
            const int64_t ii = i + r - pad, jj = j + c - pad;
            if (ii < 0 || ii >= s.gh || jj < 0 || jj >= s.gw) continue;
            acc += double(kernel[(d * s.ksize + r) * s.ksize + c]) * v[(ii * s.gw + jj) * s.width + d];
          }
        u[(s.prefix + i * s.gw + j) * s.width + d] = acc;
      }
  std::vector<double> out(size_t(n * s.c_out));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < s.c_out; ++o) {
      double acc = b_o ? b_o[o] : 0.0;
      for (int64_t d = 0; d < s.width; ++d) acc += u[t * s.width + d] * w_o[o * s.width + d];
      if (residual) acc += residual[t * s.c_out + o];
      out[t * s.c_out + o] = acc;
    }
  return out;
}

// Runs the op on one image the way the binding does, with the grid rows split into `splits` ranges.
std::vector<float> run(const DwconvAttentionWeights& w, const Shape& s, const std::vector<float>& x,
                       const float* residual, int64_t splits, const DwconvAttentionTiling& tiling, CpuIsa isa) {
  const int64_t n = s.prefix + s.gh * s.gw;
  std::vector<float> ws(size_t(dwconv_attention_workspace_floats(w, s.gw, tiling)));
  std::vector<float> out(size_t(n * s.c_out) + 1, -777.0f);  // one guard element past the output
  const float* xg = x.data() + s.prefix * s.c_in;
  dwconv_attention_prefix(w, s.gh * s.gw, s.prefix, xg, residual, out.data(), ws.data(), isa);
  for (int64_t k = 0; k < splits; ++k)
    dwconv_attention_grid_rows(w, s.gh, s.gw, s.gh * k / splits, s.gh * (k + 1) / splits, xg,
                               residual ? residual + s.prefix * s.c_out : nullptr, out.data() + s.prefix * s.c_out,
                               ws.data(), isa, tiling);
  return out;
}

int check(CpuIsa isa, std::mt19937& rng, const Shape& s, bool with_b_v, bool with_b_o, bool with_res,
          int64_t splits, const DwconvAttentionTiling& tiling) {
  const int64_t n = s.prefix + s.gh * s.gw;
  std::vector<float> x = random_vector(rng, size_t(n * s.c_in));
  std::vector<float> w_v = random_vector(rng, size_t(s.width * s.c_in), 1.0f / std::sqrt(float(s.c_in)));
  std::vector<float> b_v = random_vector(rng, size_t(s.width), 0.5f);
  std::vector<float> kernel = random_vector(rng, size_t(s.width * s.ksize * s.ksize), 1.0f / float(s.ksize));
  std::vector<float> w_o = random_vector(rng, size_t(s.c_out * s.width), 1.0f / std::sqrt(float(s.width)));
  std::vector<float> b_o = random_vector(rng, size_t(s.c_out), 0.5f);
  std::vector<float> res = random_vector(rng, size_t(n * s.c_out));
  const float* bv = with_b_v ? b_v.data() : nullptr;
  const float* bo = with_b_o ? b_o.data() : nullptr;
  const float* rp = with_res ? res.data() : nullptr;
  DwconvAttentionWeights w = DwconvAttentionWeights::pack(w_v.data(), bv, kernel.data(), w_o.data(), bo, s.c_in,
                                                          s.width, s.ksize, s.c_out);
  const std::vector<float> out = run(w, s, x, rp, splits, tiling, isa);
  const std::vector<double> ref = reference(s, x, w_v, bv, kernel, w_o, bo, rp);
  double worst = 0.0;
  for (size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, std::fabs(out[i] - ref[i]) / (2e-5 * (1.0 + std::fabs(ref[i]))));
  VT_CHECK(out.back() == -777.0f, "[%s] wrote past the output", cpu_isa_name(isa));
  VT_CHECK(worst <= 1.0, "[%s] P=%lld grid=%lldx%lld c_in=%lld D=%lld k=%lld c_out=%lld b_v=%d b_o=%d res=%d "
           "splits=%lld tile=%lld kc=%lld: error %.3g x tolerance (atol=rtol=2e-5)", cpu_isa_name(isa),
           (long long)s.prefix, (long long)s.gh, (long long)s.gw, (long long)s.c_in, (long long)s.width,
           (long long)s.ksize, (long long)s.c_out, with_b_v, with_b_o, with_res, (long long)splits,
           (long long)tiling.token_tile, (long long)tiling.kc, worst);
  return 1;
}

void test_parity(CpuIsa isa) {
  std::mt19937 rng(7);
  int count = 0;
  DwconvAttentionTiling small;  // one grid row per band (the rolling buffer moves every band) and K blocks
  small.token_tile = 1;
  small.kc = 8;
  DwconvAttentionTiling two_rows;
  two_rows.token_tile = 12;
  const DwconvAttentionTiling tilings[] = {DwconvAttentionTiling(), small, two_rows};
  for (const Shape& s : {Shape{0, 4, 4, 16, 16, 3, 16}, Shape{1, 5, 7, 17, 20, 3, 9}, Shape{1, 7, 5, 33, 33, 3, 33},
                         Shape{0, 1, 9, 8, 5, 3, 8}, Shape{2, 9, 1, 8, 5, 3, 7}, Shape{1, 1, 1, 3, 3, 3, 3},
                         Shape{0, 6, 5, 12, 17, 5, 12}, Shape{1, 4, 6, 10, 6, 1, 10}, Shape{3, 3, 3, 7, 31, 3, 15}})
    for (const DwconvAttentionTiling& t : tilings)
      for (int64_t splits : {1, 2, 3}) {
        if (splits > s.gh) continue;
        const bool opt = (s.gw + splits) % 2 == 0;
        count += check(isa, rng, s, opt, !opt, true, splits, t);
        count += check(isa, rng, s, !opt, opt, false, splits, t);
      }
  // ViT-like proportions: a 14×14 grid with a cls token (DeiT at 224²), more tokens than one band.
  count += check(isa, rng, {1, 14, 14, 48, 48, 3, 48}, true, true, true, 1, DwconvAttentionTiling());
  count += check(isa, rng, {0, 21, 28, 32, 16, 3, 32}, true, true, false, 2, DwconvAttentionTiling());
  // C_in a multiple of 1024: the value GEMM reads a padded copy of x (4 KiB rows alias in L1); with a rolling band.
  count += check(isa, rng, {1, 5, 4, 1024, 20, 3, 16}, true, true, true, 2, two_rows);
  count += check(isa, rng, {0, 3, 4, 2048, 17, 5, 8}, false, true, true, 1, small);
  std::printf("[%s] dwconv_attention parity: %d cases\n", cpu_isa_name(isa), count);
}

void test_split_is_bit_identical(CpuIsa isa) {
  // Splitting the grid rows between callers recomputes the halo rows of V with the same code: same bits.
  std::mt19937 rng(3);
  const Shape s{1, 9, 6, 20, 24, 3, 20};
  const int64_t n = s.prefix + s.gh * s.gw;
  std::vector<float> x = random_vector(rng, size_t(n * s.c_in)), w_v = random_vector(rng, size_t(24 * 20));
  std::vector<float> k = random_vector(rng, size_t(24 * 9)), w_o = random_vector(rng, size_t(20 * 24));
  DwconvAttentionWeights w = DwconvAttentionWeights::pack(w_v.data(), nullptr, k.data(), w_o.data(), nullptr, 20,
                                                          24, 3, 20);
  const std::vector<float> whole = run(w, s, x, nullptr, 1, DwconvAttentionTiling(), isa);
  const std::vector<float> split = run(w, s, x, nullptr, 3, DwconvAttentionTiling(), isa);
  check_same_bits(isa, whole, split, "row split");
}

}  // namespace

int main() { return run_on_every_isa("test_dwconv_attention", test_parity, test_split_is_bit_identical); }
