// linear_rows of every ISA path against a naive double-precision x·Wᵀ + b + residual: odd sizes around the
// 6 × 16 register block, strided x / residual / out, several token tiles and K blocks, panel ranges, and
// no write outside the valid columns.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/linear.h"
#include "tests/test_util.h"

using namespace vitfast;
using namespace vitfast_test;

namespace {

int check(CpuIsa isa, std::mt19937& rng, int64_t rows, int64_t k, int64_t n, bool with_bias, bool with_res,
          const LinearTiling& tiling) {
  // Row strides larger than the rows: the kernel must honour ldx / ld_residual / ldo.
  const int64_t ldx = k + 3, ldr = n + 5, ldo = n + 2;
  std::vector<float> x = random_vector(rng, size_t(rows * ldx));
  const float scale = 1.0f / std::sqrt(float(std::max<int64_t>(k, 1)));
  std::vector<float> w = random_vector(rng, size_t(n * k), scale), b = random_vector(rng, size_t(n), 0.5f);
  std::vector<float> res = random_vector(rng, size_t(rows * ldr));
  const gemm::PackedB packed = gemm::PackedB::pack_linear(w.data(), n, k, k, with_bias ? b.data() : nullptr);
  const float sentinel = -777.0f;
  std::vector<float> out(size_t(rows * ldo) + 1, sentinel);
  linear_rows(packed, rows, x.data(), ldx, with_res ? res.data() : nullptr, ldr, out.data(), ldo, isa, 0, -1,
              tiling);
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = with_bias ? b[j] : 0.0;
      for (int64_t p = 0; p < k; ++p) acc += double(x[r * ldx + p]) * w[j * k + p];
      if (with_res) acc += res[r * ldr + j];
      worst = std::max(worst, std::fabs(out[r * ldo + j] - acc) / (2e-5 * (1.0 + std::fabs(acc))));
    }
    for (int64_t j = n; j < ldo; ++j)
      VT_CHECK(out[r * ldo + j] == sentinel, "[%s] wrote column %lld of a %lld-column output", cpu_isa_name(isa),
               (long long)j, (long long)n);
  }
  VT_CHECK(out.back() == sentinel, "[%s] wrote past the output", cpu_isa_name(isa));
  VT_CHECK(worst <= 1.0, "[%s] rows=%lld k=%lld n=%lld bias=%d res=%d tile=%lld kc=%lld: error %.3g x tolerance",
           cpu_isa_name(isa), (long long)rows, (long long)k, (long long)n, with_bias, with_res,
           (long long)tiling.token_tile, (long long)tiling.kc, worst);
  return 1;
}

void test_parity(CpuIsa isa) {
  std::mt19937 rng(31);
  LinearTiling small;  // several token tiles and K blocks even for small shapes
  small.token_tile = 12;
  small.kc = 8;
  const LinearTiling tilings[] = {LinearTiling(), small};
  int count = 0;
  for (int64_t rows : {1, 2, 5, 6, 7, 13, 31})
    for (int64_t k : {0, 1, 5, 16, 17, 33})
      for (int64_t n : {1, 3, 15, 16, 17, 40})
        for (const LinearTiling& t : tilings) {
          const bool opt = (rows + k + n) % 2 == 0;  // alternate the optional inputs cheaply
          count += check(isa, rng, rows, k, n, opt, !opt, t);
          count += check(isa, rng, rows, k, n, !opt, opt, t);
        }
  // ViT-like proportions, more rows than one default token tile (qkv-like and proj-like).
  count += check(isa, rng, 197, 64, 192, true, false, LinearTiling());
  count += check(isa, rng, 400, 96, 48, true, true, LinearTiling());
  std::printf("[%s] linear parity: %d cases\n", cpu_isa_name(isa), count);
}

void test_row_and_panel_split(CpuIsa isa) {
  // The binding splits rows (or panels) between threads: any split gives the same bits as one call.
  std::mt19937 rng(8);
  const int64_t rows = 29, k = 21, n = 50;
  std::vector<float> x = random_vector(rng, size_t(rows * k)), w = random_vector(rng, size_t(n * k));
  std::vector<float> b = random_vector(rng, size_t(n)), res = random_vector(rng, size_t(rows * n));
  const gemm::PackedB packed = gemm::PackedB::pack_linear(w.data(), n, k, k, b.data());
  std::vector<float> whole(size_t(rows * n)), by_rows(size_t(rows * n)), by_panels(size_t(rows * n));
  linear_rows(packed, rows, x.data(), k, res.data(), n, whole.data(), n, isa);
  linear_rows(packed, 0, x.data(), k, res.data(), n, by_rows.data(), n, isa);  // no-op
  linear_rows(packed, 12, x.data(), k, res.data(), n, by_rows.data(), n, isa);
  linear_rows(packed, rows - 12, x.data() + 12 * k, k, res.data() + 12 * n, n, by_rows.data() + 12 * n, n, isa);
  linear_rows(packed, rows, x.data(), k, res.data(), n, by_panels.data(), n, isa, 0, 2);
  linear_rows(packed, rows, x.data(), k, res.data(), n, by_panels.data(), n, isa, 2, packed.panels());
  check_same_bits(isa, whole, by_rows, "row split");
  check_same_bits(isa, whole, by_panels, "panel split");
}

}  // namespace

int main() { return run_on_every_isa("test_linear", test_parity, test_row_and_panel_split); }
