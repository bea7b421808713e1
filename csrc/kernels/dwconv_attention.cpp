#include "kernels/dwconv_attention.h"

#include <algorithm>
#include <cstring>

namespace vitfast {

DwconvAttentionWeights DwconvAttentionWeights::pack(const float* w_v, const float* b_v, const float* kernel,
                                                    const float* w_o, const float* b_o, int64_t c_in,
                                                    int64_t width, int64_t ksize, int64_t c_out) {
  DwconvAttentionWeights w;
  w.c_in_ = c_in;
  w.width_ = width;
  w.ksize_ = ksize;
  w.c_out_ = c_out;
  w.value_ = gemm::PackedB::pack_linear(w_v, width, c_in, c_in, b_v);
  w.output_ = gemm::PackedB::pack_linear(w_o, c_out, width, width, b_o);
  const int64_t taps = ksize * ksize;
  w.taps_.assign(size_t(taps * width), 0.0f);
  for (int64_t d = 0; d < width; ++d)
    for (int64_t t = 0; t < taps; ++t) w.taps_[size_t(t * width + d)] = kernel[d * taps + t];
  return w;
}

size_t DwconvAttentionWeights::bytes() const {
  return value_.bytes() + output_.bytes() + taps_.size() * sizeof(float);
}

namespace {

int64_t band_rows(int64_t grid_w, const DwconvAttentionTiling& tiling) {
  return std::max<int64_t>(1, tiling.token_tile / std::max<int64_t>(grid_w, 1));
}

// u[j] (+)= Σ_dc taps[dc] ⊙ v[j + dc] over one output grid row j ∈ [0, grid_w), one kernel row: the columns that
// would read outside the grid are skipped (zero padding).  Inner loop over contiguous channels (vectorised by
// the compiler for the baseline ISA; the convolution is < 1% of the op's FLOPs, the GEMMs carry the rest).
void conv_row(float* u, int64_t ldu, const float* v, int64_t ldv, const float* taps_row, int64_t width,
              int64_t grid_w, int64_t ksize) {
  const int64_t pad = ksize / 2;
  for (int64_t c = 0; c < ksize; ++c) {
    const int64_t dc = c - pad;
    const float* kt = taps_row + c * width;
    const int64_t j0 = std::max<int64_t>(0, -dc), j1 = std::min<int64_t>(grid_w, grid_w - dc);
    for (int64_t j = j0; j < j1; ++j) {
      float* __restrict uj = u + j * ldu;
      const float* __restrict vj = v + (j + dc) * ldv;
      for (int64_t d = 0; d < width; ++d) uj[d] += kt[d] * vj[d];
    }
  }
}

}  // namespace

int64_t dwconv_attention_workspace_floats(const DwconvAttentionWeights& w, int64_t grid_w,
                                          const DwconvAttentionTiling& tiling) {
  const int64_t band = band_rows(grid_w, tiling);
  const int64_t ld = w.value().padded_n();
  const int64_t v_rows = (band + w.ksize() - 1) * grid_w;  // the rolling V buffer: a band and its halo rows
  const int64_t u_rows = band * grid_w;
  return (v_rows + u_rows) * ld + ld + 2 * w.c_in();  // + the prefix path's mean row and V row
}

void dwconv_attention_grid_rows(const DwconvAttentionWeights& w, int64_t grid_h, int64_t grid_w, int64_t row_begin,
                                int64_t row_end, const float* x, const float* residual, float* out, float* workspace,
                                CpuIsa isa, const DwconvAttentionTiling& tiling) {
  row_begin = std::max<int64_t>(row_begin, 0);
  row_end = std::min(row_end, grid_h);
  if (row_begin >= row_end) return;
  const int64_t c_in = w.c_in(), c_out = w.c_out(), width = w.width(), ksize = w.ksize(), pad = ksize / 2;
  const int64_t ld = w.value().padded_n();
  const int64_t band = band_rows(grid_w, tiling);
  float* vbuf = workspace;                                  // grid rows [have_lo, have_hi) of V
  float* ubuf = workspace + (band + ksize - 1) * grid_w * ld;  // one band of U
  const int64_t row_floats = grid_w * ld;
  int64_t have_lo = 0, have_hi = 0;  // empty

  for (int64_t r0 = row_begin; r0 < row_end; r0 += band) {
    const int64_t r1 = std::min(r0 + band, row_end);
    const int64_t need_lo = std::max<int64_t>(0, r0 - pad), need_hi = std::min(grid_h, r1 + pad);
    int64_t start = need_lo;
    if (have_hi > need_lo && have_lo <= need_lo) {
      // The halo rows shared with the previous band: move them to the front, do not recompute them.
      std::memmove(vbuf, vbuf + (need_lo - have_lo) * row_floats, size_t((have_hi - need_lo) * row_floats) * 4);
      start = have_hi;
    }
    if (need_hi > start) {
      gemm::Epilogue ep;
      ep.bias = true;
      ep.c_padded = true;
      gemm::gemm((need_hi - start) * grid_w, x + start * grid_w * c_in, c_in, w.value(),
                 vbuf + (start - need_lo) * row_floats, ld, ep, isa, tiling.kc);
    }
    have_lo = need_lo;
    have_hi = need_hi;

    // Eq. 11 over the band: U[i, j] = Σ_(r,c) K[r, c] ⊙ V[i + r − pad, j + c − pad], rows outside the grid skipped.
    const int64_t m = (r1 - r0) * grid_w;
    for (int64_t i = r0; i < r1; ++i) {
      float* urow = ubuf + (i - r0) * row_floats;
      for (int64_t j = 0; j < grid_w; ++j) std::memset(urow + j * ld, 0, size_t(width) * sizeof(float));
      for (int64_t r = 0; r < ksize; ++r) {
        const int64_t src = i + r - pad;
        if (src < 0 || src >= grid_h) continue;
        conv_row(urow, ld, vbuf + (src - have_lo) * row_floats, ld, w.taps().data() + r * ksize * width, width,
                 grid_w, ksize);
      }
    }
    gemm::Epilogue ep;
    ep.bias = true;
    ep.addend = residual != nullptr ? residual + r0 * grid_w * c_out : nullptr;
    ep.ld_addend = c_out;
    gemm::gemm(m, ubuf, ld, w.output(), out + r0 * grid_w * c_out, c_out, ep, isa, tiling.kc);
  }
}

void dwconv_attention_prefix(const DwconvAttentionWeights& w, int64_t hw, int64_t prefix, const float* x_grid,
                             const float* residual, float* out, float* workspace, CpuIsa isa) {
  if (prefix <= 0) return;
  const int64_t c_in = w.c_in(), c_out = w.c_out();
  float* mean = workspace;           // [c_in]
  float* vmean = workspace + c_in;   // [padded width]
  std::vector<double> acc(size_t(c_in), 0.0);
  for (int64_t t = 0; t < hw; ++t)
    for (int64_t c = 0; c < c_in; ++c) acc[size_t(c)] += x_grid[t * c_in + c];
  for (int64_t c = 0; c < c_in; ++c) mean[c] = hw > 0 ? float(acc[size_t(c)] / double(hw)) : 0.0f;
  gemm::Epilogue ev;
  ev.bias = true;
  ev.c_padded = true;
  gemm::gemm(1, mean, c_in, w.value(), vmean, w.value().padded_n(), ev, isa);
  for (int64_t p = 0; p < prefix; ++p) {
    gemm::Epilogue eo;
    eo.bias = true;
    eo.addend = residual != nullptr ? residual + p * c_out : nullptr;
    eo.ld_addend = c_out;
    gemm::gemm(1, vmean, w.value().padded_n(), w.output(), out + p * c_out, c_out, eo, isa);
  }
}

}  // namespace vitfast
