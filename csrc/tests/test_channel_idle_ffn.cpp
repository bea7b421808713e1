// The fused channel-idle FFN of every ISA path against a naive double-precision evaluation of
// RePaViT eq. 6 (+ biases, residual): odd widths, A = 0 (θ = 1), L = 0 (θ = 0 / LayerNorm variant),
// several token tiles and K blocks per call, with and without each optional input.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/channel_idle_ffn.h"
#include "tests/test_util.h"

using namespace vitfast;
using namespace vitfast_test;

namespace {

struct Shape {
  int64_t rows, c_in, active, c_out;
  bool linear;
};

// out = GELU(x·W_actᵀ + b_act)·W_outᵀ + (x·W_linᵀ + b_lin) + b_out + residual, in double.
std::vector<double> reference(const Shape& s, const std::vector<float>& x, const std::vector<float>& w_in,
                              const float* b_in, const std::vector<float>& w_out, const float* b_out,
                              const float* residual) {
  const int64_t lin = s.linear ? s.c_out : 0, hid = s.active + lin;
  std::vector<double> out(size_t(s.rows * s.c_out), 0.0);
  std::vector<double> h(static_cast<size_t>(hid));
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t j = 0; j < hid; ++j) {
      double acc = b_in ? b_in[j] : 0.0;
      for (int64_t p = 0; p < s.c_in; ++p) acc += double(x[r * s.c_in + p]) * w_in[j * s.c_in + p];
      h[j] = j < s.active ? gelu_ref(acc) : acc;
    }
    for (int64_t o = 0; o < s.c_out; ++o) {
      double acc = 0.0;
      for (int64_t a = 0; a < s.active; ++a) acc += h[a] * w_out[o * s.active + a];
      if (s.linear) acc += h[s.active + o];
      if (b_out) acc += b_out[o];
      if (residual) acc += residual[r * s.c_out + o];
      out[r * s.c_out + o] = acc;
    }
  }
  return out;
}

int check(CpuIsa isa, std::mt19937& rng, const Shape& s, bool with_b_in, bool with_b_out, bool with_res,
          const ChannelIdleFfnTiling& tiling) {
  const int64_t lin = s.linear ? s.c_out : 0;
  std::vector<float> x = random_vector(rng, size_t(s.rows * s.c_in));
  // nn.Linear-like scales (1/sqrt(fan_in)) so activations stay O(1) as in a trained ViT.
  const float s_in = 1.0f / std::sqrt(float(std::max<int64_t>(s.c_in, 1)));
  const float s_out = 1.0f / std::sqrt(float(std::max<int64_t>(s.active, 1)));
  std::vector<float> w_in = random_vector(rng, size_t((s.active + lin) * s.c_in), s_in);
  std::vector<float> b_in = random_vector(rng, size_t(s.active + lin), 0.5f);
  std::vector<float> w_out = random_vector(rng, size_t(s.c_out * s.active), s_out);
  std::vector<float> b_out = random_vector(rng, size_t(s.c_out), 0.5f);
  std::vector<float> res = random_vector(rng, size_t(s.rows * s.c_out));
  const float* bi = with_b_in ? b_in.data() : nullptr;
  const float* bo = with_b_out ? b_out.data() : nullptr;
  const float* rp = with_res ? res.data() : nullptr;

  ChannelIdleFfnWeights w =
      ChannelIdleFfnWeights::pack(w_in.data(), bi, w_out.data(), bo, s.c_in, s.active, lin, s.c_out);
  std::vector<float> ws(size_t(channel_idle_ffn_workspace_floats(w, tiling)) + 1);
  // One guard element past the output: the kernel must not write beyond rows × c_out.
  std::vector<float> out(size_t(s.rows * s.c_out) + 1, -777.0f);
  channel_idle_ffn_rows(w, s.rows, x.data(), rp, out.data(), ws.data(), isa, tiling);
  const std::vector<double> ref = reference(s, x, w_in, bi, w_out, bo, rp);

  double worst = 0.0;
  for (size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, std::fabs(out[i] - ref[i]) / (2e-5 * (1.0 + std::fabs(ref[i]))));
  VT_CHECK(out.back() == -777.0f, "[%s] wrote past the output", cpu_isa_name(isa));
  VT_CHECK(worst <= 1.0, "[%s] rows=%lld c_in=%lld A=%lld c_out=%lld L=%lld b_in=%d b_out=%d res=%d tile=%lld "
           "kc=%lld: error %.3g x tolerance (atol=rtol=2e-5)", cpu_isa_name(isa), (long long)s.rows,
           (long long)s.c_in, (long long)s.active, (long long)s.c_out, (long long)lin, with_b_in, with_b_out,
           with_res, (long long)tiling.token_tile, (long long)tiling.kc, worst);
  return 1;
}

