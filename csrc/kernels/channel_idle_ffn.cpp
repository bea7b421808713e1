#include "kernels/channel_idle_ffn.h"

#include <algorithm>

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
  // The fp32 pack's split and bias folding (ChannelIdleFfnWeights::pack).
  if (active > 0) {
    w.act_ = PackedBf16B::pack_linear(w_in, active, c_in, c_in, b_in);
    w.out_ = PackedBf16B::pack_linear(w_out, c_out, active, active, linear == 0 ? b_out : nullptr);
  }
  if (linear > 0) {
    w.lin_ = PackedBf16B::pack_linear(w_in + active * c_in, linear, c_in, c_in,
                                      b_in != nullptr ? b_in + active : nullptr);
    if (b_out != nullptr) w.lin_.add_to_bias(b_out);
  }
  if (active == 0 && linear == 0 && b_out != nullptr) w.bias_only_.assign(b_out, b_out + c_out);
  return w;
}

size_t ChannelIdleFfnBf16Weights::bytes() const {
  return act_.bytes() + lin_.bytes() + out_.bytes() + bias_only_.size() * sizeof(float);
}

int64_t channel_idle_ffn_workspace_floats(const ChannelIdleFfnBf16Weights& w, const ChannelIdleFfnTiling& tiling) {
  // The bf16 h_act tile (padded rows: the GELU epilogue stores whole panels), in floats.
  const int64_t tile = max_tile_rows(tiling) * (w.active() > 0 ? w.act().padded_n() : 0);
  return (tile + 1) / 2;
}

void channel_idle_ffn_rows_bf16(const ChannelIdleFfnBf16Weights& w, int64_t rows, const uint16_t* x, int64_t ldx,
                                const float* residual, float* out, float* workspace, gemm16::Bf16Kernel kernel,
                                const ChannelIdleFfnTiling& tiling, uint16_t* out16) {
  if (rows <= 0) return;
  const int64_t c_out = w.c_out(), active = w.active();
  const bool has_linear = w.linear() > 0;
  if (active == 0 && !has_linear) {
    const std::vector<float>& b = w.bias_only();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < c_out; ++j)
        out[r * c_out + j] = (b.empty() ? 0.0f : b[j]) + (residual ? residual[r * c_out + j] : 0.0f);
    if (out16 != nullptr) gemm16::narrow_to_bf16(out, rows * c_out, out16, kernel);
    return;
  }
  // Balanced token tiles, as channel_idle_ffn_rows.
  const int64_t max_rows = max_tile_rows(tiling);
  const int64_t n_tiles = (rows + max_rows - 1) / max_rows;
  const int64_t tile_rows = std::min(max_rows, round_up((rows + n_tiles - 1) / n_tiles, gemm::kMr));
  const int64_t ld_h = active > 0 ? w.act().padded_n() : 0;  // a multiple of 16: even, as bf16 rows must be
  uint16_t* h16 = reinterpret_cast<uint16_t*>(workspace);

  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t m = std::min(tile_rows, rows - r0);
    const uint16_t* xt = x + r0 * ldx;
    const float* rt = residual != nullptr ? residual + r0 * c_out : nullptr;
    float* ot = out + r0 * c_out;
    uint16_t* ot16 = out16 != nullptr ? out16 + r0 * c_out : nullptr;  // the last GEMM's bf16 copy of ot
    if (active > 0) {
      gemm::Epilogue ep;
      ep.bias = true;
      ep.gelu = true;
      ep.c_padded = true;
      // GELU's output straight to bf16 (the epilogue's c16: convert_rows' bits, no fp32 tile in between).  Padding
      // columns are GELU(0 + 0) = 0 and meet zero weights: whole padded rows are exact.
      ep.c16 = h16;
      ep.ldc16 = ld_h;
      gemm16::gemm_bf16(m, xt, ldx, w.act(), nullptr, ld_h, ep, kernel);
    }
    if (has_linear) {
      gemm::Epilogue ep;
      ep.bias = true;
      ep.addend = rt;
      ep.ld_addend = c_out;
      if (active == 0) {
        ep.c16 = ot16;
        ep.ldc16 = c_out;
      }
      gemm16::gemm_bf16(m, xt, ldx, w.lin(), ot, c_out, ep, kernel);
    }
    if (active > 0) {
      gemm::Epilogue ep;
      if (has_linear) {
        ep.accumulate = true;
      } else {
        ep.bias = true;
        ep.addend = rt;
        ep.ld_addend = c_out;
      }
      ep.c16 = ot16;
      ep.ldc16 = c_out;
      gemm16::gemm_bf16(m, h16, ld_h, w.out(), ot, c_out, ep, kernel);
    }
  }
}

}  // namespace vitfast
