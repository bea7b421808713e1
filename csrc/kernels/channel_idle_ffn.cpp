#include "kernels/channel_idle_ffn.h"

#include <algorithm>
#include <cstring>

namespace vitfast {

ChannelIdleFfnWeights ChannelIdleFfnWeights::pack(const float* w_in, const float* b_in, const float* w_out,
                                                  const float* b_out, int64_t c_in, int64_t active,
                                                  int64_t linear, int64_t c_out) {
  ChannelIdleFfnWeights w;
  w.c_in_ = c_in;
  w.active_ = active;
  w.linear_ = linear;
  w.c_out_ = c_out;
  if (active > 0) {
    w.act_ = gemm::PackedB::pack_linear(w_in, active, c_in, c_in, b_in);
    // b_out goes with the GEMM that writes out first: the linear path when there is one, else this one.
    w.out_ = gemm::PackedB::pack_linear(w_out, c_out, active, active, linear == 0 ? b_out : nullptr);
  }
  if (linear > 0) {
    w.lin_ = gemm::PackedB::pack_linear(w_in + active * c_in, linear, c_in, c_in,
                                        b_in != nullptr ? b_in + active : nullptr);
    // out = h_lin + b_out + ...: fold b_out into the linear path's bias (one add per output, not two).
    if (b_out != nullptr) w.lin_.add_to_bias(b_out);
  }
  if (active == 0 && linear == 0 && b_out != nullptr) w.bias_only_.assign(b_out, b_out + c_out);
  return w;
}

size_t ChannelIdleFfnWeights::bytes() const {
  return act_.bytes() + lin_.bytes() + out_.bytes() + bias_only_.size() * sizeof(float);
}

namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

int64_t max_tile_rows(const ChannelIdleFfnTiling& tiling) {
  return round_up(std::max<int64_t>(tiling.token_tile, 1), gemm::kMr);
}

}  // namespace

int64_t channel_idle_ffn_workspace_floats(const ChannelIdleFfnWeights& w, const ChannelIdleFfnTiling& tiling) {
  // One token tile of h_act, rows padded to whole panels (the GELU epilogue stores whole panels there).
  return w.active() > 0 ? max_tile_rows(tiling) * w.act().padded_n() : 0;
}

void channel_idle_ffn_rows(const ChannelIdleFfnWeights& w, int64_t rows, const float* x, const float* residual,
                           float* out, float* workspace, CpuIsa isa, const ChannelIdleFfnTiling& tiling) {
  if (rows <= 0) return;
  const int64_t c_in = w.c_in(), c_out = w.c_out(), active = w.active();
  const bool has_linear = w.linear() > 0;

  if (active == 0 && !has_linear) {
    // No GEMM at all (degenerate but well defined): out = b_out + residual, or zeros.
    const std::vector<float>& b = w.bias_only();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < c_out; ++j)
        out[r * c_out + j] = (b.empty() ? 0.0f : b[j]) + (residual ? residual[r * c_out + j] : 0.0f);
    return;
  }

  // Balanced token tiles: 394 rows with a 198-row tile become 198 + 196, and 400 rows become
  // 138 + 138 + 124, not 198 + 198 + 4 (a 4-row tile would stream every weight panel for very little work).
  const int64_t max_rows = max_tile_rows(tiling);
  const int64_t n_tiles = (rows + max_rows - 1) / max_rows;
  const int64_t tile_rows = std::min(max_rows, round_up((rows + n_tiles - 1) / n_tiles, gemm::kMr));
  const int64_t ld_h = active > 0 ? w.act().padded_n() : 0;

  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t m = std::min(tile_rows, rows - r0);
    const float* xt = x + r0 * c_in;
    const float* rt = residual != nullptr ? residual + r0 * c_out : nullptr;
    float* ot = out + r0 * c_out;

    if (active > 0) {
      // First GEMM, activated columns: h_act = GELU(x · W_actᵀ + b_act), into the padded scratch tile.
      gemm::Epilogue ep;
      ep.bias = true;
      ep.gelu = true;
      ep.c_padded = true;
      gemm::gemm(m, xt, c_in, w.act(), workspace, ld_h, ep, isa, tiling.kc);
    }
    if (has_linear) {
      // First GEMM, linear columns, straight into out: out = x · W_linᵀ + (b_lin + b_out) + residual.
      gemm::Epilogue ep;
      ep.bias = true;
      ep.addend = rt;
      ep.ld_addend = c_out;
      gemm::gemm(m, xt, c_in, w.lin(), ot, c_out, ep, isa, tiling.kc);
    }
    if (active > 0) {
      // Second GEMM reads h_act from the scratch tile (still in L2) and accumulates onto the linear path;
      // with no linear path it writes out itself, with b_out and the residual.
      gemm::Epilogue ep;
      if (has_linear) {
        ep.accumulate = true;
      } else {
        ep.bias = true;
        ep.addend = rt;
        ep.ld_addend = c_out;
      }
      gemm::gemm(m, workspace, ld_h, w.out(), ot, c_out, ep, isa, tiling.kc);
    }
  }
}

