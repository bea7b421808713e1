// bf16 kernels on one core, the parts that decide a bf16 ViT block's time:
//   (a) attention_head_bf16 for every head of a DeiT-S / DeiT-B image (N = 197, D = 64) against attention_head (fp32),
//       and its steps alone: K/V packing, Q rounding, S = Q·Kᵀ, the softmax to bf16 P, P·V (with the 1/Σ row scale);
//       and the head and the packing on a qkv already bf16 (the bf16 block's: no Q rounding, K/V packed unrounded);
//   (b) gemm_bf16 at DeiT-S/B linear shapes with a hot weight (the same one every call) and cold weights (16 weight
//       sets in rotation, as a model's blocks: each comes from L3 or memory), which the next-panel-pair prefetch of
//       the AVX-512 kernel is for;
//   (c) the epilogues a bf16 block gives its 768 × 768 GEMMs (DeiT-B: proj with the residual and a bf16 copy, the
//       FFN's GELU straight to bf16, its linear path with the residual, its second GEMM accumulating with a bf16
//       copy) against a plain store, interleaved in the same rounds: what each costs beyond the products;
//   (f) the channel-idle FFN's output at DeiT-B/0.75: the linear path's GEMM then the second GEMM accumulating onto
//       it, against one GEMM over [h_act | x] (kernels/channel_idle_ffn.h), with C and bf16-only;
//   (d) layer_norm_rows_bf16 (the block's LayerNorm to bf16 rows, from a bf16 input) against the three steps it
//       replaces (widen_bf16, layer_norm_rows, convert_rows), 16-row blocks at 197 × 768 as the block runs them, and
//       from fp32 rows (the FFN norm's input);
//   (e) the `vdpbf16ps` peak of one core, a register-only loop of 16 independent instructions (no loads): the
//       ceiling of every GFLOP/s above (2 × 16 × 2 operations per instruction).
// Times are the thread's CPU time over several calls per reading (one clock read costs about a microsecond in a VM);
// each figure is the median over interleaved rounds.  GFLOP/s counts 2 operations per multiply-add.
//
//   bench_gemm_bf16 [--rounds N] [--json]
//
// Every part is measured on the `vdpbf16ps` kernel and, where the CPU has AMX-BF16, on the tile kernel too (rows
// tagged [avx512_bf16] / [amx_bf16]; the GEMMs' kernels interleaved in the same rounds).
// Not a CTest test (it measures); benchmarks/bf16_kernel_parts.py builds and runs it.  Needs AVX512_BF16.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16.h"
#include "kernels/layer_norm.h"
#include "zmm_peak_loop.h"

using namespace vitfast;
using gemm16::Bf16Kernel;

namespace {

double now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Row {
  std::string group, name;
  double us, gflops;
};

// Median over rounds of the time of one call of each variant; variants interleaved within a round.
std::vector<double> interleaved(const std::vector<std::function<void()>>& fns, int rounds, int reps) {
  std::vector<std::vector<double>> t(fns.size());
  for (auto& f : fns) f();  // warm
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < fns.size(); ++i) {
      const double t0 = now();
      for (int k = 0; k < reps; ++k) fns[i]();
      t[i].push_back((now() - t0) / reps);
    }
  std::vector<double> med;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    med.push_back(v[v.size() / 2] * 1e6);
  }
  return med;
}

std::vector<float> random_values(std::mt19937& g, size_t n) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

