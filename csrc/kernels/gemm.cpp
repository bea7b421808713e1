#include "kernels/gemm.h"
#include "kernels/next_pair_prefetch.h"

#include <cassert>

#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace vitfast {

bool next_panel_prefetch_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("VITFAST_NEXT_PANEL_PREFETCH");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return on;
}

namespace gemm {

PackedB PackedB::pack_linear(const float* w, int64_t n, int64_t k, int64_t ldw, const float* bias) {
  PackedB out;
  out.n_ = n;
  out.k_ = k;
  out.panels_ = AlignedFloats(out.panels() * out.panel_stride());
  // B[kk][col] = W[col][kk]; panel p holds columns [16p, 16p + 16) as [k][16].  Padding columns stay zero,
  // so a tail panel computes zeros there (and GELU(0 + 0) = 0 in a padded scratch C).
  float* dst = out.panels_.data();
  for (int64_t col = 0; col < n; ++col) {
    const float* src = w + col * ldw;
    float* panel = dst + (col / kNr) * out.panel_stride() + (col % kNr);
    for (int64_t kk = 0; kk < k; ++kk) panel[kk * kNr] = src[kk];
  }
  if (bias != nullptr) {
    out.bias_ = AlignedFloats(out.padded_n());
    std::memcpy(out.bias_.data(), bias, size_t(n) * sizeof(float));
    out.has_bias_ = true;
  }
  return out;
}

void PackedB::add_to_bias(const float* v) {
  if (!has_bias_) {
    bias_ = AlignedFloats(padded_n());
    has_bias_ = true;
  }
  for (int64_t j = 0; j < n_; ++j) bias_.data()[j] += v[j];
}

namespace {

// B[kk][col] = W[col][kk] for columns [col0, col0 + cols) of one panel, cols <= kNr, written at panel + (col0 % kNr).
// Attention packs K_hᵀ of every head this way (N × D floats per head, ~4% of the head's time when done one float
// at a time with stride-16 stores); on x86 four columns × four k go through one 4 × 4 register transpose
// (SSE2 is part of x86-64, so no target attribute is needed), the rest one float at a time.
void pack_transposed_columns(const float* w, int64_t ldw, int64_t col0, int64_t cols, int64_t k, float* panel) {
  int64_t j = 0;
#if defined(__SSE2__)
  const int64_t k4 = k - k % 4;
  for (; j + 4 <= cols; j += 4) {
    const float* r0 = w + (col0 + j) * ldw;
    const float* r1 = r0 + ldw;
    const float* r2 = r1 + ldw;
    const float* r3 = r2 + ldw;
    float* out = panel + j;
    for (int64_t kk = 0; kk < k4; kk += 4) {
      __m128 a = _mm_loadu_ps(r0 + kk), b = _mm_loadu_ps(r1 + kk), c = _mm_loadu_ps(r2 + kk),
             d = _mm_loadu_ps(r3 + kk);
      _MM_TRANSPOSE4_PS(a, b, c, d);
      _mm_storeu_ps(out + (kk + 0) * kNr, a);
      _mm_storeu_ps(out + (kk + 1) * kNr, b);
      _mm_storeu_ps(out + (kk + 2) * kNr, c);
      _mm_storeu_ps(out + (kk + 3) * kNr, d);
    }
    for (int64_t kk = k4; kk < k; ++kk) {
      out[kk * kNr + 0] = r0[kk];
      out[kk * kNr + 1] = r1[kk];
      out[kk * kNr + 2] = r2[kk];
      out[kk * kNr + 3] = r3[kk];
    }
  }
#endif
  for (; j < cols; ++j) {
    const float* src = w + (col0 + j) * ldw;
    for (int64_t kk = 0; kk < k; ++kk) panel[kk * kNr + j] = src[kk];
  }
}

}  // namespace

void pack_b_transposed(const float* w, int64_t n, int64_t k, int64_t ldw, float* dst) {
  // Panel by panel: the stores of one panel (4·k·kNr bytes) stay in L1 while its 16 rows of W are read.
  const int64_t panels = (n + kNr - 1) / kNr;
  for (int64_t p = 0; p < panels; ++p) {
    float* panel = dst + p * k * kNr;
    const int64_t cols = n - p * kNr < kNr ? n - p * kNr : kNr;
    pack_transposed_columns(w, ldw, p * kNr, cols, k, panel);
    for (int64_t kk = 0; kk < k; ++kk)  // zero padding columns of the tail panel
      for (int64_t j = cols; j < kNr; ++j) panel[kk * kNr + j] = 0.0f;
  }
}

void pack_b(const float* b, int64_t k, int64_t n, int64_t ldb, float* dst) {
  const int64_t panels = (n + kNr - 1) / kNr;
  for (int64_t p = 0; p < panels; ++p) {
    float* panel = dst + p * k * kNr;
    const float* src = b + p * kNr;
    const int64_t cols = n - p * kNr < kNr ? n - p * kNr : kNr;
    if (cols == kNr) {
      // A whole panel row is one 64-byte line: a fixed-size copy the compiler turns into vector moves (a
      // memcpy call per line cost more than the copy: V_h's packing was ~2% of an attention head).
      for (int64_t kk = 0; kk < k; ++kk)
        for (int64_t j = 0; j < kNr; ++j) panel[kk * kNr + j] = src[kk * ldb + j];
      continue;
    }
    for (int64_t kk = 0; kk < k; ++kk) {
      std::memcpy(panel + kk * kNr, src + kk * ldb, size_t(cols) * sizeof(float));
      for (int64_t j = cols; j < kNr; ++j) panel[kk * kNr + j] = 0.0f;
    }
  }
}

namespace {

void run_block(GemmBlockArgs& g, CpuIsa isa) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case CpuIsa::kAvx2: gemm_block_avx2(g); return;
    case CpuIsa::kAvx512: gemm_block_avx512(g); return;
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon: gemm_block_neon(g); return;
#endif
    default: gemm_block_scalar(g); return;
  }
}

