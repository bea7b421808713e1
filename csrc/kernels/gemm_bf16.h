// bf16 GEMM core, beside the fp32 one (gemm.h) and with the same structure: weights packed once into 16-column
// panels, the epilogue fused into the micro-kernel (the same gemm::Epilogue: bias, GELU, addend, accumulate),
// no threads (callers split rows or panels).
//
//   C[m × n] (=|+=) epilogue( Σ_k a[r][k] · w[j][k] )        a, w: bf16;  products, sum, epilogue, C: fp32
//
// Why: a bf16 value is the top half of an fp32 one, so the product of two is exact in fp32 (8 + 8 significant
// bits <= 24) and only the fp32 accumulation rounds; `vdpbf16ps` (AVX512_BF16) and `bfdot` (ARMv8.6 BF16) do two
// such products per 32-bit lane, twice the work of an fp32 FMA per instruction, on half the bytes of B.  The error
// against fp32 comes from rounding the operands to bf16 (2^-9 relative each), not from the arithmetic.
//
// A: bf16 activations, row-major with row stride lda (even, >= padded_k(k)); elements [k, padded_k(k)) of each row
//    are zero (convert_rows writes them).  Rows are read as 32-bit pairs (a[2p], a[2p+1]).
// B: packed from fp32 (or bf16) weights rounded to nearest even: panels of kNr = 16 columns, inside a panel for
//    each pair of k the 16 columns' 2 values: [k/2][16][2], 64 bytes per pair (one zmm = the B operand of one
//    vdpbf16ps; four NEON q registers).  k is padded to even with zero weights; columns past n are zero.
// bias: fp32 (never rounded to bf16: it is added in the fp32 epilogue).
//
// Kernels (Bf16Kernel), chosen from the CPU path and its extensions (bf16_kernel):
//   kAvx512Bf16  `vdpbf16ps`, 14 × 32 tiles (x86/gemm_bf16_avx512.cpp).  The instruction flushes denormal inputs
//                and outputs to zero (bf16 operands below 2^-126 in magnitude: irrelevant for ViT activations).
//   kAmxBf16     `tdpbf16ps` on AMX tiles, 32 × 32 blocks (x86/gemm_bf16_amx.cpp), with kAvx512Bf16's epilogue and
//                helpers (conversion, packing, softmax): chosen over it where the CPU has AMX-BF16.
//   kNeonBf16    `bfdot` (arm/gemm_bf16_neon.cpp).
//   kScalar      the exact products of the bf16 values in fp32, fp32 accumulation (gemm_bf16_scalar.cpp): the
//                reference of the C++ tests.  Only attention_bf16 runs it (its definition is the bf16 products on any
//                CPU); the other ops, without a bf16 extension, keep their fp32
//                path (fp32 weights, no operand rounding), which is as fast and more accurate.
// All kernels compute the same exact products; results differ only by the order of the fp32 sums.
//
// GELU: the epilogue's is gemm::gelu_for_bf16 (erf_poly.h: kGeluBf16), the same bits on every kernel, relative error
// <= 2.2e-6 for x >= 0 (1/1800 of a bf16 ulp; absolute <= 1.2e-6·|x|): its results are rounded to bf16 or read as
// bf16 next, and the error against fp32 is the operands' 2^-9 anyway.  The fp32 GEMMs keep the fp32 GELU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/cpu_features.h"
#include "kernels/gemm.h"

namespace vitfast {
namespace gemm16 {

enum class Bf16Kernel { kScalar = 0, kAvx512Bf16 = 1, kNeonBf16 = 2, kAmxBf16 = 3 };

// True for the kernels whose helpers (convert_rows, packing, softmax) run on AVX512_BF16: kAvx512Bf16 and kAmxBf16.
bool uses_avx512_bf16(Bf16Kernel kernel);

// The kernel the given CPU path runs on this CPU: kAvx512 → kAmxBf16 if cpu_has(kAmxBf16) (and kAvx512Bf16), else
// kAvx512Bf16 if cpu_has(kAvx512Bf16); kNeon →
// kNeonBf16 if cpu_has(kNeonBf16); otherwise kScalar (= no bf16 hardware: the ops then stay on fp32).
Bf16Kernel bf16_kernel(CpuIsa isa);
const char* bf16_kernel_name(Bf16Kernel kernel);  // "scalar", "avx512_bf16", "amx_bf16", "neon_bf16"

// k rounded up to whole pairs: the smallest legal lda of bf16 activations.
inline int64_t padded_k(int64_t k) { return (k + 1) / 2 * 2; }

// fp32 -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN, ±Inf stays ±Inf, a finite value past the
// largest bf16 rounds to ±Inf (as torch's conversion).
inline uint16_t to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// 64-byte aligned storage of bf16 values (kernels/aligned.h).
using AlignedBf16 = AlignedArray<uint16_t>;

// A weight W [n × k] (nn.Linear layout) rounded to bf16 and packed as B = Wᵀ, with its fp32 bias.
class PackedBf16B {
 public:
  PackedBf16B() = default;
  // `w` row stride ldw (>= k), fp32 values (bf16 weights converted to fp32 round-trip exactly); bias: n values or
  // nullptr.
  static PackedBf16B pack_linear(const float* w, int64_t n, int64_t k, int64_t ldw, const float* bias);

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  int64_t k2() const { return padded_k(k_); }
  int64_t panels() const { return (n_ + gemm::kNr - 1) / gemm::kNr; }
  int64_t padded_n() const { return panels() * gemm::kNr; }
  int64_t panel_stride() const { return k2() * gemm::kNr; }  // bf16 values between panels
  const uint16_t* panel_data() const { return panels_.data(); }
  const float* bias() const { return has_bias_ ? bias_.data() : nullptr; }  // padded_n() values, or nullptr
  void add_to_bias(const float* v);  // as gemm::PackedB::add_to_bias
  size_t bytes() const { return size_t(panels_.size()) * 2 + size_t(bias_.size()) * sizeof(float); }

