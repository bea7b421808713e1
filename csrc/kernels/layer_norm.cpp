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

}  // namespace vitfast
