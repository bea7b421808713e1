// RePaViT channel-idle FFN at inference (RePaViT eq. 6, with its BatchNorms and shortcut folded, eq. 3-5):
//
//   h   = x · w_inᵀ + b_in                         [rows × (A + L)]: A activated channels, then L linear
//   out = GELU(h[:, :A]) · w_outᵀ + h[:, A:] + b_out + residual      (h[:, A:] only when L = C_out)
//
// Torch-free.  Weights are packed once (`ChannelIdleFfnWeights`) into three GEMM operands:
//   act = W_in[:A]ᵀ with b_in[:A]            epilogue: + bias, GELU              -> h_act scratch tile
//   lin = W_in[A:]ᵀ with b_in[A:] + b_out    epilogue: + bias, + residual        -> out (the linear path
//                                                        Y·W̃ of eq. 6, written straight into the output)
//   out = W_outᵀ                              epilogue: accumulate onto out      (L = 0: + b_out + residual)
// and `channel_idle_ffn_rows` runs one pass over token tiles: for each tile of ≤ token_tile rows the three
// GEMMs run back to back, so the tile of h_act (and of out) is still in L2 when the second GEMM reads it.
// θ = 1 (A = 0) is one GEMM; θ = 0 / the LayerNorm variant (L = 0) has no linear path.
//
// No threads here: the binding splits rows between threads and gives each its own workspace.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16.h"

namespace vitfast {

// Cache/tiling parameters; the defaults were tuned for a core with 32 KiB L1D, 1 MiB L2 and 32 MiB L3.  Every token
// tile streams all the weights once (from L3: 7 MiB for DeiT-B), so bigger tiles mean fewer weight passes:
// 198 rows (one ViT image, N = 197, in one pass) measured 2-8% faster than 96 at batch 1 and equal at batch 8.
// The scratch is token_tile × A floats per thread (0.6 MiB for DeiT-B at θ = 0.75).  Tests shrink both so
// that small shapes still cover several token tiles and K blocks.
struct ChannelIdleFfnTiling {
  int64_t token_tile = 198;           // rows per pass (rounded to a multiple of gemm::kMr)
  int64_t kc = gemm::kDefaultKc;      // K block of both GEMMs
};

class ChannelIdleFfnWeights {
 public:
  ChannelIdleFfnWeights() = default;
  // w_in [active + linear, c_in] (row-major, activated rows first), b_in [active + linear] or nullptr,
  // w_out [c_out, active] (row-major), b_out [c_out] or nullptr.  linear must be 0 or c_out.
  static ChannelIdleFfnWeights pack(const float* w_in, const float* b_in, const float* w_out,
                                    const float* b_out, int64_t c_in, int64_t active, int64_t linear,
                                    int64_t c_out);

  int64_t c_in() const { return c_in_; }
  int64_t active() const { return active_; }
  int64_t linear() const { return linear_; }
  int64_t c_out() const { return c_out_; }
  size_t bytes() const;

  const gemm::PackedB& act() const { return act_; }
  const gemm::PackedB& lin() const { return lin_; }
  const gemm::PackedB& out() const { return out_; }
  // Only used when A = 0 and L = 0 (the output is b_out + residual): b_out, empty when absent.
  const std::vector<float>& bias_only() const { return bias_only_; }

