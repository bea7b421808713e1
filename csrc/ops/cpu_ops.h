// The CPU ops' bodies after argument checking, shared by their own torch bindings (ops/<op>.cpp) and by the
// whole-block op (ops/vit_block.cpp), so a block run as one call computes exactly what the op-by-op path
// computes: same packed weights (the same cache entries), same thread split, same kernels, same bits.
//
// All fp32, row-major, on torch's intra-op threads (at::parallel_for, so torch.set_num_threads is respected).
// The callers have checked shapes, dtypes and devices; pointers may not alias unless stated.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "kernels/channel_idle_ffn.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16.h"

namespace vitfast {
namespace ops {

// channel_idle_ffn's argument check (ValueError / TypeError worded like vitfast.reference.channel_idle_ffn): A, L and C_out.
struct ChannelIdleFfnDims {
  int64_t active, linear, c_out;
};
ChannelIdleFfnDims check_channel_idle_ffn_args(const at::Tensor& x, const at::Tensor& w_in, const at::Tensor& b_in,
                                               const at::Tensor& w_out, const at::Tensor& b_out,
                                               const at::Tensor& residual);

// attention's (and attention_int8's) argument check (ValueError worded like vitfast.reference.attention): the head dim.
int64_t check_attention_args(const at::Tensor& qkv, int64_t num_heads, const std::optional<double>& scale);

// The attention ops' shared start (attention, attention_bf16, attention_int8): the argument check, the device, and
// qkv as fp32 rows the kernels read in place — uniformly strided with a unit inner stride, as the qkv Linear's
// output and slices of it are — or else its contiguous fp32 copy.  With B or N = 0 nothing is converted (`empty`:
// the op returns an empty output).  `scale`: the default 1 / sqrt(D) in fp32, as the reference computes it.
struct AttentionInput {
  at::Tensor src;
  int64_t batch, tokens, heads, d, attn_dim, ld_qkv;
  float scale;
  bool empty() const { return batch == 0 || tokens == 0; }
};
AttentionInput attention_input(const at::Tensor& qkv, int64_t num_heads, const std::optional<double>& scale);

// Packed weights from the process-wide cache (ops/weight_cache.h): validated (finite) and packed on a miss.
// weight_name / bias_name: how a non-finite value is reported (the block op names its own arguments).
std::shared_ptr<const gemm::PackedB> packed_linear_weight(const at::Tensor& weight, const at::Tensor& bias,
                                                          const char* weight_name = "weight",
                                                          const char* bias_name = "bias");
// w_in [A + L, C_in], w_out [C_out, A]: A, L and C_out are read from the shapes (checked by the caller).
std::shared_ptr<const ChannelIdleFfnWeights> packed_channel_idle_ffn_weights(const at::Tensor& w_in,
                                                                             const at::Tensor& b_in,
                                                                             const at::Tensor& w_out,
                                                                             const at::Tensor& b_out);

// The DW-conv ops' thread split (dwconv_attention, dwconv_heads; op_threads.h): (image, range of grid rows) tasks,
// each image's grid_h rows in `splits` ranges so that batch · splits >= threads (each split costs k − 1 recomputed
// halo rows of V, so no more splits than needed); task(b, row0, row1, workspace) gets the running thread's scratch of
// ws_floats floats (64-byte aligned, kept between calls).  The range with row0 == 0 also owns the image's prefix rows.
void dwconv_grid_tasks(int64_t batch, int64_t grid_h, int64_t ws_floats,
                       const std::function<void(int64_t b, int64_t row0, int64_t row1, float* workspace)>& task);

// out[rows × c] = LayerNorm(x) over each row (gamma/beta may be nullptr).
void layer_norm_run(const float* x, float* out, int64_t rows, int64_t c, const float* gamma, const float* beta,
                    float eps, CpuIsa isa);
// The same rows rounded to bf16 into out16 (row stride ld16, even; gemm16::convert_rows' bits, pad zeroed), for a bf16
// GEMM: normalised a few rows at a time into a thread's small fp32 buffer and rounded while in cache, on every thread.
// x16 != nullptr: the rows come as bf16 (c apart) and are first widened into `widened` (rows × c fp32: the caller's
// copy for later steps) in the same few-row steps, and x is not read.
void layer_norm_run_bf16(const float* x, uint16_t* out16, int64_t ld16, int64_t rows, int64_t c, const float* gamma,
                         const float* beta, float eps, CpuIsa isa, gemm16::Bf16Kernel kernel,
                         const uint16_t* x16 = nullptr, float* widened = nullptr);

// out[rows × w.n()] (row stride w.n()) = x · Wᵀ + b + residual; x and residual rows ldx / ld_residual apart.
void linear_run(const gemm::PackedB& w, int64_t rows, const float* x, int64_t ldx, const float* residual,
                int64_t ld_residual, float* out, CpuIsa isa);

// out[batch · tokens × heads·d] = per-head softmax(Q Kᵀ · scale) V of qkv [batch · tokens × 3·heads·d]
// (row stride ld_qkv; images tokens·ld_qkv apart).
void attention_run(const float* qkv, int64_t ld_qkv, int64_t batch, int64_t tokens, int64_t heads, int64_t d,
                   float scale, float* out, CpuIsa isa);

// out[rows × c_out] = channel-idle FFN of x [rows × c_in] (+ residual [rows × c_out], or nullptr).
void channel_idle_ffn_run(const ChannelIdleFfnWeights& w, int64_t rows, const float* x, const float* residual,
                          float* out, CpuIsa isa);

// ---- bf16 compute (gemm_bf16.h): bf16 inputs and weights on a CPU path with a bf16 extension run their GEMMs on
// bf16 operands with fp32 accumulation; LayerNorm, softmax, GELU, biases and residuals stay fp32.

// The bf16 kernel a call whose inputs have dtype `t` runs on the active path, or kScalar: not bf16, or no bf16
// hardware (VITFAST_CPU_EXT=none, another path forced): the call then keeps the fp32 path.
gemm16::Bf16Kernel bf16_gemm_kernel(at::ScalarType t);

// t's rows [rows × cols] as bf16 with an even row stride and zero pad elements, as the bf16 GEMMs read them: t's own
// memory when it already is such a view (bf16, unit column stride, even row stride or even cols), otherwise a
// converted copy kept alive in `holder`.
const uint16_t* bf16_rows_view(const at::Tensor& t, int64_t cols, at::Tensor& holder, int64_t& ld,
                               gemm16::Bf16Kernel kernel);

std::shared_ptr<const gemm16::PackedBf16B> packed_linear_weight_bf16(const at::Tensor& weight, const at::Tensor& bias,
                                                                     const char* weight_name = "weight",
                                                                     const char* bias_name = "bias");
std::shared_ptr<const ChannelIdleFfnBf16Weights> packed_channel_idle_ffn_weights_bf16(const at::Tensor& w_in,
                                                                                     const at::Tensor& b_in,
                                                                                     const at::Tensor& w_out,
                                                                                     const at::Tensor& b_out);

// linear_run on bf16 rows x (ldx even, pad zero); residual and out fp32; out16: also the bf16 rounding of out there
// (row stride ld16, or nullptr; linear_rows_bf16), out then nullptr for the rounding alone.
void linear_run_bf16(const gemm16::PackedBf16B& w, int64_t rows, const uint16_t* x, int64_t ldx,
                     const float* residual, int64_t ld_residual, float* out, CpuIsa isa, gemm16::Bf16Kernel kernel,
                     uint16_t* out16 = nullptr, int64_t ld16 = 0);
// attention_run with Q·Kᵀ and P·V on the bf16 GEMMs (qkv and out fp32; kernels/attention.h attention_head_bf16).
// out16 (or nullptr): the output rounded to bf16 there instead of out (row stride ld_out16; attention_head_bf16).
void attention_run_bf16(const float* qkv, int64_t ld_qkv, int64_t batch, int64_t tokens, int64_t heads, int64_t d,
                        float scale, float* out, CpuIsa isa, gemm16::Bf16Kernel kernel, uint16_t* out16 = nullptr,
                        int64_t ld_out16 = 0);
// The same on a qkv already rounded to bf16 (ld_qkv in bf16 elements; d even: kernels/attention.h).
void attention_run_bf16(const uint16_t* qkv16, int64_t ld_qkv, int64_t batch, int64_t tokens, int64_t heads, int64_t d,
                        float scale, float* out, CpuIsa isa, gemm16::Bf16Kernel kernel, uint16_t* out16 = nullptr,
                        int64_t ld_out16 = 0);
// channel_idle_ffn_run on bf16 rows x (ldx even, pad zero); residual and out fp32.  out16 != nullptr (c_out even):
// out also rounded to bf16 there (c_out apart; convert_rows' bits) by the last GEMM's epilogue, and out may be
// nullptr (no fp32 result).  x_has_h_room: x sits at column w.h_cols() of writable rows (channel_idle_ffn_rows_bf16).
void channel_idle_ffn_run_bf16(const ChannelIdleFfnBf16Weights& w, int64_t rows, const uint16_t* x, int64_t ldx,
                               const float* residual, float* out, CpuIsa isa, gemm16::Bf16Kernel kernel,
                               uint16_t* out16 = nullptr, bool x_has_h_room = false);

}  // namespace ops
}  // namespace vitfast
