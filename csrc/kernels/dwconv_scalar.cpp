// The portable depthwise-convolution rows of dwconv_attention (contract: dwconv_isa.h): the scalar path, and
// the path of aarch64 builds (the inner loop over contiguous channels is vectorised by the compiler for the
// baseline ISA).  Same order of the sum as the SIMD rows: r, then c.
#include <stdint.h>

#include <algorithm>
#include <cstring>

#include "kernels/dwconv_isa.h"

namespace vitfast {
namespace dwconv {

void conv_grid_row_scalar(float* u, const float* const* rows, const float* taps, int64_t cols, int64_t ld,
                          int64_t grid_w, int64_t ksize) {
  const int64_t pad = ksize / 2;
  for (int64_t j = 0; j < grid_w; ++j) std::memset(u + j * ld, 0, size_t(cols) * sizeof(float));
  for (int64_t r = 0; r < ksize; ++r) {
    if (rows[r] == nullptr) continue;
    for (int64_t c = 0; c < ksize; ++c) {
      const int64_t dc = c - pad;
      const float* kt = taps + (r * ksize + c) * cols;
      const int64_t j0 = std::max<int64_t>(0, -dc), j1 = std::min<int64_t>(grid_w, grid_w - dc);
      for (int64_t j = j0; j < j1; ++j) {
        float* __restrict uj = u + j * ld;
        const float* __restrict vj = rows[r] + (j + dc) * ld;
        for (int64_t d = 0; d < cols; ++d) uj[d] += kt[d] * vj[d];
      }
    }
  }
}

}  // namespace dwconv
}  // namespace vitfast
