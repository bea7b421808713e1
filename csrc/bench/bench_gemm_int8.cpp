// Int8 GEMM core against the machine and against the fp32 core, on one core:
//   (a) peaks from register-only loops of independent instructions: `tdpbssd` (AMX-INT8, four independent tiles),
//       `vpdpbusd` zmm (AVX-512 VNNI),
//       vpmaddubsw + vpmaddwd + vpaddd ymm chains (the AVX2 int8 kernel's arithmetic), fp32 FMA zmm and ymm;
//   (b) gemm_int8 (quantized activations in, fp32 out, plain epilogue) at DeiT-S/B shapes, every kernel this CPU
//       runs, with quantize_rows of the activations timed beside it;
//   (c) the fp32 gemm of the same shapes with the AVX-512 and AVX2 paths;
//   (d) attention's P: softmax_quantize_rows (one pass on x86, the exp for bf16 results) against the two steps
//       with the fp32 exp (softmax_exp_rows then quantize_rows: how P was made before its exp changed; its
//       definition's two steps have a vector form only on NEON), on a 197 × 197 score tile in row pairs (as
//       attention_int8 calls it), every SIMD path;
//   (e) on AMX hosts, the AMX kernel's distance from the tdpbssd peak split into its parts (amx_block_gops).
// Times are the thread's CPU time (see now()).  Each figure is the median over interleaved rounds (every variant
// of a shape once per round), so a busy neighbour on a shared machine slows all variants alike.  GOPS counts 2
// operations per multiply-add.
//
//   bench_gemm_int8 [--rounds N] [--scalar] [--json]
//
// Not a CTest test (it measures, it does not check); benchmarks/int8_gemm_peak.py builds and runs it.
#include <algorithm>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm_int8.h"
#include "zmm_peak_loop.h"


using namespace vitfast;
using gemm8::Int8Kernel;
using gemm8::padded_k;
using gemm8::quantize_rows;
using gemm8::softmax_quantize_rows;

