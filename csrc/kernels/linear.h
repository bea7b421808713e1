// Dense linear layer at inference on the GEMM core:   out = x · Wᵀ + b + residual
//
// Torch-free.  W [n × k] (nn.Linear layout) is packed once (`gemm::PackedB::pack_linear`, bias included);
// x rows are read in place with their row stride, so a strided view (e.g. the cls token x[:, 0] feeding a
// classifier head) needs no copy.  Used by the fused ViT block for qkv, for proj (the block's shortcut fused
// as `residual`) and for the head.
//
// No threads here: the binding splits rows (or, for fewer rows than threads, panels) between threads.
#pragma once

#include <cstdint>

#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16.h"

namespace vitfast {

// Tiling of `linear_rows`.  Every token tile streams the whole packed weight once (from L3: 7 MiB for the
// DeiT-B qkv), while the tile of x (198 × 768 × 4 B = 0.6 MiB at DeiT-B) stays in the 1 MiB L2 across all
// panels.  Without tiling a batch-8 call (788 rows per thread) re-streams a 2.4 MiB x from L3 for each of the
// 144 panels (~350 MB of L3 traffic for one qkv); with 198-row tiles it is 4 passes over the 7 MiB weight.
// Same value as ChannelIdleFfnTiling (tuned there) so one ViT image is one tile.
struct LinearTiling {
  int64_t token_tile = 198;       // rows per pass (rounded up to a multiple of gemm::kMr)
  int64_t kc = gemm::kDefaultKc;  // K block
};

// Rows [0, rows) of the layer, panels [panel_begin, panel_end) of w, on the calling thread.
// x [rows × w.k()] with row stride ldx; residual [rows × w.n()] with row stride ld_residual, or nullptr;
// out [rows × w.n()] with row stride ldo.  The bias is the one packed into w (if any).  out must alias
// neither x nor residual (when K is split into blocks, partial sums are stored into out before the last
// block reads the residual).
void linear_rows(const gemm::PackedB& w, int64_t rows, const float* x, int64_t ldx, const float* residual,
                 int64_t ld_residual, float* out, int64_t ldo, CpuIsa isa, int64_t panel_begin = 0,
                 int64_t panel_end = -1, const LinearTiling& tiling = LinearTiling());

// The same over bf16 operands (gemm_bf16.h): x [rows × w.k()] bf16 with an even row stride ldx and zero pad elements
// (gemm16::convert_rows writes such rows); residual and out fp32 as above.  out16 (or nullptr): the output also
// rounded to bf16 there (row stride ldo16; gemm::Epilogue::c16), the next bf16 GEMM's operand; out may then be
// nullptr (only the bf16 rounding is written).
void linear_rows_bf16(const gemm16::PackedBf16B& w, int64_t rows, const uint16_t* x, int64_t ldx,
                      const float* residual, int64_t ld_residual, float* out, int64_t ldo, gemm16::Bf16Kernel kernel,
                      int64_t panel_begin = 0, int64_t panel_end = -1, const LinearTiling& tiling = LinearTiling(),
                      uint16_t* out16 = nullptr, int64_t ldo16 = 0);

}  // namespace vitfast
