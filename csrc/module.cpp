// The Python module `vitfast._C`.  Importing it loads this shared object, which registers the CPU kernels
// (TORCH_LIBRARY_IMPL blocks in csrc/ops/*.cpp) with the dispatcher; the schemas live in vitfast/ops/<op>.py.
#include <torch/extension.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/gemm_bf16.h"
#include "kernels/gemm_int8.h"
#include "kernels/huge_arena.h"
#include "ops/int8_block.h"
#include "ops/op_threads.h"
#include "ops/output_pool.h"
#include "ops/vit_forward.h"
#include "ops/weight_cache.h"

namespace {

using vitfast::CpuIsa;

constexpr CpuIsa kAllIsas[] = {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kNeon};
constexpr vitfast::CpuExt kAllExtensions[] = {vitfast::CpuExt::kAvx512Vnni, vitfast::CpuExt::kAvx512Bf16,
                                              vitfast::CpuExt::kAmxBf16,    vitfast::CpuExt::kAmxInt8,
                                              vitfast::CpuExt::kNeonDotProd, vitfast::CpuExt::kNeonBf16,
                                              vitfast::CpuExt::kAvxVnni};

// A Python dict of named counters (the caches' stats functions).
py::dict counters(std::initializer_list<std::pair<const char*, py::object>> items) {
  py::dict d;
  for (const auto& kv : items) d[kv.first] = kv.second;
  return d;
}

std::vector<std::string> supported_isas() {
  std::vector<std::string> out;
  for (CpuIsa isa : kAllIsas)
    if (vitfast::cpu_supports(isa)) out.emplace_back(vitfast::cpu_isa_name(isa));
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& e : v) s += (s.empty() ? "'" : ", '") + e + "'";
  return s;
}

// Force a code path (tests, A/B benchmarks).  Returns the previous one.  ValueError for a name that is not
// a path, RuntimeError for a path this CPU/binary cannot run.
std::string set_cpu_isa(const std::string& name) {
  for (CpuIsa isa : kAllIsas) {
    if (name != vitfast::cpu_isa_name(isa)) continue;
    const std::string previous = vitfast::cpu_isa_name(vitfast::active_cpu_isa());
    TORCH_CHECK(vitfast::set_active_cpu_isa(isa), "isa: '", name,
                "' is not supported on this CPU/build (supported: ", join(supported_isas()), ")");
    return previous;
  }
  TORCH_CHECK_VALUE(false, "isa: expected one of 'scalar', 'avx2', 'avx512', 'neon', got '", name, "'");
  return {};
}

// VITFAST_CPU_ISA naming a path that is unknown or unsupported falls back to the best path (cpu_features);
// say so once, at import, instead of silently benchmarking the wrong code.
void warn_on_bad_environment() {
  const char* env = std::getenv("VITFAST_CPU_ISA");
  if (env == nullptr || *env == '\0') return;
  const std::string active = vitfast::cpu_isa_name(vitfast::active_cpu_isa());
  if (active == env) return;
  const std::string msg = std::string("VITFAST_CPU_ISA: expected one of ") + join(supported_isas()) +
                          " (supported here), got '" + env + "'; using '" + active + "'";
  // -W error turns the warning into an exception: propagate it (the import fails) instead of returning a
  // module with a Python error set.
  if (PyErr_WarnEx(PyExc_RuntimeWarning, msg.c_str(), 1) != 0) throw py::error_already_set();
}


// ---- vit_forward plans (csrc/ops/vit_forward.h), built once per model structure by vitfast.nn.vit.

using OptTensor = std::optional<at::Tensor>;

vitfast::ops::ForwardNorm forward_norm(const py::object& spec) {  // None or (weight, bias, eps)
  vitfast::ops::ForwardNorm n;
  if (spec.is_none()) return n;
  const py::tuple t = spec.cast<py::tuple>();
  n.present = true;
  n.weight = t[0].cast<OptTensor>();
  n.bias = t[1].cast<OptTensor>();
  n.eps = t[2].cast<double>();
  return n;
}

