#include "kernels/batch_gate.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace vitfast {
namespace {

// Dot product with 8 independent partial sums: a float reduction in one accumulator is a dependency chain the
// compiler may not reorder (no -ffast-math), 8 lanes let it vectorise on every ISA (SSE2/AVX2/NEON).
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

}  // namespace

void token_mean(const float* x, int64_t rows, int64_t channels, float* feature) {
  constexpr int64_t kRowBlock = 64;
  std::vector<double> total(static_cast<size_t>(channels), 0.0);
  std::vector<float> block(static_cast<size_t>(channels));
  for (int64_t r0 = 0; r0 < rows; r0 += kRowBlock) {
    const int64_t r1 = std::min(rows, r0 + kRowBlock);
    std::fill(block.begin(), block.end(), 0.0f);
    for (int64_t r = r0; r < r1; ++r) {
      const float* row = x + r * channels;
      for (int64_t c = 0; c < channels; ++c) block[c] += row[c];
    }
    for (int64_t c = 0; c < channels; ++c) total[c] += block[c];
  }
  const double inv = rows > 0 ? 1.0 / static_cast<double>(rows) : 0.0;
  for (int64_t c = 0; c < channels; ++c) feature[c] = static_cast<float>(total[c] * inv);
}

void batch_gate_logits(const float* feature, int64_t channels, const BatchGateNet& net, float* scratch,
                       float logits[2]) {
  const int64_t hidden = net.hidden;
  float* h = scratch;
  for (int64_t j = 0; j < hidden; ++j) {
    h[j] = dot(net.w1 + j * channels, feature, channels) + (net.b1 ? net.b1[j] : 0.0f);
  }
  if (net.layer_norm) {
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < hidden; ++j) mean += h[j];
    mean /= static_cast<double>(hidden);
    for (int64_t j = 0; j < hidden; ++j) var += (h[j] - mean) * (h[j] - mean);
    var /= static_cast<double>(hidden);  // biased, as LayerNorm
    const float rstd = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(net.eps)));
    for (int64_t j = 0; j < hidden; ++j) h[j] = static_cast<float>(h[j] - mean) * rstd;
  }
  if (net.act == GateAct::kRelu) {
    for (int64_t j = 0; j < hidden; ++j) h[j] = std::max(h[j], 0.0f);
  } else if (net.act == GateAct::kGelu) {
    for (int64_t j = 0; j < hidden; ++j) h[j] = 0.5f * h[j] * (1.0f + std::erf(h[j] * 0.70710678118654752f));
  }
  if (net.w2 == nullptr) {
    logits[0] = h[0];
    logits[1] = h[1];
    return;
  }
  for (int g = 0; g < 2; ++g) {
    logits[g] = dot(net.w2 + g * hidden, h, hidden) + (net.b2 ? net.b2[g] : 0.0f);
  }
}

void batch_gate(const float* x, int64_t rows, int64_t channels, const BatchGateNet& net, float* scratch,
                float decision[2]) {
  float* feature = scratch;
  token_mean(x, rows, channels, feature);
  float logits[2];
  batch_gate_logits(feature, channels, net, scratch + channels, logits);
  for (int g = 0; g < 2; ++g) decision[g] = logits[g] > 0.0f ? 1.0f : 0.0f;
}

}  // namespace vitfast
