// Multi-head self-attention at inference, straight from the packed qkv projection:
//
//   qkv [tokens × 3·H·D] per image (timm's layout: q | k | v, each H heads of D), row stride ld_qkv
//   out [tokens × H·D]   per image: head h in columns [h·D, (h+1)·D) — the layout proj reads, so there is no
//                        permute / transpose / copy on either side (SDPA needs [B, H, N, D] views and the
//                        output transposed back).
//   out_h = softmax(Q_h K_hᵀ · scale) V_h
//
// Torch-free, on the GEMM core.  Per (head, block of query rows): pack K_h and V_h into 16-column panels
// (N·D floats each: cheap next to the 4·N²·D FLOPs), then per chunk of at most kAttentionChunk query rows:
// S = Q_h · K_hᵀ with the micro-kernels into a chunk × N scratch tile (42 × 208 floats at N = 197: 35 KiB, about
// L1), the two-pass unnormalised softmax in place (gemm::softmax_exp_rows: exp(s·scale − max), fp32 statistics),
// P · V_h straight into the output columns, each row multiplied by 1/Σ in that GEMM's epilogue (row_scale: the
// softmax's third pass over N columns, and a pass over the D output columns, are both gone).  The whole row of scores
// of a chunk fits in cache at ViT token counts, so the exact row maximum is used (no online rescaling) and there is no
// N × N matrix beyond one chunk.
//
// Prefetch (measured at DeiT-B shapes, 1 thread, in a model-like sequence of ops on a loaded machine): in a model
// the head's K/V rows arrive cold — each qkv row is 9 KiB at DeiT-B, so every head's 256-byte slice of a row
// sits on its own page and the hardware prefetchers do not follow it; packing K and V then cost ~2-3× what it
// does hot (~15% of the head).  The caller names the next task it will run (`AttentionNext`) and its K, V, Q
// rows and output columns are prefetched, a few lines after each pair of softmax rows, while this head computes.
// GCC removes plain prefetches as dead code, so they are volatile asm (see prefetch_line in attention.cpp;
// tests/test_cpp_kernels.py checks they are emitted).  They make batch 8 on one thread 2-6% faster (DeiT-Ti to
// DeiT-B, docs/performance.md); batch 1, whose qkv is still in L2, is unchanged.
//
// No threads here: the binding splits (image, head, query block) tasks between threads.
#pragma once

#include <cstdint>

#include "kernels/cpu_features.h"
#include "kernels/gemm_bf16.h"
#include "kernels/head_operands.h"