// ("int8", qweight, w_scale, bias, smooth, act_scale) from `t` at `i`.
vitfast::ops::Int8LinearArgs int8_linear(const py::tuple& t, size_t i) {
  return {t[i].cast<at::Tensor>(), t[i + 1].cast<at::Tensor>(), t[i + 2].cast<OptTensor>(),
          t[i + 3].cast<OptTensor>(), t[i + 4].cast<double>()};
}

// _int8_block's FFN arguments (qw_in, s_in, b_in, qw_out, s_out, b_out, smooth_in, smooth_out, act_scale_in,
// act_scale_out, residual) from `t` at `i`.
vitfast::ops::Int8FfnArgs int8_ffn_args(const py::tuple& t, size_t i) {
  return {t[i].cast<at::Tensor>(),     t[i + 1].cast<at::Tensor>(), t[i + 2].cast<OptTensor>(),
          t[i + 3].cast<at::Tensor>(), t[i + 4].cast<at::Tensor>(), t[i + 5].cast<OptTensor>(),
          t[i + 6].cast<OptTensor>(),  t[i + 7].cast<OptTensor>(),  t[i + 8].cast<double>(),
          t[i + 9].cast<double>(),     t[i + 10].cast<bool>()};
}

vitfast::ops::BlockAttention block_attention(const py::handle& v) {
  const int64_t attention = v.cast<int64_t>();
  if (attention < 0 || attention > 2) throw py::value_error("attention: expected 0 (fp32), 1 (int8) or 2 (bf16)");
  return static_cast<vitfast::ops::BlockAttention>(attention);
}

// An MHSA sub-block's entries from `t` at `i`: (norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj) (vit_block's
// order), or for int8 linears (norm1_eps, qkv's 5 int8 linear entries, num_heads, attention, proj's 5)
// (_int8_block's order).
void float_mhsa(vitfast::ops::ForwardBlock& b, const py::tuple& t, size_t i) {
  b.norm1_eps = t[i].cast<double>();
  b.w_qkv = t[i + 1].cast<at::Tensor>();
  b.b_qkv = t[i + 2].cast<OptTensor>();
  b.num_heads = t[i + 3].cast<int64_t>();
  b.w_proj = t[i + 4].cast<at::Tensor>();
  b.b_proj = t[i + 5].cast<OptTensor>();
}
void int8_mhsa(vitfast::ops::ForwardBlock& b, const py::tuple& t, size_t i) {
  b.attn_int8 = true;
  b.norm1_eps = t[i].cast<double>();
  b.qkv = int8_linear(t, i + 1);
  b.num_heads = t[i + 6].cast<int64_t>();
  b.attention = block_attention(t[i + 7]);
  b.proj = int8_linear(t, i + 8);
}

// One layer: ("fp32", weight, bias) or ("int8", qweight, w_scale, bias, smooth, act_scale).
vitfast::ops::ForwardLinear forward_linear(const py::tuple& t) {
  vitfast::ops::ForwardLinear l;
  const std::string kind = t[0].cast<std::string>();
  if (kind == "int8" && t.size() == 6) {
    l.int8 = true;
    l.q = int8_linear(t, 1);
  } else if (kind == "fp32" && t.size() == 3) {
    l.weight = t[1].cast<at::Tensor>();
    l.bias = t[2].cast<OptTensor>();
  } else {
    throw py::value_error("blocks: a layer is ('fp32', weight, bias) or ('int8', 5 entries)");
  }
  return l;
}

// An MHSA sub-block: ("fp32", float_mhsa's 6 entries) or ("int8", int8_mhsa's 13).
void mhsa_part(vitfast::ops::ForwardBlock& b, const py::tuple& t) {
  const std::string kind = t[0].cast<std::string>();
  if (kind == "int8" && t.size() == 14)
    int8_mhsa(b, t, 1);
  else if (kind == "fp32" && t.size() == 7)
    float_mhsa(b, t, 1);
  else
    throw py::value_error("blocks: an MHSA sub-block is ('fp32', 6 entries) or ('int8', 13 entries)");
}

