#include "kernels/dwconv_attention.h"

#include <algorithm>
#include <cstring>

#include "kernels/dwconv_isa.h"

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
  w.taps_ = dwconv_taps(kernel, width, ksize);
  return w;
}

std::vector<float> dwconv_taps(const float* kernel, int64_t width, int64_t ksize) {
  const int64_t taps = ksize * ksize, ld = (width + gemm::kNr - 1) / gemm::kNr * gemm::kNr;
  // Rows padded to V's padded width with zero taps: the SIMD rows run over whole 16-channel slices (V's padding
  // columns are zeros, so U's are too, and the output GEMM never reads them).
  std::vector<float> out(size_t(taps * ld), 0.0f);
  for (int64_t d = 0; d < width; ++d)
    for (int64_t t = 0; t < taps; ++t) out[size_t(t * ld + d)] = kernel[d * taps + t];
  return out;
}

size_t DwconvAttentionWeights::bytes() const {
  return value_.bytes() + output_.bytes() + taps_.size() * sizeof(float);
}

namespace {

// Row stride (floats) of the V and U band buffers: V's padded width, plus one 16-float line when that is an even
// number of lines.  With D = 1024 an unpadded token row is 4 KiB, so every token of a 16-channel slice maps to
// the same L1 set (and to the same 4 KiB alias as the U stores): the convolution ran 3.5× slower (0.61 vs 0.18 ms
// per 24×24 grid, D = 1024, AVX-512).  An odd number of lines spreads consecutive tokens over all sets.
int64_t band_ld(int64_t padded_width) {
  return (padded_width / gemm::kNr) % 2 == 0 ? padded_width + gemm::kNr : padded_width;
}
int64_t band_ld(const DwconvAttentionWeights& w) { return band_ld(w.value().padded_n()); }
int64_t padded16(int64_t n) { return (n + gemm::kNr - 1) / gemm::kNr * gemm::kNr; }

// Row stride of the copy of x the value GEMM reads, or 0 for "read x in place".  When a token row of x is a
// multiple of 4 KiB (C = 1024, 2048: ViT-L, ViT-H's value input), the AVX-512 GEMM's 14-row A tile broadcasts
// from 14 rows in one L1 set (8 ways): measured 13.6 vs 10.9 ms for 576×1024×1024 on AVX-512.  Copying the
// band's rows to a stride one line longer costs ~2% of that GEMM's time.
int64_t x_copy_ld(int64_t c_in) { return c_in % 1024 == 0 ? c_in + gemm::kNr : 0; }

int64_t band_rows(int64_t grid_w, const DwconvAttentionTiling& tiling) {
  return std::max<int64_t>(1, tiling.token_tile / std::max<int64_t>(grid_w, 1));
}

void conv_grid_row(float* u, const float* const* rows, const float* taps, int64_t cols, int64_t ld, int64_t grid_w,
                   int64_t ksize, CpuIsa isa) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case CpuIsa::kAvx512: dwconv::conv_grid_row_avx512(u, rows, taps, cols, ld, grid_w, ksize); return;
    case CpuIsa::kAvx2: dwconv::conv_grid_row_avx2(u, rows, taps, cols, ld, grid_w, ksize); return;
#endif
    default: dwconv::conv_grid_row_scalar(u, rows, taps, cols, ld, grid_w, ksize); return;
  }
}

}  // namespace

int64_t dwconv_attention_workspace_floats(const DwconvAttentionWeights& w, int64_t grid_w,
                                          const DwconvAttentionTiling& tiling) {
  const int64_t band = band_rows(grid_w, tiling);
  const int64_t ld = band_ld(w);
  const int64_t v_rows = (band + w.ksize() - 1) * grid_w;  // the rolling V buffer: a band and its halo rows
  const int64_t u_rows = band * grid_w;
  const int64_t x_copy = v_rows * x_copy_ld(w.c_in());  // the padded copy of the band's x rows, if any
  return (v_rows + u_rows) * ld + ld + 2 * w.c_in() + x_copy;  // + the prefix path's mean row and V row
}