namespace vitfast {

// Query rows per chunk: a multiple of both register tiles (AVX2/NEON 6 rows, AVX-512 14 rows); the last chunk
// takes the remainder, so 197 rows run as 4 chunks of 42 and one of 29.
constexpr int64_t kAttentionChunk = 42;

// The task the calling thread runs after this one (qkv == nullptr: none): its Q rows, K and V (unless it is
// the same head of the same image) and its output columns are prefetched during this one.
struct AttentionNext {
  const void* qkv = nullptr;   // that image's row 0 (fp32; bf16 for the bf16-qkv head below)
  float* out = nullptr;        // that image's output row 0 (nullptr: not prefetched, e.g. a bf16 output)
  int64_t h = 0, q0 = 0, q1 = 0;
};

// Floats of scratch that one concurrent caller of attention_head must provide for `q_rows` query rows; it
// must be 64-byte aligned (gemm::AlignedFloats): K and V are packed there and the micro-kernels use aligned loads.
int64_t attention_workspace_floats(int64_t tokens, int64_t head_dim, int64_t q_rows);

// One head of one image, query rows [q0, q1).  qkv and out point at the image's row 0.
void attention_head(const float* qkv, int64_t ld_qkv, int64_t tokens, int64_t heads, int64_t head_dim, int64_t h,
                    int64_t q0, int64_t q1, float scale, float* out, int64_t ld_out, float* workspace, CpuIsa isa,
                    const AttentionNext& next = AttentionNext());

// The same head on the bf16 GEMMs (gemm_bf16.h), for bf16 models on CPUs with a bf16 extension: Q, K and V rounded
// to bf16 as they are packed, S = Q·Kᵀ accumulated in fp32, the softmax in fp32, P rounded to bf16 for P·V (fp32
// accumulation), the division by the row sums in fp32.  qkv and out stay fp32.  `kernel` must not be kScalar's
// stand-in for "no bf16" (the callers keep attention_head then).  Workspace: attention_workspace_floats_bf16.
// Three steps are fused without changing a bit (csrc/tests/test_attention.cpp checks it against the plain
// sequence): the scale is the score GEMM's row_scale, the exps are rounded to bf16 as they are made
// (gemm16::softmax_exp_rows_bf16), and the division by Σ is the P·V GEMM's row_scale.  With K packed by in-register
// transposes (pack_b_transposed_bf16), one head of DeiT-B (N = 197, D = 64) ran 37.5 -> 33 µs on one core.
int64_t attention_workspace_floats_bf16(int64_t tokens, int64_t head_dim, int64_t q_rows);
// out16 (or nullptr): the head's output rounded to bf16 there instead (row stride ld_out16, the next GEMM's operand:
// gemm::Epilogue::c16, convert_rows' bits); out is then not written and may be nullptr.
void attention_head_bf16(const float* qkv, int64_t ld_qkv, int64_t tokens, int64_t heads, int64_t head_dim, int64_t h,
                         int64_t q0, int64_t q1, float scale, float* out, int64_t ld_out, float* workspace, CpuIsa isa,
                         gemm16::Bf16Kernel kernel, const AttentionNext& next = AttentionNext(),
                         uint16_t* out16 = nullptr, int64_t ld_out16 = 0);

// The same head reading a qkv already rounded to bf16 (the bf16 block's qkv GEMM writes only its bf16 rounding,
// gemm::Epilogue::c16): Q's rows are the score GEMM's operand as they are and K, V are packed without rounding
// (gemm16::pack_b_*_bf16 from bf16), so the result has the bits of the fp32-qkv entry above on qkv's fp32 values,
// without writing those values (DeiT-B: 3.6 MB an image) or reading them back.  head_dim must be even (Q is read as
// whole pairs); ld_qkv even.
void attention_head_bf16(const uint16_t* qkv16, int64_t ld_qkv, int64_t tokens, int64_t heads, int64_t head_dim,
                         int64_t h, int64_t q0, int64_t q1, float scale, float* out, int64_t ld_out, float* workspace,
                         CpuIsa isa, gemm16::Bf16Kernel kernel, const AttentionNext& next = AttentionNext(),
                         uint16_t* out16 = nullptr, int64_t ld_out16 = 0);

// The bf16 head on strided operands (kernels/head_operands.h: dk may differ from dv, as in `xwx_heads_bf16`): query
// rows [q0, q1), out at the head's first output column of row 0 (row stride ld_out), no prefetch; workspace:
// attention_workspace_floats_bf16(tokens, dk, dv, q1 − q0) floats, 64-byte aligned.
int64_t attention_workspace_floats_bf16(int64_t tokens, int64_t dk, int64_t dv, int64_t q_rows);
void attention_head_bf16(const HeadOperands& operands, int64_t tokens, int64_t q0, int64_t q1, float scale,
                         float* out, int64_t ld_out, float* workspace, CpuIsa isa, gemm16::Bf16Kernel kernel);

// The same head in two steps, for callers that pack each head's K and V once and run its query rows in several
// tasks (xwx_attention's bf16 path): attention_pack_bf16 writes K_hᵀ and V_h as bf16 panels into `packed`
// (attention_packed_floats_bf16 floats, 64-byte aligned; operands.q unused); attention_rows_bf16 runs query rows
// [q0, q1) against them (operands.q and its stride, dk, dv used), out / out16 pointing at row q0's first output
// column; workspace: attention_rows_workspace_floats_bf16(tokens, dk, q1 − q0) floats, 64-byte aligned.  Pack then
// rows give attention_head_bf16's bits.
int64_t attention_packed_floats_bf16(int64_t tokens, int64_t dk, int64_t dv);
int64_t attention_rows_workspace_floats_bf16(int64_t tokens, int64_t dk, int64_t q_rows);
void attention_pack_bf16(const HeadOperands& operands, int64_t tokens, float* packed, gemm16::Bf16Kernel kernel);
void attention_rows_bf16(const HeadOperands& operands, const float* packed, int64_t tokens, int64_t q0, int64_t q1,
                         float scale, float* out, int64_t ld_out, uint16_t* out16, int64_t ld_out16, float* workspace,
                         CpuIsa isa, gemm16::Bf16Kernel kernel);

}  // namespace vitfast
