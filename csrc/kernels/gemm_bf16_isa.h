// The contract between gemm_bf16.cpp and the per-kernel files of the bf16 GEMM (gemm_bf16_scalar.cpp,
// x86/gemm_bf16_avx512.cpp, arm/gemm_bf16_neon.cpp).  A *plain* header for the reason gemm_isa.h gives: PODs and
// declarations only, because the x86 file includes it under `#pragma GCC target("...,avx512bf16")` and the arm one
// under `+bf16`, where an inline function with external linkage would be emitted with those instructions and could
// be the copy the linker keeps for callers on CPUs without them (the ODR hazard).
#pragma once

#include <stdint.h>

#include "kernels/gemm_isa.h"

namespace vitfast {
namespace gemm16 {

// C[m × n] (=|+=) epilogue(A · B) over packed bf16 panels [panel_begin, panel_end) (layout: gemm_bf16.h).
// Column 0 of c, bias and addend is column 0 of panel 0.  Epilogue order as gemm::GemmBlockArgs:
//   acc = A·B (+ old C if accumulate)  ->  + bias  ->  gelu_for_bf16 if gelu  ->  + addend  ->  C.
struct Bf16BlockArgs {
  int64_t m;             // rows of A and C
  int64_t n;             // valid columns of B
  int64_t k2;            // reduction depth rounded up to even (A's and B's pad elements are zero); 0 allowed
  const uint16_t* a;     // bf16 rows, lda apart (lda even)
  int64_t lda;
  const uint16_t* b;     // packed panels, 64-byte aligned; panel p at b + p * b_panel_stride, layout [k2/2][16][2]
  int64_t b_panel_stride;
  int64_t panel_begin;
  int64_t panel_end;
  float* c;
  int64_t ldc;
  bool c_padded;         // C has >= panel_end * kNr writable columns per row (no addend): tail stored whole
  bool accumulate;
  const float* bias;     // nullptr or >= panel_end * kNr fp32 values (zero padded)
  bool gelu;
  const float* addend;   // nullptr or [m × n] fp32, ld_addend apart
  int64_t ld_addend;
  const float* row_scale;  // nullptr or m values: row i's sums × row_scale[i] first (gemm::Epilogue::row_scale)
  uint16_t* c16;           // nullptr or the bf16 copy of C (gemm::Epilogue::c16), ldc16 apart; c may then be nullptr
  int64_t ldc16;
};

void gemm_bf16_block_scalar(const Bf16BlockArgs& args);
#if defined(__x86_64__) || defined(__i386__)
void gemm_bf16_block_avx512(const Bf16BlockArgs& args);
// AMX-BF16 tiles (x86/gemm_bf16_amx.cpp), the same contract.
void gemm_bf16_block_amx(const Bf16BlockArgs& args);
// convert_rows (gemm_bf16.h) with AVX-512 F/BW: the same bits as the portable loop, ~5× faster (measured 197 × 384:
// 20.7 -> 3.9 µs), which matters next to the ~110-330 µs bf16 GEMMs (n = 384..1152) that read those rows.
void convert_rows_avx512(const float* x, int64_t ldx, int64_t rows, int64_t k, uint16_t* dst, int64_t ld);
// pack_b_transposed_bf16 (gemm_bf16.h) with 16-lane gathers down W's rows, the same bits; 16 · ldw must fit int32.
// Attention packs every head's K_hᵀ this way: the element-wise loop was ~5% of a DeiT-S bf16 block (perf); one
// DeiT head (197 × 64, row stride 1152, hot) 9.7 -> 3.0 µs.
void pack_b_transposed_bf16_avx512(const float* w, int64_t n, int64_t k, int64_t ldw, uint16_t* dst);
// pack_b_bf16 (gemm_bf16.h) a 16-column line at a time, the same bits (attention's V_h: ~2.5% of a bf16 DeiT-S block
// element by element, perf).
void pack_b_bf16_avx512(const float* b, int64_t k, int64_t n, int64_t ldb, uint16_t* dst);
// The two packings from bf16 values (gemm_bf16.h): 64-byte row loads, the K pack's in-register transpose and the
// V pack's word interleave as above, without the rounding.
void pack_b_transposed_bf16_avx512(const uint16_t* w, int64_t n, int64_t k, int64_t ldw, uint16_t* dst);
void pack_b_bf16_avx512(const uint16_t* b, int64_t k, int64_t n, int64_t ldb, uint16_t* dst);
// gemm::softmax_exp_rows_avx512 with the exps rounded to bf16 into p (row stride ldp, the pad element of an odd n
// zeroed) instead of stored in place (gemm16::softmax_exp_rows_bf16).
void softmax_exp_rows_bf16_avx512(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                                  float* row_sum, uint16_t* p, int64_t ldp);
#endif
#if defined(__aarch64__)
void gemm_bf16_block_neon(const Bf16BlockArgs& args);
#endif

}  // namespace gemm16
}  // namespace vitfast