ChannelIdleFfnBf16Weights ChannelIdleFfnBf16Weights::pack(const float* w_in, const float* b_in, const float* w_out,
                                                          const float* b_out, int64_t c_in, int64_t active,
                                                          int64_t linear, int64_t c_out) {
  using gemm16::PackedBf16B;
  ChannelIdleFfnBf16Weights w;
  w.c_in_ = c_in;
  w.active_ = active;
  w.linear_ = linear;
  w.c_out_ = c_out;
  if (active > 0) w.act_ = PackedBf16B::pack_linear(w_in, active, c_in, c_in, b_in);
  if (active > 0 && linear > 0) {
    // [W_out | 0 | W_lin] rows (the h_act columns padded to h_cols()), bias b_lin + b_out as the linear path's.
    const int64_t h = w.act_.padded_n(), k = h + c_in;
    std::vector<float> cat(size_t(c_out * k), 0.0f);
    for (int64_t j = 0; j < c_out; ++j) {
      std::copy(w_out + j * active, w_out + (j + 1) * active, cat.begin() + j * k);
      std::copy(w_in + (active + j) * c_in, w_in + (active + j + 1) * c_in, cat.begin() + j * k + h);
    }
    w.cat_ = PackedBf16B::pack_linear(cat.data(), c_out, k, k, b_in != nullptr ? b_in + active : nullptr);
    if (b_out != nullptr) w.cat_.add_to_bias(b_out);
  } else if (active > 0) {
    w.out_ = PackedBf16B::pack_linear(w_out, c_out, active, active, b_out);
  } else if (linear > 0) {
    // The fp32 pack's folding: out = h_lin + b_out + ..., b_out added to the linear path's bias once.
    w.lin_ = PackedBf16B::pack_linear(w_in, linear, c_in, c_in, b_in);
    if (b_out != nullptr) w.lin_.add_to_bias(b_out);
  }
  if (active == 0 && linear == 0 && b_out != nullptr) w.bias_only_.assign(b_out, b_out + c_out);
  return w;
}

size_t ChannelIdleFfnBf16Weights::bytes() const {
  return act_.bytes() + lin_.bytes() + out_.bytes() + cat_.bytes() + bias_only_.size() * sizeof(float);
}

namespace {
// bf16 values in one workspace row: h_act, then (with both paths) a copy of x beside it.
int64_t bf16_workspace_row(const ChannelIdleFfnBf16Weights& w) {
  const int64_t h = w.active() > 0 ? w.act().padded_n() : 0;
  return w.h_cols() > 0 ? h + gemm16::padded_k(w.c_in()) : h;
}
}  // namespace

int64_t channel_idle_ffn_workspace_floats(const ChannelIdleFfnBf16Weights& w, const ChannelIdleFfnTiling& tiling) {
  return (max_tile_rows(tiling) * bf16_workspace_row(w) + 1) / 2;
}