void attention_parts(const char* model, int64_t heads, Bf16Kernel k16, int rounds, std::vector<Row>& rows) {
  const int64_t n = 197, d = 64, attn = heads * d, ld = 3 * attn, chunk = kAttentionChunk;
  std::mt19937 g(0);
  const std::vector<float> qkv = random_values(g, size_t(n * ld));
  std::vector<uint16_t> qkv16(size_t(n * ld));  // the bf16 block's qkv: the qkv GEMM stores only this rounding
  gemm16::convert_rows(qkv.data(), ld, n, ld, qkv16.data(), ld, k16);
  std::vector<float> out(size_t(n * attn));
  const CpuIsa isa = CpuIsa::kAvx512;
  const float scale = 0.125f;
  gemm::AlignedFloats ws16(attention_workspace_floats_bf16(n, d, n)), ws32(attention_workspace_floats(n, d, n));
  const int64_t ld_s = (n + 15) / 16 * 16, ld_q = gemm16::padded_k(d), ld_p = gemm16::padded_k(n);
  gemm16::AlignedBf16 kp(gemm16::packed_bf16(n, d)), vp(gemm16::packed_bf16(d, n)), q16(chunk * ld_q);
  gemm16::AlignedBf16 p16(chunk * ld_p);
  gemm::AlignedFloats s(chunk * ld_s), mx(chunk), sum(chunk), inv(chunk);
  for (int64_t i = 0; i < chunk; ++i) inv.data()[i] = 0.01f;
  gemm::Epilogue padded;
  padded.c_padded = true;
  gemm::Epilogue normalise;
  normalise.row_scale = inv.data();
  const int64_t chunks = (n + chunk - 1) / chunk;
  // Each step over every (head, chunk) of the image, as attention_head_bf16 runs them.
  auto per_chunk = [&](auto&& step) {
    return [&, step]() {
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t c = 0; c < chunks; ++c) step(h, c * chunk, std::min(chunk, n - c * chunk));
    };
  };
  std::vector<std::function<void()>> fns = {
      [&] {
        for (int64_t h = 0; h < heads; ++h)
          attention_head_bf16(qkv.data(), ld, n, heads, d, h, 0, n, scale, out.data(), attn, ws16.data(), isa, k16);
      },
      [&] {
        for (int64_t h = 0; h < heads; ++h)
          attention_head(qkv.data(), ld, n, heads, d, h, 0, n, scale, out.data(), attn, ws32.data(), isa);
      },
      [&] {
        for (int64_t h = 0; h < heads; ++h) {
          gemm16::pack_b_transposed_bf16(qkv.data() + attn + h * d, n, d, ld, kp.data(), k16);
          gemm16::pack_b_bf16(qkv.data() + 2 * attn + h * d, n, d, ld, vp.data(), k16);
        }
      },
      per_chunk([&](int64_t h, int64_t r0, int64_t m) {
        gemm16::convert_rows(qkv.data() + r0 * ld + h * d, ld, m, d, q16.data(), ld_q, k16);
      }),
      per_chunk([&](int64_t, int64_t, int64_t m) {
        gemm16::gemm_bf16_raw(m, q16.data(), ld_q, kp.data(), n, d, s.data(), ld_s, padded, k16);
      }),
      per_chunk([&](int64_t, int64_t, int64_t m) {
        for (int64_t i = 0; i < m; ++i) mx.data()[i] = -INFINITY;
        gemm16::softmax_exp_rows_bf16(s.data(), m, n, ld_s, 1.0f, mx.data(), sum.data(), p16.data(), ld_p, isa, k16);
      }),
      per_chunk([&](int64_t h, int64_t r0, int64_t m) {
        gemm16::gemm_bf16_raw(m, p16.data(), ld_p, vp.data(), d, n, out.data() + r0 * attn + h * d, attn, normalise,
                              k16);
      }),
      [&] {
        for (int64_t h = 0; h < heads; ++h)
          attention_head_bf16(qkv16.data(), ld, n, heads, d, h, 0, n, scale, out.data(), attn, ws16.data(), isa, k16);
      },
      [&] {
        for (int64_t h = 0; h < heads; ++h) {
          gemm16::pack_b_transposed_bf16(qkv16.data() + attn + h * d, n, d, ld, kp.data(), k16);
          gemm16::pack_b_bf16(qkv16.data() + 2 * attn + h * d, n, d, ld, vp.data(), k16);
        }
      },
  };
  const char* names[] = {"attention_head_bf16, all heads", "attention_head (fp32), all heads", "pack K and V",
                         "round Q rows", "S = Q·Kᵀ", "softmax -> bf16 P", "P·V, 1/Σ epilogue",
                         "attention_head_bf16 on a bf16 qkv, all heads", "pack K and V from a bf16 qkv"};
  const double head_flops = 4.0 * n * n * d;
  const double flops[] = {head_flops * heads, head_flops * heads, 0, 0, head_flops * heads / 2, 0,
                          head_flops * heads / 2, head_flops * heads, 0};
  const std::vector<double> us = interleaved(fns, rounds, 5);
  for (size_t i = 0; i < fns.size(); ++i)
    rows.push_back({std::string(model) + " attention (N = 197, D = 64, " + std::to_string(heads) + " heads)",
                    i == 1 ? std::string(names[i]) : std::string("[") + gemm16::bf16_kernel_name(k16) + "] " + names[i], us[i], flops[i] > 0 ? flops[i] / us[i] / 1e3 : 0.0});
}

