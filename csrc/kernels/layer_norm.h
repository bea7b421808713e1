// Row LayerNorm over the last dimension for the fused blocks' pre-norms (the affine of most of them is folded
// into the next linear layer, so gamma/beta are usually absent):
//
//   y = (x − mean) / √(var + eps)  [· gamma]  [+ beta]       per row of c contiguous floats
//
// Mean and variance in two passes (gemm_isa.h: no E[x²] − mean² cancellation when |mean| ≫ std, as in a ViT's
// residual stream), fp32 throughout.  torch's CPU LayerNorm costs ~4× this at DeiT-Ti width (mostly per-row
// overhead at C = 192), twice that again without an affine.  No threads here (the binding splits rows).
#pragma once

#include <cstdint>

#include "kernels/cpu_features.h"

namespace vitfast {

// y must not overlap x.  gamma, beta: c floats each, or nullptr.
void layer_norm_rows(const float* x, float* y, int64_t rows, int64_t c, const float* gamma, const float* beta,
                     float eps, CpuIsa isa);

}  // namespace vitfast
