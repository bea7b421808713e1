#include "ops/int8_common.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "ops/op_threads.h"
#include "ops/op_utils.h"
#include "ops/weight_cache.h"

namespace vitfast {
namespace ops {

int64_t check_int8_weight(const char* name, const char* scale_name, const at::Tensor& w, const at::Tensor& scale,
                          int64_t k, const char* k_name, const at::Tensor& x) {
  check_required({{name, &w}, {scale_name, &scale}});
  TORCH_CHECK_VALUE(w.scalar_type() == at::kChar, name, ": expected dtype torch.int8, got ", py_dtype(w.scalar_type()));
  TORCH_CHECK_VALUE(w.dim() == 2 && w.size(1) == k, name, ": expected shape [N, ", k, "] (", k_name, " = ", k,
                    "), got ", fmt_shape(w.sizes()));
  TORCH_CHECK_VALUE(scale.scalar_type() == at::kFloat, scale_name, ": expected dtype torch.float32, got ",
                    py_dtype(scale.scalar_type()));
  TORCH_CHECK_VALUE(scale.dim() == 1 && scale.size(0) == w.size(0), scale_name, ": expected shape [", w.size(0),
                    "], got ", fmt_shape(scale.sizes()));
  TORCH_CHECK_VALUE(w.device() == x.device(), name, ": expected device ", x.device(), " (same as x), got ", w.device());
  TORCH_CHECK_VALUE(scale.device() == x.device(), scale_name, ": expected device ", x.device(), " (same as x), got ",
                    scale.device());
  return w.size(0);
}

void check_smooth(const char* name, const at::Tensor& smooth, int64_t k, const at::Tensor& x) {
  if (!smooth.defined()) return;
  TORCH_CHECK_VALUE(smooth.scalar_type() == at::kFloat, name, ": expected dtype torch.float32, got ",
                    py_dtype(smooth.scalar_type()));
  TORCH_CHECK_VALUE(smooth.dim() == 1 && smooth.size(0) == k, name, ": expected shape [", k, "], got ",
                    fmt_shape(smooth.sizes()));
  TORCH_CHECK_VALUE(smooth.device() == x.device(), name, ": expected device ", x.device(), " (same as x), got ",
                    smooth.device());
}

void check_act_scale(const char* name, double value) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value >= 0.0, name,
                    ": expected a finite number >= 0 (0: per-token scales), got ", value);
}

std::shared_ptr<const gemm8::PackedInt8B> packed_int8_weight(const char* op, const at::Tensor& qw,
                                                             const at::Tensor& scale, const at::Tensor& bias,
                                                             int64_t row0, int64_t rows, const at::Tensor& extra_bias,
                                                             gemm8::Int8Kernel kernel, const char* qw_name,
                                                             const char* scale_name, const char* bias_name) {
  // A pack is made for one kernel (the VNNI one stores u8 = q + 128) and one row range: both are in the cache's name.
  const std::string key = std::string(op) + "/" + gemm8::int8_kernel_name(kernel) + "/" + std::to_string(row0) + "+" +
                          std::to_string(rows);
  return cached_pack_as<gemm8::PackedInt8B>(key.c_str(), {qw, scale, bias, extra_bias}, [&]() -> PackedEntry {
    check_finite(scale_name, scale);
    check_finite(bias_name, bias);
    check_finite("b_out", extra_bias);
    const at::Tensor q = qw.contiguous();
    const at::Tensor s = scale.contiguous();
    at::Tensor b;
    if (bias.defined()) b = bias.to(at::kFloat).slice(0, row0, row0 + rows).contiguous();
    if (extra_bias.defined()) {
      const at::Tensor e = extra_bias.to(at::kFloat);
      b = b.defined() ? (b + e).contiguous() : e.contiguous();  // fp32 sum: the reference adds b_in[A:] + b_out once
    }
    try {
      auto packed = std::make_shared<gemm8::PackedInt8B>(gemm8::PackedInt8B::pack(
          q.data_ptr<int8_t>() + row0 * q.size(1), rows, q.size(1), q.size(1), s.data_ptr<float>() + row0,
          b.defined() ? b.data_ptr<float>() : nullptr, kernel));
      PackedEntry e;
      e.bytes = packed->bytes();
      e.packed = std::move(packed);
      return e;
    } catch (const std::invalid_argument& err) {
      TORCH_CHECK_VALUE(false, qw_name, ": expected values in [-127, 127] (symmetric int8), got ", err.what());
    }
  });
}