#if defined(__x86_64__)
// (e): zmm_peak_loop.h; the operand 1.0f is the bf16 pair (0, 1.0).
__attribute__((target("avx512f,avx512bf16"))) double peak_vdpbf16ps_gflops(int64_t iters) {
  const float one = 1.0f;
  int64_t n = iters;
  const double t0 = now();
  VITFAST_ZMM_PEAK_LOOP("vdpbf16ps", n, one);
  return 2.0 * double(iters) * 16 * 32 / (now() - t0) * 1e-9;  // 32 multiply-adds per vdpbf16ps zmm
}
#endif

// (c): one weight, one input; each epilogue as the block calls gemm_bf16 (ops/vit_block.cpp,
// kernels/channel_idle_ffn.cpp).
void block_epilogues(const std::vector<Bf16Kernel>& kernels, int rounds, std::vector<Row>& rows) {
  const int64_t m = 197, n = 768, k = 768;
  std::mt19937 g(2);
  const std::vector<float> w = random_values(g, size_t(n * k)), bias = random_values(g, size_t(n));
  const gemm16::PackedBf16B pw = gemm16::PackedBf16B::pack_linear(w.data(), n, k, k, bias.data());
  const std::vector<float> x = random_values(g, size_t(m * k)), residual = random_values(g, size_t(m * n));
  std::vector<uint16_t> a(size_t(m * k)), c16(size_t(m * n));
  gemm16::convert_rows(x.data(), k, m, k, a.data(), k, kernels[0]);
  std::vector<float> c(size_t(m * n));
  struct Variant {
    const char* name;
    gemm::Epilogue ep;
    bool store_c;
  };
  std::vector<Variant> variants(7);
  variants[0] = {"plain store", gemm::Epilogue(), true};
  variants[1] = {"bias + residual, bf16 copy (proj)", gemm::Epilogue(), true};
  variants[1].ep.bias = true;
  variants[1].ep.addend = residual.data();
  variants[1].ep.ld_addend = n;
  variants[1].ep.c16 = c16.data();
  variants[1].ep.ldc16 = n;
  variants[2] = {"bias + GELU to bf16 only (FFN act)", gemm::Epilogue(), false};
  variants[2].ep.bias = true;
  variants[2].ep.gelu = true;
  variants[2].ep.c_padded = true;
  variants[2].ep.c16 = c16.data();
  variants[2].ep.ldc16 = n;
  variants[3] = {"bias + residual (FFN linear path)", gemm::Epilogue(), true};
  variants[3].ep.bias = true;
  variants[3].ep.addend = residual.data();
  variants[3].ep.ld_addend = n;
  variants[4] = {"accumulate, bf16 copy (FFN out)", gemm::Epilogue(), true};
  variants[4].ep.accumulate = true;
  variants[4].ep.c16 = c16.data();
  variants[4].ep.ldc16 = n;
  variants[5] = {"bf16 only (qkv as bf16)", gemm::Epilogue(), false};
  variants[5].ep.c_padded = true;
  variants[5].ep.c16 = c16.data();
  variants[5].ep.ldc16 = n;
  variants[6] = {"bias, bf16 only", gemm::Epilogue(), false};
  variants[6].ep.bias = true;
  variants[6].ep.c_padded = true;
  variants[6].ep.c16 = c16.data();
  variants[6].ep.ldc16 = n;
  std::vector<std::function<void()>> fns;
  for (Bf16Kernel k16 : kernels)
    for (const Variant& v : variants)
      fns.push_back([&, k16] {
        gemm16::gemm_bf16(m, a.data(), k, pw, v.store_c ? c.data() : nullptr, n, v.ep, k16);
      });
  const std::vector<double> us = interleaved(fns, rounds, 8);
  const double flops = 2.0 * m * n * k;
  for (size_t i = 0; i < kernels.size(); ++i)
    for (size_t j = 0; j < variants.size(); ++j) {
      const double t = us[i * variants.size() + j];
      rows.push_back({"DeiT-B block GEMM epilogues (197 × 768 × 768)",
                      std::string("[") + gemm16::bf16_kernel_name(kernels[i]) + "] " + variants[j].name, t,
                      flops / t / 1e3});
    }
}

