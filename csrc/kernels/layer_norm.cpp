#include "kernels/layer_norm.h"

#include "kernels/gemm_isa.h"

namespace vitfast {

void layer_norm_rows(const float* x, float* y, int64_t rows, int64_t c, const float* gamma, const float* beta,
                     float eps, CpuIsa isa) {
  if (rows <= 0 || c <= 0) return;
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case CpuIsa::kAvx2: gemm::layer_norm_rows_avx2(x, y, rows, c, gamma, beta, eps); return;
    case CpuIsa::kAvx512: gemm::layer_norm_rows_avx512(x, y, rows, c, gamma, beta, eps); return;
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon: gemm::layer_norm_rows_neon(x, y, rows, c, gamma, beta, eps); return;
#endif
    default: gemm::layer_norm_rows_scalar(x, y, rows, c, gamma, beta, eps); return;
  }
}

void layer_norm_rows_bf16(const float* x, const uint16_t* x16, float* widened, uint16_t* y16, int64_t ld16,
                          int64_t rows, int64_t c, const float* gamma, const float* beta, float eps, CpuIsa isa,
                          gemm16::Bf16Kernel kernel, float* scratch) {
  if (rows <= 0 || c <= 0) return;
#if defined(__x86_64__) || defined(__i386__)
  if (isa == CpuIsa::kAvx512) {
    gemm::layer_norm_rows_bf16_avx512(x, x16, widened, y16, ld16, rows, c, gamma, beta, eps);
    return;
  }
#endif
  if (x16 != nullptr) {
    gemm16::widen_bf16(x16, rows * c, widened);
    x = widened;
  }
  layer_norm_rows(x, scratch, rows, c, gamma, beta, eps, isa);
  gemm16::convert_rows(scratch, c, rows, c, y16, ld16, kernel);
}

}  // namespace vitfast
