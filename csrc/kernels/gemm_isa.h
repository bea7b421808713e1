// The contract between the portable callers (gemm.cpp, layer_norm.cpp, attention) and the per-ISA code, one
// file per ISA and role: gemm_<isa>.cpp (GEMM micro-kernels: gemm_scalar.cpp, x86/gemm_avx2.cpp,
// x86/gemm_avx512.cpp, arm/gemm_neon.cpp) and vec_<isa>.cpp (GELU, row softmaxes, row LayerNorm: vec_scalar.cpp,
// x86/vec_avx2.cpp, x86/vec_avx512.cpp, arm/vec_neon.cpp).
//
// A *plain* header on purpose: PODs and function declarations only, no STL and no inline functions with
// external linkage.  It is included by files compiled with `#pragma GCC target("avx2,fma")`; an inline
// function defined here would be emitted with AVX2 code in that translation unit, and the linker could
// pick that copy for callers on a CPU without AVX2 (the ODR hazard).  Code shared between ISA files
// (x86/avx2_math.h, x86/avx512_math.h, the width-generic x86/*_body.inc, arm/neon_math.h, scalar_math.h) has
// internal linkage only (anonymous namespaces), so every instantiation stays inside its own ISA's file.
#pragma once

#include <stdint.h>

namespace vitfast {
namespace gemm {

// Register block of every micro-kernel: kMr rows of A times kNr columns of B.  The packed-weight layout
// (panels of kNr columns) depends on kNr only, so one packed weight serves every ISA path.
enum : int64_t { kMr = 6, kNr = 16 };

// C[m × n] (=|+=) epilogue(A[m × k] · B[k × n]) for one row block, over packed panels
// [panel_begin, panel_end).  Column 0 of `c`, `bias` and `addend` is column 0 of panel 0.
//
// Order of operations at the end of the reduction (the epilogue, fused so C is written once):
//   acc = A·B (+ old C if accumulate)  ->  + bias  ->  GELU(erf) if gelu  ->  + addend  ->  C.
struct GemmBlockArgs {
  int64_t m;  // rows of A and C
  int64_t n;  // valid columns of B (the last panel may be partial: columns >= n are never stored)
  int64_t k;  // reduction depth (0 allowed: C = epilogue(0))
  const float* a;
  int64_t lda;
  const float* b;          // packed panels; panel p starts at b + p * b_panel_stride, layout [k][kNr]
  int64_t b_panel_stride;  // floats between panels (>= k * kNr)
  int64_t panel_begin;
  int64_t panel_end;
  float* c;
  int64_t ldc;
  bool c_padded;  // C has >= panel_end * kNr writable columns per row: the tail panel may be stored whole
  bool accumulate;         // C += result instead of C = result (the "accumulate onto" epilogue)
  const float* bias;       // nullptr or >= panel_end * kNr values (zero padded)
  bool gelu;               // exact erf-GELU after the bias (the split-GELU epilogue: callers pass only
                           // the panels that hold activated channels)
  const float* addend;     // nullptr or a [m × n] matrix added last (the residual)
  int64_t ld_addend;
  const float* row_scale = nullptr;  // nullptr or m values: row i's whole sum × row_scale[i], before bias, GELU and
                                     // addend, in the last K block (after earlier blocks' partial sums); not with
                                     // accumulate (gemm.h)
  int64_t kc;  // K block (cache blocking): the B micro-panel kc × kNr stays in L1 across the row tiles
};

// Row softmax in place, for attention: for each of `rows` rows of s (row stride ld), over columns [0, n):
//   t = s · scale;  s = exp(t − max t) / Σ exp(t − max t)      (statistics in fp32; columns >= n untouched)
void softmax_rows_scalar(float* s, int64_t rows, int64_t n, int64_t ld, float scale);

// The unnormalised row softmax of flash attention (online softmax over key tiles), two passes instead of three:
// for each of `rows` rows of s (row stride ld), over columns [0, n):
//   t = s·scale (stored);  m = max(row_max[r], max_j t);  s = exp(t − m);  row_sum[r] = Σ_j s;
//   row_max[r] = m.
// row_max[r] = -inf starts a row.  The caller rescales what it accumulated with the previous maximum by
// exp(old − new) and divides by the running sum once at the end (on the D-wide P·V result instead of the
// n-wide probabilities: the third pass of softmax_rows disappears).  Columns >= n are untouched.
void softmax_exp_rows_scalar(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                             float* row_sum);
// The same with the exp made for bf16 results (exp_poly.h: kExp2Bf16P; scalar_math.h: exp_for_bf16), for attention's
// bf16 P (gemm16::softmax_exp_rows_bf16 on the kernels without an AVX-512 pass of their own) and its int8 P
// (gemm8::softmax_quantize_rows: its definition, and its path off x86): every path gives exp_for_bf16's bits for each
// exp; the sums differ only in the order of their additions.
void softmax_exp_rows_for_bf16_scalar(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                                      float* row_sum);

// Row LayerNorm over contiguous rows of c floats (the fused blocks' pre-norms):
//   m1 = x0 + Σ(x − x0) / c  (x0 = the row's first value: the sum's rounding scales with the spread, not |x|);
//   d = x − m1;  corr = Σd / c;  mean = m1 + corr;  var = Σd² / c − corr²  (the corrected two-pass algorithm:
//     no E[x²] − mean² cancellation, and corr removes pass 1's rounding, which is large when x0 is an outlier:
//     c = 4096 values ~N(5, 1) after x0 = 1e5 put 0.47 into m1);  rstd = 1/√((var < 0 ? 0 : var) + eps)
//   y = (x − mean) · rstd  [· gamma]  [+ beta]        (gamma, beta: c floats each, or nullptr)
// y may not overlap x (the normalising pass rereads x).
void layer_norm_rows_scalar(const float* x, float* y, int64_t rows, int64_t c, const float* gamma, const float* beta,
                            float eps);
void gemm_block_scalar(const GemmBlockArgs& args);
void gelu_scalar(float* x, int64_t n);

#if defined(__x86_64__) || defined(__i386__)
void gemm_block_avx2(const GemmBlockArgs& args);
void layer_norm_rows_avx2(const float* x, float* y, int64_t rows, int64_t c, const float* gamma, const float* beta,
                          float eps);
void gelu_avx2(float* x, int64_t n);
void softmax_rows_avx2(float* s, int64_t rows, int64_t n, int64_t ld, float scale);
void softmax_exp_rows_avx2(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                           float* row_sum);
// AVX-512 GEMM (x86/gemm_avx512.cpp: 14 × 32 tiles over pairs of the same 16-column panels), row softmaxes and
// LayerNorm (x86/vec_avx512.cpp).  The AVX-512 path reuses gelu_avx2 for the standalone GELU (every AVX-512 CPU
// has AVX2).
void gemm_block_avx512(const GemmBlockArgs& args);
void layer_norm_rows_avx512(const float* x, float* y, int64_t rows, int64_t c, const float* gamma,
                            const float* beta, float eps);
void layer_norm_rows_bf16_avx512(const float* x, const uint16_t* x16, float* widened, uint16_t* y16, int64_t ld16,
                                 int64_t rows, int64_t c, const float* gamma, const float* beta, float eps);
void softmax_rows_avx512(float* s, int64_t rows, int64_t n, int64_t ld, float scale);
void softmax_exp_rows_avx512(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                             float* row_sum);
#endif

#if defined(__aarch64__)
void gemm_block_neon(const GemmBlockArgs& args);
void layer_norm_rows_neon(const float* x, float* y, int64_t rows, int64_t c, const float* gamma, const float* beta,
                          float eps);
void gelu_neon(float* x, int64_t n);
void softmax_rows_neon(float* s, int64_t rows, int64_t n, int64_t ld, float scale);
void softmax_exp_rows_neon(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                           float* row_sum);
void softmax_exp_rows_for_bf16_neon(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                                    float* row_sum);
#endif

}  // namespace gemm
}  // namespace vitfast
