#include "kernels/gemm_bf16.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/gemm_bf16_isa.h"

namespace vitfast {
namespace gemm16 {

using gemm::kNr;

bool uses_avx512_bf16(Bf16Kernel kernel) {
  return kernel == Bf16Kernel::kAvx512Bf16 || kernel == Bf16Kernel::kAmxBf16;
}

Bf16Kernel bf16_kernel(CpuIsa isa) {
  if (isa == CpuIsa::kAvx512 && cpu_has(CpuExt::kAvx512Bf16))
    return cpu_has(CpuExt::kAmxBf16) ? Bf16Kernel::kAmxBf16 : Bf16Kernel::kAvx512Bf16;
  if (isa == CpuIsa::kNeon && cpu_has(CpuExt::kNeonBf16)) return Bf16Kernel::kNeonBf16;
  return Bf16Kernel::kScalar;
}

const char* bf16_kernel_name(Bf16Kernel kernel) {
  switch (kernel) {
    case Bf16Kernel::kAvx512Bf16: return "avx512_bf16";
    case Bf16Kernel::kAmxBf16: return "amx_bf16";
    case Bf16Kernel::kNeonBf16: return "neon_bf16";
    default: return "scalar";
  }
}

PackedBf16B PackedBf16B::pack_linear(const float* w, int64_t n, int64_t k, int64_t ldw, const float* bias) {
  PackedBf16B out;
  out.n_ = n;
  out.k_ = k;
  out.panels_ = AlignedBf16(out.panels() * out.panel_stride());
  // B[kk][col] = bf16(W[col][kk]) at panel[(kk / 2) · 32 + (col % 16) · 2 + kk % 2]; the pad (odd k, columns past
  // n) stays zero.
  uint16_t* dst = out.panels_.data();
  for (int64_t col = 0; col < n; ++col) {
    const float* src = w + col * ldw;
    uint16_t* panel = dst + (col / kNr) * out.panel_stride() + (col % kNr) * 2;
    for (int64_t kk = 0; kk < k; ++kk) panel[(kk / 2) * 2 * kNr + (kk % 2)] = to_bf16(src[kk]);
  }
  if (bias != nullptr) {
    out.bias_ = gemm::AlignedFloats(out.padded_n());
    std::memcpy(out.bias_.data(), bias, size_t(n) * sizeof(float));
    out.has_bias_ = true;
  }
  return out;
}

void PackedBf16B::add_to_bias(const float* v) {
  if (!has_bias_) {
    bias_ = gemm::AlignedFloats(padded_n());
    has_bias_ = true;
  }
  for (int64_t j = 0; j < n_; ++j) bias_.data()[j] += v[j];
}

void convert_rows(const float* x, int64_t ldx, int64_t rows, int64_t k, uint16_t* dst, int64_t ld,
                  Bf16Kernel kernel) {
#if defined(__x86_64__) || defined(__i386__)
  if (uses_avx512_bf16(kernel) && cpu_has(CpuExt::kAvx512Bf16)) {
    convert_rows_avx512(x, ldx, rows, k, dst, ld);
    return;
  }
#endif
  (void)kernel;
  // Branch-free rounding (the NaN case as a select) so the compiler vectorises the row with the baseline ISA.
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = x + r * ldx;
    uint16_t* out = dst + r * ld;
    for (int64_t j = 0; j < k; ++j) {
      uint32_t u;
      std::memcpy(&u, src + j, 4);
      const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
      const uint32_t nan = (u >> 16) | 0x40u;
      out[j] = uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
    }
    if (k % 2 != 0) out[k] = 0;
  }
}

void widen_bf16(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_bf16(src[i]);
}

void narrow_to_bf16(const float* src, int64_t n, uint16_t* dst, Bf16Kernel kernel) {
  // One row of the even part (convert_rows writes no pad for an even length), the odd last value alone.
  const int64_t even = n - n % 2;
  if (even > 0) convert_rows(src, even, 1, even, dst, even, kernel);
  if (n % 2 != 0) dst[n - 1] = to_bf16(src[n - 1]);
}

void softmax_exp_rows_bf16(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max, float* row_sum,
                           uint16_t* p, int64_t ldp, CpuIsa isa, Bf16Kernel kernel) {
#if defined(__x86_64__) || defined(__i386__)
  if (uses_avx512_bf16(kernel) && isa == CpuIsa::kAvx512 && cpu_has(CpuExt::kAvx512Bf16)) {
    softmax_exp_rows_bf16_avx512(s, rows, n, ld, scale, row_max, row_sum, p, ldp);
    return;
  }
#endif
  gemm::softmax_exp_rows_for_bf16(s, rows, n, ld, scale, row_max, row_sum, isa);
  convert_rows(s, ld, rows, n, p, ldp, kernel);
}

namespace {
// One source value as bf16: an fp32 one rounded (to_bf16), a bf16 one as it is.
inline uint16_t bf16_of(float v) { return to_bf16(v); }
inline uint16_t bf16_of(uint16_t v) { return v; }

// The packings for an fp32 (T = float) or bf16 (T = uint16_t) source: the AVX-512 forms where they run, else the
// portable loops (pads, odd k's last pair element and columns past n, zero).
template <class T>
void pack_transposed(const T* w, int64_t n, int64_t k, int64_t ldw, uint16_t* dst, Bf16Kernel kernel) {
#if defined(__x86_64__) || defined(__i386__)
  if (uses_avx512_bf16(kernel) && cpu_has(CpuExt::kAvx512Bf16)) {
    pack_b_transposed_bf16_avx512(w, n, k, ldw, dst);
    return;
  }
#endif
  (void)kernel;
  const int64_t k2 = padded_k(k), panels = (n + kNr - 1) / kNr;
  for (int64_t p = 0; p < panels; ++p) {
    uint16_t* panel = dst + p * k2 * kNr;
    for (int64_t j = 0; j < kNr; ++j) {
      const int64_t col = p * kNr + j;
      const T* src = col < n ? w + col * ldw : nullptr;
      uint16_t* out = panel + 2 * j;
      for (int64_t kk = 0; kk < k2; ++kk)
        out[(kk / 2) * 2 * kNr + (kk % 2)] = src != nullptr && kk < k ? bf16_of(src[kk]) : uint16_t(0);
    }
  }
}

template <class T>
void pack_rows(const T* b, int64_t k, int64_t n, int64_t ldb, uint16_t* dst, Bf16Kernel kernel) {
#if defined(__x86_64__) || defined(__i386__)
  if (uses_avx512_bf16(kernel) && cpu_has(CpuExt::kAvx512Bf16)) {
    pack_b_bf16_avx512(b, k, n, ldb, dst);
    return;
  }
#endif
  (void)kernel;
  const int64_t k2 = padded_k(k), panels = (n + kNr - 1) / kNr;
  for (int64_t p = 0; p < panels; ++p) {
    uint16_t* panel = dst + p * k2 * kNr;
    const int64_t cols = n - p * kNr < kNr ? n - p * kNr : kNr;
    for (int64_t q = 0; q < k2 / 2; ++q) {
      const T* r0 = b + (2 * q) * ldb + p * kNr;
      const bool has_r1 = 2 * q + 1 < k;
      uint16_t* out = panel + q * 2 * kNr;
      for (int64_t j = 0; j < kNr; ++j) {
        out[2 * j] = j < cols ? bf16_of(r0[j]) : uint16_t(0);
        out[2 * j + 1] = j < cols && has_r1 ? bf16_of(r0[ldb + j]) : uint16_t(0);
      }
    }
  }
}
}  // namespace

void pack_b_transposed_bf16(const float* w, int64_t n, int64_t k, int64_t ldw, uint16_t* dst, Bf16Kernel kernel) {
  pack_transposed(w, n, k, ldw, dst, kernel);
}
void pack_b_transposed_bf16(const uint16_t* w, int64_t n, int64_t k, int64_t ldw, uint16_t* dst, Bf16Kernel kernel) {
  pack_transposed(w, n, k, ldw, dst, kernel);
}
void pack_b_bf16(const float* b, int64_t k, int64_t n, int64_t ldb, uint16_t* dst, Bf16Kernel kernel) {
  pack_rows(b, k, n, ldb, dst, kernel);
}
void pack_b_bf16(const uint16_t* b, int64_t k, int64_t n, int64_t ldb, uint16_t* dst, Bf16Kernel kernel) {
  pack_rows(b, k, n, ldb, dst, kernel);
}

namespace {

void run_block(const Bf16BlockArgs& g, Bf16Kernel kernel) {
  switch (kernel) {
#if defined(__x86_64__) || defined(__i386__)
    case Bf16Kernel::kAvx512Bf16:
      if (cpu_has(CpuExt::kAvx512Bf16)) return gemm_bf16_block_avx512(g);
      break;
    case Bf16Kernel::kAmxBf16:
      if (cpu_has(CpuExt::kAmxBf16) && cpu_has(CpuExt::kAvx512Bf16)) return gemm_bf16_block_amx(g);
      if (cpu_has(CpuExt::kAvx512Bf16)) return gemm_bf16_block_avx512(g);
      break;
#endif
#if defined(__aarch64__)
    case Bf16Kernel::kNeonBf16:
      if (cpu_has(CpuExt::kNeonBf16)) return gemm_bf16_block_neon(g);
      break;
#endif
    default: break;
  }
  // The scalar kernel, or a hardware kernel this CPU (or VITFAST_CPU_EXT) does not allow: the same products.
  gemm_bf16_block_scalar(g);
}

Bf16BlockArgs block_args(int64_t m, const uint16_t* a, int64_t lda, float* c, int64_t ldc, const gemm::Epilogue& ep) {
  Bf16BlockArgs g;
  g.m = m;
  g.a = a;
  g.lda = lda;
  g.c = c;
  g.ldc = ldc;
  g.c_padded = ep.c_padded;
  g.accumulate = ep.accumulate;
  g.bias = nullptr;
  g.gelu = ep.gelu;
  g.addend = ep.addend;
  g.ld_addend = ep.ld_addend;
  g.row_scale = ep.row_scale;
  g.c16 = ep.c16;
  g.ldc16 = ep.ldc16;
  return g;
}

}  // namespace

void gemm_bf16_raw(int64_t m, const uint16_t* a, int64_t lda, const uint16_t* b_panels, int64_t n, int64_t k, float* c,
                   int64_t ldc, const gemm::Epilogue& ep, Bf16Kernel kernel) {
  if (m <= 0 || n <= 0) return;
  Bf16BlockArgs g = block_args(m, a, lda, c, ldc, ep);
  g.n = n;
  g.k2 = padded_k(k);
  g.b = b_panels;
  g.b_panel_stride = g.k2 * kNr;
  g.panel_begin = 0;
  g.panel_end = (n + kNr - 1) / kNr;
  run_block(g, kernel);
}

void gemm_bf16_panels(int64_t m, const uint16_t* a, int64_t lda, const PackedBf16B& b, int64_t panel_begin,
                      int64_t panel_end, float* c, int64_t ldc, const gemm::Epilogue& ep, Bf16Kernel kernel) {
  if (m <= 0 || panel_end <= panel_begin) return;
  Bf16BlockArgs g = block_args(m, a, lda, c, ldc, ep);
  g.n = b.n();
  g.k2 = b.k2();
  g.b = b.panel_data();
  g.b_panel_stride = b.panel_stride();
  g.panel_begin = panel_begin;
  g.panel_end = panel_end;
  g.bias = ep.bias ? b.bias() : nullptr;
  run_block(g, kernel);
}

}  // namespace gemm16
}  // namespace vitfast
