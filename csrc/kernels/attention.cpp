#include "kernels/attention.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/gemm.h"

namespace vitfast {

namespace {

int64_t padded(int64_t n) { return (n + gemm::kNr - 1) / gemm::kNr * gemm::kNr; }

// A software prefetch the compiler must emit.  GCC (12, -O1 and up) deleted the whole __builtin_prefetch loop
// nest of NextPrefetcher::rows as dead code (prefetches have no side effects it must keep): the library held
// no prefetch of the next task at all.  A volatile asm statement cannot be removed.  Output rows get a read
// prefetch too (what GCC emits for a write prefetch without -mprfchw): the line is in cache when it is stored.
inline void prefetch_line(const char* p) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm volatile("prefetcht0 %0" : : "m"(*p));
#elif defined(__GNUC__) && defined(__aarch64__)
  asm volatile("prfm pldl1keep, %0" : : "Q"(*p));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

// Cache lines of the next task, walked a few at a time: `rows` rows of `width` floats at base + r·ld.
struct LineStream {
  const char* base = nullptr;
  int64_t ld_bytes = 0, rows = 0, lines_per_row = 0;
};

class NextPrefetcher {
 public:
  NextPrefetcher() = default;  // nothing to prefetch
  // qkv elements of `bytes` bytes (fp32, or a bf16 qkv's 2); the output is fp32.
  NextPrefetcher(const AttentionNext& next, const void* cur_qkv, int64_t cur_h, int64_t ld_qkv, int64_t tokens,
                 int64_t heads, int64_t d, int64_t ld_out, int64_t bytes = int64_t(sizeof(float))) {
    if (next.qkv == nullptr || next.q1 <= next.q0) return;
    const char* base = static_cast<const char*>(next.qkv);
    const int64_t ld = ld_qkv * bytes;
    if (next.qkv != cur_qkv || next.h != cur_h) {  // the same head's K and V are already in cache
      add(base + (heads + next.h) * d * bytes, ld, tokens, d * bytes);  // K and V first: packed as the next task starts
      add(base + (2 * heads + next.h) * d * bytes, ld, tokens, d * bytes);
    }
    add(base + (next.q0 * ld_qkv + next.h * d) * bytes, ld, next.q1 - next.q0, d * bytes);
    if (next.out != nullptr)
      add(reinterpret_cast<const char*>(next.out + next.q0 * ld_out + next.h * d), ld_out * int64_t(sizeof(float)),
          next.q1 - next.q0, d * int64_t(sizeof(float)));
  }
  int64_t total_rows() const { return total_; }
  // Rows [r0, r1) of the concatenated streams.
  void rows(int64_t r0, int64_t r1) const {
    for (int s = 0; s < count_ && r0 < r1; ++s) {
      const LineStream& st = streams_[s];
      const int64_t a = std::max<int64_t>(r0, 0), b = std::min(r1, st.rows);
      for (int64_t r = a; r < b; ++r) {
        const char* p = st.base + r * st.ld_bytes;
        for (int64_t l = 0; l < st.lines_per_row; ++l) prefetch_line(p + 64 * l);
      }
      r0 -= st.rows;
      r1 -= st.rows;
    }
  }