at::Tensor contiguous_float(const at::Tensor& t) {
  if (!t.defined()) return t;
  return t.scalar_type() == at::kFloat ? t.contiguous() : t.to(at::kFloat).contiguous();
}

int64_t min_parallel_macs(gemm8::Int8Kernel kernel) {
  switch (kernel) {
    case gemm8::Int8Kernel::kAmxInt8: return int64_t(1) << 22;
    case gemm8::Int8Kernel::kAvx512Vnni: return int64_t(1) << 20;
    default: return int64_t(1) << 18;
  }
}

int64_t min_parallel_block_macs(gemm8::Int8Kernel kernel) {
  switch (kernel) {
    case gemm8::Int8Kernel::kAmxInt8: return int64_t(1) << 23;
    case gemm8::Int8Kernel::kAvx512Vnni: return int64_t(1) << 22;
    default: return int64_t(1) << 21;
  }
}

void for_each_token_tile(int64_t rows, CpuIsa isa, int64_t macs_per_row, gemm8::Int8Kernel kernel,
                         const std::function<void(int64_t r0, int64_t m)>& body) {
  const bool small = macs_per_row > 0 && rows < min_parallel_macs(kernel) / macs_per_row;
  const gemm::RowShares shares(rows, small ? 1 : op_threads(), isa);  // one share runs inline: no parallel region
  at::parallel_for(0, shares.chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t r_end = shares.end(c);
      for (int64_t r0 = shares.begin(c); r0 < r_end; r0 += kInt8TokenTile)
        body(r0, std::min(kInt8TokenTile, r_end - r0));
    }
  });
}

namespace {
struct ThreadBuffers {
  gemm8::AlignedBytes qa;
  gemm::AlignedFloats sa;
  std::vector<int32_t> rowsum;
};
}  // namespace

QuantizedRows thread_quantized_rows(int64_t rows, int64_t k, int slot) {
  thread_local ThreadBuffers buffers[2];
  ThreadBuffers& b = buffers[slot & 1];
  const int64_t lda = gemm8::padded_k(k);
  if (b.qa.size() < rows * lda) b.qa = gemm8::AlignedBytes(rows * lda);
  if (b.sa.size() < rows) b.sa = gemm::AlignedFloats(rows);
  if (int64_t(b.rowsum.size()) < rows) b.rowsum.resize(size_t(rows));
  return {b.qa.data(), lda, b.sa.data(), b.rowsum.data()};
}

float* thread_int8_scratch(int64_t floats) {
  thread_local gemm::AlignedFloats scratch;
  if (scratch.size() < floats) scratch = gemm::AlignedFloats(floats);
  return scratch.data();
}

void quantize_activations(const float* x, int64_t ldx, int64_t rows, int64_t k, const float* smooth, double act_scale,
                          const QuantizedRows& q, CpuIsa isa) {
  if (act_scale == 0.0) {
    gemm8::quantize_rows(x, ldx, rows, k, smooth, q.qa, q.lda, q.sa, q.rowsum, isa);
    return;
  }
  // Static: one scale for the tensor (calibrated).  A plain loop: it is O(rows·k) beside the GEMM's O(rows·k·n).
  const float scale = float(act_scale);
  const float inv = 1.0f / scale;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    int8_t* out = q.qa + r * q.lda;
    bool finite = true;
    int32_t sum = 0;
    for (int64_t c = 0; c < k; ++c) {
      const float xs = smooth != nullptr ? xr[c] * smooth[c] : xr[c];
      finite = finite && std::isfinite(xs);
      float t = std::nearbyint(xs * inv);  // (x · inv may overflow to ±Inf: clamped to ±127 below)  // round half to even (the default rounding mode), as torch.round
      t = t > 127.0f ? 127.0f : (t < -127.0f ? -127.0f : t);
      const int v8 = std::isfinite(t) ? int(t) : 0;
      out[c] = int8_t(v8);
      sum += v8;
    }
    if (!finite) {  // as the dynamic rule: the row's output is NaN, its codes 0
      for (int64_t c = 0; c < k; ++c) out[c] = 0;
      sum = 0;
    }
    for (int64_t c = k; c < q.lda; ++c) out[c] = 0;
    q.sa[r] = finite ? scale : NAN;
    q.rowsum[r] = sum;
  }
}

}  // namespace ops
}  // namespace vitfast