// A whose row stride is a multiple of 4 KiB puts every row of a register tile in the same L1 set (64 sets of
// 64-byte lines: addresses 4 KiB apart share a set).  The AVX-512 path's 14-row tile then reads 14 lines per k
// step from one 8-way set and misses L1 on every step: measured 13.6 vs 10.9 ms at 576×1024×1024, which is
// every ViT-L GEMM whose input width is C = 1024 (qkv, proj, fc1).  Such an A is copied a chunk of rows at a
// time into a buffer whose row stride is padded by one cache line (16 floats), so consecutive rows step
// through the sets.  The AVX2 6-row tile fits in 8 ways and is left alone.
constexpr int64_t kAliasStrideFloats = 1024;
// Rows per copied chunk: 32 AVX-512 row tiles.  Each chunk re-streams B once; B is k·n floats, against
// 2·chunk·k·n FLOPs of work, so the extra traffic is ~1/chunk of the FLOPs.
constexpr int64_t kUnaliasChunkRows = 448;

bool a_rows_alias(const GemmBlockArgs& g, CpuIsa isa) {
  return isa == CpuIsa::kAvx512 && g.m > 1 && g.k > 0 && g.lda % kAliasStrideFloats == 0;
}

void run_blocks(const GemmBlockArgs& g, CpuIsa isa) {
  if (!a_rows_alias(g, isa)) {
    GemmBlockArgs args = g;
    run_block(args, isa);
    return;
  }
  const int64_t ld = (g.k + kNr - 1) / kNr * kNr + kNr;
  const int64_t chunk = g.m < kUnaliasChunkRows ? g.m : kUnaliasChunkRows;
  thread_local AlignedFloats buffer;
  if (buffer.size() < chunk * ld) buffer = AlignedFloats(chunk * ld);
  for (int64_t r0 = 0; r0 < g.m; r0 += chunk) {
    GemmBlockArgs part = g;
    part.m = g.m - r0 < chunk ? g.m - r0 : chunk;
    for (int64_t i = 0; i < part.m; ++i)
      std::memcpy(buffer.data() + i * ld, g.a + (r0 + i) * g.lda, size_t(g.k) * sizeof(float));
    part.a = buffer.data();
    part.lda = ld;
    part.c = g.c + r0 * g.ldc;
    part.addend = g.addend != nullptr ? g.addend + r0 * g.ld_addend : nullptr;
    part.row_scale = g.row_scale != nullptr ? g.row_scale + r0 : nullptr;
    run_block(part, isa);
  }
}
}  // namespace
void gemm_raw(int64_t m, const float* a, int64_t lda, const float* b_panels, int64_t n, int64_t k, float* c,
              int64_t ldc, const Epilogue& ep, CpuIsa isa, int64_t kc) {
  if (m <= 0 || n <= 0) return;
  assert(ep.c16 == nullptr && "c16: bf16 kernels only (gemm.h)");
  assert(!(ep.row_scale != nullptr && ep.accumulate) && "row_scale with accumulate (gemm.h)");
  GemmBlockArgs g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = a;
  g.lda = lda;
  g.b = b_panels;
  g.b_panel_stride = k * kNr;
  g.panel_begin = 0;
  g.panel_end = (n + kNr - 1) / kNr;
  g.c = c;
  g.ldc = ldc;
  g.c_padded = ep.c_padded;
  g.accumulate = ep.accumulate;
  g.bias = nullptr;
  g.gelu = ep.gelu;
  g.addend = ep.addend;
  g.ld_addend = ep.ld_addend;
  g.row_scale = ep.row_scale;
  g.kc = kc;
  run_blocks(g, isa);
}