 private:
  int64_t c_in_ = 0, active_ = 0, linear_ = 0, c_out_ = 0;
  gemm::PackedB act_, lin_, out_;
  std::vector<float> bias_only_;
};

// Floats of scratch that one concurrent caller of channel_idle_ffn_rows must provide.
int64_t channel_idle_ffn_workspace_floats(const ChannelIdleFfnWeights& w,
                                          const ChannelIdleFfnTiling& tiling = ChannelIdleFfnTiling());

// Rows [0, rows) of the op, on the calling thread.  x [rows × c_in], residual [rows × c_out] or nullptr,
// out [rows × c_out]: contiguous rows.  `workspace`: channel_idle_ffn_workspace_floats(w, tiling) floats,
// 64-byte aligned preferred.  out must not alias x or residual.
void channel_idle_ffn_rows(const ChannelIdleFfnWeights& w, int64_t rows, const float* x, const float* residual,
                           float* out, float* workspace, CpuIsa isa,
                           const ChannelIdleFfnTiling& tiling = ChannelIdleFfnTiling());

// The same FFN on the bf16 GEMMs (gemm_bf16.h): x read as bf16 rows, h_act = GELU(...) made in fp32 by the first
// GEMM's epilogue and stored only as its bf16 rounding (convert_rows' bits); the linear path, the residual and out in
// fp32.  With both paths (A > 0 and L = C_out) the second GEMM and the linear path are one GEMM over the two operands
// side by side, K = h_cols() + C_in:
//
//   act = W_in[:A]ᵀ with b_in[:A]                          epilogue: + bias, GELU, bf16 -> h_act columns of [h_act | x]
//   cat = [W_out | 0 | W_in[A:]]ᵀ with b_in[A:] + b_out    epilogue: + bias, + residual -> out (and/or its bf16 copy)
//
// so out is stored once, from one accumulator per output, instead of written by the linear path and read back, added
// to and stored again by the second GEMM (csrc/bench/bench_gemm_bf16.cpp "DeiT-B FFN output": 1059 -> 1025 µs with
// a bf16-only out, 197 × 1536 × 768, one core).  h_act's padding columns [A, h_cols()) are GELU(0 + 0) = 0 and meet
// zero weights.  One path alone keeps its own GEMMs (act then out; lin).
class ChannelIdleFfnBf16Weights {
 public:
  ChannelIdleFfnBf16Weights() = default;
  // Arguments as ChannelIdleFfnWeights::pack (fp32 values; bf16 weights converted to fp32 round-trip exactly).
  static ChannelIdleFfnBf16Weights pack(const float* w_in, const float* b_in, const float* w_out,
                                        const float* b_out, int64_t c_in, int64_t active, int64_t linear,
                                        int64_t c_out);

  int64_t c_in() const { return c_in_; }
  int64_t active() const { return active_; }
  int64_t linear() const { return linear_; }
  int64_t c_out() const { return c_out_; }
  size_t bytes() const;
  // The h_act columns in front of x in the second GEMM's operand rows (a multiple of 16), or 0 when there is no such
  // GEMM (A = 0 or L = 0).
  int64_t h_cols() const { return linear_ > 0 && active_ > 0 ? act_.padded_n() : 0; }

  const gemm16::PackedBf16B& act() const { return act_; }  // A > 0
  const gemm16::PackedBf16B& lin() const { return lin_; }  // A = 0, L > 0
  const gemm16::PackedBf16B& out() const { return out_; }  // A > 0, L = 0
  const gemm16::PackedBf16B& cat() const { return cat_; }  // A > 0, L > 0
  const std::vector<float>& bias_only() const { return bias_only_; }

 private:
  int64_t c_in_ = 0, active_ = 0, linear_ = 0, c_out_ = 0;
  gemm16::PackedBf16B act_, lin_, out_, cat_;
  std::vector<float> bias_only_;
};

// Floats of scratch per concurrent caller of channel_idle_ffn_rows_bf16: one token tile of bf16 h_act, or of
// [h_act | x] rows when x does not come with room for h_act (x_has_h_room below).
int64_t channel_idle_ffn_workspace_floats(const ChannelIdleFfnBf16Weights& w,
                                          const ChannelIdleFfnTiling& tiling = ChannelIdleFfnTiling());

// Rows [0, rows): x [rows × c_in] bf16 rows ldx apart (ldx even, pad elements zero: gemm16::convert_rows),
// residual [rows × c_out] fp32 or nullptr, out [rows × c_out] fp32; workspace 64-byte aligned.  out16 != nullptr
// (c_out even): out rounded to bf16 there as well (c_out apart, convert_rows' bits), by the last GEMM's epilogue;
// out may then be nullptr (only the bf16 result wanted: no fp32 store).  x_has_h_room: the w.h_cols() bf16 values
// before each x row are scratch this call may write (x is the right part of [h_act | x] rows, ldx ≥ h_cols() +
// c_in), so the second GEMM reads its operand in place; otherwise x is copied beside h_act in the workspace.
void channel_idle_ffn_rows_bf16(const ChannelIdleFfnBf16Weights& w, int64_t rows, const uint16_t* x, int64_t ldx,
                                const float* residual, float* out, float* workspace, gemm16::Bf16Kernel kernel,
                                const ChannelIdleFfnTiling& tiling = ChannelIdleFfnTiling(),
                                uint16_t* out16 = nullptr, bool x_has_h_room = false);

}  // namespace vitfast
