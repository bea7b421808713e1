// The fused channel-idle FFN of every ISA path against a naive double-precision evaluation of
// RePaViT eq. 6 (+ biases, residual): odd widths, A = 0 (θ = 1), L = 0 (θ = 0 / LayerNorm variant),
// several token tiles and K blocks per call, with and without each optional input.  Its bf16 form on every bf16
// kernel this CPU has: the second GEMM over [h_act | x] against the same products in double, x in place or copied,
// out and/or its bf16 copy.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/channel_idle_ffn.h"
#include "kernels/gemm_bf16.h"
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

// The bf16 FFN (channel_idle_ffn_rows_bf16) on one bf16 kernel: h_act is the act GEMM's bf16 rounding (that GEMM
// is gemm_bf16's own, tested in test_gemm_bf16.cpp), and out must be h_act · W_out + x · W_lin + biases + residual
// over the bf16 weights, in double up to the fp32 sums' order (atol = rtol = 2e-5); x copied beside h_act and x read
// in place must give the same bits, as must the bf16 copy with and without the fp32 out (to_bf16 of it); nothing is
// written past the rows or into x.
int check_bf16(gemm16::Bf16Kernel kernel, std::mt19937& rng, const Shape& s, bool with_bias, bool with_res,
               const ChannelIdleFfnTiling& tiling) {
  const int64_t lin = s.linear ? s.c_out : 0, ldx0 = gemm16::padded_k(s.c_in);
  const float s_in = 1.0f / std::sqrt(float(s.c_in)), s_out = 1.0f / std::sqrt(float(std::max<int64_t>(s.active, 1)));
  std::vector<float> xf = random_vector(rng, size_t(s.rows * s.c_in));
  std::vector<float> w_in = random_vector(rng, size_t((s.active + lin) * s.c_in), s_in);
  std::vector<float> w_out = random_vector(rng, size_t(s.c_out * s.active), s_out);
  std::vector<float> b_in = random_vector(rng, size_t(s.active + lin), 0.5f), b_out = random_vector(rng, size_t(s.c_out));
  std::vector<float> res = random_vector(rng, size_t(s.rows * s.c_out));
  const float* bi = with_bias ? b_in.data() : nullptr;
  const float* bo = with_bias ? b_out.data() : nullptr;
  const float* rp = with_res ? res.data() : nullptr;
  const ChannelIdleFfnBf16Weights w =
      ChannelIdleFfnBf16Weights::pack(w_in.data(), bi, w_out.data(), bo, s.c_in, s.active, lin, s.c_out);
  const int64_t h = w.h_cols(), ldf = h + ldx0 + 2;  // [h_act | x | 2 spare] rows for the in-place call
  std::vector<uint16_t> x16(size_t(s.rows * ldx0)), xf16(size_t(s.rows * ldf), 0x7fc1);
  gemm16::convert_rows(xf.data(), s.c_in, s.rows, s.c_in, x16.data(), ldx0, kernel);
  for (int64_t r = 0; r < s.rows; ++r)
    std::copy(x16.begin() + r * ldx0, x16.begin() + (r + 1) * ldx0, xf16.begin() + r * ldf + h);
  const std::vector<uint16_t> xf16_before = xf16;
  std::vector<float> ws(size_t(channel_idle_ffn_workspace_floats(w, tiling)) + 16);
  const int64_t n_out = s.rows * s.c_out;
  std::vector<float> out(size_t(n_out) + 1, -777.0f), out_in_place(size_t(n_out) + 1, -777.0f);
  std::vector<uint16_t> o16(size_t(n_out) + 1, 0xffff), o16_alone(size_t(n_out) + 1, 0xffff);
  const bool even = s.c_out % 2 == 0;
  channel_idle_ffn_rows_bf16(w, s.rows, x16.data(), ldx0, rp, out.data(), ws.data(), kernel, tiling,
                             even ? o16.data() : nullptr);
  channel_idle_ffn_rows_bf16(w, s.rows, xf16.data() + h, ldf, rp, out_in_place.data(), ws.data(), kernel, tiling,
                             nullptr, true);
  if (even)
    channel_idle_ffn_rows_bf16(w, s.rows, x16.data(), ldx0, rp, nullptr, ws.data(), kernel, tiling, o16_alone.data());

  // The reference: h_act as the act GEMM rounds it, then the output products over the bf16 weights in double.
  auto b16 = [](float v) { return double(gemm16::from_bf16(gemm16::to_bf16(v))); };
  const int64_t ldh = s.active > 0 ? w.act().padded_n() : 0;
  std::vector<uint16_t> hact(size_t(s.rows * std::max<int64_t>(ldh, 1)));
  if (s.active > 0) {
    gemm::Epilogue ep;
    ep.bias = true;
    ep.gelu = true;
    ep.c_padded = true;
    ep.c16 = hact.data();
    ep.ldc16 = ldh;
    gemm16::gemm_bf16(s.rows, x16.data(), ldx0, w.act(), nullptr, ldh, ep, kernel);
  }
  double worst = 0.0;
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t o = 0; o < s.c_out; ++o) {
      double acc = 0.0;
      for (int64_t a = 0; a < s.active; ++a)
        acc += double(gemm16::from_bf16(hact[r * ldh + a])) * b16(w_out[o * s.active + a]);
      for (int64_t p = 0; p < (s.linear ? s.c_in : 0); ++p)
        acc += double(gemm16::from_bf16(x16[r * ldx0 + p])) * b16(w_in[(s.active + o) * s.c_in + p]);
      if (bi != nullptr && s.linear) acc += bi[s.active + o];
      if (bo != nullptr) acc += bo[o];
      if (rp != nullptr) acc += rp[r * s.c_out + o];
      worst = std::max(worst, std::fabs(out[r * s.c_out + o] - acc) / (2e-5 * (1.0 + std::fabs(acc))));
    }
  const char* name = gemm16::bf16_kernel_name(kernel);
  VT_CHECK(worst <= 1.0, "[%s] bf16 rows=%lld c_in=%lld A=%lld c_out=%lld L=%lld bias=%d res=%d tile=%lld: error "
           "%.3g x tolerance (atol=rtol=2e-5)", name, (long long)s.rows, (long long)s.c_in, (long long)s.active,
           (long long)s.c_out, (long long)lin, with_bias, with_res, (long long)tiling.token_tile, worst);
  VT_CHECK(out.back() == -777.0f && out_in_place.back() == -777.0f, "[%s] bf16: wrote past the output", name);
  VT_CHECK(std::equal(out.begin(), out.end(), out_in_place.begin()),
           "[%s] bf16 rows=%lld c_in=%lld A=%lld L=%lld: x in place and x copied differ", name, (long long)s.rows,
           (long long)s.c_in, (long long)s.active, (long long)lin);
  bool x_kept = true;
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t j = h; j < ldf; ++j) x_kept = x_kept && xf16[r * ldf + j] == xf16_before[r * ldf + j];
  VT_CHECK(x_kept, "[%s] bf16 in place: x (or the spare columns after it) was written", name);
  if (even) {
    bool ok = o16.back() == 0xffff && o16_alone.back() == 0xffff;
    for (int64_t i = 0; i < n_out; ++i) ok = ok && o16[i] == gemm16::to_bf16(out[i]) && o16_alone[i] == o16[i];
    VT_CHECK(ok, "[%s] bf16 rows=%lld A=%lld L=%lld: the bf16 copy is not to_bf16(out) with and without out", name,
             (long long)s.rows, (long long)s.active, (long long)lin);
  }
  return 1;
}

