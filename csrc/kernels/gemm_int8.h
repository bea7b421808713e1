// Int8 GEMM core, beside the fp32 one (gemm.h) and with the same structure: weights packed once into 16-column
// panels, the epilogue fused into the micro-kernel (the same gemm::Epilogue: bias, erf-GELU, addend, accumulate),
// no threads (callers split rows or panels).
//
//   C[m × n] (=|+=) epilogue( sa[r] · sw[j] · Σ_k qa[r][k] · qw[j][k] )
//
// qa: int8 activations, symmetric per row (token), made by `quantize_rows`:
//       amax = max_k |x[r][k]|,  inv = 127 / amax (fp32),  qa = clamp(rne(x · inv), −127, 127),  sa = amax / 127
//     (rne: round half to even, as torch.round and cvtps2dq; never −128, which the AVX2 kernel negates).  An all-zero row gives sa = 0, qa = 0; a row with a
//     NaN or ±Inf gives sa = NaN and qa = 0, so its output row is NaN as in fp32.  A row whose 127 / amax overflows
//     fp32 (amax < 127 / FLT_MAX ≈ 3.7e-37) counts as all-zero (x · inf would turn its zeros into NaN).  Row-major with row stride lda
//     (a multiple of 4, >= round_up(k, 4)); the bytes in [k, round_up(k, 4)) are zero.
// qw: int8 weights, symmetric per output channel, in [−127, 127] (−128 is refused by the pack: the kernels below
//     rely on it), with fp32 scales sw[n].
//
// Kernels (Int8Kernel), chosen from the CPU path and its extensions (int8_kernel):
//   kAvx512Vnni  `vpdpbusd` (u8 × s8, four products summed into s32, no saturation).  B is stored as u8 = qw + 128
//                so that A, the s8 operand, can be the instruction's embedded broadcast; the offset is removed
//                per row in the epilogue: Σ qa·(qw + 128) = Σ qa·qw + 128·rowsum[r], rowsum[r] = Σ_k qa[r][k]
//                (written by quantize_rows).
//   kAvxVnni     the same `vpdpbusd` on 256-bit registers (VEX-encoded AVX-VNNI: Intel client cores since Alder
//                Lake, which have no AVX-512), 6 × 16 tiles on the same u8 form of B
//                (x86/gemm_int8_avxvnni.cpp): the int8 kernel of the AVX2 path where the CPU has it.
//   kAvx2        `vpmaddubsw` + `vpmaddwd` with the sign trick |qw| × (sign(qw)·qa): u8 ≤ 127 times s8 ≥ −127, so a
//                pair sum is at most 2·127·127 = 32258 < 2^15 (vpmaddubsw saturates at 2^15 − 1: never reached).
//                Its pack stores |qw| beside qw, so the sign trick costs one `vpsignb` per row and B vector
//                (x86/gemm_int8_avx2.cpp has the instruction counts).  Narrow form: when every weight of a
//                layer lies in [−64, 64] (vitfast.quantize(weight_bits=7)), the pack keeps u8 = qw + 64 ∈ [0, 128]
//                alone (padding byte 64) and the kernel multiplies it by qa ∈ [−127, 127] with no sign trick, a
//                pair sum at most 2·128·127 = 32512 < 2^15; the offset, 64·rowsum[r], is removed per row in the
//                epilogue as the VNNI kernels' 128·rowsum[r].
//   kAmxInt8     `tdpbssd` (s8 × s8) on AMX tiles, 32 × 32 blocks (x86/gemm_int8_amx.cpp), the VNNI kernel's
//                epilogue: chosen over kAvx512Vnni where the CPU has AMX-INT8.  B is the plain s8 form (as kScalar's).
//   kNeonDot     `sdot` (s8 × s8, four products into s32).
//   kScalar      int32 loops (also the exact reference of the C++ tests).
// Epilogue (every kernel, fp32): v = fma(float(dot) · sa[r], sw[j], accumulate ? C : 0), + bias, GELU, + addend
// (gemm_int8_isa.h says why the fma is explicit).
// Every kernel computes the same int32 dot products exactly (|Σ| ≤ k·127² < 2^31 for k < 133 000), so results
// differ between kernels only by the fp32 rounding of the epilogue.
//
// Packed B layout (all kernels): panels of kNr = 16 columns; inside a panel, for each group of 4 k, the 16 columns'
// 4 bytes in order: [k4][16][4], 64 bytes per group (one zmm, two ymm, four NEON q registers).  The AVX2 form
// follows each group's 64 bytes with their absolute values (128 bytes per group).  Padding (k past the last group,
// columns past n) holds weight 0 (byte 128 in the u8 form, 64 in the AVX2 narrow form).  A pack is made for one
// kernel (the u8 form is the VNNI kernels' only, the |qw| halves and the narrow form the AVX2 kernel's); gemm_int8
// refuses a pack made for another kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/cpu_features.h"
#include "kernels/gemm.h"

