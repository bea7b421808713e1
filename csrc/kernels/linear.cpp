#include "kernels/linear.h"

#include <algorithm>

namespace vitfast {

namespace {
int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
}  // namespace

void linear_rows(const gemm::PackedB& w, int64_t rows, const float* x, int64_t ldx, const float* residual,
                 int64_t ld_residual, float* out, int64_t ldo, CpuIsa isa, int64_t panel_begin,
                 int64_t panel_end, const LinearTiling& tiling) {
  if (panel_end < 0) panel_end = w.panels();
  if (rows <= 0 || panel_end <= panel_begin) return;
  // Balanced token tiles of whole register blocks (as in channel_idle_ffn_rows): 394 rows = 198 + 196,
  // never 198 + 198 + a sliver that streams every weight panel for almost no work.
  const int64_t max_rows = round_up(std::max<int64_t>(tiling.token_tile, 1), gemm::kMr);
  const int64_t n_tiles = (rows + max_rows - 1) / max_rows;
  const int64_t tile_rows = std::min(max_rows, round_up((rows + n_tiles - 1) / n_tiles, gemm::kMr));
  gemm::Epilogue ep;
  ep.bias = true;  // no-op when w was packed without a bias
  ep.ld_addend = ld_residual;
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t m = std::min(tile_rows, rows - r0);
    ep.addend = residual != nullptr ? residual + r0 * ld_residual : nullptr;
    gemm::gemm_panels(m, x + r0 * ldx, ldx, w, panel_begin, panel_end, out + r0 * ldo, ldo, ep, isa,
                      tiling.kc);
  }
}

void linear_rows_bf16(const gemm16::PackedBf16B& w, int64_t rows, const uint16_t* x, int64_t ldx,
                      const float* residual, int64_t ld_residual, float* out, int64_t ldo, gemm16::Bf16Kernel kernel,
                      int64_t panel_begin, int64_t panel_end, const LinearTiling& tiling, uint16_t* out16,
                      int64_t ldo16) {
  if (panel_end < 0) panel_end = w.panels();
  if (rows <= 0 || panel_end <= panel_begin) return;
  // The token tiles of linear_rows: one x tile stays in L2 while the whole weight streams past it.
  const int64_t max_rows = round_up(std::max<int64_t>(tiling.token_tile, 1), gemm::kMr);
  const int64_t n_tiles = (rows + max_rows - 1) / max_rows;
  const int64_t tile_rows = std::min(max_rows, round_up((rows + n_tiles - 1) / n_tiles, gemm::kMr));
  gemm::Epilogue ep;
  ep.bias = true;
  ep.ld_addend = ld_residual;
  ep.ldc16 = ldo16;
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t m = std::min(tile_rows, rows - r0);
    ep.addend = residual != nullptr ? residual + r0 * ld_residual : nullptr;
    ep.c16 = out16 != nullptr ? out16 + r0 * ldo16 : nullptr;
    gemm16::gemm_bf16_panels(m, x + r0 * ldx, ldx, w, panel_begin, panel_end, out != nullptr ? out + r0 * ldo : nullptr,
                             ldo, ep, kernel);
  }
}

}  // namespace vitfast