// (f): the channel-idle FFN's output as its block ran it at DeiT-B/0.75 (A = 768 active channels, a 768-wide linear
// path): the linear path's GEMM into C (bias + residual) then the second GEMM accumulating onto it with the bf16 copy,
// against one GEMM over the two operands side by side ([h_act | x] · [W_out ; W_lin]ᵀ, K = 1536) with the bias,
// residual and bf16 copy in its one epilogue.
void ffn_output(Bf16Kernel k16, int rounds, std::vector<Row>& rows) {
  const int64_t m = 197, n = 768, k = 768;
  std::mt19937 g(4);
  const std::vector<float> w_out = random_values(g, size_t(n * k)), w_lin = random_values(g, size_t(n * k));
  const std::vector<float> bias = random_values(g, size_t(n)), residual = random_values(g, size_t(m * n));
  std::vector<float> w_cat(size_t(n * 2 * k));
  for (int64_t j = 0; j < n; ++j) {
    std::copy(w_out.begin() + j * k, w_out.begin() + (j + 1) * k, w_cat.begin() + j * 2 * k);
    std::copy(w_lin.begin() + j * k, w_lin.begin() + (j + 1) * k, w_cat.begin() + j * 2 * k + k);
  }
  const gemm16::PackedBf16B p_out = gemm16::PackedBf16B::pack_linear(w_out.data(), n, k, k, nullptr);
  const gemm16::PackedBf16B p_lin = gemm16::PackedBf16B::pack_linear(w_lin.data(), n, k, k, bias.data());
  const gemm16::PackedBf16B p_cat = gemm16::PackedBf16B::pack_linear(w_cat.data(), n, 2 * k, 2 * k, bias.data());
  const std::vector<float> hx = random_values(g, size_t(m * 2 * k));
  std::vector<uint16_t> a(size_t(m * 2 * k)), c16(size_t(m * n));
  gemm16::convert_rows(hx.data(), 2 * k, m, 2 * k, a.data(), 2 * k, k16);
  std::vector<float> c(size_t(m * n));
  gemm::Epilogue lin, acc, one;
  lin.bias = true;
  lin.addend = residual.data();
  lin.ld_addend = n;
  acc.accumulate = true;
  acc.c16 = c16.data();
  acc.ldc16 = n;
  one = lin;
  one.c16 = c16.data();
  one.ldc16 = n;
  std::vector<std::function<void()>> fns;
  fns.push_back([&] {
    gemm16::gemm_bf16(m, a.data() + k, 2 * k, p_lin, c.data(), n, lin, k16);
    gemm16::gemm_bf16(m, a.data(), 2 * k, p_out, c.data(), n, acc, k16);
  });
  fns.push_back([&] { gemm16::gemm_bf16(m, a.data(), 2 * k, p_cat, c.data(), n, one, k16); });
  fns.push_back([&] { gemm16::gemm_bf16(m, a.data(), 2 * k, p_cat, nullptr, n, one, k16); });
  const std::vector<double> us = interleaved(fns, rounds, 8);
  const double flops = 2.0 * m * n * 2 * k;
  const std::string group = "DeiT-B FFN output (197 × 1536 × 768)";
  const std::string tag = std::string("[") + gemm16::bf16_kernel_name(k16) + "] ";
  rows.push_back({group, tag + "two GEMMs (linear path; accumulate)", us[0], flops / us[0] / 1e3});
  rows.push_back({group, tag + "one GEMM over [h_act | x]", us[1], flops / us[1] / 1e3});
  rows.push_back({group, tag + "one GEMM over [h_act | x], bf16 only", us[2], flops / us[2] / 1e3});
}

