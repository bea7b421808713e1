// Multi-head self-attention at inference, straight from the packed qkv projection:
//
//   qkv [tokens × 3·H·D] per image (timm's layout: q | k | v, each H heads of D), row stride ld_qkv
//   out [tokens × H·D]   per image: head h in columns [h·D, (h+1)·D) — the layout proj reads, so there is no
//                        permute / transpose / copy on either side (SDPA needs [B, H, N, D] views and the
//                        output transposed back).
//   out_h = softmax(Q_h K_hᵀ · scale) V_h
//
// Torch-free, on the GEMM core.  Per (head, block of query rows): pack K_h and V_h into 16-column panels
// (N·D floats each: cheap next to the 4·N²·D FLOPs), S = Q_h · K_hᵀ with the 6×16 micro-kernels into a
// scratch tile (N = 197: 198 × 208 floats = 165 KiB, stays in L2), vectorised row softmax in place (fp32
// statistics), then out_h = P · V_h written straight into the output columns.  The whole row of scores fits
// in L2 at ViT token counts, so a two-pass (exact max) softmax is used rather than an online one.
//
// No threads here: the binding splits (image, head, query block) tasks between threads.
#pragma once

#include <cstdint>

#include "kernels/cpu_features.h"

namespace vitfast {

// Floats of scratch that one concurrent caller of attention_head must provide for `q_rows` query rows; it
// must be 64-byte aligned (gemm::AlignedFloats): K and V are packed there and the micro-kernels use aligned loads.
int64_t attention_workspace_floats(int64_t tokens, int64_t head_dim, int64_t q_rows);

// One head of one image, query rows [q0, q1).  qkv and out point at the image's row 0.
void attention_head(const float* qkv, int64_t ld_qkv, int64_t tokens, int64_t heads, int64_t head_dim, int64_t h,
                    int64_t q0, int64_t q1, float scale, float* out, int64_t ld_out, float* workspace, CpuIsa isa);

}  // namespace vitfast