void softmax_rows(float* s, int64_t rows, int64_t n, int64_t ld, float scale, CpuIsa isa) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case CpuIsa::kAvx2: softmax_rows_avx2(s, rows, n, ld, scale); return;
    case CpuIsa::kAvx512: softmax_rows_avx512(s, rows, n, ld, scale); return;
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon: softmax_rows_neon(s, rows, n, ld, scale); return;
#endif
    default: softmax_rows_scalar(s, rows, n, ld, scale); return;
  }
}

void softmax_exp_rows(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max, float* row_sum,
                      CpuIsa isa) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case CpuIsa::kAvx2: softmax_exp_rows_avx2(s, rows, n, ld, scale, row_max, row_sum); return;
    case CpuIsa::kAvx512: softmax_exp_rows_avx512(s, rows, n, ld, scale, row_max, row_sum); return;
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon: softmax_exp_rows_neon(s, rows, n, ld, scale, row_max, row_sum); return;
#endif
    default: softmax_exp_rows_scalar(s, rows, n, ld, scale, row_max, row_sum); return;
  }
}

void softmax_exp_rows_for_bf16(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                               float* row_sum, CpuIsa isa) {
#if defined(__aarch64__)
  if (isa == CpuIsa::kNeon) {
    softmax_exp_rows_for_bf16_neon(s, rows, n, ld, scale, row_max, row_sum);
    return;
  }
#endif
  (void)isa;
  softmax_exp_rows_for_bf16_scalar(s, rows, n, ld, scale, row_max, row_sum);
}

void gemm_panels(int64_t m, const float* a, int64_t lda, const PackedB& b, int64_t panel_begin,
                 int64_t panel_end, float* c, int64_t ldc, const Epilogue& ep, CpuIsa isa, int64_t kc) {
  if (m <= 0 || panel_end <= panel_begin) return;
  assert(ep.c16 == nullptr && "c16: bf16 kernels only (gemm.h)");
  assert(!(ep.row_scale != nullptr && ep.accumulate) && "row_scale with accumulate (gemm.h)");
  GemmBlockArgs g;
  g.m = m;
  g.n = b.n();
  g.k = b.k();
  g.a = a;
  g.lda = lda;
  g.b = b.panel_data();
  g.b_panel_stride = b.panel_stride();
  g.panel_begin = panel_begin;
  g.panel_end = panel_end;
  g.c = c;
  g.ldc = ldc;
  g.c_padded = ep.c_padded;
  g.accumulate = ep.accumulate;
  g.bias = ep.bias ? b.bias() : nullptr;
  g.gelu = ep.gelu;
  g.addend = ep.addend;
  g.ld_addend = ep.ld_addend;
  g.row_scale = ep.row_scale;
  g.kc = kc;
  run_blocks(g, isa);
}

void gemm(int64_t m, const float* a, int64_t lda, const PackedB& b, float* c, int64_t ldc, const Epilogue& ep,
          CpuIsa isa, int64_t kc) {
  gemm_panels(m, a, lda, b, 0, b.panels(), c, ldc, ep, isa, kc);
}

void gelu(float* x, int64_t n, CpuIsa isa) {
  switch (isa) {
#if defined(__x86_64__) || defined(__i386__)
    case CpuIsa::kAvx2:
    case CpuIsa::kAvx512: gelu_avx2(x, n); return;
#endif
#if defined(__aarch64__)
    case CpuIsa::kNeon: gelu_neon(x, n); return;
#endif
    default: gelu_scalar(x, n); return;
  }
}

}  // namespace gemm
}  // namespace vitfast
