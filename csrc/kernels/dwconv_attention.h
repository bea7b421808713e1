// Drop-in depthwise-convolution heads at inference (dropin-depthwise-conv-attention eq. 11, 13), fused with the
// value and output projections:
//
//   V = x · w_vᵀ + b_v                         grid tokens, [HW × D]   (D = replaced heads · d_h; d_h when ensembled)
//   U = Conv_DW(V, kernel)                     k×k per channel over the grid_h × grid_w token grid, zero padding
//   out = U · w_oᵀ + b_o + residual            [HW × C_out]
//   prefix tokens (cls, registers):  U = mean of V over the grid = mean(x_grid) · w_vᵀ + b_v  (linear, exact)
//
// Torch-free.  Weights are packed once (`DwconvAttentionWeights`): two GEMM operands on the shared GEMM core
// (w_v with b_v; w_o with b_o) and the kernel transposed tap-major ([k·k][D padded to 16]) so the convolution's
// inner loop runs over contiguous channels (SIMD rows per ISA: kernels/dwconv_isa.h).
//
// `dwconv_attention_grid_rows` computes the output rows [row_begin, row_end) of one image's grid in bands of
// `band` grid rows (≈ token_tile tokens).  V lives only in a rolling buffer of band + k − 1 grid rows: each band
// computes V for its new rows (one GEMM into the buffer), keeps the k − 1 halo rows it shares with the next
// band (moved to the front of the buffer, never recomputed), convolves into a band of U, and runs the output
// GEMM with the bias/residual epilogue straight into out.  V never exists in full, and the token tile of U is
// still in L2 when the second GEMM reads it.  Callers that split an image's rows between threads pay k − 1
// recomputed halo rows per split.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/gemm.h"

namespace vitfast {

struct DwconvAttentionTiling {
  // Tokens per band (rounded to whole grid rows, at least one).  48 = two rows of a 24×24 grid: the band's x
  // rows, V rows (+ halo) and U stay within L2 (≈ 1 MiB at D = C = 1024) while both GEMMs stream their packed
  // weight.  Measured at 24×24, one thread (thread CPU time), as a multiple of two whole-grid GEMMs: with the
  // L1-aliasing fixes (band_ld, x_copy_ld in the .cpp) 48 and 192 are within noise (ViT-L 0.84-0.86×, ViT-B
  // 1.04-1.06× either way; docs/performance.md), and 48 keeps the band in L2.
  int64_t token_tile = 48;
  int64_t kc = gemm::kDefaultKc;  // K block of both GEMMs
};

class DwconvAttentionWeights {
 public:
  DwconvAttentionWeights() = default;
  // w_v [width × c_in] (row-major), b_v [width] or nullptr, kernel [width × ksize × ksize], w_o [c_out × width],
  // b_o [c_out] or nullptr.  ksize odd.
  static DwconvAttentionWeights pack(const float* w_v, const float* b_v, const float* kernel, const float* w_o,
                                     const float* b_o, int64_t c_in, int64_t width, int64_t ksize, int64_t c_out);

  int64_t c_in() const { return c_in_; }
  int64_t width() const { return width_; }
  int64_t ksize() const { return ksize_; }
  int64_t c_out() const { return c_out_; }
  size_t bytes() const;

  const gemm::PackedB& value() const { return value_; }
  const gemm::PackedB& output() const { return output_; }
  // kernel transposed: taps()[tap · value().padded_n() + d] = kernel[d][tap], tap = r·k + c (zeros for d ≥ width).
  const std::vector<float>& taps() const { return taps_; }

 private:
  int64_t c_in_ = 0, width_ = 0, ksize_ = 0, c_out_ = 0;
  gemm::PackedB value_, output_;
  std::vector<float> taps_;
};

// Floats of scratch one concurrent caller of dwconv_attention_grid_rows / _prefix must provide for this grid width.
int64_t dwconv_attention_workspace_floats(const DwconvAttentionWeights& w, int64_t grid_w,
                                          const DwconvAttentionTiling& tiling = DwconvAttentionTiling());

// Output rows [row_begin, row_end) of one image's grid.  x: the image's grid tokens [grid_h · grid_w × c_in]
// (row-major grid, after any prefix tokens); residual: the same rows' shortcut [grid_h · grid_w × c_out] or nullptr;
// out: [grid_h · grid_w × c_out] (only rows [row_begin, row_end) · grid_w are written).  out must not alias x
// or residual (a width past the K block stores partial sums into out before the last block adds the residual).
void dwconv_attention_grid_rows(const DwconvAttentionWeights& w, int64_t grid_h, int64_t grid_w, int64_t row_begin,
                                int64_t row_end, const float* x, const float* residual, float* out, float* workspace,
                                CpuIsa isa, const DwconvAttentionTiling& tiling = DwconvAttentionTiling());

// The convolution alone, on values computed elsewhere (`dwconv_heads`: an int8 model's value GEMM).  taps: the
// kernel [width × ksize × ksize] transposed tap-major with rows of padded16(width) channels (dwconv_taps: the layout of
// DwconvAttentionWeights::taps).  Grid rows [row_begin, row_end) of U (u, row stride ldu >= width) from one image's
// grid values v [grid_h · grid_w × width] (row stride ldv), each band of rows copied with its halo into a padded
// buffer (zero pad channels; the row stride of band_ld) and convolved by the same per-row kernels as
// dwconv_attention_grid_rows, so U has those bits.  workspace: dwconv_conv_workspace_floats floats.
std::vector<float> dwconv_taps(const float* kernel, int64_t width, int64_t ksize);
int64_t dwconv_conv_workspace_floats(int64_t width, int64_t grid_w, int64_t ksize,
                                     const DwconvAttentionTiling& tiling = DwconvAttentionTiling());
void dwconv_conv_grid_rows(const float* taps, int64_t width, int64_t ksize, int64_t grid_h, int64_t grid_w,
                           int64_t row_begin, int64_t row_end, const float* v, int64_t ldv, float* u, int64_t ldu,
                           float* workspace, CpuIsa isa, const DwconvAttentionTiling& tiling = DwconvAttentionTiling());

// The prefix tokens of one image: all `prefix` rows of out get mean(V over the grid) · w_oᵀ + b_o + their residual.
// x_grid [hw × c_in]; residual [prefix × c_out] or nullptr; out [prefix × c_out], aliasing neither.
void dwconv_attention_prefix(const DwconvAttentionWeights& w, int64_t hw, int64_t prefix, const float* x_grid,
                             const float* residual, float* out, float* workspace, CpuIsa isa);

}  // namespace vitfast