void test_bf16(CpuIsa isa) {
  std::vector<gemm16::Bf16Kernel> kernels = {gemm16::Bf16Kernel::kScalar};
  if (gemm16::bf16_kernel(isa) != gemm16::Bf16Kernel::kScalar) kernels.push_back(gemm16::bf16_kernel(isa));
  ChannelIdleFfnTiling small;
  small.token_tile = 12;
  const ChannelIdleFfnTiling tilings[] = {ChannelIdleFfnTiling(), small};
  for (gemm16::Bf16Kernel kernel : kernels) {
    std::mt19937 rng(17);
    int count = 0;
    for (int64_t rows : {1, 5, 31})
      for (int64_t c : {16, 17, 33})
        for (int64_t active : {0, 5, 16, 17})
          for (bool linear : {true, false})
            for (const ChannelIdleFfnTiling& t : tilings)
              count += check_bf16(kernel, rng, {rows, c, active, c, linear}, (rows + active) % 2 == 0, rows != 5, t);
    count += check_bf16(kernel, rng, {17, 15, 7, 10, false}, true, true, small);  // c_in != c_out, no linear path
    count += check_bf16(kernel, rng, {197, 48, 48, 48, true}, true, true, ChannelIdleFfnTiling());
    count += check_bf16(kernel, rng, {200, 40, 20, 40, true}, true, false, small);
    std::printf("[%s] channel_idle_ffn bf16 [%s]: %d cases\n", cpu_isa_name(isa), gemm16::bf16_kernel_name(kernel),
                count);
  }
}

}  // namespace

int main() { return run_on_every_isa("test_channel_idle_ffn", test_parity, test_zero_rows_and_split, test_bf16); }