void dwconv_attention_grid_rows(const DwconvAttentionWeights& w, int64_t grid_h, int64_t grid_w, int64_t row_begin,
                                int64_t row_end, const float* x, const float* residual, float* out, float* workspace,
                                CpuIsa isa, const DwconvAttentionTiling& tiling) {
  row_begin = std::max<int64_t>(row_begin, 0);
  row_end = std::min(row_end, grid_h);
  if (row_begin >= row_end) return;
  const int64_t c_in = w.c_in(), c_out = w.c_out(), ksize = w.ksize(), pad = ksize / 2;
  const int64_t ld = band_ld(w), cols = w.value().padded_n();
  const int64_t band = band_rows(grid_w, tiling);
  float* vbuf = workspace;                                  // grid rows [have_lo, have_hi) of V
  float* ubuf = workspace + (band + ksize - 1) * grid_w * ld;  // one band of U
  const int64_t ldx = x_copy_ld(c_in);
  float* xbuf = ubuf + band * grid_w * ld;  // the band's x rows at stride ldx (when ldx > 0)
  const int64_t row_floats = grid_w * ld;
  int64_t have_lo = 0, have_hi = 0;  // empty
  std::vector<const float*> rows(static_cast<size_t>(ksize));  // the k V rows one output grid row reads (nullptr: padding)

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
      const int64_t tokens = (need_hi - start) * grid_w;
      const float* a = x + start * grid_w * c_in;
      int64_t lda = c_in;
      if (ldx > 0) {
        for (int64_t t = 0; t < tokens; ++t) std::memcpy(xbuf + t * ldx, a + t * c_in, size_t(c_in) * sizeof(float));
        a = xbuf;
        lda = ldx;
      }
      gemm::gemm(tokens, a, lda, w.value(), vbuf + (start - need_lo) * row_floats, ld, ep, isa, tiling.kc);
    }
    have_lo = need_lo;
    have_hi = need_hi;

    // Eq. 11 over the band: U[i, j] = Σ_(r,c) K[r, c] ⊙ V[i + r − pad, j + c − pad], rows outside the grid skipped.
    const int64_t m = (r1 - r0) * grid_w;
    for (int64_t i = r0; i < r1; ++i) {
      for (int64_t r = 0; r < ksize; ++r) {
        const int64_t src = i + r - pad;
        rows[r] = src < 0 || src >= grid_h ? nullptr : vbuf + (src - have_lo) * row_floats;
      }
      conv_grid_row(ubuf + (i - r0) * row_floats, rows.data(), w.taps().data(), cols, ld, grid_w, ksize, isa);
    }
    gemm::Epilogue ep;
    ep.bias = true;
    ep.addend = residual != nullptr ? residual + r0 * grid_w * c_out : nullptr;
    ep.ld_addend = c_out;
    gemm::gemm(m, ubuf, ld, w.output(), out + r0 * grid_w * c_out, c_out, ep, isa, tiling.kc);
  }
}

int64_t dwconv_conv_workspace_floats(int64_t width, int64_t grid_w, int64_t ksize, const DwconvAttentionTiling& tiling) {
  const int64_t band = band_rows(grid_w, tiling), ld = band_ld(padded16(width));
  return ((band + ksize - 1) * grid_w + band * grid_w) * ld;  // a band of V with its halo rows, a band of U
}

void dwconv_conv_grid_rows(const float* taps, int64_t width, int64_t ksize, int64_t grid_h, int64_t grid_w,
                           int64_t row_begin, int64_t row_end, const float* v, int64_t ldv, float* u, int64_t ldu,
                           float* workspace, CpuIsa isa, const DwconvAttentionTiling& tiling) {
  row_begin = std::max<int64_t>(row_begin, 0);
  row_end = std::min(row_end, grid_h);
  if (row_begin >= row_end || width <= 0) return;
  const int64_t pad = ksize / 2, cols = padded16(width), ld = band_ld(cols), band = band_rows(grid_w, tiling);
  const int64_t row_floats = grid_w * ld;
  float* vbuf = workspace;
  float* ubuf = workspace + (band + ksize - 1) * row_floats;
  std::vector<const float*> rows(static_cast<size_t>(ksize));
  for (int64_t r0 = row_begin; r0 < row_end; r0 += band) {
    const int64_t r1 = std::min(r0 + band, row_end);
    const int64_t need_lo = std::max<int64_t>(0, r0 - pad), need_hi = std::min(grid_h, r1 + pad);
    for (int64_t t = 0; t < (need_hi - need_lo) * grid_w; ++t) {  // the band's V rows, zero pad channels
      float* dst = vbuf + t * ld;
      std::memcpy(dst, v + (need_lo * grid_w + t) * ldv, size_t(width) * sizeof(float));
      std::fill(dst + width, dst + cols, 0.0f);
    }
    for (int64_t i = r0; i < r1; ++i) {
      for (int64_t r = 0; r < ksize; ++r) {
        const int64_t src = i + r - pad;
        rows[r] = src < 0 || src >= grid_h ? nullptr : vbuf + (src - need_lo) * row_floats;
      }
      conv_grid_row(ubuf + (i - r0) * row_floats, rows.data(), taps, cols, ld, grid_w, ksize, isa);
    }
    for (int64_t t = 0; t < (r1 - r0) * grid_w; ++t)
      std::memcpy(u + (r0 * grid_w + t) * ldu, ubuf + t * ld, size_t(width) * sizeof(float));
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
