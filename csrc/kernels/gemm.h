// GEMM core of the torch-free kernel tier, shared by the fused ops.
//
//   C[m × n] (=|+=) epilogue(A[m × k] · B[k × n])      A row-major (lda), C row-major (ldc), fp32
//
// B is always a weight, packed once into panels of kNr = 16 columns (`PackedB`, layout [panel][k][16],
// 64-byte aligned, zero padded to a whole panel) so the micro-kernels read one cache line per k.  A is read
// in place (token rows), so activations are never copied.  The epilogue is fused into the micro-kernel:
// bias, erf-GELU (on the columns of this B only: split-GELU = pack the activated and the linear columns as
// two PackedB), an addend (residual) and accumulate-onto-C.
//
// Threading does not live here: `gemm` computes the rows it is given on the calling thread; callers split
// rows (tokens) or panels between threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/aligned.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm_isa.h"

namespace vitfast {
namespace gemm {

// K block of the cache blocking (see gemm_driver.h).  Measured on a core with 32 KiB L1D and 1 MiB L2 at ViT
// shapes (docs/performance.md): a B micro-panel of kc × kNr × 4 B = 64 KiB streamed from L2 (with the software prefetch) beats
// L1-sized blocks (kc = 256: -5..8%), because every extra K block re-reads and re-writes the C tile and
// restarts the B stream.  So K <= 1024 runs unblocked, and a larger K (e.g. the second GEMM at θ = 0.5,
// K = 1536 for DeiT-B, or ViT-L's 4096) is split into equal blocks of at most 1024.
constexpr int64_t kDefaultKc = 1024;

// 64-byte aligned float storage (kernels/aligned.h).
using AlignedFloats = AlignedArray<float>;

// A weight W [n × k] (nn.Linear layout, out_features × in_features) packed as B = Wᵀ, with its bias.
class PackedB {
 public:
  PackedB() = default;
  // `w` row stride `ldw` (>= k); `bias` may be nullptr (no bias) or point to n values.
  static PackedB pack_linear(const float* w, int64_t n, int64_t k, int64_t ldw, const float* bias);

  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  int64_t panels() const { return (n_ + kNr - 1) / kNr; }
  int64_t padded_n() const { return panels() * kNr; }
  int64_t panel_stride() const { return k_ * kNr; }
  const float* panel_data() const { return panels_.data(); }
  // nullptr when packed without bias; otherwise padded_n() values (zeros past n).
  const float* bias() const { return has_bias_ ? bias_.data() : nullptr; }
  // Adds `v` (n values) to the bias, creating it if absent: folds a later bias (e.g. b_out) into this one.
  void add_to_bias(const float* v);
  size_t bytes() const { return size_t(panels_.size() + bias_.size()) * sizeof(float); }

