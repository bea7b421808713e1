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
#include "kernels/gemm_bf16.h"

namespace vitfast {

// y must not overlap x.  gamma, beta: c floats each, or nullptr.
void layer_norm_rows(const float* x, float* y, int64_t rows, int64_t c, const float* gamma, const float* beta,
                     float eps, CpuIsa isa);

// The LayerNorm of the bf16 GEMMs' inputs: y16 (rows ld16 apart, an odd c's pad element zero) gets exactly
// gemm16::convert_rows(layer_norm_rows(x)).  x16 != nullptr: the input is bf16 rows (c apart), widened (exactly) into
// `widened` (fp32, c apart; the caller keeps it) and normalised from there.  AVX-512 does it per row pair in L1; the
// other paths widen, normalise into scratch (rows × c floats) and round, three passes.
void layer_norm_rows_bf16(const float* x, const uint16_t* x16, float* widened, uint16_t* y16, int64_t ld16,
                          int64_t rows, int64_t c, const float* gamma, const float* beta, float eps, CpuIsa isa,
                          gemm16::Bf16Kernel kernel, float* scratch);

}  // namespace vitfast