// An FFN sub-block: ("fp32", ffn_norm, w_in, b_in, w_out, b_out, ffn_residual) or ("int8", ffn_norm, the 11
// int8_ffn_args entries).
void ffn_part(vitfast::ops::ForwardBlock& b, const py::tuple& t) {
  const std::string kind = t[0].cast<std::string>();
  b.ffn_norm = forward_norm(t[1]);
  if (kind == "int8" && t.size() == 13) {
    b.ffn_int8 = true;
    b.ffn = int8_ffn_args(t, 2);
  } else if (kind == "fp32" && t.size() == 7) {
    b.w_in = t[2].cast<at::Tensor>();
    b.b_in = t[3].cast<OptTensor>();
    b.w_out = t[4].cast<at::Tensor>();
    b.b_out = t[5].cast<OptTensor>();
    b.ffn_residual = t[6].cast<bool>();
  } else {
    throw py::value_error("blocks: an FFN sub-block is ('fp32', 6 entries) or ('int8', 12 entries)");
  }
}

vitfast::ops::ForwardBlock forward_block(const py::tuple& t) {
  vitfast::ops::ForwardBlock b;
  const std::string kind = t[0].cast<std::string>();
  if (kind == "vit") {
    // (kind, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out, b_out, residual):
    // vit_block's arguments after x (fp32, or bf16 in a bf16 model).
    if (t.size() != 13) throw py::value_error("blocks: a vit block takes 13 entries");
    float_mhsa(b, t, 1);
    b.ffn_norm_eps = t[7].cast<std::optional<double>>();
    b.w_in = t[8].cast<at::Tensor>();
    b.b_in = t[9].cast<OptTensor>();
    b.w_out = t[10].cast<at::Tensor>();
    b.b_out = t[11].cast<OptTensor>();
    b.ffn_residual = t[12].cast<bool>();
  } else if (kind == "int8") {
    // (kind, _int8_block's arguments after x)
    if (t.size() != 26) throw py::value_error("blocks: an int8 block takes 26 entries");
    b.kind = vitfast::ops::BlockKind::kInt8;
    int8_mhsa(b, t, 1);
    b.ffn_norm_eps = t[14].cast<std::optional<double>>();
    b.ffn = int8_ffn_args(t, 15);
  } else if (kind == "parts") {
    // (kind, MHSA sub-block, FFN sub-block)
    if (t.size() != 3) throw py::value_error("blocks: a parts block takes 3 entries");
    b.kind = vitfast::ops::BlockKind::kParts;
    b.has_attn = b.has_ffn = true;
    mhsa_part(b, t[1].cast<py::tuple>());
    ffn_part(b, t[2].cast<py::tuple>());
  } else if (kind == "xwx") {
    // (kind, norm1_eps, w_q, w_k, key_bias, w_v, w_o, b_o, FFN sub-block)
    if (t.size() != 9) throw py::value_error("blocks: an xwx block takes 9 entries");
    b.kind = vitfast::ops::BlockKind::kXwx;
    b.norm1_eps = t[1].cast<double>();
    b.w_q = t[2].cast<at::Tensor>();
    b.w_k = t[3].cast<OptTensor>();
    b.key_bias = t[4].cast<OptTensor>();
    b.w_v = t[5].cast<at::Tensor>();
    b.w_o = t[6].cast<at::Tensor>();
    b.b_o = t[7].cast<OptTensor>();
    ffn_part(b, t[8].cast<py::tuple>());
  } else if (kind == "xwx_proj") {
    // (kind, norm1_eps, proj_in layer, num_heads, value_dim, full, proj_out layer, FFN sub-block, products: 0 fp32,
    //  1 int8, 2 bf16)
    if (t.size() != 9) throw py::value_error("blocks: an xwx_proj block takes 9 entries");
    b.kind = vitfast::ops::BlockKind::kXwxProjected;
    b.norm1_eps = t[1].cast<double>();
    b.xwx_in = forward_linear(t[2].cast<py::tuple>());
    b.num_heads = t[3].cast<int64_t>();
    b.value_dim = t[4].cast<int64_t>();
    b.xwx_full = t[5].cast<bool>();
    b.xwx_out = forward_linear(t[6].cast<py::tuple>());
    ffn_part(b, t[7].cast<py::tuple>());
    const int64_t products = t[8].cast<int64_t>();
    if (products < 0 || products > 2) throw py::value_error("blocks: an xwx_proj block's products must be 0, 1 or 2");
    b.xwx_products = static_cast<vitfast::ops::BlockAttention>(products);
  } else if (kind == "dwconv") {
    // (kind, norm1_eps, w_qkv, b_qkv, attn_heads, attn_proj, value_w, value_b, conv_kernel, out_w, out_b, grid_h,
    //  grid_w, FFN sub-block); w_qkv / attn_proj None without attention heads
    if (t.size() != 14) throw py::value_error("blocks: a dwconv block takes 14 entries");
    b.kind = vitfast::ops::BlockKind::kDwconv;
    b.norm1_eps = t[1].cast<double>();
    b.attn_proj = t[5].cast<OptTensor>();
    if (b.attn_proj.has_value()) {
      b.w_qkv = t[2].cast<at::Tensor>();
      b.b_qkv = t[3].cast<OptTensor>();
      b.num_heads = t[4].cast<int64_t>();
    }
    b.value_w = t[6].cast<at::Tensor>();
    b.value_b = t[7].cast<OptTensor>();
    b.conv_kernel = t[8].cast<at::Tensor>();
    b.out_w = t[9].cast<at::Tensor>();
    b.out_b = t[10].cast<OptTensor>();
    b.grid_h = t[11].cast<int64_t>();
    b.grid_w = t[12].cast<int64_t>();
    ffn_part(b, t[13].cast<py::tuple>());
  } else if (kind == "dwconv_q") {
    // (kind, norm1_eps, qkv layer or None, attn_heads, attn_proj layer or None, value layer, conv_kernel, out_proj
    //  layer, grid_h, grid_w, FFN sub-block): a DW-conv block with int8 layers
    if (t.size() != 11) throw py::value_error("blocks: a dwconv_q block takes 11 entries");
    b.kind = vitfast::ops::BlockKind::kDwconvProjected;
    b.norm1_eps = t[1].cast<double>();
    if (!t[2].is_none()) {
      b.dw_qkv = forward_linear(t[2].cast<py::tuple>());
      b.num_heads = t[3].cast<int64_t>();
      b.dw_attn_proj = forward_linear(t[4].cast<py::tuple>());
    }
    b.dw_value = forward_linear(t[5].cast<py::tuple>());
    b.conv_kernel = t[6].cast<at::Tensor>();
    b.dw_out = forward_linear(t[7].cast<py::tuple>());
    b.grid_h = t[8].cast<int64_t>();
    b.grid_w = t[9].cast<int64_t>();
    ffn_part(b, t[10].cast<py::tuple>());
  } else if (kind == "gated") {
    // (kind, MHSA sub-block, ffn_norm_eps, FFN sub-block, gate_w1, gate_b1, gate_w2, gate_b2, gate_layer_norm,
    //  gate_act, gate_eps, whole); a missing sub-block None; whole: both open run as one vit_block (fp32) or
    //  int8_block (int8 sub-blocks) call
    if (t.size() != 12) throw py::value_error("blocks: a gated block takes 12 entries");
    b.kind = vitfast::ops::BlockKind::kGated;
    b.has_attn = !t[1].is_none();
    b.has_ffn = !t[3].is_none();
    if (b.has_attn) mhsa_part(b, t[1].cast<py::tuple>());
    b.ffn_norm_eps = t[2].cast<std::optional<double>>();
    if (b.has_ffn) ffn_part(b, t[3].cast<py::tuple>());
    b.gate_w1 = t[4].cast<at::Tensor>();
    b.gate_b1 = t[5].cast<OptTensor>();
    b.gate_w2 = t[6].cast<OptTensor>();
    b.gate_b2 = t[7].cast<OptTensor>();
    b.gate_layer_norm = t[8].cast<bool>();
    b.gate_act = t[9].cast<std::string>();
    b.gate_eps = t[10].cast<double>();
    b.whole = t[11].cast<bool>();
    if (b.whole && !(b.has_attn && b.has_ffn && b.attn_int8 == b.ffn_int8))
      throw py::value_error("blocks: a gated block runs whole only with both sub-blocks, both fp32 or both int8");
  } else {
    throw py::value_error("blocks: expected a block of kind 'vit', 'int8', 'parts', 'xwx', 'xwx_proj', 'dwconv', 'dwconv_q' or 'gated', "
        "got '" +
                          kind + "'");
  }
  return b;
}