namespace vitfast {
namespace gemm8 {

enum class Int8Kernel { kScalar = 0, kAvx2 = 1, kAvx512Vnni = 2, kNeonDot = 3, kAmxInt8 = 4, kAvxVnni = 5 };

// The kernel the given CPU path runs on this CPU: kAvx512 → kAmxInt8 if cpu_has(kAmxInt8) (and kAvx512Vnni), else
// kAvx512Vnni if cpu_has(kAvx512Vnni), else kAvxVnni if cpu_has(kAvxVnni), else kAvx2;
// kAvx2 → kAvxVnni if cpu_has(kAvxVnni), else kAvx2; kNeon → kNeonDot if cpu_has(kNeonDotProd), else kScalar;
// kScalar → kScalar.
Int8Kernel int8_kernel(CpuIsa isa);
const char* int8_kernel_name(Int8Kernel kernel);  // "scalar", "avx2", "avx_vnni", "avx512_vnni", "amx_int8",
                                                   // "neon_dot"

// Whether the kernel's B is the u8 form (qw + 128; padding byte 128) with 128·rowsum removed in its epilogue.
inline bool vnni_u8_form(Int8Kernel kernel) {
  return kernel == Int8Kernel::kAvx512Vnni || kernel == Int8Kernel::kAvxVnni;
}

// k rounded up to whole groups of 4: the smallest legal lda of quantized activations.
inline int64_t padded_k(int64_t k) { return (k + 3) / 4 * 4; }

// 64-byte aligned int8 storage (kernels/aligned.h).
using AlignedBytes = AlignedArray<int8_t>;

// The AVX2 form's second halves: in each of `groups` 128-byte groups, bytes [64, 128) = |bytes [0, 64)| (codes in
// [−127, 127]).  PackedInt8B::pack and attention_int8's per-head K/V panels call it after writing the codes.
void fill_abs_halves(int8_t* panels, int64_t groups);

// A quantized weight qw [n × k] (nn.Linear layout) packed as B = qwᵀ, with its per-channel scales and bias.
class PackedInt8B {
 public:
  PackedInt8B() = default;
  // qw row stride ldw (>= k), values in [−127, 127] (throws std::invalid_argument naming the first −128);
  // w_scale: n fp32 scales; bias: n values or nullptr.
  static PackedInt8B pack(const int8_t* qw, int64_t n, int64_t k, int64_t ldw, const float* w_scale,
                          const float* bias, Int8Kernel kernel);

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  int64_t k4() const { return padded_k(k_); }
  int64_t panels() const { return (n_ + gemm::kNr - 1) / gemm::kNr; }
  int64_t padded_n() const { return panels() * gemm::kNr; }
  // Bytes per group of 4 k in a panel: 64, or 128 in the AVX2 kernel's wide form (qw then |qw|).
  int64_t group_bytes() const { return kernel_ == Int8Kernel::kAvx2 && !narrow() ? 8 * gemm::kNr : 4 * gemm::kNr; }
  // The AVX2 kernel's narrow form (every weight in [−64, 64]; see the kernels above): u8 = qw + 64 alone.
  bool narrow() const { return narrow_; }
  int64_t panel_stride() const { return k4() / 4 * group_bytes(); }  // bytes between panels
  const int8_t* panel_data() const { return panels_.data(); }
  const float* scale() const { return scale_.data(); }        // padded_n() values (zeros past n)
  const float* bias() const { return has_bias_ ? bias_.data() : nullptr; }  // padded_n() values, or nullptr
  Int8Kernel kernel() const { return kernel_; }
  // Adds `v` (n values) to the bias, creating it if absent (as gemm::PackedB::add_to_bias).
  void add_to_bias(const float* v);
  size_t bytes() const {
    return size_t(panels_.size()) + size_t(scale_.size() + bias_.size()) * sizeof(float);
  }

