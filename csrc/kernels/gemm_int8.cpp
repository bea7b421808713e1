#include "kernels/gemm_int8.h"

#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>

#include "kernels/gemm_int8_isa.h"


namespace vitfast {
namespace gemm8 {

using gemm::kNr;

namespace {

bool compiled(Int8Kernel kernel) {
  switch (kernel) {
    case Int8Kernel::kScalar: return true;
#if defined(__x86_64__) || defined(__i386__)
    case Int8Kernel::kAvx2:
    case Int8Kernel::kAvxVnni:
    case Int8Kernel::kAvx512Vnni:
    case Int8Kernel::kAmxInt8: return true;
#endif
#if defined(__aarch64__)
    case Int8Kernel::kNeonDot: return true;
#endif
    default: return false;
  }
}
}  // namespace

Int8Kernel int8_kernel(CpuIsa isa) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case CpuIsa::kAvx512:
      if (!cpu_has(CpuExt::kAvx512Vnni)) return cpu_has(CpuExt::kAvxVnni) ? Int8Kernel::kAvxVnni : Int8Kernel::kAvx2;
      return cpu_has(CpuExt::kAmxInt8) ? Int8Kernel::kAmxInt8 : Int8Kernel::kAvx512Vnni;
    case CpuIsa::kAvx2: return cpu_has(CpuExt::kAvxVnni) ? Int8Kernel::kAvxVnni : Int8Kernel::kAvx2;
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon: return cpu_has(CpuExt::kNeonDotProd) ? Int8Kernel::kNeonDot : Int8Kernel::kScalar;
#endif
    default: return Int8Kernel::kScalar;
  }
}

const char* int8_kernel_name(Int8Kernel kernel) {
  switch (kernel) {
    case Int8Kernel::kScalar: return "scalar";
    case Int8Kernel::kAvx2: return "avx2";
    case Int8Kernel::kAvxVnni: return "avx_vnni";
    case Int8Kernel::kAvx512Vnni: return "avx512_vnni";
    case Int8Kernel::kAmxInt8: return "amx_int8";
    case Int8Kernel::kNeonDot: return "neon_dot";
  }
  return "unknown";
}

void fill_abs_halves(int8_t* panels, int64_t groups) {
  for (int64_t g = 0; g < groups; ++g) {
    int8_t* p = panels + g * 128;
    for (int i = 0; i < 64; ++i) p[64 + i] = int8_t(p[i] < 0 ? -p[i] : p[i]);
  }
}

PackedInt8B PackedInt8B::pack(const int8_t* qw, int64_t n, int64_t k, int64_t ldw, const float* w_scale,
                              const float* bias, Int8Kernel kernel) {
  if (n < 0 || k < 0 || ldw < k) throw std::invalid_argument("PackedInt8B::pack: bad shape or ldw < k");
  if (n > 0 && w_scale == nullptr) throw std::invalid_argument("PackedInt8B::pack: w_scale is required");
  // −128 first: the AVX2 sign trick negates qw (−(−128) does not exist in int8) and the VNNI kernel's u8 form
  // qw + 128 would be 0 = "weight −128" where the kernels' bounds (|qa·qw| <= 127²) assume |qw| <= 127.
  for (int64_t j = 0; j < n; ++j)
    for (int64_t c = 0; c < k; ++c)
      if (qw[j * ldw + c] == -128)
        throw std::invalid_argument("PackedInt8B::pack: weight -128 at [" + std::to_string(j) + "][" +
                                    std::to_string(c) + "] (symmetric int8 weights lie in [-127, 127])");
  PackedInt8B out;
  out.n_ = n;
  out.k_ = k;
  out.kernel_ = kernel;
  if (kernel == Int8Kernel::kAvx2 && n > 0) {
    // The narrow form when every weight fits it (gemm_int8.h): the pack's own property, so a model quantized with
    // 7-bit weights gets it on load and any other keeps the wide form.
    bool narrow = true;
    for (int64_t j = 0; j < n && narrow; ++j)
      for (int64_t c = 0; c < k; ++c)
        if (qw[j * ldw + c] > 64 || qw[j * ldw + c] < -64) {
          narrow = false;
          break;
        }
    out.narrow_ = narrow;
  }
  out.panels_ = AlignedBytes(out.panels() * out.panel_stride());
  // The u8 operand of the VNNI kernels, qw + 128, and of the AVX2 kernel's narrow form, qw + 64: the padding
  // (weight 0) is byte 128 / 64.
  const int offset = vnni_u8_form(kernel) ? 128 : out.narrow_ ? 64 : 0;
  int8_t* dst = out.panels_.data();
  if (offset != 0) std::memset(dst, offset, size_t(out.panels_.size()));
  for (int64_t j = 0; j < n; ++j) {
    const int8_t* src = qw + j * ldw;
    int8_t* panel = dst + (j / kNr) * out.panel_stride() + (j % kNr) * 4;
    for (int64_t c = 0; c < k; ++c)
      panel[(c / 4) * out.group_bytes() + (c % 4)] = int8_t(uint8_t(int(src[c]) + offset));
  }
  if (kernel == Int8Kernel::kAvx2 && !out.narrow())
    fill_abs_halves(dst, out.panels() * out.k4() / 4);  // −128 refused above
  out.scale_ = gemm::AlignedFloats(out.padded_n());
  if (n > 0) std::memcpy(out.scale_.data(), w_scale, size_t(n) * sizeof(float));
  if (bias != nullptr) {
    out.bias_ = gemm::AlignedFloats(out.padded_n());
    std::memcpy(out.bias_.data(), bias, size_t(n) * sizeof(float));
    out.has_bias_ = true;
  }
  return out;
}

