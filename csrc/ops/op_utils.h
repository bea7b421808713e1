// Helpers shared by the torch bindings: argument messages worded like the Python checks (vitfast/reference/_check.py and vitfast/reference/<op>.py) (name the
// argument, the expected and the given, with Python's spelling of dtypes and shapes).
#pragma once

#include <ATen/ATen.h>

#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace vitfast {
namespace ops {

// "[2, 197, 384]", as vitfast.reference._check.fmt_shape prints it.
inline std::string fmt_shape(at::IntArrayRef sizes) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < sizes.size(); ++i) s << (i ? ", " : "") << sizes[i];
  s << "]";
  return s.str();
}

// Python's name of a dtype ("torch.float32"), so C++ and Python messages read the same.
inline std::string py_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kDouble: return "torch.float64";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    default: return std::string("torch.") + c10::toString(t);
  }
}

// a·b in decimal for an argument message, exact where the int64 product would wrap (num_heads = 2⁶² must not
// read as "3·num_heads = 2"): Python's validators print the true product, and so must their C++ mirrors.
inline std::string exact_product(int64_t a, int64_t b) {
#if defined(__SIZEOF_INT128__)
  __int128 p = static_cast<__int128>(a) * b;
  const bool negative = p < 0;
  unsigned __int128 u = negative ? -static_cast<unsigned __int128>(p) : static_cast<unsigned __int128>(p);
  std::string digits;
  do {
    digits.insert(digits.begin(), char('0' + int(u % 10)));
    u /= 10;
  } while (u != 0);
  return negative ? "-" + digits : digits;
#else
  return std::to_string(a) + "*" + std::to_string(b);
#endif
}

// A required Tensor argument passed as None arrives as an undefined tensor: say so (its dim() / dtype would
// otherwise produce "got shape [0]" or "got torch.UNKNOWN_SCALAR").  Same wording as vitfast.reference._check.check_tensor.
inline void check_required(std::initializer_list<std::pair<const char*, const at::Tensor*>> tensors) {
  for (const auto& nt : tensors) TORCH_CHECK_TYPE(nt.second->defined(), nt.first, ": expected a Tensor, got None");
}

inline bool is_float_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

// Number of NaN/Inf elements, each element read exactly once (an all-ones exponent field).  Not at::isfinite: it
// computes (x == x) with two loads of the same memory, so a weight that another thread was overwriting with
// finite values between the two loads read as NaN (1 refusal in ~25 calls overlapping a `w.copy_(finite)`).
template <class Bits>
inline int64_t count_exponent_all_ones(const at::Tensor& contiguous, Bits mask) {
  const Bits* p = static_cast<const Bits*>(contiguous.data_ptr());
  const int64_t n = contiguous.numel();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += (p[i] & mask) == mask;
  return bad;
}

inline int64_t count_nonfinite(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  switch (c.scalar_type()) {
    case at::kFloat: return count_exponent_all_ones<uint32_t>(c, 0x7f800000u);
    case at::kHalf: return count_exponent_all_ones<uint16_t>(c, uint16_t(0x7c00));
    case at::kBFloat16: return count_exponent_all_ones<uint16_t>(c, uint16_t(0x7f80));
    default: return c.numel() - at::isfinite(c).sum().item<int64_t>();
  }
}

// Refuse NaN/Inf in a weight, as vitfast._checks.check_finite_parameter words it.  Callers run it once per weight
// version (see weight_cache.h), not per call.
inline void check_finite(const char* name, const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return;
  const int64_t bad = count_nonfinite(t);
  TORCH_CHECK_VALUE(bad == 0, name, ": expected finite values, got ", bad, " non-finite of ", t.numel());
}

using NamedTensor = std::pair<const char*, const at::Tensor*>;

// Every optional companion of x (weights, biases, residual) must share x's dtype and device.
inline void check_same_dtype_device_as_x(const at::Tensor& x, std::initializer_list<NamedTensor> others) {
  for (const auto& [name, t] : others) {
    if (!t->defined()) continue;
    TORCH_CHECK_VALUE(t->scalar_type() == x.scalar_type(), name, ": expected dtype ", py_dtype(x.scalar_type()),
                      " (same as x), got ", py_dtype(t->scalar_type()));
    TORCH_CHECK_VALUE(t->device() == x.device(), name, ": expected device ", x.device(), " (same as x), got ",
                      t->device());
  }
}

// An optional 1-D bias of length n.
inline void check_bias_shape(const char* name, const at::Tensor& bias, int64_t n) {
  if (bias.defined())
    TORCH_CHECK_VALUE(bias.dim() == 1 && bias.size(0) == n, name, ": expected shape [", n, "], got ",
                      fmt_shape(bias.sizes()));
}

// An optional residual shaped like the output: x's leading dims, then c_out.
inline void check_residual_shape(const at::Tensor& residual, const at::Tensor& x, int64_t c_out) {
  if (!residual.defined()) return;
  std::vector<int64_t> expected = x.sizes().vec();
  expected.back() = c_out;
  TORCH_CHECK_VALUE(residual.sizes().equals(expected), "residual: expected shape ", fmt_shape(expected), ", got ",
                    fmt_shape(residual.sizes()));
}

// The token grid of `name` [B, N, ·] (prefix tokens first, then grid_h × grid_w): both sides >= 1 and N >= their
// product; returns the prefix tokens.  Same words as vitfast.reference._check.check_token_grid.  grid_h·grid_w <= N is
// tested as grid_h <= N / grid_w: the product wraps for huge grids (2⁶²·4 = 0 passed and crashed; 2³²·2³² reached
// the allocator).
inline int64_t check_token_grid(const char* name, const at::Tensor& t, int64_t grid_h, int64_t grid_w) {
  TORCH_CHECK_VALUE(grid_h >= 1, "grid_h: expected an int >= 1, got ", grid_h);
  TORCH_CHECK_VALUE(grid_w >= 1, "grid_w: expected an int >= 1, got ", grid_w);
  const int64_t tokens = t.size(1);
  TORCH_CHECK_VALUE(grid_h <= tokens / grid_w, name, ": expected N >= grid_h·grid_w = ", grid_h, "·", grid_w, " = ",
                    exact_product(grid_h, grid_w), " tokens (prefix tokens, then the grid), got shape ",
                    fmt_shape(t.sizes()));
  return tokens - grid_h * grid_w;
}

// Beyond the Python checks (the reference accepts any layout): the kernels read dense memory.
inline void check_dense(std::initializer_list<NamedTensor> tensors) {
  for (const auto& [name, t] : tensors) {
    if (t->defined())
      TORCH_CHECK_VALUE(t->layout() == at::kStrided, name, ": expected a dense (strided) tensor, got layout ",
                        t->layout());
  }
}

}  // namespace ops
}  // namespace vitfast