// (d): the same bits (csrc/tests/test_layer_norm.cpp); k16 is convert_rows' kernel in the three steps.
void layer_norm_to_bf16(Bf16Kernel k16, int rounds, std::vector<Row>& rows) {
  const int64_t m = 197, c = 768, block = 16;  // ops/layer_norm.cpp layer_norm_run_bf16's row blocks
  std::mt19937 g(3);
  const std::vector<float> x = random_values(g, size_t(m * c));
  std::vector<uint16_t> x16(size_t(m * c)), y16(size_t(m * c));
  gemm16::convert_rows(x.data(), c, m, c, x16.data(), c, k16);
  std::vector<float> wide(size_t(m * c)), y(size_t(block * c));
  const std::vector<std::function<void()>> fns = {
      [&] {
        for (int64_t r0 = 0; r0 < m; r0 += block) {
          const int64_t n = std::min(block, m - r0);
          gemm16::widen_bf16(x16.data() + r0 * c, n * c, wide.data() + r0 * c);
          layer_norm_rows(wide.data() + r0 * c, y.data(), n, c, nullptr, nullptr, 1e-6f, CpuIsa::kAvx512);
          gemm16::convert_rows(y.data(), c, n, c, y16.data() + r0 * c, c, k16);
        }
      },
      [&] {
        for (int64_t r0 = 0; r0 < m; r0 += block) {
          const int64_t n = std::min(block, m - r0);
          layer_norm_rows_bf16(nullptr, x16.data() + r0 * c, wide.data() + r0 * c, y16.data() + r0 * c, c, n, c,
                               nullptr, nullptr, 1e-6f, CpuIsa::kAvx512, k16, y.data());
        }
      },
      [&] {  // the FFN norm's case: fp32 rows in (x1), nothing widened
        for (int64_t r0 = 0; r0 < m; r0 += block) {
          const int64_t n = std::min(block, m - r0);
          layer_norm_rows_bf16(x.data() + r0 * c, nullptr, nullptr, y16.data() + r0 * c, c, n, c, nullptr, nullptr,
                               1e-6f, CpuIsa::kAvx512, k16, y.data());
        }
      }};
  const std::vector<double> us = interleaved(fns, rounds, 16);
  const std::string group = "LayerNorm to bf16, bf16 input (197 × 768)";
  rows.push_back({group, "widen_bf16 + layer_norm_rows + convert_rows", us[0], 0.0});
  rows.push_back({group, "layer_norm_rows_bf16", us[1], 0.0});
  rows.push_back({"LayerNorm to bf16, fp32 input (197 × 768)", "layer_norm_rows_bf16", us[2], 0.0});
}

