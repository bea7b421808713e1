// What the int8 CPU ops (ops/linear_int8.cpp, ops/channel_idle_ffn_int8.cpp) share: their argument checks (mirrors of
// vitfast/reference/linear_int8.py, same words), the packed int8 weights from the process-wide cache, and the
// activation quantization step (dynamic per row on the core's quantize_rows, or one static scale).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "kernels/cpu_features.h"
#include "kernels/gemm_int8.h"

namespace vitfast {
namespace ops {

// An int8 weight [N, k] with fp32 scales [N] on x's device (check_int8_weight of the reference); returns N.
int64_t check_int8_weight(const char* name, const char* scale_name, const at::Tensor& w, const at::Tensor& scale,
                          int64_t k, const char* k_name, const at::Tensor& x);
// An optional fp32 [k] SmoothQuant multiplier on x's device.
void check_smooth(const char* name, const at::Tensor& smooth, int64_t k, const at::Tensor& x);
// A static activation scale: finite, >= 0 (0: per-token scales).
void check_act_scale(const char* name, double value);

// Rows [row0, row0 + rows) of qw (row stride qw.size(1)) with their scales and bias (fp32 tensors, bias optional),
// packed for `kernel`, cached under (op, tensors): values are checked once per weight version (qw in [−127, 127],
// scales and bias finite).  extra_bias: nullptr, or a tensor of `rows` values added to the bias (b_out folded into the
// FFN's linear path), part of the cache key.
std::shared_ptr<const gemm8::PackedInt8B> packed_int8_weight(const char* op, const at::Tensor& qw,
                                                             const at::Tensor& scale, const at::Tensor& bias,
                                                             int64_t row0, int64_t rows, const at::Tensor& extra_bias,
                                                             gemm8::Int8Kernel kernel, const char* qw_name,
                                                             const char* scale_name, const char* bias_name);

// Per-thread buffers of quantized rows: `rows` rows of padded_k(k) bytes (lda), their scales and row sums.
struct QuantizedRows {
  int8_t* qa;
  int64_t lda;
  float* sa;
  int32_t* rowsum;
};
// Buffers of the calling thread for `rows` × `k` (slot 0 or 1: an op that quantizes twice per tile uses both).
QuantizedRows thread_quantized_rows(int64_t rows, int64_t k, int slot);

// x [rows × k] (row stride ldx) → q: per row (act_scale == 0, the core's quantize_rows) or with the static scale
// (q = clamp(rne(x · smooth · (1 / act_scale)), ±127), a row with NaN/Inf gets scale NaN and q = 0).
void quantize_activations(const float* x, int64_t ldx, int64_t rows, int64_t k, const float* smooth, double act_scale,
                          const QuantizedRows& q, CpuIsa isa);

// t as contiguous fp32 (itself when it already is one; undefined stays undefined).
at::Tensor contiguous_float(const at::Tensor& t);

// The int8 ops' thread split: balanced shares of `rows` token rows (gemm::RowShares), each run as tiles of at most
// kInt8TokenTile rows (one ViT image: the quantized tile and its output rows stay in L2 while every weight panel
// streams once per tile).  body(r0, m) runs on torch's intra-op threads — or all of it on the calling thread when
// rows × macs_per_row is below min_parallel_macs(kernel): a few µs of work, where the parallel region's fork and
// join cost more than the second thread saves.
constexpr int64_t kInt8TokenTile = 198;
void for_each_token_tile(int64_t rows, CpuIsa isa, int64_t macs_per_row, gemm8::Int8Kernel kernel,
                         const std::function<void(int64_t r0, int64_t m)>& body);

// Multiply-adds below which an int8 op runs on one thread.  Measured with linear_int8 at 17-68 token rows, one
// thread against two (the demo model's shapes; the parity tests run both sides of it at 1 and 2 threads): AMX lost
// up to 2 µs on two threads at 1.9 M multiply-adds and gained from 7.5 M; the VNNI kernel broke even at 0.94 M; the
// AVX2 kernel (4× slower per multiply-add) lost at 0.16 M and gained from 0.47 M.
int64_t min_parallel_macs(gemm8::Int8Kernel kernel);

// Multiply-adds of a whole int8 block (int8_block.cpp) below which it runs on one thread (op_threads.h): its ops'
// own split alone left attention on two threads, whose output rows the next (one-thread) GEMM then read from the
// other core.  Measured at the demo model's shape (1.4 M multiply-adds per image), one thread ÷ two, paired: AMX
// 1.00 up to batch 8 (11 M); VNNI 1.06 at 5.6 M, 1.33 at 11 M; AVX2 0.95 at 1.4 M (two threads slower), 1.25 at 2.8 M.
int64_t min_parallel_block_macs(gemm8::Int8Kernel kernel);

// Floats of the calling thread's fp32 scratch (the FFN's GELU channels), 64-byte aligned.
float* thread_int8_scratch(int64_t floats);

}  // namespace ops
}  // namespace vitfast