void PackedInt8B::add_to_bias(const float* v) {
  if (!has_bias_) {
    bias_ = gemm::AlignedFloats(padded_n());
    has_bias_ = true;
  }
  for (int64_t j = 0; j < n_; ++j) bias_.data()[j] += v[j];
}

void quantize_rows(const float* x, int64_t ldx, int64_t rows, int64_t k, const float* col_scale, int8_t* qa,
                   int64_t lda, float* sa, int32_t* rowsum, CpuIsa isa) {
  if (rows <= 0) return;
  if (lda % 4 != 0 || lda < padded_k(k))
    throw std::invalid_argument("quantize_rows: lda must be a multiple of 4 >= padded_k(k)");
  QuantizeArgs q{x, ldx, rows, k, col_scale, qa, lda, sa, rowsum};
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case CpuIsa::kAvx512: quantize_rows_avx512(q); return;
    case CpuIsa::kAvx2: quantize_rows_avx2(q); return;
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon: quantize_rows_neon(q); return;
#endif
    default: quantize_rows_scalar(q); return;
  }
}

void softmax_quantize_rows(float* s, int64_t rows, int64_t n, int64_t ld, float scale, int8_t* qp, int64_t lda,
                           float* sa, int32_t* rowsum, CpuIsa isa) {
  if (rows <= 0) return;
  if (lda % 4 != 0 || lda < padded_k(n))
    throw std::invalid_argument("softmax_quantize_rows: lda must be a multiple of 4 >= padded_k(n)");
  const SoftmaxQuantizeArgs a{s, rows, n, ld, scale, qp, lda, sa, rowsum};
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case CpuIsa::kAvx512: softmax_quantize_rows_avx512(a); return;
    case CpuIsa::kAvx2: softmax_quantize_rows_avx2(a); return;
#endif
    default:
      for (int64_t r = 0; r < rows; r += 2) {
        const int64_t pair = rows - r < 2 ? rows - r : 2;
        float row_max[2] = {-std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
        float row_sum[2];
        gemm::softmax_exp_rows_for_bf16(s + r * ld, pair, n, ld, scale, row_max, row_sum, isa);
        quantize_rows(s + r * ld, ld, pair, n, nullptr, qp + r * lda, lda, sa + r, rowsum + r, isa);
      }
      return;
  }
}

void gemm_int8_panels(int64_t m, const int8_t* qa, int64_t lda, const float* sa, const int32_t* rowsum,
                      const PackedInt8B& b, int64_t panel_begin, int64_t panel_end, float* c, int64_t ldc,
                      const gemm::Epilogue& ep, Int8Kernel kernel) {
  if (kernel != b.kernel())
    throw std::invalid_argument(std::string("gemm_int8: weights packed for ") + int8_kernel_name(b.kernel()) +
                                ", called with " + int8_kernel_name(kernel));
  if (!compiled(kernel))
    throw std::invalid_argument(std::string("gemm_int8: kernel ") + int8_kernel_name(kernel) +
                                " is not compiled into this binary");
  if (kernel == Int8Kernel::kAmxInt8 && !cpu_has(CpuExt::kAmxInt8))
    throw std::invalid_argument("gemm_int8: kernel amx_int8 is not available on this CPU (or is switched off)");
  if (panel_begin < 0 || panel_end > b.panels())
    throw std::invalid_argument("gemm_int8: panels [" + std::to_string(panel_begin) + ", " + std::to_string(panel_end) +
                                ") outside the weight's " + std::to_string(b.panels()));
  if (m <= 0 || panel_end <= panel_begin) return;
  if (lda % 4 != 0 || lda < b.k4())
    throw std::invalid_argument("gemm_int8: lda must be a multiple of 4 >= padded_k(k)");
  Int8BlockArgs g;
  g.m = m;
  g.n = b.n();
  g.k4 = b.k4();
  g.a = qa;
  g.lda = lda;
  g.sa = sa;
  g.rowsum = rowsum;
  g.b = b.panel_data();
  g.b_panel_stride = b.panel_stride();
  g.narrow = b.narrow();
  g.a_unsigned = false;
  g.panel_begin = panel_begin;
  g.panel_end = panel_end;
  g.w_scale = b.scale();
  g.c = c;
  g.ldc = ldc;
  g.c_padded = ep.c_padded;
  g.accumulate = ep.accumulate;
  g.bias = ep.bias ? b.bias() : nullptr;
  g.gelu = ep.gelu;
  g.addend = ep.addend;
  g.ld_addend = ep.ld_addend;
  switch (kernel) {
#if defined(__x86_64__) || defined(__i386__)
    case Int8Kernel::kAvx512Vnni: gemm_int8_block_avx512_vnni(g); return;
    case Int8Kernel::kAmxInt8: gemm_int8_block_amx(g); return;
    case Int8Kernel::kAvx2: gemm_int8_block_avx2(g); return;
    case Int8Kernel::kAvxVnni: gemm_int8_block_avxvnni(g); return;
#endif
#if defined(__aarch64__)
    case Int8Kernel::kNeonDot: gemm_int8_block_neon_dot(g); return;
#endif
    default: gemm_int8_block_scalar(g); return;
  }
}

}  // namespace gemm8
}  // namespace vitfast