 private:
  int64_t n_ = 0, k_ = 0;
  AlignedFloats panels_;
  AlignedFloats bias_;
  bool has_bias_ = false;
};

struct Epilogue {
  bool bias = false;               // add b.bias() (ignored when the PackedB has none)
  bool gelu = false;               // exact erf-GELU after the bias
  const float* addend = nullptr;   // [m × n] added last (row stride ld_addend), e.g. the residual; must not
                                   // alias C (with K blocks, earlier blocks store partial sums into C first)
  int64_t ld_addend = 0;
  bool accumulate = false;         // C += result instead of C = result
  bool c_padded = false;           // C rows have >= b.padded_n() writable columns (scratch buffers)
  // Row i's sums multiplied by row_scale[i] before the rest of the epilogue (attention's 1/Σ of the unnormalised
  // softmax, applied where P·V is stored instead of in a pass over the output).  fp32: C = (A·B)·row_scale[i] [+ bias
  // ...], the whole sum over K blocks, rounded then multiplied: the bits of a pass over the stored sums afterwards; not
  // with accumulate (the partial sums of K blocks live in C, so C's own values could not be told from them).
  const float* row_scale = nullptr;
  // Also (or, with C = nullptr, only) the result rounded to bf16 (gemm16::to_bf16's bits) into c16, row stride ldc16:
  // the next GEMM's operand written by this one's epilogue, without an fp32 round trip.  Same columns as C (c_padded
  // included).  bf16 kernels only, and not with accumulate when C is nullptr.
  uint16_t* c16 = nullptr;
  int64_t ldc16 = 0;
};

// Rows [0, m) of C, all panels of b, on the calling thread with the given ISA path (scalar if that path was
// not compiled into this binary).
void gemm(int64_t m, const float* a, int64_t lda, const PackedB& b, float* c, int64_t ldc, const Epilogue& ep,
          CpuIsa isa, int64_t kc = kDefaultKc);

// The same over panels [panel_begin, panel_end) only (columns [16·panel_begin, min(n, 16·panel_end))):
// lets a caller split the output columns between threads.
void gemm_panels(int64_t m, const float* a, int64_t lda, const PackedB& b, int64_t panel_begin,
                 int64_t panel_end, float* c, int64_t ldc, const Epilogue& ep, CpuIsa isa,
                 int64_t kc = kDefaultKc);

// Packing into caller-owned memory, for operands that change every call (attention's K and V): `dst` holds
// panels(n) · k · kNr floats (`packed_floats`), 64-byte aligned (e.g. AlignedFloats: the x86 micro-kernels use
// aligned loads of B and fault otherwise); padding columns are written as zeros.
inline int64_t packed_floats(int64_t n, int64_t k) { return (n + kNr - 1) / kNr * kNr * k; }
// B = Wᵀ from W [n × k] with row stride ldw (nn.Linear layout; e.g. K_h, so that A · B = Q_h · K_hᵀ).
void pack_b_transposed(const float* w, int64_t n, int64_t k, int64_t ldw, float* dst);
// B from B [k × n] row-major with row stride ldb (e.g. V_h, so that A · B = P · V_h).
void pack_b(const float* b, int64_t k, int64_t n, int64_t ldb, float* dst);
// C = epilogue(A · B) over such a raw packed B (n columns, depth k, 64-byte aligned; ep.bias is ignored: there is none).
void gemm_raw(int64_t m, const float* a, int64_t lda, const float* b_panels, int64_t n, int64_t k, float* c,
              int64_t ldc, const Epilogue& ep, CpuIsa isa, int64_t kc = kDefaultKc);

// Row softmax in place with the given ISA path: rows of s (row stride ld), columns [0, n), after scaling by
// `scale` (see softmax_rows_* in gemm_isa.h).
void softmax_rows(float* s, int64_t rows, int64_t n, int64_t ld, float scale, CpuIsa isa);

// The unnormalised two-pass row softmax of flash attention (see softmax_exp_rows_* in gemm_isa.h):
// s = exp(s·scale − m) with m = max(row_max, max s·scale) written back to row_max, and row_sum = Σ s.
void softmax_exp_rows(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max, float* row_sum,
                      CpuIsa isa);
// The same with the exp made for results rounded to bf16 or quantized to int8 next (exp_poly.h: kExp2Bf16P;
// softmax_exp_rows_for_bf16_* in gemm_isa.h): NEON's pass on NEON, the scalar one elsewhere (the x86 callers, bf16
// and int8 attention's P, make these exps inside their own one-pass kernels); the same exps on every path.
void softmax_exp_rows_for_bf16(float* s, int64_t rows, int64_t n, int64_t ld, float scale, float* row_max,
                               float* row_sum, CpuIsa isa);

// In-place exact erf-GELU with the given ISA path (the same code the GELU epilogue runs).
void gelu(float* x, int64_t n, CpuIsa isa);

// Thread shares of `rows` GEMM rows: at most `max_chunks` balanced ranges [begin(c), end(c)), each starting on
// a whole register block of the ISA's micro-kernel.  The AVX-512 driver sizes its row tiles from whatever rows
// it gets (balanced 14-row tiles), so there a share may start on any row: 197 rows on 2 threads are 99 + 98,
// where 6-row blocks (the AVX2/NEON/scalar tile) give 102 + 95, ~3% of idle time for the shorter share
// (measured: channel_idle_ffn, DeiT-B θ .75, batch 1, 2 threads, 3.41 -> 3.35 ms median of 9 alternations).
struct RowShares {
  int64_t rows, unit, blocks, chunks;
  RowShares(int64_t rows_, int64_t max_chunks, CpuIsa isa)
      : rows(rows_), unit(isa == CpuIsa::kAvx512 ? int64_t(1) : int64_t(kMr)), blocks((rows_ + unit - 1) / unit),
        chunks(max_chunks < 1 ? 1 : (max_chunks < blocks ? max_chunks : (blocks > 0 ? blocks : 1))) {}
  int64_t begin(int64_t c) const {
    const int64_t r = blocks * c / chunks * unit;
    return r < rows ? r : rows;
  }
  int64_t end(int64_t c) const { return begin(c + 1); }
  // Rows of the largest share (a workspace sized for it serves every share).
  int64_t max_share() const {
    const int64_t r = (blocks + chunks - 1) / chunks * unit;
    return r < rows ? r : rows;
  }
};

}  // namespace gemm
}  // namespace vitfast