 private:
  int64_t n_ = 0, k_ = 0;
  Int8Kernel kernel_ = Int8Kernel::kScalar;
  AlignedBytes panels_;
  gemm::AlignedFloats scale_, bias_;
  bool has_bias_ = false, narrow_ = false;
};

// Dynamic per-row quantization of x [rows × k] (row stride ldx) into qa (row stride lda, a multiple of 4 >= k),
// sa[rows] and rowsum[rows] (see the header comment).  col_scale: nullptr, or k fp32 multipliers applied to x
// before the row maximum is taken (x[r][c] · col_scale[c]: a SmoothQuant migration's division, folded in).
void quantize_rows(const float* x, int64_t ldx, int64_t rows, int64_t k, const float* col_scale, int8_t* qa,
                   int64_t lda, float* sa, int32_t* rowsum, CpuIsa isa);

// Attention's P (attention_int8.h): gemm::softmax_exp_rows_for_bf16_scalar's exps of rows [0, rows) of s (row stride
// ld, n columns, each row's maximum starting from −inf: softmax_exp_rows with the exp made for results rounded to
// bf16, exp_poly.h kExp2Bf16P, the same bits on every path; the codes keep 7 bits, so its relative error of at most
// 4.2e-6 moves a code at ~1e-4 of the exps, and it takes 10 vector operations where the fp32 exp takes 16), then
// quantize_rows of the exps into qp (row stride lda), sa and rowsum: the same bytes, scales and sums, bit for bit (s
// is scratch afterwards).  Why it can be one pass: softmax_exp_rows
// stores the scaled scores its maximum was taken over, so the maximum's own exp is exp(0) = 1 exactly; a row whose
// largest exp is exactly 1 (and holds no NaN) has quantize_rows' amax = 1, inv = 127 and codes rne(e · 127) with
// nothing to clamp.  The AVX2 and AVX-512 paths write those codes from the exp pass, skipping quantize_rows' two
// passes over the row; any other row (a NaN, an all −inf row) takes the two steps.  Other paths: the two steps.
void softmax_quantize_rows(float* s, int64_t rows, int64_t n, int64_t ld, float scale, int8_t* qp, int64_t lda,
                           float* sa, int32_t* rowsum, CpuIsa isa);

// Rows [0, m) of C, panels [panel_begin, panel_end) of b (columns [16·panel_begin, min(n, 16·panel_end))), on the
// calling thread.  ep: as in gemm.h (ep.bias adds b.bias(); addend must not alias C).  `kernel` must be
// b.kernel() (std::invalid_argument otherwise).  No K blocking: the int32 accumulators live across all of K.
void gemm_int8_panels(int64_t m, const int8_t* qa, int64_t lda, const float* sa, const int32_t* rowsum,
                      const PackedInt8B& b, int64_t panel_begin, int64_t panel_end, float* c, int64_t ldc,
                      const gemm::Epilogue& ep, Int8Kernel kernel);

inline void gemm_int8(int64_t m, const int8_t* qa, int64_t lda, const float* sa, const int32_t* rowsum,
                      const PackedInt8B& b, float* c, int64_t ldc, const gemm::Epilogue& ep, Int8Kernel kernel) {
  gemm_int8_panels(m, qa, lda, sa, rowsum, b, 0, b.panels(), c, ldc, ep, kernel);
}

}  // namespace gemm8
}  // namespace vitfast