 private:
  // Rows of `width` bytes, from the line of the first row's first byte: when the row stride is a whole number
  // of lines every row has that row's line count, otherwise one more line covers any offset (a prefetch past
  // a row's end never faults).
  void add(const char* base, int64_t ld_bytes, int64_t rows, int64_t width) {
    LineStream& s = streams_[count_++];
    const uintptr_t first = reinterpret_cast<uintptr_t>(base) & ~uintptr_t(63);
    s.base = reinterpret_cast<const char*>(first);
    s.ld_bytes = ld_bytes;
    s.rows = rows;
    s.lines_per_row = ld_bytes % 64 == 0
                          ? int64_t((reinterpret_cast<uintptr_t>(base + width) - 1 - first) / 64 + 1)
                          : (width + 63) / 64 + 1;
    total_ += rows;
  }
  LineStream streams_[4];
  int count_ = 0;
  int64_t total_ = 0;
};

}  // namespace

int64_t attention_workspace_floats(int64_t tokens, int64_t head_dim, int64_t q_rows) {
  const int64_t chunk = std::min(q_rows, kAttentionChunk);
  return gemm::packed_floats(tokens, head_dim) + gemm::packed_floats(head_dim, tokens) + chunk * padded(tokens) +
         chunk * padded(head_dim) + 2 * padded(chunk);
}

void attention_head(const float* qkv, int64_t ld_qkv, int64_t tokens, int64_t heads, int64_t head_dim, int64_t h,
                    int64_t q0, int64_t q1, float scale, float* out, int64_t ld_out, float* workspace, CpuIsa isa,
                    const AttentionNext& next) {
  if (q1 <= q0) return;
  const int64_t d = head_dim, attn_dim = heads * head_dim, m = q1 - q0;
  const int64_t chunks = (m + kAttentionChunk - 1) / kAttentionChunk;
  const int64_t max_chunk = std::min(m, kAttentionChunk);
  float* k_panels = workspace;
  float* v_panels = k_panels + gemm::packed_floats(tokens, d);
  float* scores = v_panels + gemm::packed_floats(d, tokens);
  float* q_rows = scores + max_chunk * padded(tokens);
  const int64_t ld_q = padded(d);
  float* row_max = q_rows + max_chunk * ld_q;
  // Q rows ld_qkv apart map to the same few L1 sets when the stride is a multiple of 2 KiB (ViT-L: 12 KiB, every
  // row of a register tile in one set group): then the chunk's Q rows are copied side by side first (measured at
  // ViT-L, N = 577: the score GEMM went from ~63% to ~80% of peak).  At DeiT strides (4.5 and 9 KiB: 8 and 4 set
  // groups) reading in place is faster: the copy's cold loads are not overlapped with FMAs.
  const bool copy_q = ld_qkv * int64_t(sizeof(float)) % 2048 == 0;
  float* row_sum = row_max + padded(max_chunk);
  const int64_t ld_s = padded(tokens);
  const float* q = qkv + h * d;
  const float* k = qkv + attn_dim + h * d;
  const float* v = qkv + 2 * attn_dim + h * d;
  gemm::pack_b_transposed(k, tokens, d, ld_qkv, k_panels);  // B = K_hᵀ  [D × N]
  gemm::pack_b(v, tokens, d, ld_qkv, v_panels);             // B = V_h   [N × D]
  const NextPrefetcher prefetch(next, qkv, h, ld_qkv, tokens, heads, d, ld_out);
  const int64_t pf_total = prefetch.total_rows();
  gemm::Epilogue padded_c;
  padded_c.c_padded = true;
  for (int64_t c = 0; c < chunks; ++c) {
    // Whole chunks of kAttentionChunk rows, the remainder last: every chunk but the last is whole register tiles
    // (AVX2/NEON 6 rows, AVX-512 14), so a head has one partial tile instead of one per chunk.  Balanced chunks
    // (197 rows as 39-40 each) ran five partial tiles, of 3-4 rows, where a 3-row tile has too few accumulators to
    // hide the FMA latency; whole chunks were 1.4-2.3% faster per head (N = 197 and 577, one thread).
    // A row's result does not depend on the chunking (each micro-kernel row reduces over k in the same order), so
    // the bits are the same either way.
    const int64_t r0 = q0 + c * kAttentionChunk, r1 = std::min(q1, r0 + kAttentionChunk), rows = r1 - r0;
    // S = Q_h · K_hᵀ, whole panels into the padded scratch (the padding columns are never read back).
    if (copy_q) {
      for (int64_t i = 0; i < rows; ++i)
        std::copy(q + (r0 + i) * ld_qkv, q + (r0 + i) * ld_qkv + d, q_rows + i * ld_q);
      gemm::gemm_raw(rows, q_rows, ld_q, k_panels, tokens, d, scores, ld_s, padded_c, isa);
    } else {
      gemm::gemm_raw(rows, q + r0 * ld_qkv, ld_qkv, k_panels, tokens, d, scores, ld_s, padded_c, isa);
    }
    // Two rows per call (the AVX-512 softmax interleaves a pair's latency chains), the next task's prefetches
    // spread between the pairs.
    for (int64_t i = 0; i < rows; i += 2) {
      const int64_t pair = std::min<int64_t>(2, rows - i);
      for (int64_t r = i; r < i + pair; ++r) row_max[r] = -std::numeric_limits<float>::infinity();
      gemm::softmax_exp_rows(scores + i * ld_s, pair, tokens, ld_s, scale, row_max + i, row_sum + i, isa);
      const int64_t done = (r0 - q0 + i) * pf_total / m, upto = (r0 - q0 + i + pair) * pf_total / m;
      prefetch.rows(done, upto);
    }
    // out_h = (P · V_h) · 1/Σ, straight into the head's columns of the output rows: the division is the GEMM's
    // row_scale (the product rounded, then multiplied by the rounded 1/Σ: the bits of a pass over the output after
    // it, which cost ~2% of a head).
    for (int64_t i = 0; i < rows; ++i) row_sum[i] = 1.0f / row_sum[i];
    gemm::Epilogue normalise;
    normalise.row_scale = row_sum;
    gemm::gemm_raw(rows, scores, ld_s, v_panels, d, tokens, out + r0 * ld_out + h * d, ld_out, normalise, isa);
  }
}

namespace {
// Floats holding n bf16 values, rounded up to whole 64-byte lines (so the next buffer stays aligned).
int64_t bf16_floats(int64_t n) { return (n + 31) / 32 * 16; }
}  // namespace

int64_t attention_packed_floats_bf16(int64_t tokens, int64_t dk, int64_t dv) {
  return bf16_floats(gemm16::packed_bf16(tokens, dk)) + bf16_floats(gemm16::packed_bf16(dv, tokens));
}

int64_t attention_rows_workspace_floats_bf16(int64_t tokens, int64_t dk, int64_t q_rows) {
  const int64_t chunk = std::min(q_rows, kAttentionChunk);
  return chunk * padded(tokens) + bf16_floats(chunk * padded(dk)) + bf16_floats(chunk * padded(tokens)) +
         3 * padded(chunk);
}

int64_t attention_workspace_floats_bf16(int64_t tokens, int64_t dk, int64_t dv, int64_t q_rows) {
  return attention_packed_floats_bf16(tokens, dk, dv) + attention_rows_workspace_floats_bf16(tokens, dk, q_rows);
}

int64_t attention_workspace_floats_bf16(int64_t tokens, int64_t head_dim, int64_t q_rows) {
  return attention_workspace_floats_bf16(tokens, head_dim, head_dim, q_rows);
}

void attention_pack_bf16(const HeadOperands& o, int64_t tokens, float* packed, gemm16::Bf16Kernel kernel) {
  uint16_t* k_panels = reinterpret_cast<uint16_t*>(packed);
  uint16_t* v_panels = reinterpret_cast<uint16_t*>(packed + bf16_floats(gemm16::packed_bf16(tokens, o.dk)));
  // B = K_hᵀ [dk × N] and B = V_h [N × dv], from the bf16 operands when given (no rounding) or the fp32 ones.
  if (o.k16 != nullptr)
    gemm16::pack_b_transposed_bf16(o.k16, tokens, o.dk, o.ldk, k_panels, kernel);
  else
    gemm16::pack_b_transposed_bf16(o.k, tokens, o.dk, o.ldk, k_panels, kernel);
  if (o.v16 != nullptr)
    gemm16::pack_b_bf16(o.v16, tokens, o.dv, o.ldv, v_panels, kernel);
  else
    gemm16::pack_b_bf16(o.v, tokens, o.dv, o.ldv, v_panels, kernel);
}

namespace {
// Query rows [q0, q1) of one head against its packed K and V (attention_pack_bf16); out / out16 at row q0's first
// output column; the prefetch of the caller's next task walked alongside.
void bf16_rows(const HeadOperands& o, const float* packed, int64_t tokens, int64_t q0, int64_t q1, float scale,
               float* out, int64_t ld_out, uint16_t* out16, int64_t ld_out16, float* workspace, CpuIsa isa,
               gemm16::Bf16Kernel kernel, const NextPrefetcher& prefetch) {
  if (q1 <= q0) return;
  const int64_t dk = o.dk, d = o.dv, m = q1 - q0;
  const int64_t chunks = (m + kAttentionChunk - 1) / kAttentionChunk;
  const int64_t max_chunk = std::min(m, kAttentionChunk);
  const int64_t ld_s = padded(tokens), ld_q = padded(dk);
  const uint16_t* k_panels = reinterpret_cast<const uint16_t*>(packed);
  const uint16_t* v_panels = reinterpret_cast<const uint16_t*>(packed + bf16_floats(gemm16::packed_bf16(tokens, dk)));
  float* scores = workspace;
  uint16_t* q16 = reinterpret_cast<uint16_t*>(scores + max_chunk * ld_s);
  uint16_t* p16 = reinterpret_cast<uint16_t*>(scores + max_chunk * ld_s + bf16_floats(max_chunk * ld_q));
  float* row_max = scores + max_chunk * ld_s + bf16_floats(max_chunk * ld_q) + bf16_floats(max_chunk * ld_s);
  float* row_sum = row_max + padded(max_chunk);
  float* row_scale = row_sum + padded(max_chunk);
  // The scale applied by the score GEMM's epilogue (row_scale: the fp32 product s · scale that the softmax's first
  // pass would compute, so the same bits), and the softmax run with scale 1: its first pass then only reads.
  std::fill(row_scale, row_scale + max_chunk, scale);
  gemm::Epilogue scaled;
  scaled.c_padded = true;
  scaled.row_scale = row_scale;
  const int64_t pf_total = prefetch.total_rows();
  for (int64_t c = 0; c < chunks; ++c) {
    // attention_head's chunking; Q and P rounded to bf16 rows per chunk (their only reader is the next GEMM).
    const int64_t r0 = q0 + c * kAttentionChunk, r1 = std::min(q1, r0 + kAttentionChunk), rows = r1 - r0;
    // A bf16 Q is read in place unless its row stride is a multiple of 2 KiB (every row of a register tile in the
    // same L1 sets: attention_head's copy_q), then copied side by side as the fp32 Q's rounding is.
    const uint16_t* a = q16;
    int64_t lda = ld_q;
    if (o.q16 == nullptr) {
      gemm16::convert_rows(o.q + r0 * o.ldq, o.ldq, rows, dk, q16, ld_q, kernel);
    } else if (o.ldq * 2 % 2048 == 0) {
      for (int64_t i = 0; i < rows; ++i) std::memcpy(q16 + i * ld_q, o.q16 + (r0 + i) * o.ldq, size_t(dk) * 2);
    } else {
      a = o.q16 + r0 * o.ldq;
      lda = o.ldq;
    }
    gemm16::gemm_bf16_raw(rows, a, lda, k_panels, tokens, dk, scores, ld_s, scaled, kernel);
    for (int64_t i = 0; i < rows; i += 2) {
      const int64_t pair = std::min<int64_t>(2, rows - i);
      for (int64_t r = i; r < i + pair; ++r) row_max[r] = -std::numeric_limits<float>::infinity();
      gemm16::softmax_exp_rows_bf16(scores + i * ld_s, pair, tokens, ld_s, 1.0f, row_max + i, row_sum + i,
                                    p16 + i * ld_s, ld_s, isa, kernel);
      const int64_t done = (r0 - q0 + i) * pf_total / m, upto = (r0 - q0 + i + pair) * pf_total / m;
      prefetch.rows(done, upto);
    }
    // out_h = (P · V_h) / Σ: the division as the GEMM's row scale (the same fp32 product as a pass over the output).
    for (int64_t i = 0; i < rows; ++i) row_sum[i] = 1.0f / row_sum[i];
    gemm::Epilogue normalise;
    normalise.row_scale = row_sum;
    if (out16 != nullptr) {
      normalise.c16 = out16 + (r0 - q0) * ld_out16;
      normalise.ldc16 = ld_out16;
    }
    gemm16::gemm_bf16_raw(rows, p16, ld_s, v_panels, d, tokens, out16 != nullptr ? nullptr : out + (r0 - q0) * ld_out,
                          ld_out, normalise, kernel);
  }
}

// One head: K and V packed into the workspace, then its rows (the rows' scratch after the packed panels).
void bf16_head(const HeadOperands& o, int64_t tokens, int64_t q0, int64_t q1, float scale, float* out,
               int64_t ld_out, float* workspace, CpuIsa isa, gemm16::Bf16Kernel kernel,
               const NextPrefetcher& prefetch, uint16_t* out16, int64_t ld_out16) {
  if (q1 <= q0) return;
  attention_pack_bf16(o, tokens, workspace, kernel);
  bf16_rows(o, workspace, tokens, q0, q1, scale, out != nullptr ? out + q0 * ld_out : nullptr, ld_out,
            out16 != nullptr ? out16 + q0 * ld_out16 : nullptr, ld_out16,
            workspace + attention_packed_floats_bf16(tokens, o.dk, o.dv), isa, kernel, prefetch);
}
}  // namespace

void attention_rows_bf16(const HeadOperands& operands, const float* packed, int64_t tokens, int64_t q0, int64_t q1,
                         float scale, float* out, int64_t ld_out, uint16_t* out16, int64_t ld_out16, float* workspace,
                         CpuIsa isa, gemm16::Bf16Kernel kernel) {
  bf16_rows(operands, packed, tokens, q0, q1, scale, out, ld_out, out16, ld_out16, workspace, isa, kernel,
            NextPrefetcher());
}

void attention_head_bf16(const HeadOperands& operands, int64_t tokens, int64_t q0, int64_t q1, float scale,
                         float* out, int64_t ld_out, float* workspace, CpuIsa isa, gemm16::Bf16Kernel kernel) {
  bf16_head(operands, tokens, q0, q1, scale, out, ld_out, workspace, isa, kernel, NextPrefetcher(), nullptr, 0);
}

namespace {
// Head h of a packed qkv row layout: fp32 slices (T = float) or bf16 ones (T = uint16_t: HeadOperands' q16, k16,
// v16).
template <class T>
void qkv_head_bf16(const T* qkv, int64_t ld_qkv, int64_t tokens, int64_t heads, int64_t d, int64_t h, int64_t q0,
                   int64_t q1, float scale, float* out, int64_t ld_out, float* workspace, CpuIsa isa,
                   gemm16::Bf16Kernel kernel, const AttentionNext& next, uint16_t* out16, int64_t ld_out16) {
  const int64_t attn_dim = heads * d;
  const T *q = qkv + h * d, *k = qkv + attn_dim + h * d, *v = qkv + 2 * attn_dim + h * d;
  HeadOperands o;
  if constexpr (std::is_same_v<T, float>)
    o.q = q, o.k = k, o.v = v;
  else
    o.q16 = q, o.k16 = k, o.v16 = v;
  o.ldq = o.ldk = o.ldv = ld_qkv;
  o.dk = o.dv = d;
  bf16_head(o, tokens, q0, q1, scale, out != nullptr ? out + h * d : nullptr, ld_out, workspace, isa, kernel,
            NextPrefetcher(next, qkv, h, ld_qkv, tokens, heads, d, ld_out, int64_t(sizeof(T))),
            out16 != nullptr ? out16 + h * d : nullptr, ld_out16);
}
}  // namespace

void attention_head_bf16(const float* qkv, int64_t ld_qkv, int64_t tokens, int64_t heads, int64_t head_dim, int64_t h,
                         int64_t q0, int64_t q1, float scale, float* out, int64_t ld_out, float* workspace, CpuIsa isa,
                         gemm16::Bf16Kernel kernel, const AttentionNext& next, uint16_t* out16, int64_t ld_out16) {
  qkv_head_bf16(qkv, ld_qkv, tokens, heads, head_dim, h, q0, q1, scale, out, ld_out, workspace, isa, kernel, next,
                out16, ld_out16);
}

void attention_head_bf16(const uint16_t* qkv16, int64_t ld_qkv, int64_t tokens, int64_t heads, int64_t head_dim,
                         int64_t h, int64_t q0, int64_t q1, float scale, float* out, int64_t ld_out, float* workspace,
                         CpuIsa isa, gemm16::Bf16Kernel kernel, const AttentionNext& next, uint16_t* out16,
                         int64_t ld_out16) {
  qkv_head_bf16(qkv16, ld_qkv, tokens, heads, head_dim, h, q0, q1, scale, out, ld_out, workspace, isa, kernel, next,
                out16, ld_out16);
}

}  // namespace vitfast