namespace {

// Seconds of CPU time of the calling thread: on a shared machine (more runnable threads than cores) wall time
// counts the slices the scheduler gave to others; measured with wall time the 20 ms GEMM timings ran at ~45% of a
// peak taken from 0.5 ms loops, which are rarely preempted.  CPU time is what the core spent on this work.
double now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

#if defined(__x86_64__)
// Register-only loops in inline asm (in C++ GCC spilled an array of 16 accumulators to the stack every iteration,
// halving the figure): N independent accumulators, more than latency × throughput of each instruction (vpdpbusd
// and FMA: 4-5 cycles latency, up to 2 per cycle), so the loop runs at the issue rate.  The loop counter's
// dec/jnz is one fused op per 16 instructions.  vpdpbusd's is zmm_peak_loop.h's, shared with bench_gemm_bf16.
__attribute__((target("avx512f,avx512vnni"))) double peak_vnni_gops(int64_t iters) {
  const int32_t one = 0x01010101;
  int64_t n = iters;
  const double t0 = now();
  VITFAST_ZMM_PEAK_LOOP("vpdpbusd", n, one);
  return 2.0 * double(iters) * 16 * 64 / (now() - t0) * 1e-9;  // 64 MACs per vpdpbusd zmm
}

// AMX: four independent tile products (C tiles 0-3 from A tiles 4-5 and B tiles 6-7, loaded once) per iteration,
// the kernel's own block; 16 × 16 × 64 MACs per tdpbssd.  Needs the tile permission (cpu_has(kAmxInt8) asked for it).
struct AmxPeakConfig {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
__attribute__((target("amx-tile,amx-int8"))) double peak_amx_int8_gops(int64_t iters) {
  static AmxPeakConfig cfg;  // static: ldtilecfg's 64 bytes, off the stack (see x86/amx_tiles.inc)
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  static int8_t ab[16 * 64];
  std::memset(ab, 1, sizeof ab);
  _tile_loadconfig(&cfg);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const double t0 = now();
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  const double t = now() - t0;
  _tile_release();
  return 2.0 * double(iters) * 4 * 16 * 16 * 64 / t * 1e-9;
}

// The AMX kernel's block (x86/amx_tiles.inc: 32 rows × 2 panels, per 64-byte K step 2 A + 2 B tile loads for four
// tdpbssd, then the four C tiles stored) without the rest of the kernel, to split its distance from the
// register-only rate: `blocks` blocks of k bytes over B pairs [0, pairs) of b (pairs = 1: the same 32 columns every
// block, so every operand is in L1 after the first; more: the pairs stream from L2 as in the kernel, loaded with
// the same non-temporal hint), the same 32 rows of a (lda = k) every time.  Returns GOPS.
__attribute__((target("amx-tile,amx-int8"))) double amx_block_gops(const int8_t* a, const int8_t* b, int64_t k,
                                                                   int64_t pairs, int64_t blocks) {
  static AmxPeakConfig cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  alignas(64) static int32_t c[32 * 32];
  _tile_loadconfig(&cfg);
  const int64_t steps = k / 64;
  const double t0 = now();
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int8_t* b0 = b + (blk % pairs) * 32 * k;
    const int8_t* b1 = b0 + 16 * k;
    const int8_t* a1 = a + 16 * k;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t q = 0; q < steps; ++q) {
      _tile_loadd(4, a + 64 * q, k);
      _tile_stream_loadd(6, b0 + 1024 * q, 64);
      _tile_dpbssd(0, 4, 6);
      _tile_stream_loadd(7, b1 + 1024 * q, 64);
      _tile_dpbssd(1, 4, 7);
      _tile_loadd(5, a1 + 64 * q, k);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, c, 128);
    _tile_stored(1, c + 16, 128);
    _tile_stored(2, c + 512, 128);
    _tile_stored(3, c + 528, 128);
  }
  const double t = now() - t0;
  _tile_release();
  return 2.0 * double(blocks) * 32 * 32 * double(k) / t * 1e-9;
}