void channel_idle_ffn_rows_bf16(const ChannelIdleFfnBf16Weights& w, int64_t rows, const uint16_t* x, int64_t ldx,
                                const float* residual, float* out, float* workspace, gemm16::Bf16Kernel kernel,
                                const ChannelIdleFfnTiling& tiling, uint16_t* out16, bool x_has_h_room) {
  if (rows <= 0) return;
  const int64_t c_in = w.c_in(), c_out = w.c_out(), active = w.active(), h_cols = w.h_cols();
  if (active == 0 && w.linear() == 0) {
    const std::vector<float>& b = w.bias_only();
    std::vector<float> row(static_cast<size_t>(c_out));
    for (int64_t r = 0; r < rows; ++r) {
      float* o = out != nullptr ? out + r * c_out : row.data();
      for (int64_t j = 0; j < c_out; ++j)
        o[j] = (b.empty() ? 0.0f : b[j]) + (residual ? residual[r * c_out + j] : 0.0f);
      if (out16 != nullptr) gemm16::narrow_to_bf16(o, c_out, out16 + r * c_out, kernel);
    }
    return;
  }
  // Balanced token tiles, as channel_idle_ffn_rows.
  const int64_t max_rows = max_tile_rows(tiling);
  const int64_t n_tiles = (rows + max_rows - 1) / max_rows;
  const int64_t tile_rows = std::min(max_rows, round_up((rows + n_tiles - 1) / n_tiles, gemm::kMr));
  uint16_t* ws16 = reinterpret_cast<uint16_t*>(workspace);
  // Where h_act goes and how far apart its rows are: in front of x in place, beside a copy of x, or alone.
  const bool in_place = h_cols > 0 && x_has_h_room;
  const int64_t ld_h = in_place ? ldx : bf16_workspace_row(w);  // even, as bf16 rows must be
  const int64_t kx = gemm16::padded_k(c_in);

  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t m = std::min(tile_rows, rows - r0);
    const uint16_t* xt = x + r0 * ldx;
    int64_t ldxt = ldx;
    const float* rt = residual != nullptr ? residual + r0 * c_out : nullptr;
    float* ot = out != nullptr ? out + r0 * c_out : nullptr;
    uint16_t* ot16 = out16 != nullptr ? out16 + r0 * c_out : nullptr;  // the last GEMM's bf16 copy of ot
    uint16_t* h16 = in_place ? const_cast<uint16_t*>(xt) - h_cols : ws16;
    if (h_cols > 0 && !in_place) {
      // x beside h_act: the second GEMM's operand rows [h_act | x] (pad zero, as convert_rows leaves it).
      for (int64_t i = 0; i < m; ++i) {
        uint16_t* dst = ws16 + i * ld_h + h_cols;
        std::memcpy(dst, xt + i * ldx, size_t(c_in) * 2);
        if (kx > c_in) dst[c_in] = 0;
      }
      xt = ws16 + h_cols;
      ldxt = ld_h;
    }
    // The last GEMM's epilogue: + bias (b_out folded in) + residual, to out and/or its bf16 copy.
    gemm::Epilogue last;
    last.bias = true;
    last.addend = rt;
    last.ld_addend = c_out;
    last.c16 = ot16;
    last.ldc16 = c_out;
    if (active > 0) {
      gemm::Epilogue ep;
      ep.bias = true;
      ep.gelu = true;
      ep.c_padded = true;
      // GELU's output straight to bf16 (the epilogue's c16: convert_rows' bits, no fp32 tile in between).  Padding
      // columns are GELU(0 + 0) = 0 and meet zero weights: whole padded rows are exact.
      ep.c16 = h16;
      ep.ldc16 = ld_h;
      gemm16::gemm_bf16(m, xt, ldxt, w.act(), nullptr, ld_h, ep, kernel);
      if (h_cols > 0)
        gemm16::gemm_bf16(m, h16, ld_h, w.cat(), ot, c_out, last, kernel);
      else
        gemm16::gemm_bf16(m, h16, ld_h, w.out(), ot, c_out, last, kernel);
    } else {
      gemm16::gemm_bf16(m, xt, ldxt, w.lin(), ot, c_out, last, kernel);
    }
  }
}

}  // namespace vitfast