 private:
  int64_t n_ = 0, k_ = 0;
  AlignedBf16 panels_;
  gemm::AlignedFloats bias_;
  bool has_bias_ = false;
};

// x [rows × k] (fp32, row stride ldx) -> dst [rows × padded_k(k)] bf16 (row stride ld, even, >= padded_k(k)),
// round to nearest even, the pad element zeroed.  The same bits on every kernel (the AVX-512 one is the integer
// rounding of the portable loop, 16 values at a time: not vcvtneps2bf16, which flushes denormals to zero).
void convert_rows(const float* x, int64_t ldx, int64_t rows, int64_t k, uint16_t* dst, int64_t ld,
                  Bf16Kernel kernel = Bf16Kernel::kScalar);

// n contiguous values between bf16 and fp32 (a tensor's storage, no row padding): widening is exact; narrowing rounds
// as convert_rows (to nearest even, NaN kept quiet).  The vit_block op's input and output, without an at::Tensor::to.
void widen_bf16(const uint16_t* src, int64_t n, float* dst);
void narrow_to_bf16(const float* src, int64_t n, uint16_t* dst, Bf16Kernel kernel = Bf16Kernel::kScalar);

// Attention's softmax for the bf16 P·V: gemm::softmax_exp_rows (scaled scores s with their row max and the sum of
// the fp32 exps) with the exps rounded to bf16 into p [rows × padded_k(n)] (row stride ldp, even) instead of
// stored in s, and made by the exp for bf16 results (exp_poly.h: kExp2Bf16P, relative error <= 4.2e-6, 1/1000 of a
// bf16 ulp): P is the bf16 rounding of scalar_math.h's exp_for_bf16 on every kernel, row_sum the sum of those fp32
// exps, and P within one bf16 ulp of the exact exp's rounding.  On kAvx512Bf16 (and AMX) in one pass fewer (s keeps
// the scaled scores, the exps go to p); elsewhere NEON's or the scalar exp pass, then convert_rows.
void softmax_exp_rows_bf16(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max, float* row_sum,
                           uint16_t* p, int64_t ldp, CpuIsa isa, Bf16Kernel kernel);

// Packing into caller-owned memory, for operands that change every call (attention's K and V), rounded to bf16:
// `dst` holds packed_bf16(n, k) values (panels(n) · padded_k(k) · kNr), 64-byte aligned; pads written as zeros.
inline int64_t packed_bf16(int64_t n, int64_t k) { return (n + gemm::kNr - 1) / gemm::kNr * gemm::kNr * padded_k(k); }
// B = Wᵀ from W [n × k] fp32 with row stride ldw (e.g. K_h: A · B = Q_h · K_hᵀ).
void pack_b_transposed_bf16(const float* w, int64_t n, int64_t k, int64_t ldw, uint16_t* dst,
                            Bf16Kernel kernel = Bf16Kernel::kScalar);
// B from B [k × n] fp32 row-major with row stride ldb (e.g. V_h: A · B = P · V_h).
void pack_b_bf16(const float* b, int64_t k, int64_t n, int64_t ldb, uint16_t* dst,
                 Bf16Kernel kernel = Bf16Kernel::kScalar);
// The same two packings from values already bf16 (a bf16 qkv's K_h and V_h: a rearrangement of 32-bit pairs and
// 16-bit words, nothing rounded), so packing a bf16 operand gives the bits of packing its fp32 source.
void pack_b_transposed_bf16(const uint16_t* w, int64_t n, int64_t k, int64_t ldw, uint16_t* dst,
                            Bf16Kernel kernel = Bf16Kernel::kScalar);
void pack_b_bf16(const uint16_t* b, int64_t k, int64_t n, int64_t ldb, uint16_t* dst,
                 Bf16Kernel kernel = Bf16Kernel::kScalar);
// C = epilogue(A · B) over such a raw packed B (n columns, depth k; ep.bias ignored).
void gemm_bf16_raw(int64_t m, const uint16_t* a, int64_t lda, const uint16_t* b_panels, int64_t n, int64_t k, float* c,
                   int64_t ldc, const gemm::Epilogue& ep, Bf16Kernel kernel);

// Rows [0, m) of C, panels [panel_begin, panel_end) of b (columns [16·panel_begin, min(n, 16·panel_end))), on the
// calling thread.  ep: as in gemm.h (ep.bias adds b.bias(); addend must not alias C).  No K blocking: a B panel is
// K × 32 bytes (48 KiB at K = 1536), half the fp32 one that gemm.h streams unblocked up to K = 1024.
void gemm_bf16_panels(int64_t m, const uint16_t* a, int64_t lda, const PackedBf16B& b, int64_t panel_begin,
                      int64_t panel_end, float* c, int64_t ldc, const gemm::Epilogue& ep, Bf16Kernel kernel);

inline void gemm_bf16(int64_t m, const uint16_t* a, int64_t lda, const PackedBf16B& b, float* c, int64_t ldc,
                      const gemm::Epilogue& ep, Bf16Kernel kernel) {
  gemm_bf16_panels(m, a, lda, b, 0, b.panels(), c, ldc, ep, kernel);
}

}  // namespace gemm16
}  // namespace vitfast