// The AVX-VNNI kernel's instruction: `{vex} vpdpbusd` on ymm, 14 independent accumulators (ymm14/15 the operands).
__attribute__((target("avx2,avxvnni"))) double peak_avxvnni_gops(int64_t iters) {
  const int32_t one = 0x01010101;
  int64_t n = iters;
  const double t0 = now();
  asm volatile(
        "vpbroadcastd %1, %%ymm14\n\t"
        "vpbroadcastd %1, %%ymm15\n\t"
        ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13\n\t"
        "vpxor %%ymm\\r, %%ymm\\r, %%ymm\\r\n\t"
        ".endr\n\t"
        "1:\n\t"
        ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13\n\t"
        "%{vex%} vpdpbusd %%ymm15, %%ymm14, %%ymm\\r\n\t"
        ".endr\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        : "+r"(n)
        : "m"(one)
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm12", "xmm13", "xmm14", "xmm15", "cc");
  return 2.0 * double(iters) * 14 * 32 / (now() - t0) * 1e-9;  // 32 MACs per vpdpbusd ymm
}

// The AVX2 kernel's arithmetic per 32 MACs: vpmaddubsw (u8·s8 pairs -> s16), vpmaddwd by ones (-> s32), vpaddd;
// four independent chains (12 instructions) per iteration, temporaries ymm4-11.
double peak_avx2_int8_gops(int64_t iters) {
  const int32_t one = 0x01010101, ones16 = 0x00010001;
  int64_t n = iters;
  const double t0 = now();
  asm volatile(
        "vpbroadcastd %1, %%ymm13\n\t"
        "vpbroadcastd %1, %%ymm14\n\t"
        "vpbroadcastd %2, %%ymm15\n\t"
        "vpxor %%ymm0, %%ymm0, %%ymm0\n\t"
        "vpxor %%ymm1, %%ymm1, %%ymm1\n\t"
        "vpxor %%ymm2, %%ymm2, %%ymm2\n\t"
        "vpxor %%ymm3, %%ymm3, %%ymm3\n\t"
        "1:\n\t"
        "vpmaddubsw %%ymm14, %%ymm13, %%ymm4\n\t"
        "vpmaddubsw %%ymm14, %%ymm13, %%ymm5\n\t"
        "vpmaddubsw %%ymm14, %%ymm13, %%ymm6\n\t"
        "vpmaddubsw %%ymm14, %%ymm13, %%ymm7\n\t"
        "vpmaddwd %%ymm15, %%ymm4, %%ymm8\n\t"
        "vpmaddwd %%ymm15, %%ymm5, %%ymm9\n\t"
        "vpmaddwd %%ymm15, %%ymm6, %%ymm10\n\t"
        "vpmaddwd %%ymm15, %%ymm7, %%ymm11\n\t"
        "vpaddd %%ymm8, %%ymm0, %%ymm0\n\t"
        "vpaddd %%ymm9, %%ymm1, %%ymm1\n\t"
        "vpaddd %%ymm10, %%ymm2, %%ymm2\n\t"
        "vpaddd %%ymm11, %%ymm3, %%ymm3\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        : "+r"(n)
        : "m"(one), "m"(ones16)
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm12", "xmm13", "xmm14", "xmm15", "cc");
  return 2.0 * double(iters) * 4 * 32 / (now() - t0) * 1e-9;
}

__attribute__((target("avx512f"))) double peak_fma512_gflops(int64_t iters) {
  const float a = 0.999f, b = 1e-3f;
  int64_t n = iters;
  const double t0 = now();
  asm volatile(
        "vbroadcastss %1, %%zmm16\n\t"
        "vbroadcastss %2, %%zmm17\n\t"
        "vmovaps %%zmm17, %%zmm0\n\t"
        "vmovaps %%zmm17, %%zmm1\n\t"
        "vmovaps %%zmm17, %%zmm2\n\t"
        "vmovaps %%zmm17, %%zmm3\n\t"
        "vmovaps %%zmm17, %%zmm4\n\t"
        "vmovaps %%zmm17, %%zmm5\n\t"
        "vmovaps %%zmm17, %%zmm6\n\t"
        "vmovaps %%zmm17, %%zmm7\n\t"
        "vmovaps %%zmm17, %%zmm8\n\t"
        "vmovaps %%zmm17, %%zmm9\n\t"
        "vmovaps %%zmm17, %%zmm10\n\t"
        "vmovaps %%zmm17, %%zmm11\n\t"
        "vmovaps %%zmm17, %%zmm12\n\t"
        "vmovaps %%zmm17, %%zmm13\n\t"
        "vmovaps %%zmm17, %%zmm14\n\t"
        "vmovaps %%zmm17, %%zmm15\n\t"
        "1:\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm0\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm1\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm2\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm3\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm4\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm5\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm6\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm7\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm8\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm9\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm10\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm11\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm12\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm13\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm14\n\t"
        "vfmadd213ps %%zmm17, %%zmm16, %%zmm15\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        : "+r"(n)
        : "m"(a), "m"(b)
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "cc");
  return 2.0 * double(iters) * 16 * 16 / (now() - t0) * 1e-9;
}

double peak_fma256_gflops(int64_t iters) {
  const float a = 0.999f, b = 1e-3f;
  int64_t n = iters;
  const double t0 = now();
  asm volatile(
        "vbroadcastss %1, %%ymm14\n\t"
        "vbroadcastss %2, %%ymm15\n\t"
        "vmovaps %%ymm15, %%ymm0\n\t"
        "vmovaps %%ymm15, %%ymm1\n\t"
        "vmovaps %%ymm15, %%ymm2\n\t"
        "vmovaps %%ymm15, %%ymm3\n\t"
        "vmovaps %%ymm15, %%ymm4\n\t"
        "vmovaps %%ymm15, %%ymm5\n\t"
        "vmovaps %%ymm15, %%ymm6\n\t"
        "vmovaps %%ymm15, %%ymm7\n\t"
        "vmovaps %%ymm15, %%ymm8\n\t"
        "vmovaps %%ymm15, %%ymm9\n\t"
        "vmovaps %%ymm15, %%ymm10\n\t"
        "vmovaps %%ymm15, %%ymm11\n\t"
        "1:\n\t"
        "vfmadd213ps %%ymm15, %%ymm14, %%ymm0\n\t"
        "vfmadd213ps %%ymm15, %%ymm14, %%ymm1\n\t"
        "vfmadd213ps %%ymm15, %%ymm14, %%ymm2\n\t"
        "vfmadd213ps %%ymm15, %%ymm14, %%ymm3\n\t"
        "vfmadd213ps %%ymm15, %%ymm14, %%ymm4\n\t"
        "vfmadd213ps %%ymm15, %%ymm14, %%ymm5\n\t"
        "vfmadd213ps %%ymm15, %%ymm14, %%ymm6\n\t"
        "vfmadd213ps %%ymm15, %%ymm14, %%ymm7\n\t"
        "vfmadd213ps %%ymm15, %%ymm14, %%ymm8\n\t"
        "vfmadd213ps %%ymm15, %%ymm14, %%ymm9\n\t"
        "vfmadd213ps %%ymm15, %%ymm14, %%ymm10\n\t"
        "vfmadd213ps %%ymm15, %%ymm14, %%ymm11\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        : "+r"(n)
        : "m"(a), "m"(b)
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm12", "xmm13", "xmm14", "xmm15", "cc");
  return 2.0 * double(iters) * 12 * 8 / (now() - t0) * 1e-9;
}
#endif

// 64-byte aligned bytes, as the ops' activation rows and the packs are: an AMX tile row across two cache lines
// costs 1.6× (std::vector's 16-byte alignment measured the AMX kernel at ~0.6-0.8× its speed in the ops).
struct FreeBytes {
  void operator()(int8_t* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<int8_t[], FreeBytes>;
AlignedBytes aligned_bytes(int64_t n, int8_t fill) {
  const size_t size = (size_t(n) + 63) / 64 * 64;
  AlignedBytes p(static_cast<int8_t*>(std::aligned_alloc(64, size)));
  std::memset(p.get(), fill, size);
  return p;
}

struct Shape {
  const char* name;
  int64_t m, k, n;
};

struct Variant {
  std::string name;   // "int8 avx512_vnni", "fp32 avx512", ...
  std::string peak;   // which peak its % refers to
  std::function<void()> run;
  std::vector<double> seconds;  // per call, one per round
  int reps = 1;
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7;
  bool with_scalar = false, json = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--scalar")) with_scalar = true;
    else if (!std::strcmp(argv[i], "--json")) json = true;
  }

  // (a) Peaks.  Measured inside every round of every shape (below), beside the kernels, so that a figure and the
  // peak it is divided by come from the same minutes of a shared machine; the peak reported is the median of all.
  struct Peak {
    const char* name;
    double (*fn)(int64_t);
    int64_t iters;
    std::vector<double> all, shape;
    double gops;  // median of `shape` while a shape runs, of `all` at the end
  };
  std::vector<Peak> peaks;
#if defined(__x86_64__)
  // ~1-2 ms per measurement.
  if (cpu_has(CpuExt::kAmxInt8)) peaks.push_back({"int8 tdpbssd amx", peak_amx_int8_gops, 20000, {}, {}, 0.0});
  if (cpu_has(CpuExt::kAvx512Vnni)) peaks.push_back({"int8 vpdpbusd zmm", peak_vnni_gops, 200000, {}, {}, 0.0});
  if (cpu_has(CpuExt::kAvxVnni)) peaks.push_back({"int8 vpdpbusd ymm", peak_avxvnni_gops, 400000, {}, {}, 0.0});
  if (cpu_supports(CpuIsa::kAvx2))
    peaks.push_back({"int8 vpmaddubsw+vpmaddwd+vpaddd ymm", peak_avx2_int8_gops, 400000, {}, {}, 0.0});
  if (cpu_supports(CpuIsa::kAvx512)) peaks.push_back({"fp32 fma zmm", peak_fma512_gflops, 200000, {}, {}, 0.0});
  if (cpu_supports(CpuIsa::kAvx2)) peaks.push_back({"fp32 fma ymm", peak_fma256_gflops, 200000, {}, {}, 0.0});
  for (Peak& p : peaks) p.fn(p.iters);  // warm-up (clock ramp)
#endif
  auto peak_of = [&](const std::string& name) {
    for (const Peak& p : peaks)
      if (name == p.name) return p.gops;
    return 0.0;
  };

  // (b), (c): shapes (m tokens × k in × n out).
  const Shape shapes[] = {
      {"in-cache 197x256x256", 197, 256, 256},  {"DeiT-S qkv", 197, 384, 1152}, {"DeiT-S proj", 197, 384, 384},
      {"DeiT-S fc1", 197, 384, 1536},           {"DeiT-S fc2", 197, 1536, 384}, {"DeiT-B qkv", 197, 768, 2304},
      {"DeiT-B proj", 197, 768, 768},           {"DeiT-B fc1", 197, 768, 3072}, {"DeiT-B fc2", 197, 3072, 768},
  };
  std::vector<Int8Kernel> kernels;
#if defined(__x86_64__)
  if (cpu_has(CpuExt::kAmxInt8)) kernels.push_back(Int8Kernel::kAmxInt8);
  if (cpu_has(CpuExt::kAvx512Vnni)) kernels.push_back(Int8Kernel::kAvx512Vnni);
  if (cpu_has(CpuExt::kAvxVnni)) kernels.push_back(Int8Kernel::kAvxVnni);
  if (cpu_supports(CpuIsa::kAvx2)) kernels.push_back(Int8Kernel::kAvx2);
#endif
#if defined(__aarch64__)
  if (cpu_has(CpuExt::kNeonDotProd)) kernels.push_back(Int8Kernel::kNeonDot);
#endif
  if (with_scalar || kernels.empty()) kernels.push_back(Int8Kernel::kScalar);
  std::vector<CpuIsa> fp32_isas;
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kNeon})
    if (cpu_supports(isa)) fp32_isas.push_back(isa);
  const CpuIsa quant_isa = active_cpu_isa();

  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> qd(-127, 127);
  if (!json) {
    std::printf("%-22s %-18s %9s %9s %8s %10s\n", "shape (m x k x n)", "variant", "us/call", "GOPS", "% peak",
                "quant us");
  }
  std::string rows_json;
  for (const Shape& s : shapes) {
    const int64_t lda8 = padded_k(s.k);
    std::vector<float> x(size_t(s.m * s.k)), w(size_t(s.n * s.k)), c(size_t(s.m * s.n)), sw(size_t(s.n), 0.01f);
    for (float& v : x) v = nd(rng);
    for (float& v : w) v = 0.05f * nd(rng);
    std::vector<int8_t> qw(size_t(s.n * s.k));
    const AlignedBytes qa = aligned_bytes(s.m * lda8, 0);
    for (int8_t& v : qw) v = int8_t(qd(rng));
    std::vector<float> sa(size_t(s.m));
    std::vector<int32_t> rowsum(size_t(s.m));
    quantize_rows(x.data(), s.k, s.m, s.k, nullptr, qa.get(), lda8, sa.data(), rowsum.data(), quant_isa);
    const double ops = 2.0 * double(s.m) * s.k * s.n;

    std::vector<gemm8::PackedInt8B> packs8;
    for (Int8Kernel kern : kernels)
      packs8.push_back(gemm8::PackedInt8B::pack(qw.data(), s.n, s.k, s.k, sw.data(), nullptr, kern));
    // The AVX2 kernel's narrow form (weights in [−64, 64], vitfast.quantize(weight_bits=7)): the same codes halved.
    std::vector<int8_t> qw7(qw.size());
    for (size_t i = 0; i < qw.size(); ++i) qw7[i] = int8_t(qw[i] / 2);
    std::vector<gemm8::PackedInt8B> packs7;
    if (std::find(kernels.begin(), kernels.end(), Int8Kernel::kAvx2) != kernels.end())
      packs7.push_back(gemm8::PackedInt8B::pack(qw7.data(), s.n, s.k, s.k, sw.data(), nullptr, Int8Kernel::kAvx2));
    const gemm::PackedB pack32 = gemm::PackedB::pack_linear(w.data(), s.n, s.k, s.k, nullptr);
    std::vector<Variant> variants;
    for (const gemm8::PackedInt8B& b7 : packs7) {
      Variant v;
      v.name = "int8 avx2 7-bit w";
      v.peak = "int8 vpmaddubsw+vpmaddwd+vpaddd ymm";
      const gemm8::PackedInt8B* b = &b7;
      v.run = [&, b] {
        gemm8::gemm_int8(s.m, qa.get(), lda8, sa.data(), rowsum.data(), *b, c.data(), s.n, gemm::Epilogue(),
                         Int8Kernel::kAvx2);
      };
      variants.push_back(v);
    }
    for (size_t i = 0; i < kernels.size(); ++i) {
      const gemm8::PackedInt8B* b = &packs8[i];
      const Int8Kernel kern = kernels[i];
      Variant v;
      v.name = std::string("int8 ") + gemm8::int8_kernel_name(kern);
      v.peak = kern == Int8Kernel::kAmxInt8      ? "int8 tdpbssd amx"
               : kern == Int8Kernel::kAvx512Vnni ? "int8 vpdpbusd zmm"
               : kern == Int8Kernel::kAvxVnni    ? "int8 vpdpbusd ymm"
               : kern == Int8Kernel::kAvx2     ? "int8 vpmaddubsw+vpmaddwd+vpaddd ymm"
                                               : "";
      v.run = [&, b, kern] {
        gemm8::gemm_int8(s.m, qa.get(), lda8, sa.data(), rowsum.data(), *b, c.data(), s.n, gemm::Epilogue(), kern);
      };
      variants.push_back(v);
    }
    for (CpuIsa isa : fp32_isas) {
      Variant v;
      v.name = std::string("fp32 ") + cpu_isa_name(isa);
      v.peak = isa == CpuIsa::kAvx512 ? "fp32 fma zmm" : isa == CpuIsa::kAvx2 ? "fp32 fma ymm" : "";
      v.run = [&, isa] { gemm::gemm(s.m, x.data(), s.k, pack32, c.data(), s.n, gemm::Epilogue(), isa); };
      variants.push_back(v);
    }
    Variant quant;
    quant.name = "quantize_rows";
    quant.run = [&] {
      quantize_rows(x.data(), s.k, s.m, s.k, nullptr, qa.get(), lda8, sa.data(), rowsum.data(), quant_isa);
    };
    variants.push_back(quant);
    // Calls per timing: ~20 ms each (one warm-up call sizes it).
    for (Variant& v : variants) {
      v.run();
      const double t0 = now();
      v.run();
      const double t = now() - t0;
      v.reps = std::max(1, int(0.02 / std::max(t, 1e-7)));
    }
    for (Peak& p : peaks) p.shape.clear();
    for (int r = 0; r < rounds; ++r) {
      for (Peak& p : peaks) {
        const double g = p.fn(p.iters);
        p.shape.push_back(g);
        p.all.push_back(g);
      }
      for (Variant& v : variants) {
        const double t0 = now();
        for (int i = 0; i < v.reps; ++i) v.run();
        v.seconds.push_back((now() - t0) / v.reps);
      }
    }
    for (Peak& p : peaks) p.gops = median(p.shape);
    const double quant_us = median(variants.back().seconds) * 1e6;
    variants.pop_back();
    char dims[64];
    std::snprintf(dims, sizeof(dims), "%lldx%lldx%lld", (long long)s.m, (long long)s.k, (long long)s.n);
    for (const Variant& v : variants) {
      const double t = median(v.seconds), gops = ops / t * 1e-9, pk = peak_of(v.peak);
      const double pct = pk > 0 ? 100.0 * gops / pk : 0.0;
      const bool is8 = v.name.rfind("int8", 0) == 0;
      if (!json) {
        std::printf("%-22s %-18s %9.1f %9.1f %7.1f%% %10s\n", (std::string(s.name) + "").c_str(), v.name.c_str(),
                    t * 1e6, gops, pct, is8 ? std::to_string(int(quant_us + 0.5)).c_str() : "");
      }
      char row[512];
      std::snprintf(row, sizeof(row),
                    "%s    {\"shape\": \"%s\", \"mkn\": \"%s\", \"variant\": \"%s\", \"us\": %.2f, \"gops\": %.2f, "
                    "\"peak\": \"%s\", \"pct_peak\": %.1f, \"quant_us\": %.2f}",
                    rows_json.empty() ? "" : ",\n", s.name, dims, v.name.c_str(), t * 1e6, gops, v.peak.c_str(),
                    pct, is8 ? quant_us : 0.0);
      rows_json += row;
    }
  }
  // (d) softmax_quantize_rows against the fp32-exp two steps, interleaved per round; each call starts from the same
  // scores.
  std::string softmax_json;
  {
    const int64_t n = 197, ld = 208, lda = padded_k(n) + 4;
    std::normal_distribution<float> nd(0.0f, 8.0f);
    std::vector<float> scores(static_cast<size_t>(n * ld)), work(scores.size()), sa(static_cast<size_t>(n)),
        row_max(2), row_sum(2);
    for (float& v : scores) v = nd(rng);
    std::vector<int8_t> q(static_cast<size_t>(n * lda));
    std::vector<int32_t> rs(static_cast<size_t>(n));
    if (!json) std::printf("\nattention's P, 197 x 197 scores in row pairs:\n");
    for (CpuIsa isa : fp32_isas) {
      std::vector<double> fused, steps;
      for (int r = 0; r < rounds; ++r) {
        for (int which = 0; which < 2; ++which) {
          work = scores;
          const double t0 = now();
          for (int64_t i = 0; i < n; i += 2) {
            const int64_t pair = std::min<int64_t>(2, n - i);
            if (which == 0) {
              softmax_quantize_rows(work.data() + i * ld, pair, n, ld, 0.125f, q.data() + i * lda, lda,
                                    sa.data() + i, rs.data() + i, isa);
            } else {
              row_max[0] = row_max[1] = -std::numeric_limits<float>::infinity();
              gemm::softmax_exp_rows(work.data() + i * ld, pair, n, ld, 0.125f, row_max.data(), row_sum.data(), isa);
              quantize_rows(work.data() + i * ld, ld, pair, n, nullptr, q.data() + i * lda, lda, sa.data() + i,
                            rs.data() + i, isa);
            }
          }
          (which == 0 ? fused : steps).push_back(now() - t0);
        }
      }
      const double f = median(fused) * 1e6, t = median(steps) * 1e6;
      if (!json) std::printf("  [%s] softmax_quantize_rows %7.1f us, softmax_exp_rows + quantize_rows %7.1f us (%.2fx)\n",
                             cpu_isa_name(isa), f, t, t / f);
      char row[256];
      std::snprintf(row, sizeof(row), "%s{\"isa\": \"%s\", \"fused_us\": %.2f, \"two_steps_us\": %.2f}",
                    softmax_json.empty() ? "" : ", ", cpu_isa_name(isa), f, t);
      softmax_json += row;
    }
  }
  // (e) The AMX kernel's distance from the tdpbssd peak, split (AMX hosts only): its block with every operand in
  // L1, with B's panel pairs streamed from L2 (n = 1152: 36 pairs), and the whole kernel (A rows from memory, the
  // fp32 epilogue, 192 × k × 1152), interleaved per round like the shapes above.
  std::string amx_json;
#if defined(__x86_64__)
  if (cpu_has(CpuExt::kAmxInt8)) {
    if (!json) std::printf("\nAMX kernel against the tdpbssd peak, split (n = 1152, 192 rows = 6 row blocks):\n");
    const int64_t m = 192, n = 1152, pairs = n / 32;
    for (int64_t k : {int64_t(384), int64_t(768), int64_t(1536)}) {
      const AlignedBytes a = aligned_bytes(m * k, 1), bq = aligned_bytes(n * k, 1);
      std::vector<float> sa(size_t(m), 1.0f), sw(size_t(n), 1.0f), c(size_t(m * n));
      std::vector<int32_t> rowsum(static_cast<size_t>(m));
      const gemm8::PackedInt8B pack =
          gemm8::PackedInt8B::pack(bq.get(), n, k, k, sw.data(), nullptr, Int8Kernel::kAmxInt8);
      const int64_t blocks = 6 * pairs * 20, reps = 20;  // ~1-5 ms per measurement
      std::vector<double> in_l1, from_l2, kernel, peak;
      for (int r = 0; r < rounds; ++r) {
        peak.push_back(peak_amx_int8_gops(20000));
        in_l1.push_back(amx_block_gops(a.get(), bq.get(), k, 1, blocks));
        from_l2.push_back(amx_block_gops(a.get(), bq.get(), k, pairs, blocks));
        const double t0 = now();
        for (int64_t i = 0; i < reps; ++i)
          gemm8::gemm_int8(m, a.get(), k, sa.data(), rowsum.data(), pack, c.data(), n, gemm::Epilogue(),
                           Int8Kernel::kAmxInt8);
        kernel.push_back(2.0 * double(m) * k * n * double(reps) / (now() - t0) * 1e-9);
      }
      const double pk = median(peak);
      const struct {
        const char* name;
        double gops;
      } parts[] = {{"block, operands in L1", median(in_l1)},
                   {"block, B pairs from L2", median(from_l2)},
                   {"kernel (A from memory, fp32 epilogue)", median(kernel)}};
      for (const auto& part : parts) {
        if (!json)
          std::printf("  k = %4lld  %-40s %8.1f GOPS %6.1f%%\n", (long long)k, part.name, part.gops,
                      100.0 * part.gops / pk);
        char row[256];
        std::snprintf(row, sizeof(row), "%s{\"k\": %lld, \"part\": \"%s\", \"gops\": %.1f, \"pct_peak\": %.1f}",
                      amx_json.empty() ? "" : ", ", (long long)k, part.name, part.gops, 100.0 * part.gops / pk);
        amx_json += row;
      }
    }
  }
#endif
  for (Peak& p : peaks) p.gops = median(p.all);
  if (!json) {
    std::printf("\npeaks (one core, register-only loops; medians over all rounds; %% peak above uses each shape's own\n"
                "rounds):\n");
    for (const Peak& p : peaks) std::printf("  %-40s %8.1f GOPS\n", p.name, p.gops);
  }
  if (json) {
    std::printf("{\n  \"rounds\": %d,\n  \"quantize_isa\": \"%s\",\n  \"peaks\": [", rounds, cpu_isa_name(quant_isa));
    for (size_t i = 0; i < peaks.size(); ++i)
      std::printf("%s{\"name\": \"%s\", \"gops\": %.2f}", i ? ", " : "", peaks[i].name, peaks[i].gops);
    std::printf("],\n  \"rows\": [\n%s\n  ],\n  \"softmax_quantize\": [%s],\n  \"amx_bounds\": [%s]\n}\n",
                rows_json.c_str(), softmax_json.c_str(), amx_json.c_str());
  }
  return 0;
}
