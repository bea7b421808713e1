// USDC batch-level gate (torch-free kernel tier): one decision per batch for [MHSA, FFN].
//
//   feature = mean of the `rows` = B·N token vectors of x [rows, C]      (token mean-pool, then batch mean)
//   h       = feature · w1ᵀ + b1                                          [H]
//   h       = act(LayerNorm(h))                                           (non-affine LN if layer_norm)
//   logits  = h · w2ᵀ + b2                                                [2] (w2 == nullptr: H = 2, logits = h)
//   decision[g] = logits[g] > 0                                           1 = execute sub-block g, 0 = skip it
//
// The gate network is tiny (H ≤ C, one vector), so it is plain loops the compiler vectorises on every ISA; the
// only pass that scales with the input is the token mean, a streaming column sum.
#pragma once

#include <cstdint>

namespace vitfast {

enum class GateAct : int { kNone = 0, kRelu = 1, kGelu = 2 };

struct BatchGateNet {
  const float* w1 = nullptr;  // [H, C]
  const float* b1 = nullptr;  // [H] or nullptr
  int64_t hidden = 2;         // H
  const float* w2 = nullptr;  // [2, H] or nullptr (one-layer network)
  const float* b2 = nullptr;  // [2] or nullptr
  bool layer_norm = false;
  GateAct act = GateAct::kNone;
  float eps = 1e-5f;
};

// Column means of x [rows, channels] (row-major) into feature [channels]; float partial sums over blocks of
// rows, accumulated in double across blocks so B·N in the tens of thousands loses no precision.
void token_mean(const float* x, int64_t rows, int64_t channels, float* feature);

// The two logits of the gate network on `feature` [channels]; `scratch` holds H floats.
void batch_gate_logits(const float* feature, int64_t channels, const BatchGateNet& net, float* scratch,
                       float logits[2]);

// token_mean + batch_gate_logits + threshold; `scratch` holds channels + H floats.
void batch_gate(const float* x, int64_t rows, int64_t channels, const BatchGateNet& net, float* scratch,
                float decision[2]);

}  // namespace vitfast
