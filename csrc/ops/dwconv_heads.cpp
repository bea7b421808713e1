// torch binding of the drop-in DW-conv heads on their values: `torch.ops.vitfast.dwconv_heads` on CPU.
//
//   dwconv_heads(Tensor v, Tensor kernel, int grid_h, int grid_w) -> Tensor      (schema: vitfast/ops/dwconv_heads.py)
//   U_grid = Conv_DW(V_grid, kernel) (k×k per channel, zero padding), U_prefix = mean of V over the grid
//                                                                              (vitfast/reference/dwconv_heads.py)
//
// - Checks: the same as vitfast.reference.dwconv_heads.check_dwconv_heads_args, same wording (ValueError).
// - The kernel is transposed tap-major once per version (cache entry "dwconv_heads", finite values checked there) and
//   convolved by dwconv_attention's per-row kernels (kernels/dwconv_attention.h dwconv_conv_grid_rows).
// - fp16/bf16: converted to fp32, computed in fp32, rounded once at the end.
// - Threads (op_threads.h): (image, range of grid rows) tasks as in dwconv_attention; the prefix rows (the grid
//   mean, summed in float64 per channel) by the task that owns the image's first grid row.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/dwconv_attention.h"
#include "ops/cpu_ops.h"
#include "ops/int8_common.h"  // contiguous_float
#include "ops/op_threads.h"
#include "ops/op_utils.h"
#include "ops/output_pool.h"
#include "ops/weight_cache.h"

namespace vitfast {
namespace ops {
namespace {

struct Dims {
  int64_t prefix, width, ksize;
};

// Mirror of vitfast.reference.dwconv_heads.check_dwconv_heads_args (same order, same messages).
Dims check_args(const at::Tensor& v, const at::Tensor& kernel, int64_t grid_h, int64_t grid_w) {
  check_required({{"v", &v}, {"kernel", &kernel}});
  TORCH_CHECK_VALUE(v.dim() == 3, "v: expected 3-D [B, N, D], got shape ", fmt_shape(v.sizes()));
  TORCH_CHECK_VALUE(is_float_dtype(v.scalar_type()), "v: expected dtype float32, float16 or bfloat16, got ",
                    py_dtype(v.scalar_type()));
  const int64_t prefix = check_token_grid("v", v, grid_h, grid_w), width = v.size(2);
  TORCH_CHECK_VALUE(kernel.dim() == 3 && kernel.size(0) == width && kernel.size(1) == kernel.size(2) &&
                        kernel.size(1) % 2 == 1,
                    "kernel: expected [", width, ", k, k] with k odd (one k×k filter per value channel), got shape ",
                    fmt_shape(kernel.sizes()));
  TORCH_CHECK_VALUE(kernel.scalar_type() == v.scalar_type() && kernel.device() == v.device(), "kernel: expected dtype ",
                    py_dtype(v.scalar_type()), " on ", v.device(), " (like v), got ", py_dtype(kernel.scalar_type()),
                    " on ", kernel.device());
  check_dense({{"v", &v}, {"kernel", &kernel}});
  return {prefix, width, kernel.size(1)};
}

struct Taps {
  std::vector<float> taps;
};

std::shared_ptr<const Taps> packed_taps(const at::Tensor& kernel, const Dims& d) {
  return cached_pack_as<Taps>("dwconv_heads", {kernel}, [&]() -> PackedEntry {
    check_finite("kernel", kernel);
    const at::Tensor k = contiguous_float(kernel);
    auto packed = std::make_shared<Taps>();
    packed->taps = dwconv_taps(k.data_ptr<float>(), d.width, d.ksize);
    PackedEntry e;
    e.bytes = packed->taps.size() * sizeof(float);
    e.packed = std::move(packed);
    return e;
  });
}

}  // namespace

at::Tensor dwconv_heads_op(const at::Tensor& v, const at::Tensor& kernel, int64_t grid_h, int64_t grid_w) {
  const Dims d = check_args(v, kernel, grid_h, grid_w);
  TORCH_CHECK_VALUE(v.device().is_cpu(), "v: expected device cpu (the CPU kernel), got ", v.device());
  const int64_t batch = v.size(0), tokens = v.size(1), hw = grid_h * grid_w, D = d.width;
  if (batch == 0 || D == 0) return at::empty({batch, tokens, D}, v.options());
  const std::shared_ptr<const Taps> taps = packed_taps(kernel, d);
  const at::Tensor vf = contiguous_float(v);
  at::Tensor out = empty_output({batch, tokens, D}, at::kFloat);
  const float* vp = vf.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const CpuIsa isa = active_cpu_isa();
  const DwconvAttentionTiling tiling;
  const int64_t ws_floats = dwconv_conv_workspace_floats(D, grid_w, d.ksize, tiling);
  dwconv_grid_tasks(batch, grid_h, ws_floats, [&](int64_t b, int64_t row0, int64_t row1, float* ws) {
    const float* v_grid = vp + (b * tokens + d.prefix) * D;
    float* o = op + b * tokens * D;
    if (row0 == 0 && d.prefix > 0) {  // every prefix row: the mean of V over the grid (float64 sums)
      std::vector<double> acc(size_t(D), 0.0);
      for (int64_t t = 0; t < hw; ++t)
        for (int64_t c = 0; c < D; ++c) acc[size_t(c)] += v_grid[t * D + c];
      for (int64_t p = 0; p < d.prefix; ++p)
        for (int64_t c = 0; c < D; ++c) o[p * D + c] = float(acc[size_t(c)] / double(hw));
    }
    dwconv_conv_grid_rows(taps->taps.data(), D, d.ksize, grid_h, grid_w, row0, row1, v_grid, D, o + d.prefix * D, D,
                          ws, isa, tiling);
  });
  return v.scalar_type() == at::kFloat ? out : out.to(v.scalar_type());
}

}  // namespace ops
}  // namespace vitfast

TORCH_LIBRARY_IMPL(vitfast, CPU, m) { m.impl("dwconv_heads", &vitfast::ops::dwconv_heads_op); }