void test_parity(CpuIsa isa) {
  std::mt19937 rng(99);
  int count = 0;
  ChannelIdleFfnTiling small;  // several token tiles and K blocks even for these small shapes
  small.token_tile = 12;
  small.kc = 8;
  const ChannelIdleFfnTiling tilings[] = {ChannelIdleFfnTiling(), small};
  for (int64_t rows : {1, 2, 3, 5, 7, 15, 31})
    for (int64_t c : {1, 3, 16, 17, 33})
      for (int64_t active : {0, 1, 5, 16, 17, 31, 33})
        for (bool linear : {true, false})
          for (const ChannelIdleFfnTiling& t : tilings) {
            const bool opt = (rows + c + active) % 2 == 0;  // alternate the optional inputs cheaply
            count += check(isa, rng, {rows, c, active, c, linear}, opt, !opt, true, t);
            count += check(isa, rng, {rows, c, active, c, linear}, !opt, opt, false, t);
          }
  // Every combination of optional inputs, A = 0 and L = 0 included, c_in != c_out.
  for (bool b_in : {false, true})
    for (bool b_out : {false, true})
      for (bool res : {false, true})
        for (int64_t active : {0, 7, 40})
          for (bool linear : {true, false})
            for (const ChannelIdleFfnTiling& t : tilings)
              count += check(isa, rng, {17, 15, active, 9, linear}, b_in, b_out, res, t);
  // ViT-like proportions (hidden = 4C·(1-θ)), more rows than one default token tile.
  count += check(isa, rng, {197, 48, 48, 48, true}, true, true, false, ChannelIdleFfnTiling());
  count += check(isa, rng, {197, 48, 192, 48, false}, true, true, true, ChannelIdleFfnTiling());
  count += check(isa, rng, {50, 300, 300, 300, true}, true, true, true, ChannelIdleFfnTiling());
  std::printf("[%s] channel_idle_ffn parity: %d cases\n", cpu_isa_name(isa), count);
}

void test_zero_rows_and_split(CpuIsa isa) {
  // Splitting the rows between callers (as the binding does per thread) gives the same bits.
  std::mt19937 rng(5);
  const Shape s{29, 20, 24, 20, true};
  std::vector<float> x = random_vector(rng, size_t(s.rows * s.c_in)), w_in = random_vector(rng, size_t(44 * 20));
  std::vector<float> w_out = random_vector(rng, size_t(20 * 24)), b = random_vector(rng, 44);
  ChannelIdleFfnWeights w = ChannelIdleFfnWeights::pack(w_in.data(), b.data(), w_out.data(), nullptr, 20, 24, 20, 20);
  std::vector<float> ws(size_t(channel_idle_ffn_workspace_floats(w)));
  std::vector<float> whole(size_t(s.rows * 20)), split(size_t(s.rows * 20));
  channel_idle_ffn_rows(w, s.rows, x.data(), nullptr, whole.data(), ws.data(), isa);
  channel_idle_ffn_rows(w, 0, x.data(), nullptr, split.data(), ws.data(), isa);  // no-op
  channel_idle_ffn_rows(w, 12, x.data(), nullptr, split.data(), ws.data(), isa);
  channel_idle_ffn_rows(w, s.rows - 12, x.data() + 12 * 20, nullptr, split.data() + 12 * 20, ws.data(), isa);
  check_same_bits(isa, whole, split, "row split");
}

}  // namespace

int main() { return run_on_every_isa("test_channel_idle_ffn", test_parity, test_zero_rows_and_split); }
