// The contract between gemm_int8.cpp (packing, dispatch) and the per-ISA int8 code: gemm_int8_scalar.cpp,
// x86/gemm_int8_avx2.cpp, x86/gemm_int8_avx512.cpp (VNNI), arm/gemm_int8_neon.cpp (dot product).
//
// A *plain* header for the same reason as gemm_isa.h: it is included by files compiled under
// `#pragma GCC target("avx512vnni,...")` or `target("+dotprod")`, so it holds PODs and declarations only (an
// inline function with external linkage defined here would be emitted with that ISA's code, and the linker could
// pick that copy for a caller on a CPU without it).
#pragma once

#include <stdint.h>

namespace vitfast {
namespace gemm8 {

// C[m × n] (=|+=) epilogue(sa[r] · sw[j] · Σ_k qa[r][k] · qw[j][k]) for rows [0, m), packed panels
// [panel_begin, panel_end) (16 columns each, layout [k4 / 4][16][4] bytes, see gemm_int8.h).  Column 0 of `c`,
// `w_scale`, `bias` and `addend` is column 0 of panel 0.
//
// Epilogue, in this order and in fp32 in every kernel (so kernels differ only by the GELU polynomial):
//   v = fma(float(dot) · sa[r], sw[j], accumulate ? C : 0)  ->  + bias  ->  GELU(erf) if gelu  ->  + addend
// where dot is the exact int32 Σ qa·qw (the VNNI kernel computes Σ qa·(qw + 128) and subtracts 128·rowsum[r], the
// AVX2 kernel's narrow form Σ qa·(qw + 64) and 64·rowsum[r]).
// The fused multiply-add is written out because compilers contract a product followed by an addition into one
// (GCC's C++ default is -ffp-contract=fast; aarch64 has a scalar fmadd): spelled as fma, every kernel, the
// scalar one on any target included, rounds the same way, and the C++ test can demand identical bits.
struct Int8BlockArgs {
  int64_t m;   // rows of A and C
  int64_t n;   // valid columns (the last panel may be partial: columns >= n are never stored unless c_padded)
  int64_t k4;  // reduction depth in bytes, a multiple of 4 (padding bytes of A and B are zero / weight 0)
  const int8_t* a;
  int64_t lda;            // bytes, a multiple of 4
  const float* sa;        // m row scales
  const int32_t* rowsum;  // m row sums Σ_k qa (used by the VNNI kernels and the AVX2 kernel's narrow form)
  const int8_t* b;        // packed panels; panel p starts at b + p · b_panel_stride
  int64_t b_panel_stride; // bytes between panels (= k4 · 16; k4 · 32 in the AVX2 kernel's wide form: each 4-k
                          // group is 128 bytes, its 64 bytes of qw then their |qw|)
  // The AVX2 kernel's narrow form (weights in [−64, 64], gemm_int8.h): B holds u8 = qw + 64, and 64 · rowsum[r]
  // is removed from every dot of row r.  false for every other pack.
  bool narrow;
  // A's codes all lie in [0, 127] (attention's P: quantized exps, never negative), and B is the plain s8 form (no
  // |qw| halves): the AVX2 kernel then takes A as vpmaddubsw's unsigned operand, with no sign trick and no offset
  // (a pair sum at most 2·127·127 = 32258).  Every other kernel ignores it (their forms need nothing of A).
  bool a_unsigned;
  int64_t panel_begin;
  int64_t panel_end;
  const float* w_scale;   // >= panel_end · 16 values (zero padded)
  float* c;
  int64_t ldc;
  bool c_padded;          // C has >= panel_end · 16 writable columns per row (no addend): tail panels stored whole
  bool accumulate;
  const float* bias;      // nullptr or >= panel_end · 16 values (zero padded)
  bool gelu;
  const float* addend;    // nullptr or [m × n], row stride ld_addend
  int64_t ld_addend;
};

// Per-row quantization (see gemm_int8.h for the definition every variant implements bit for bit):
// x [rows × k] (row stride ldx), optional col_scale[k]; writes qa (row stride lda, bytes [k, padded_k) zero),
// sa[rows], rowsum[rows].
struct QuantizeArgs {
  const float* x;
  int64_t ldx;
  int64_t rows;
  int64_t k;
  const float* col_scale;
  int8_t* qa;
  int64_t lda;
  float* sa;
  int32_t* rowsum;
};

// Attention's P (gemm_int8.h: softmax_quantize_rows): rows [0, rows) of s (row stride ld, n columns) through
// gemm::softmax_exp_rows (row maxima from −inf), then quantize_rows of the exps into q (row stride lda), sa, rowsum.
// The x86 versions (vec_avx2.cpp, vec_avx512.cpp) quantize in the exp pass and so skip both passes of
// quantize_rows, falling back to the two steps for a row where the shortcut would not give their bits.
struct SoftmaxQuantizeArgs {
  float* s;
  int64_t rows;
  int64_t n;
  int64_t ld;
  float scale;
  int8_t* q;
  int64_t lda;
  float* sa;
  int32_t* rowsum;
};

void gemm_int8_block_scalar(const Int8BlockArgs& args);
void quantize_rows_scalar(const QuantizeArgs& args);

#if defined(__x86_64__) || defined(__i386__)
void gemm_int8_block_avx2(const Int8BlockArgs& args);
void gemm_int8_block_avxvnni(const Int8BlockArgs& args);  // x86/gemm_int8_avxvnni.cpp (kAvxVnni)
void quantize_rows_avx2(const QuantizeArgs& args);
void gemm_int8_block_avx512_vnni(const Int8BlockArgs& args);
void gemm_int8_block_amx(const Int8BlockArgs& args);  // x86/gemm_int8_amx.cpp (kAmxInt8; rowsum unused)
void quantize_rows_avx512(const QuantizeArgs& args);
void softmax_quantize_rows_avx2(const SoftmaxQuantizeArgs& args);
// pack_words_transposed_avx512 (below) on AVX2, 8 × 8 words at a time: the K panels of the AVX2 path's AVX-VNNI
// kernel (the same 64-byte-group u8 form).
void pack_words_transposed_avx2(const int8_t* src, int64_t ld, int64_t rows, int64_t words, uint32_t flip,
                                int8_t* dst, int64_t panel_stride);
// Attention's K panels in the 64-byte-group form (VNNI, AMX): the 32-bit words [0, words) of rows [0, rows) of src
// (`ld` bytes apart), each XORed with `flip`, to dst as B = srcᵀ in gemm_int8.h's layout — row t's word w at
// dst + (t / 16) · panel_stride + w · 64 + (t % 16) · 4.  The last panel's rows past `rows` get `flip` (weight 0 in
// either form).  16 × 16 words at a time through a register transpose.
void pack_words_transposed_avx512(const int8_t* src, int64_t ld, int64_t rows, int64_t words, uint32_t flip,
                                  int8_t* dst, int64_t panel_stride);
void softmax_quantize_rows_avx512(const SoftmaxQuantizeArgs& args);
// Attention's V (attention_int8.cpp's v_columns / v_pack, 16 channels per register): per channel j < d over rows
// [0, tokens) of v (`ld` floats apart), amax[j] = max |v| and chk[j] += Σ v · 0 (NaN iff the column holds a NaN or
// ±Inf); then the codes (clamp(rne(v · inv[j]), ±127) & keep[j]) + offset, four tokens per 32-bit word (token t in
// byte t % 4), panel p's group g of 16 words at dst + p · panel_stride + g · group_bytes, for groups [0, k4 / 4):
// tokens past `tokens` and channels past d are byte `offset` (inv and keep hold panels · 16 values, 0 past d).
void attention_v_columns_avx512(const float* v, int64_t ld, int64_t tokens, int64_t d, float* amax, float* chk);
void attention_v_pack_avx512(const float* v, int64_t ld, int64_t tokens, int64_t d, int64_t k4, int64_t panels,
                             int64_t panel_stride, int64_t group_bytes, int32_t offset, const float* inv,
                             const int32_t* keep, int8_t* dst);
#endif

#if defined(__aarch64__)
void gemm_int8_block_neon_dot(const Int8BlockArgs& args);
void quantize_rows_neon(const QuantizeArgs& args);
#endif

}  // namespace gemm8
}  // namespace vitfast