// Each kernel's hot and rotating-weight calls interleaved in the same rounds, so their ratio is a same-seconds one.
void cold_weights(const std::vector<Bf16Kernel>& kernels, int rounds, std::vector<Row>& rows) {
  struct Shape {
    const char* name;
    int64_t m, n, k;
  };
  const Shape shapes[] = {{"DeiT-S qkv", 197, 1152, 384}, {"DeiT-S FFN in", 197, 768, 384},
                          {"DeiT-B qkv", 197, 2304, 768}, {"DeiT-B FFN in", 197, 1536, 768}};
  for (const Shape& sh : shapes) {
    std::mt19937 g(1);
    std::vector<gemm16::PackedBf16B> ws;
    for (int i = 0; i < 16; ++i) {
      const std::vector<float> w = random_values(g, size_t(sh.n * sh.k));
      ws.push_back(gemm16::PackedBf16B::pack_linear(w.data(), sh.n, sh.k, sh.k, nullptr));
    }
    const std::vector<float> x = random_values(g, size_t(sh.m * sh.k));
    std::vector<uint16_t> a(size_t(sh.m * sh.k));
    gemm16::convert_rows(x.data(), sh.k, sh.m, sh.k, a.data(), sh.k, kernels[0]);
    std::vector<float> c(size_t(sh.m * sh.n));
    int next = 0;
    std::vector<std::function<void()>> fns;
    for (Bf16Kernel k16 : kernels) {
      fns.push_back([&, k16] { gemm16::gemm_bf16(sh.m, a.data(), sh.k, ws[0], c.data(), sh.n, gemm::Epilogue(), k16); });
      fns.push_back([&, k16] {
        gemm16::gemm_bf16(sh.m, a.data(), sh.k, ws[size_t(next)], c.data(), sh.n, gemm::Epilogue(), k16);
        next = (next + 1) % 16;
      });
    }
    const std::vector<double> us = interleaved(fns, rounds, 16);
    const double flops = 2.0 * sh.m * sh.n * sh.k;
    const std::string group = std::string(sh.name) + " (" + std::to_string(sh.m) + " × " + std::to_string(sh.k) +
                              " × " + std::to_string(sh.n) + ")";
    for (size_t i = 0; i < kernels.size(); ++i) {
      const std::string tag = std::string("[") + gemm16::bf16_kernel_name(kernels[i]) + "] gemm_bf16";
      rows.push_back({group, tag + ", hot weight", us[2 * i], flops / us[2 * i] / 1e3});
      rows.push_back({group, tag + ", 16 weights in rotation", us[2 * i + 1], flops / us[2 * i + 1] / 1e3});
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 9;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--json") == 0) json = true;
  }
  if (!cpu_supports(CpuIsa::kAvx512) || !gemm16::uses_avx512_bf16(gemm16::bf16_kernel(CpuIsa::kAvx512))) {
    std::fprintf(stderr, "bench_gemm_bf16: this CPU has no AVX512_BF16 (the kernels measured here)\n");
    return 2;
  }
  // The AVX-512 kernel always, and the AMX one where the CPU has it.
  std::vector<Bf16Kernel> kernels = {Bf16Kernel::kAvx512Bf16};
  if (cpu_has(CpuExt::kAmxBf16)) kernels.push_back(Bf16Kernel::kAmxBf16);
  std::vector<Row> rows;
  for (Bf16Kernel k16 : kernels) {
    attention_parts("DeiT-S", 6, k16, rounds, rows);
    attention_parts("DeiT-B", 12, k16, rounds, rows);
  }
  cold_weights(kernels, rounds, rows);
  block_epilogues(kernels, rounds, rows);
  for (Bf16Kernel k16 : kernels) ffn_output(k16, rounds, rows);
  layer_norm_to_bf16(kernels[0], rounds, rows);
#if defined(__x86_64__)
  {
    constexpr int64_t kIters = 20000000;
    std::vector<double> peaks;
    for (int r = 0; r < rounds; ++r) peaks.push_back(peak_vdpbf16ps_gflops(kIters));
    std::sort(peaks.begin(), peaks.end());
    const double peak = peaks[peaks.size() / 2];  // GFLOP/s; the row's µs: one reading of kIters iterations
    rows.push_back({"peak of one core (register-only loop)", "vdpbf16ps zmm", 2.0 * 16 * 32 * kIters / (peak * 1e3),
                    peak});
  }
#endif
  if (json) {
    std::printf("{\"rounds\": %d, \"rows\": [", rounds);
    for (size_t i = 0; i < rows.size(); ++i)
      std::printf("%s{\"group\": \"%s\", \"name\": \"%s\", \"us\": %.2f, \"gflops\": %.1f}", i ? ", " : "",
                  rows[i].group.c_str(), rows[i].name.c_str(), rows[i].us, rows[i].gflops);
    std::printf("]}\n");
  } else {
    for (const Row& r : rows)
      std::printf("%-52s %-36s %9.1f us %8.1f GFLOP/s\n", r.group.c_str(), r.name.c_str(), r.us, r.gflops);
  }
  return 0;
}