std::shared_ptr<vitfast::ops::VitForwardPlan> vit_forward_plan(const py::tuple& stem, const py::tuple& tokens,
                                                               const py::object& norm_pre,
                                                               const std::vector<py::tuple>& blocks,
                                                               const py::object& norm, int64_t pool,
                                                               int64_t num_prefix_tokens, bool pool_include_prefix,
                                                               const py::object& fc_norm, const py::tuple& head) {
  auto p = std::make_shared<vitfast::ops::VitForwardPlan>();
  const std::string stem_kind = stem[0].cast<std::string>();
  p->patch_h = stem[1].cast<int64_t>();
  p->patch_w = stem[2].cast<int64_t>();
  if (p->patch_h < 1 || p->patch_w < 1) throw py::value_error("stem: expected a patch size >= 1");
  if (stem_kind == "float") {  // (kind, p, q, conv weight, bias): fp32, or bf16 for a bf16 model
    p->patch_weight = stem[3].cast<at::Tensor>();
    p->patch_bias = stem[4].cast<OptTensor>();
    p->dtype = p->patch_weight.scalar_type();
    if (p->dtype != at::kFloat && p->dtype != at::kBFloat16)
      throw py::value_error("stem: expected a float32 or bfloat16 patch weight");
  } else if (stem_kind == "int8") {  // (kind, p, q, qweight, w_scale, bias, smooth, act_scale)
    p->stem_int8 = true;
    p->stem_q = int8_linear(stem, 3);
  } else {
    throw py::value_error("stem: expected kind 'float' or 'int8', got '" + stem_kind + "'");
  }
  p->cls_token = tokens[0].cast<OptTensor>();  // (cls_token, reg_token, pos_embed, no_embed_class)
  p->reg_token = tokens[1].cast<OptTensor>();
  p->pos_embed = tokens[2].cast<at::Tensor>();
  p->no_embed_class = tokens[3].cast<bool>();
  p->norm_pre = forward_norm(norm_pre);
  for (const py::tuple& b : blocks) p->blocks.push_back(forward_block(b));
  p->norm = forward_norm(norm);
  if (pool < 0 || pool > 2) throw py::value_error("pool: expected 0 (none), 1 (token) or 2 (avg)");
  p->pool = static_cast<vitfast::ops::ForwardPool>(pool);
  p->num_prefix_tokens = num_prefix_tokens;
  p->pool_include_prefix = pool_include_prefix;
  p->fc_norm = forward_norm(fc_norm);
  const int64_t head_kind = head[0].cast<int64_t>();  // (kind, weight, bias)
  if (head_kind < 0 || head_kind > 2) throw py::value_error("head: expected 0 (identity), 1 (packed) or 2 (aten)");
  p->head = static_cast<vitfast::ops::ForwardHead>(head_kind);
  if (head_kind != 0) {
    p->head_weight = head[1].cast<at::Tensor>();
    p->head_bias = head[2].cast<OptTensor>();
  }
  return p;
}
}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "vitfast CPU kernels (registered under torch.ops.vitfast)";
  m.def("cpu_isa", []() { return std::string(vitfast::cpu_isa_name(vitfast::active_cpu_isa())); },
        "The CPU code path chosen at run time: 'avx512', 'avx2', 'neon' or 'scalar' (override: VITFAST_CPU_ISA).");
  m.def("int8_kernel",
        []() {
          return std::string(vitfast::gemm8::int8_kernel_name(vitfast::gemm8::int8_kernel(vitfast::active_cpu_isa())));
        },
        "The int8 GEMM kernel the current CPU path runs: 'amx_int8', 'avx512_vnni', 'avx_vnni', 'avx2', 'neon_dot' or "
        "'scalar' "
        "(VITFAST_CPU_EXT=none turns the extensions off).");
  m.def("supported_cpu_isas", &supported_isas, "The CPU code paths this CPU and build can run.");
  m.def("set_cpu_isa", &set_cpu_isa, py::arg("isa"),
        "Force a CPU code path ('scalar', 'avx2', 'avx512', 'neon') for every later call; returns the previous one. "
        "ValueError for an unknown name, RuntimeError for a path this CPU cannot run.");
  // The low-precision extensions inside the paths (cpu_features.h CpuExt): listed, and switched together for tests.
  m.def(
      "cpu_extensions",
      []() {
        std::vector<std::string> out;
        const vitfast::CpuIsa isa = vitfast::active_cpu_isa();
        for (auto e : kAllExtensions)
          if (vitfast::cpu_ext_in_use(e, isa)) out.emplace_back(vitfast::cpu_ext_name(e));
        return out;
      },
      "The low-precision extensions the current CPU path's kernels use: 'avx512_vnni', 'avx512_bf16', 'amx_bf16', "
      "'amx_int8' (the avx512 path), 'avx_vnni' (the avx2 path), 'neon_dotprod', 'neon_bf16' (VITFAST_CPU_EXT=none "
      "turns them off, VITFAST_CPU_EXT=noamx the AMX ones).");
  m.def(
      "set_cpu_ext_enabled",
      [](bool enabled, std::optional<std::vector<std::string>> names) {
        for (auto e : kAllExtensions) {
          const std::string name = vitfast::cpu_ext_name(e);
          if (names && std::find(names->begin(), names->end(), name) == names->end()) continue;
          vitfast::set_cpu_ext_enabled(e, enabled);  // false (no change) for one the CPU lacks
        }
      },
      py::arg("enabled"), py::arg("names") = py::none(),
      "Turn the low-precision extensions this CPU has on or off: all of them, or those named (cpu_extensions' "
      "names; e.g. ['amx_bf16', 'amx_int8'] to compare the AMX kernels with the AVX-512 ones).");
  m.def(
      "_weight_cache_stats",
      []() {
        const vitfast::ops::WeightCacheStats s = vitfast::ops::weight_cache_stats();
        return counters({{"entries", py::int_(s.entries)}, {"bytes", py::int_(s.bytes)}, {"hits", py::int_(s.hits)},
                         {"misses", py::int_(s.misses)}});
      },
      "Packed-weight cache counters (entries, bytes, hits, misses) — for tests and diagnostics.");
  m.def("_weight_cache_clear", &vitfast::ops::weight_cache_clear, "Drop every packed weight.");
  m.def(
      "_output_pool_stats",
      []() {
        const vitfast::ops::OutputPoolStats s = vitfast::ops::output_pool_stats();
        return counters({{"cached_bytes", py::int_(s.cached_bytes)}, {"reused", py::int_(s.reused)},
                         {"enabled", py::bool_(s.enabled)}});
      },
      "The op-output cache (csrc/ops/output_pool.h): bytes held now, blocks reused so far, whether it is on.");
  m.def(
      "_int8_block",
      [](const at::Tensor& x, double norm1_eps, const at::Tensor& qkv_qweight, const at::Tensor& qkv_w_scale,
         const std::optional<at::Tensor>& qkv_bias, const std::optional<at::Tensor>& qkv_smooth, double qkv_act_scale,
         int64_t num_heads, int64_t attention, const at::Tensor& proj_qweight, const at::Tensor& proj_w_scale,
         const std::optional<at::Tensor>& proj_bias, const std::optional<at::Tensor>& proj_smooth,
         double proj_act_scale, std::optional<double> ffn_norm_eps, const at::Tensor& qw_in, const at::Tensor& s_in,
         const std::optional<at::Tensor>& b_in, const at::Tensor& qw_out, const at::Tensor& s_out,
         const std::optional<at::Tensor>& b_out, const std::optional<at::Tensor>& smooth_in,
         const std::optional<at::Tensor>& smooth_out, double act_scale_in, double act_scale_out, bool ffn_residual) {
        if (attention < 0 || attention > 2) throw py::value_error("attention: expected 0 (fp32), 1 (int8) or 2 (bf16)");
        const vitfast::ops::Int8LinearArgs qkv{qkv_qweight, qkv_w_scale, qkv_bias, qkv_smooth, qkv_act_scale};
        const vitfast::ops::Int8LinearArgs proj{proj_qweight, proj_w_scale, proj_bias, proj_smooth, proj_act_scale};
        const vitfast::ops::Int8FfnArgs ffn{qw_in,     s_in,       b_in,         qw_out,        s_out,       b_out,
                                            smooth_in, smooth_out, act_scale_in, act_scale_out, ffn_residual};
        try {
          py::gil_scoped_release no_gil;  // the kernels need no Python; other Python threads may run meanwhile
          return vitfast::ops::int8_block(x, norm1_eps, qkv, num_heads,
                                          static_cast<vitfast::ops::BlockAttention>(attention), proj, ffn_norm_eps,
                                          ffn);
        } catch (const c10::ValueError& e) {  // the ops' argument errors keep their Python type
          throw py::value_error(e.what_without_backtrace());
        } catch (const c10::TypeError& e) {
          throw py::type_error(e.what_without_backtrace());
        }
      },
      "An int8 fused block's five CPU ops in one call (csrc/ops/int8_block.h; vitfast.nn.block.int8_block_forward).");
  py::class_<vitfast::ops::VitForwardPlan, std::shared_ptr<vitfast::ops::VitForwardPlan>>(
      m, "_VitForwardPlan", "A fused ViT's forward as data (csrc/ops/vit_forward.h; made by _vit_forward_plan).");
  m.def("_vit_forward_plan", &vit_forward_plan, py::arg("stem"), py::arg("tokens"), py::arg("norm_pre"),
        py::arg("blocks"), py::arg("norm"), py::arg("pool"), py::arg("num_prefix_tokens"),
        py::arg("pool_include_prefix"), py::arg("fc_norm"), py::arg("head"),
        "The plan of a fused timm ViT's forward (vitfast.nn.vit builds it once per model structure).");
  m.def(
      "_vit_forward",
      [](const vitfast::ops::VitForwardPlan& plan, const at::Tensor& images) -> std::optional<at::Tensor> {
        try {
          py::gil_scoped_release no_gil;  // the kernels need no Python
          return vitfast::ops::vit_forward(plan, images);
        } catch (const c10::ValueError& e) {  // the ops' argument errors keep their Python type
          throw py::value_error(e.what_without_backtrace());
        } catch (const c10::TypeError& e) {
          throw py::type_error(e.what_without_backtrace());
        }
      },
      py::arg("plan"), py::arg("images"),
      "A fused ViT's logits in one call (csrc/ops/vit_forward.h), or None where the module path must run.");
  m.def(
      "_huge_arena_stats",
      []() {
        const vitfast::HugeArenaStats s = vitfast::huge_arena_stats();
        return counters({{"enabled", py::bool_(vitfast::huge_arena_enabled())}, {"chunks", py::int_(s.chunks)},
                         {"mapped_bytes", py::int_(s.mapped_bytes)}, {"live_blocks", py::int_(s.live_blocks)},
                         {"live_bytes", py::int_(s.live_bytes)}});
      },
      "The huge-page arena of packed weights and scratch (csrc/kernels/huge_arena.h): on or off, chunks and bytes "
      "mapped, live blocks and their bytes.");
  m.def("_output_pool_clear", &vitfast::ops::output_pool_clear,
        "Give every cached op-output block back to malloc (outputs still alive are not affected).");
  m.def("_parallel_block_macs_scale", &vitfast::ops::parallel_block_macs_scale,
        "How many times more multiply-adds a block needs before its ops go parallel: 8 under "
        "OMP_WAIT_POLICY=PASSIVE, else 1 (csrc/ops/op_threads.h).");
  m.def(
      "bf16_kernel",
      []() {
        const vitfast::gemm16::Bf16Kernel k = vitfast::gemm16::bf16_kernel(vitfast::active_cpu_isa());
        return std::string(k == vitfast::gemm16::Bf16Kernel::kScalar ? "none" : vitfast::gemm16::bf16_kernel_name(k));
      },
      "The bf16 GEMM kernel bf16 CPU ops run on the active path: 'avx512_bf16', 'neon_bf16', or 'none' (no bf16 "
      "extension, or VITFAST_CPU_EXT=none: bf16 inputs are then computed in fp32).");
  warn_on_bad_environment();
}
