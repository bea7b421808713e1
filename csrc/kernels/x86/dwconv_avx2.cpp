// AVX2 rows of the depthwise convolution of dwconv_attention (contract: kernels/dwconv_isa.h): the
// width-generic body of dwconv_body.inc at 8 lanes.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC target("avx2,fma")
#endif

#include <stdint.h>

#include "kernels/dwconv_isa.h"
#include "kernels/x86/avx2_math.h"
#include "kernels/x86/dwconv_body.inc"

namespace vitfast {
namespace dwconv {

void conv_grid_row_avx2(float* u, const float* const* rows, const float* taps, int64_t cols, int64_t ld,
                        int64_t grid_w, int64_t ksize) {
  conv_grid_row<x86::Avx2>(u, rows, taps, cols, ld, grid_w, ksize);
}

}  // namespace dwconv
}  // namespace vitfast

#if defined(__clang__)
#pragma clang attribute pop
#endif
