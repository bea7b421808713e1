// CTest: the torch-free USDC batch gate against a double-precision oracle written from the equations.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/batch_gate.h"
#include "test_util.h"

namespace {

using vitfast_test::gelu_ref;

struct Case {
  int64_t rows, channels, hidden;
  bool two_layers, layer_norm, bias;
  vitfast::GateAct act;
};

void oracle(const std::vector<float>& x, const Case& k, const std::vector<float>& w1, const std::vector<float>& b1,
            const std::vector<float>& w2, const std::vector<float>& b2, double logits[2]) {
  std::vector<double> f(k.channels, 0.0), h(k.hidden, 0.0);
  for (int64_t r = 0; r < k.rows; ++r)
    for (int64_t c = 0; c < k.channels; ++c) f[c] += x[r * k.channels + c];
  for (double& v : f) v /= static_cast<double>(k.rows);
  for (int64_t j = 0; j < k.hidden; ++j) {
    double acc = k.bias ? b1[j] : 0.0;
    for (int64_t c = 0; c < k.channels; ++c) acc += static_cast<double>(w1[j * k.channels + c]) * f[c];
    h[j] = acc;
  }
  if (k.layer_norm) {
    double mean = 0, var = 0;
    for (double v : h) mean += v;
    mean /= k.hidden;
    for (double v : h) var += (v - mean) * (v - mean);
    var /= k.hidden;
    for (double& v : h) v = (v - mean) / std::sqrt(var + 1e-5);
  }
  for (double& v : h) {
    if (k.act == vitfast::GateAct::kRelu) v = v > 0 ? v : 0;
    if (k.act == vitfast::GateAct::kGelu) v = gelu_ref(v);
  }
  if (!k.two_layers) {
    logits[0] = h[0];
    logits[1] = h[1];
    return;
  }
  for (int g = 0; g < 2; ++g) {
    double acc = k.bias ? b2[g] : 0.0;
    for (int64_t j = 0; j < k.hidden; ++j) acc += static_cast<double>(w2[g * k.hidden + j]) * h[j];
    logits[g] = acc;
  }
}

void run_case(std::mt19937& rng, const Case& k) {
  // Token rows share a per-channel offset, so the mean is far from zero and pooling errors would show.
  std::vector<float> x = vitfast_test::random_vector(rng, k.rows * k.channels);
  std::vector<float> offset = vitfast_test::random_vector(rng, k.channels, 2.0f);
  for (int64_t r = 0; r < k.rows; ++r)
    for (int64_t c = 0; c < k.channels; ++c) x[r * k.channels + c] += offset[c];
  const float s1 = 1.0f / std::sqrt(static_cast<float>(k.channels));
  const float s2 = 1.0f / std::sqrt(static_cast<float>(k.hidden));
  std::vector<float> w1 = vitfast_test::random_vector(rng, k.hidden * k.channels, s1);
  std::vector<float> b1 = vitfast_test::random_vector(rng, k.hidden, 0.1f);
  std::vector<float> w2 = vitfast_test::random_vector(rng, 2 * k.hidden, s2);
  std::vector<float> b2 = vitfast_test::random_vector(rng, 2, 0.1f);
  vitfast::BatchGateNet net;
  net.w1 = w1.data();
  net.b1 = k.bias ? b1.data() : nullptr;
  net.hidden = k.hidden;
  net.w2 = k.two_layers ? w2.data() : nullptr;
  net.b2 = k.two_layers && k.bias ? b2.data() : nullptr;
  net.layer_norm = k.layer_norm;
  net.act = k.act;
  std::vector<float> scratch(k.channels + k.hidden), feature(k.channels);
  vitfast::token_mean(x.data(), k.rows, k.channels, feature.data());
  float logits[2];
  vitfast::batch_gate_logits(feature.data(), k.channels, net, scratch.data(), logits);
  double expect[2];
  oracle(x, k, w1, b1, w2, b2, expect);
  for (int g = 0; g < 2; ++g) {
    const double err = std::fabs(logits[g] - expect[g]);
    VT_CHECK(err <= 1e-4 + 1e-4 * std::fabs(expect[g]), "rows=%lld C=%lld H=%lld gate %d: %g vs %g",
             (long long)k.rows, (long long)k.channels, (long long)k.hidden, g, logits[g], expect[g]);
  }
  float decision[2];
  vitfast::batch_gate(x.data(), k.rows, k.channels, net, scratch.data(), decision);
  for (int g = 0; g < 2; ++g) {
    if (std::fabs(expect[g]) < 1e-3) continue;  // a tie within rounding may go either way
    VT_CHECK(decision[g] == (expect[g] > 0 ? 1.0f : 0.0f), "decision %d = %g for logit %g", g, decision[g],
             expect[g]);
  }
}

}  // namespace

int main() {
  std::mt19937 rng(1234);
  using A = vitfast::GateAct;
  const Case cases[] = {
      {1, 1, 2, false, false, false, A::kNone},   {3, 7, 2, false, false, true, A::kNone},
      {197, 192, 96, true, true, true, A::kRelu}, {2 * 197, 384, 192, true, false, true, A::kRelu},
      {5, 33, 17, true, true, false, A::kGelu},   {64 * 50, 768, 384, true, true, true, A::kGelu},
      {130, 65, 1, true, false, true, A::kNone},
  };
  for (const Case& k : cases) run_case(rng, k);
  std::printf("batch_gate parity (scalar loops, every ISA build): %s\n", vitfast_test::failures() ? "FAILED" : "ok");
  return vitfast_test::finish("test_batch_gate");
}
