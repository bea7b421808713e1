// Multi-head self-attention at inference with both products on the int8 core (gemm_int8.h), from the packed qkv
// (the layout of kernels/attention.h: q | k | v, H heads of D each, no permute; out in proj's [tokens × H·D]).
//
// Per (head h, block of query rows), the definition of vitfast/reference/attention_int8.py:
//   K_h quantized per key token (quantize_rows) and packed as the B operand [D × N] with the tokens' scales as the
//   per-column scales; V_hᵀ [D × N] (a transposed fp32 copy) quantized per channel d over the tokens and packed as
//   the B operand [N × D] with the channels' scales.  Both are O(N·D) beside the O(N²·D) products.
//   Per chunk of at most kAttentionInt8Chunk query rows:
//     Q rows quantized per token → S = Q·Kᵀ (int8 GEMM, fp32 scores from the epilogue) into a chunk × N tile
//     → E = exp(S·scale − max) (gemm::softmax_exp_rows, fp32; the row maximum becomes 1)
//     → E quantized per row (its 1 maps to code 127; on x86 in the exp pass: gemm8::softmax_quantize_rows)
//     → the row's scale replaced by 1 / Σ codes (the quantized
//       row's exact integer sum, which the quantizer writes anyway: the softmax normalisation, folded in)
//     → O = P·V (int8 GEMM) straight into the head's output columns.
//   NaN: a query row with NaN/±Inf gives a NaN output row, a key row with one a NaN head, a V channel with one a
//   NaN output column (as fp32 attention; set explicitly, not left to the exp polynomial's handling of NaN).
//
// Measured (AMD EPYC with AVX-512 VNNI, 1 thread, interleaved medians vs the fp32 op, benchmarks/
// bench_attention_int8.py; 2 shared cores): DeiT-S and DeiT-B at batch 1 1.50x (0.34 -> 0.22 ms, 0.68 -> 0.45 ms),
// batch 8 1.2-1.4x.  Accuracy (benchmarks/attention_int8_accuracy.py, the digits demo model): 0.4-0.6% relative
// error per block against fp32 attention, the int8 model's top-1 unchanged (argmax agreement 1.0).  Most of that
// error is P's 7-bit range (codes [0, 127]); Q and K add ~0.1% each, V ~0.3%.
//
// No threads here: the binding splits (image, head, query block) tasks.
#pragma once

#include <cstdint>

#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm_int8.h"
#include "kernels/head_operands.h"

namespace vitfast {

// Query rows per chunk (as kAttentionChunk: a multiple of the 6- and 14-row register tiles).
constexpr int64_t kAttentionInt8Chunk = 42;

// Scratch of one concurrent caller, grown on demand (reused between calls).
struct AttentionInt8Workspace {
  gemm::AlignedFloats floats;  // Vᵀ copy, score tile, scales
  gemm8::AlignedBytes bytes;   // quantized K, Vᵀ, Q and P rows
  void reserve(int64_t tokens, int64_t dk, int64_t dv, int64_t q_rows);
};

// The task the calling thread runs after this one (qkv == nullptr: none), as kernels/attention.h's AttentionNext:
// its K and V (unless the same head of the same image), Q rows and output columns are prefetched during this
// one (in a batch the head's K/V rows, 256 bytes every qkv row, arrive cold: the hardware prefetchers do not
// follow them; measured DeiT-B batch 8, 1 thread: see the commit).
struct AttentionInt8Next {
  const float* qkv = nullptr;
  float* out = nullptr;
  int64_t h = 0, q0 = 0, q1 = 0;
};

// One head of one image, query rows [q0, q1).  qkv and out point at the image's row 0.
void attention_int8_head(const float* qkv, int64_t ld_qkv, int64_t tokens, int64_t heads, int64_t head_dim,
                         int64_t h, int64_t q0, int64_t q1, float scale, float* out, int64_t ld_out,
                         AttentionInt8Workspace& ws, CpuIsa isa, const AttentionInt8Next& next = AttentionInt8Next());

// The head on strided operands (kernels/head_operands.h: dk may differ from dv, as in `xwx_heads_int8`).
// Query rows [q0, q1); out points at the head's first output column of row 0 (row stride ld_out); no prefetch.
void attention_int8_head(const HeadOperands& operands, int64_t tokens, int64_t q0, int64_t q1, float scale,
                         float* out, int64_t ld_out, AttentionInt8Workspace& ws, CpuIsa isa);

}  // namespace vitfast
