"""Triton GEMM with the preceding non-affine LayerNorm folded in, and the epilogues of the fused ViT block.

    out = LN(x) · Wᵀ + b  [GELU on the first `gelu_cols` columns]  + b2 + add + residual        (one kernel)

The fused model's LayerNorms are affine-free (their affine is folded into the next linear), so with per-row mean μ
and rstd = 1/√(σ² + eps)

    LN(x) · Wᵀ = rstd ⊙ (x · Wᵀ − μ · colsum(W)),      colsum(W)[n] = Σ_k W[n, k]

and the GEMM can read the raw residual stream x: no normalised copy of x is ever written.  μ and rstd are not
recomputed from x here: they arrive as per-row partial statistics (`RowStats`) emitted by the previous GEMM's
residual epilogue (`emit_stats=True`), or by the small `row_stats` kernel when no producer emitted them (the first
block).

Row statistics format (`RowStats`): `partials` float32 [2, T, M] holds, for each row m and each column tile t of
`tile` columns (the last one ragged), the tile's sum and its M2 = Σ (v − mean_t)² about the tile's own mean.  The
consumer combines the T tiles with Chan's parallel formula in a fixed order:

    μ = Σ_t sum_t / K,    M2 = Σ_t [M2_t + n_t (sum_t / n_t − μ)²],    σ² = M2 / K

which is deterministic (no atomics, no order that depends on scheduling) and does not cancel the way
E[x²] − E[x]² does when |μ| ≫ σ.  The tile width is a fixed STAT_TILE, not the autotuned BLOCK_N, so the buffer's
shape does not depend on the config the autotuner picks.  Statistics are taken from the output *as stored* (rounded
to its dtype): they describe exactly the tensor the next LayerNorm reads.

Cancellation bound (why the launcher may fall back).  Write a row as x_k = μ + σ z_k (Σ z = 0, Σ z² = K) and let κ =
|μ|/σ.  The folded path computes x·w − μ·colsum(w) = σ Σ z_k w_k, whose size is ≈ σ‖w‖₂, from terms of size
≈ |μ|‖w‖₂.  Relative to σ‖w‖₂ its error is

    e_fold ≲ (1 + κ) · (u_x + u_acc·√K)  +  c·κ

where u_x is the rounding of the raw x as a dot operand (0 for fp16/bf16 x: the stored values are the operands and
their products are exact in the fp32 accumulator; 2⁻¹¹ when an fp32 x goes through TF32; 0 for ieee fp32),
u_acc = 2⁻²⁴ the fp32 accumulation (√K: random-walk growth over K sums), and c·κ with c = u_acc·log₂K the error of
the fp32 mean itself (a tree sum of values of size |μ|), which every path shares — torch's own LayerNorm included.
colsum(w) is an fp32 sum of exactly the operands of x·Wᵀ, so it adds no term of its own beyond u_acc: fp16/bf16 W
are the operands as stored (summed by the launcher: once per weight version, or inside a captured or traced graph);
an fp32 W may be rounded to TF32 inside the dot, so there colsum is a dot as well (a row of ones times each W tile).
Normalising first (LN, round to the operand dtype, GEMM: the train-time composition) has

    e_norm ≲ u_op + u_acc·√K + c·κ,      u_op = 2⁻⁸ (bf16), 2⁻¹¹ (fp16, TF32), 2⁻²⁴ (ieee fp32).

The folded path is taken for a tile of rows only while e_fold ≤ 2·e_norm (the precision criterion of the GPU block
path: no worse than twice the composition's own error), i.e. while the tile's largest κ ≤ κ_max =
(2·u_op + u_acc·√K − u_x) / (u_x + u_acc·(√K − log₂K)) (`fold_kappa_max`; unbounded when the denominator is not
positive): at K = 768 ≈ 1.6 for ieee fp32, ≈ 1 for TF32 (where folding a row with |μ| = 100σ loses ~5% of the
result), ≈ 900 for fp16, ≈ 7200 for bf16 — more than bf16 storage can carry: a bf16 row has only 8 significant bits,
so |μ|/σ beyond a few hundred means its values have collapsed onto a few levels.  Rows that collapse entirely
(σ = 0 after rounding, κ = ∞) normalise explicitly in every dtype.  Above κ_max the kernel normalises explicitly: each
loaded x tile becomes (x − μ)·rstd, rounded to x's dtype, before the dot (the train-time composition's own rounding,
without writing LN(x) to memory).  The choice is made per BLOCK_M rows inside the kernel from the statistics it has
already loaded, so no host synchronisation is needed (CUDA graphs capture it) and it is deterministic.
The statistics' divisions are IEEE-rounded (`div_rn`, `sqrt_rn`): Triton's `/` on fp32 is the approximate
div.full.f32 (up to 2 ulp), and an error of 2 ulp in μ is 2⁻²³·κ in every normalised value — a constant row
(κ = ∞) would come out as ±(that)·rstd instead of 0.
`norm="explicit"` / `"fold"` force one path (tests; A/B timing on a GPU).

Split-K for few rows (`split_k_factor`, `ln_linear_triton(split_k=...)`).  At batch 1 (197 token rows) the tile
grid is a few dozen programs on a GPU with 132 SMs; the launcher then splits K into S slices, each program of a tile
writes its slice's fp32 partial to a workspace, and the last program of the tile to arrive (an acq_rel counter per
tile) adds the S partials in the fixed order s = 0 .. S − 1 and runs the epilogue — deterministic, and still one
launch, so the block keeps its five.

Performance: the block path built on this kernel ran slower than inductor on the same fused graph on an H100
(table `gpu_blocks`, benchmarks/results/2026-11-28-nvidia-h100-80gb-hbm3.json), and each of its GEMMs 1.7-3.0x slower
than cuBLAS on an H200 (table `gpu_block_gemms`, 2026-11-30-nvidia-h200.json; benchmarks/gpu_profile_blocks.py),
the folded qkv the slowest while colsum(W) was summed in its main loop (`_folded_tile`).  Correctness is checked
under the Triton interpreter, natively when a GPU is present, and by compiling for sm_90 without one
(tests/test_ln_linear_triton.py).
"""
from __future__ import annotations

import inspect
import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from vitfast._derived import DerivedCache
from vitfast.kernels._common import (
    INTERPRET as _INTERPRET,
    autotune,
    cdiv,
    check_device,
    cuda_properties,
    input_precision,
    launcher as _launcher,
    load_tile_f32,
    next_pow2,
    on_device as _on_device,
    operand,
    real_cuda,
    rows as _rows,
    split_gelu_epilogue,
    tile_ids_of,
    to_dtype,
    traced,
    tuned_configs,
)

__all__ = ["MAX_SPLIT_K", "STAT_TILE", "RowStats", "candidates", "fold_kappa_max",
           "launch_count", "ln_linear_triton", "row_stats_triton", "split_k_factor"]

# Column width of one partial-statistics tile emitted by a residual epilogue; every BLOCK_N is a multiple of it.
STAT_TILE = 32
_NORM_MODES = {"auto": 2, "explicit": 1, "fold": 3}
_U32 = 2.0 ** -24
_LAUNCHES = [0]


class RowStats(NamedTuple):
    """Per-row LayerNorm statistics in partial form: `partials` float32 [2, T, M] (tile sums, tile M2s) over tiles
    of `tile` columns of a width-`width` row (module docstring)."""

    partials: torch.Tensor
    tile: int
    width: int

    def mean_var(self):
        """(mean, biased variance) per row, float64, combined as the kernels do (for tests and debugging)."""
        s, q = self.partials.double()
        t = torch.arange(s.shape[0], device=s.device, dtype=torch.float64)
        n = (self.width - t * self.tile).clamp(0, self.tile)[:, None]
        mean = s.sum(0) / self.width
        m2 = (q + n * (s / n.clamp(min=1) - mean) ** 2).sum(0)
        return mean, m2 / self.width


def launch_count() -> int:
    """Kernel launches issued by this module (and counted by its callers, e.g. the block path's SDPA call) since
    import: what the launch-count tests difference."""
    return _LAUNCHES[0]


def count_launch(n: int = 1) -> None:
    _LAUNCHES[0] += n


def fold_kappa_max(dtype: torch.dtype, precision: str, k: int) -> float:
    """The largest |μ|/σ of a tile of rows for which the folded path's error bound stays within twice the
    normalise-then-GEMM bound (module docstring); inf where the bound never favours explicit normalisation."""
    if dtype == torch.float32:
        u_x, u_op = (2.0 ** -11, 2.0 ** -11) if precision == "tf32" else (0.0, _U32)
    elif dtype == torch.float16:
        u_x, u_op = 0.0, 2.0 ** -11
    elif dtype == torch.bfloat16:
        u_x, u_op = 0.0, 2.0 ** -8
    else:
        raise ValueError(f"dtype: expected torch.float32, torch.float16 or torch.bfloat16, got {dtype}")
    k = max(k, 1)
    acc, mean = _U32 * math.sqrt(k), _U32 * math.log2(k)
    denominator = u_x + acc - mean
    return (2.0 * u_op + acc - u_x) / denominator if denominator > 0 else math.inf


# ---------------------------------------------------------------------------------------------- autotune configs
def candidates(tma: bool = False) -> list:
    """Every autotune candidate of the GEMM kernel (the pointer-load tiles, the persistent ones when offered, the TMA
    ones with `tma`), whatever VITFAST_TRITON_AUTOTUNE says: what the every-candidate parity test and the profile's
    sweep run through `forced_config`.  The first is the one used with autotuning off."""
    # Every BLOCK_N is a multiple of STAT_TILE (the statistics epilogue splits a tile into STAT_TILE columns) and
    # every tile side is >= 16 (tl.dot).
    def config(bm, bn, bk, w, s, use_tma=False, **extra):
        return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "USE_TMA": use_tma,
                              "PERSISTENT": False}, num_warps=w, num_stages=s, **extra)

    cfgs = [config(*c) for c in (
        (128, 128, 64, 8, 3),
        (128, 256, 64, 8, 3),
        (128, 64, 64, 4, 4),
        (64, 128, 64, 4, 4),
        (64, 64, 64, 4, 4),
        (64, 64, 32, 4, 5),
    )]
    if _MAXNREG:
        # The default tile with its registers capped at 128 a thread: with the block path's epilogues (folded
        # LayerNorm, GELU, residual, statistics) ptxas gives it 142-167, so only one 256-thread program fits an SM
        # and nothing overlaps one program's epilogue and prologue at K = 384 (six K steps); capped, two fit, for
        # 8-136 bytes of spills in the epilogue (sm_90 compile, bf16).  The autotuner decides whether that pays.
        cfgs.append(config(128, 128, 64, 8, 3, maxnreg=128))
    if _FLATTEN and _OFFER_PERSISTENT:
        cfgs += persistent_configs()
    if tma:
        # Hopper's bulk tensor copies (`_descriptors`) at the two middle tiles: candidates beside the pointer loads,
        # never the untuned default, so the autotuner alone decides whether they pay.
        cfgs += [config(128, 128, 64, 8, 3, True), config(64, 128, 64, 4, 4, True)]
    return cfgs


def _configs(tma: bool = False):
    # The interpreter runs numpy per Triton op per program: one small GPU-legal tile, so that test shapes of a few
    # dozen rows and columns still cross tile edges in M, N and K.
    interpreter = triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4, "USE_TMA": False,
                                 "PERSISTENT": False}, num_warps=4)
    return tuned_configs(candidates(tma), interpreter)


def persistent_configs() -> list:
    """The persistent candidates (`_ln_linear_kernel`: one program per SM looping over the tiles, the tile loop
    flattened with the K loop so the next tile's loads overlap this tile's epilogue); [] without loop flattening.

    Offered to the autotuner only with VITFAST_TRITON_PERSISTENT=1 (A/B on a GPU).  On an H200 with autotuning on,
    the block path's logits came out 7-12% off the fp32 model while fc2 ran the (128, 128, 64, 4 stages) persistent
    candidate and qkv the 128 x 256 tile with colsum(W) summed in its loop (2026-11-30-nvidia-h200.json, table
    `gpu_blocks`); the native parity tests had run the first candidate only.  The kept colsum removed the second
    suspect; these stay out until `test_every_candidate_gives_the_reference` has passed on them natively (it
    runs them whether offered or not)."""
    if not _FLATTEN:
        return []
    return [triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "USE_TMA": False,
                           "PERSISTENT": True}, num_warps=8, num_stages=stages) for stages in (3, 4)]


# triton.Config(maxnreg=...): a register cap per thread (ptxas -maxrregcount) for one candidate (`candidates`).
_MAXNREG = "maxnreg" in inspect.signature(triton.Config.__init__).parameters

# triton >= 3.3's loop-nest flattening (tl.range(..., flatten=...)): the persistent configs need it (without it a
# persistent program would only serialise its tiles) and are offered only with it.
_FLATTEN = "flatten" in inspect.signature(tl.range.__init__).parameters
_OFFER_PERSISTENT = os.environ.get("VITFAST_TRITON_PERSISTENT", "0").strip() == "1"


def _m_bucket(m: int) -> int:
    # Autotune on the power-of-two bucket of M: every batch size of a ViT (M = B·197) does not retune.
    return next_pow2(max(int(m), 1))


# ---------------------------------------------------------------------------------------------- row statistics
@triton.jit
def _row_stats_kernel(x_ptr, stats_ptr, M, K, stride_xm, stride_xk, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """partials [2, 1, M]: the row sum and the M2 about the row mean (two passes over the row: no cancellation)."""
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rk = tl.arange(0, BLOCK_K)
    # Element-wise accumulators reduced once after each loop (also what triton's NVIDIA pipeline accepts: a row
    # sum carried through the loop and used twice afterwards failed its thread-locality pass).
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask = row_ok[:, None] & ((k0 + rk) < K)[None, :]
        acc += load_tile_f32(x_ptr, rows, k0 + rk, stride_xm, stride_xk, mask)
    total = tl.sum(acc, axis=1)
    mean = tl.math.div_rn(total, tl.zeros_like(total) + K)  # (division: module docstring)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask = row_ok[:, None] & ((k0 + rk) < K)[None, :]
        d = tl.where(mask, load_tile_f32(x_ptr, rows, k0 + rk, stride_xm, stride_xk, mask) - mean[:, None], 0.0)
        acc += d * d
    m2 = tl.sum(acc, axis=1)
    tl.store(stats_ptr + rows, total, mask=row_ok)
    tl.store(stats_ptr + M + rows, m2, mask=row_ok)


def row_stats_triton(x: torch.Tensor, *, _wrap=None) -> RowStats:
    """LayerNorm statistics of x's rows [..., K] in `RowStats` form (one tile per row).  (`_wrap`: the launch
    wrapper of the registered op, `torch.library.wrap_triton`: vitfast/ops/triton_ops.py.)"""
    check_device(x)
    k = x.shape[-1]
    x2 = _rows(x, k)
    m = x2.shape[0]
    partials = torch.empty((2, 1, m), dtype=torch.float32, device=x.device)
    if m:
        block_m, block_k = 16, min(next_pow2(max(k, 16)), 256)
        with _on_device(x):
            _launcher(_row_stats_kernel, _wrap)[(cdiv(m, block_m),)](
                x2, partials, m, k, x2.stride(0), x2.stride(1), BLOCK_M=block_m, BLOCK_K=block_k,
            )
        count_launch()
    return RowStats(partials, max(k, 1), k)


# ---------------------------------------------------------------------------------------------- GEMM pieces
@triton.jit
def _combine_stats(stats_ptr, rows, M, K, T, TILE, eps, T_POW2: tl.constexpr):
    """(mean, rstd) of `rows` from partials [2, T, M] (Chan's combination, fixed order: module docstring)."""
    t = tl.arange(0, T_POW2)
    t_ok = t < T
    ptrs = stats_ptr + t[None, :].to(tl.int64) * M + rows[:, None]
    s = tl.load(ptrs, mask=t_ok[None, :], other=0.0)
    q = tl.load(ptrs + T * M, mask=t_ok[None, :], other=0.0)
    n = tl.minimum(tl.maximum(K - t * TILE, 0), TILE).to(tl.float32)
    total = tl.sum(s, axis=1)
    mean = tl.math.div_rn(total, tl.zeros_like(total) + K)
    dev = tl.where(t_ok[None, :], tl.math.div_rn(s, tl.maximum(n, 1.0)[None, :] + tl.zeros_like(s)) - mean[:, None],
                   0.0)
    m2 = tl.sum(q + n[None, :] * dev * dev, axis=1)
    var = tl.math.div_rn(m2, tl.zeros_like(m2) + K)
    rstd = 1.0 / tl.sqrt_rn(tl.maximum(var, 0.0) + eps)
    return mean, rstd


@triton.jit
def _descriptors(x_ptr, w_ptr, M, N, K, stride_xm, stride_wn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tensor-memory-accelerator descriptors of x [M, K] and W [N, K] (unit inner strides, 16-byte aligned: the
    launcher's `_tma_ok`); each load is one bulk copy into shared memory, zero-filled outside the tensor."""
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_xm, 1], block_shape=[BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[stride_wn, 1], block_shape=[BLOCK_N, BLOCK_K])
    return x_desc, w_desc


@triton.jit
def _folded_tile(
    x_ptr, w_ptr, colsum_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, pid_m, pid_n, k_first, k_count,
    mean, rstd,
    COLSUM_GIVEN: tl.constexpr, INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr,
):
    """rstd ⊙ (x·Wᵀ − μ·colsum(W)) for one tile over the K tiles [k_first, k_first + k_count) (all of K, or one
    split-K slice: the expression is linear in x·Wᵀ and colsum, so the slices' results add up to it).

    COLSUM_GIVEN (fp16/bf16 weights): colsum is read from `colsum_ptr`, an fp32 sum of the stored W made by the
    launcher (`_colsum`), and subtracted by the first K slice only; the main loop is then the plain GEMM's.
    Summed here from the W tiles instead, it cost the loop a cross-thread reduction of every W tile read back from
    the shared memory the wgmma pipeline fills: 20 more bar.sync and 30 more ld.shared than the plain loop in the
    sm_90 PTX at the default config, and qkv (the only folded GEMM of RePa-DeiT-S) took 251 µs of GPU time against
    84 µs per 384 columns for the unfolded fc1 (gpu_profile_blocks.py, H200, batch 256).  That in-loop sum is also
    what the H200 run's wrong results had in common (the block path's logits 7-12% off fp32 at the autotuned
    configs, 7 outputs of the bf16 split-K test off by up to 0.23 at the default one; not proven the cause), so
    16-bit weights use it only when a test asks (`_colsum_in_kernel=True`: `test_kept_colsum_matches_the_in_kernel_
    sum` compares the two, natively too).  fp32 keeps a ones-row dot over the same W tiles: TF32 rounds W inside
    the dot, and colsum must see that rounding (as a 16-row dot in fp16/bf16 it made ptxas serialise the main
    loop's wgmma, C7515, which the sm_90 compile test checks)."""
    rows = (pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    cols = (pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + rows[:, None] * stride_xm + (k_first * BLOCK_K + rk)[None, :] * stride_xk
    w_ptrs = w_ptr + (k_first * BLOCK_K + rk)[:, None] * stride_wk + cols[None, :] * stride_wn
    # Row 0 all ones, rows 1..15 zero: tl.dot needs 16 rows; summing over them afterwards is exact.
    ones = tl.where(tl.arange(0, 16)[:, None] == 0, 1.0, 0.0) + tl.zeros((16, BLOCK_K), dtype=tl.float32)
    ones = ones.to(w_ptr.dtype.element_ty)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sums = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    colsum = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if COLSUM_GIVEN:
        if k_first == 0:
            colsum = tl.load(colsum_ptr + cols)
    if USE_TMA:
        x_desc, w_desc = _descriptors(x_ptr, w_ptr, M, N, K, stride_xm, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K)
    for k in range(k_first, k_first + k_count):
        if USE_TMA:  # out-of-range rows, columns and K come back as zeros: no masks
            a = x_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
            w = w_desc.load([pid_n * BLOCK_N, k * BLOCK_K]).T
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            w = tl.load(w_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(operand(a, INTERPRET_BF16), operand(w, INTERPRET_BF16), acc, input_precision=INPUT_PRECISION)
        if not COLSUM_GIVEN:
            if w_ptr.dtype.element_ty == tl.float32:
                sums = tl.dot(operand(ones, INTERPRET_BF16), operand(w, INTERPRET_BF16), sums,
                              input_precision=INPUT_PRECISION)
            else:
                colsum += tl.sum(w.to(tl.float32), axis=0)
        a_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    if not COLSUM_GIVEN and w_ptr.dtype.element_ty == tl.float32:
        colsum = tl.sum(sums, axis=0)
    return rstd[:, None] * (acc - mean[:, None] * colsum[None, :])


@triton.jit
def _normalised_tile(
    x_ptr, w_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, pid_m, pid_n, k_first, k_count,
    mean, rstd,
    NORMALISE: tl.constexpr, INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_TMA: tl.constexpr,
):
    """x·Wᵀ for one tile over the K tiles [k_first, k_first + k_count), each x tile first normalised to
    (x − μ)·rstd in x's dtype when NORMALISE (the train-time composition's rounding of LN(x), done in registers)."""
    rows = (pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    cols = (pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + rows[:, None] * stride_xm + (k_first * BLOCK_K + rk)[None, :] * stride_xk
    w_ptrs = w_ptr + (k_first * BLOCK_K + rk)[:, None] * stride_wk + cols[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if USE_TMA:
        x_desc, w_desc = _descriptors(x_ptr, w_ptr, M, N, K, stride_xm, stride_wn, BLOCK_M, BLOCK_N, BLOCK_K)
    for k in range(k_first, k_first + k_count):
        k_left = K - k * BLOCK_K
        if USE_TMA:
            a = x_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        else:
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
        if NORMALISE:
            # Columns past K stay 0: −μ·rstd there could overflow fp16 to inf, and inf · 0 (masked W) is NaN.
            a = tl.where(rk[None, :] < k_left, (a.to(tl.float32) - mean[:, None]) * rstd[:, None], 0.0)
            a = to_dtype(a, x_ptr.dtype.element_ty, INTERPRET_BF16)
        if USE_TMA:
            w = w_desc.load([pid_n * BLOCK_N, k * BLOCK_K]).T
        else:
            w = tl.load(w_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(operand(a, INTERPRET_BF16), operand(w, INTERPRET_BF16), acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    return acc


@triton.jit
def _emit_stats(v, stats_ptr, rows, row_ok, pid_n, M, N, T_OUT,
                STAT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Partials of the stored output tile v [BLOCK_M, BLOCK_N] (fp32 of the rounded values): for each STAT-column
    sub-tile the sum and the M2 about the sub-tile mean, into [2, T_OUT, M]."""
    S: tl.constexpr = BLOCK_N // STAT
    j = tl.arange(0, S)
    first = pid_n * BLOCK_N + j * STAT  # first column of each sub-tile
    valid = ((first[:, None] + tl.arange(0, STAT)[None, :]) < N)[None, :, :]  # [1, S, STAT]
    v3 = tl.where(valid, tl.reshape(v, (BLOCK_M, S, STAT)), 0.0)
    s = tl.sum(v3, axis=2)
    n = tl.minimum(tl.maximum(N - first, 0), STAT).to(tl.float32)
    mean = tl.math.div_rn(s, tl.maximum(n, 1.0)[None, :] + tl.zeros_like(s))
    d = tl.where(valid, v3 - mean[:, :, None], 0.0)
    q = tl.sum(d * d, axis=2)
    t = pid_n * S + j
    ptrs = stats_ptr + t[None, :].to(tl.int64) * M + rows[:, None]
    mask = row_ok[:, None] & (t < T_OUT)[None, :]
    tl.store(ptrs, s, mask=mask)
    tl.store(ptrs + T_OUT * M, q, mask=mask)


# ---------------------------------------------------------------------------------------------- the kernel
@triton.jit
def _epilogue(
    acc, rows, cols, row_ok, col_ok, mask, pid_n, b_ptr, b2_ptr, add_ptr, res_ptr, out_ptr, stats_out_ptr,
    M, N, GELU_COLS, T_OUT, stride_am, stride_an, stride_rm, stride_rn, stride_om, stride_on,
    HAS_BIAS: tl.constexpr, HAS_GELU: tl.constexpr, HAS_BIAS2: tl.constexpr, HAS_ADD: tl.constexpr,
    HAS_RES: tl.constexpr, EMIT_STATS: tl.constexpr, STAT: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """+ b, GELU on columns < GELU_COLS, + b2 + add + res, store (rounded to out's dtype), statistics of the stored
    tile."""
    acc = split_gelu_epilogue(acc, rows, cols, col_ok, mask, pid_n, b_ptr, b2_ptr, add_ptr, res_ptr, GELU_COLS,
                              stride_am, stride_an, stride_rm, stride_rn,
                              HAS_BIAS, HAS_GELU, HAS_BIAS2, HAS_ADD, HAS_RES, BLOCK_N)
    out = to_dtype(acc, out_ptr.dtype.element_ty, INTERPRET_BF16)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on, out, mask=mask)
    if EMIT_STATS:
        _emit_stats(out.to(tl.float32), stats_out_ptr, rows, row_ok, pid_n, M, N, T_OUT, STAT, BLOCK_M, BLOCK_N)


@triton.jit
def _ln_linear_tile(
    tile, x_ptr, w_ptr, b_ptr, b2_ptr, add_ptr, res_ptr, out_ptr, stats_in_ptr, stats_out_ptr, ws_ptr, cnt_ptr,
    colsum_ptr, M, N, K, M_BUCKET, GELU_COLS, T_IN, STAT_IN_TILE, T_OUT, eps, kappa_max,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_am, stride_an, stride_rm, stride_rn, stride_om, stride_on,
    NORM: tl.constexpr, T_IN_POW2: tl.constexpr, COLSUM_GIVEN: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_GELU: tl.constexpr, HAS_BIAS2: tl.constexpr, HAS_ADD: tl.constexpr,
    HAS_RES: tl.constexpr, EMIT_STATS: tl.constexpr, STAT: tl.constexpr, SPLIT_K: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """Output tile `tile` of `_ln_linear_kernel` (with SPLIT_K > 1, its K slice tl.program_id(1))."""
    pid_m, pid_n = tile_ids_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    k_tiles = tl.cdiv(K, BLOCK_K)
    if SPLIT_K == 1:
        k_first = 0
        k_count = k_tiles
    else:
        per_split = tl.cdiv(k_tiles, SPLIT_K)
        k_first = tl.program_id(1) * per_split
        k_count = tl.minimum(per_split, k_tiles - k_first)  # <= 0 for a trailing empty slice: a zero partial
    if NORM == 0:
        zero = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = _normalised_tile(
            x_ptr, w_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, pid_m, pid_n, k_first, k_count,
            zero, zero, False, INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA,
        )
    else:
        mean, rstd = _combine_stats(stats_in_ptr, rows % M, M, K, T_IN, STAT_IN_TILE, eps, T_IN_POW2)
        if NORM == 1:
            acc = _normalised_tile(
                x_ptr, w_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, pid_m, pid_n, k_first, k_count,
                mean, rstd, True, INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA,
            )
        elif NORM == 3:
            acc = _folded_tile(
                x_ptr, w_ptr, colsum_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, pid_m, pid_n,
                k_first, k_count, mean, rstd, COLSUM_GIVEN, INPUT_PRECISION, INTERPRET_BF16,
                BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA,
            )
        else:
            # Every split of a tile reads the same rows' statistics, so all of them take the same path.
            kappa = tl.max(tl.where(row_ok, tl.abs(mean) * rstd, 0.0), axis=0)
            if kappa <= kappa_max:
                acc = _folded_tile(
                    x_ptr, w_ptr, colsum_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, pid_m, pid_n,
                    k_first, k_count, mean, rstd, COLSUM_GIVEN, INPUT_PRECISION, INTERPRET_BF16,
                    BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA,
                )
            else:
                acc = _normalised_tile(
                    x_ptr, w_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, pid_m, pid_n, k_first,
                    k_count, mean, rstd, True, INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA,
                )
    if SPLIT_K == 1:
        _epilogue(acc, rows, cols, row_ok, col_ok, mask, pid_n, b_ptr, b2_ptr, add_ptr, res_ptr, out_ptr,
                  stats_out_ptr, M, N, GELU_COLS, T_OUT, stride_am, stride_an, stride_rm, stride_rn, stride_om,
                  stride_on, HAS_BIAS, HAS_GELU, HAS_BIAS2, HAS_ADD, HAS_RES, EMIT_STATS, STAT, INTERPRET_BF16,
                  BLOCK_M, BLOCK_N)
    else:
        # The fp32 partial of this slice to the workspace [SPLIT_K, M, N] (L2 only: .cg), every thread's stores
        # before the barrier, then one acq_rel arrival on the tile's counter: its release publishes the partial,
        # and the program that arrives last (count SPLIT_K − 1) acquires every other slice's partial.
        offsets = rows[:, None] * N + cols[None, :]
        slice_size = M.to(tl.int64) * N
        tl.store(ws_ptr + tl.program_id(1) * slice_size + offsets, acc, mask=mask, cache_modifier=".cg")
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            # Fixed order s = 0 .. SPLIT_K − 1, whichever program came last: the result does not depend on the
            # schedule.  The counter goes back to 0 for the next launch (the buffer is reused, never cleared).
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.range(0, SPLIT_K):
                total += tl.load(ws_ptr + s * slice_size + offsets, mask=mask, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")
            _epilogue(total, rows, cols, row_ok, col_ok, mask, pid_n, b_ptr, b2_ptr, add_ptr, res_ptr, out_ptr,
                      stats_out_ptr, M, N, GELU_COLS, T_OUT, stride_am, stride_an, stride_rm, stride_rn, stride_om,
                      stride_on, HAS_BIAS, HAS_GELU, HAS_BIAS2, HAS_ADD, HAS_RES, EMIT_STATS, STAT, INTERPRET_BF16,
                      BLOCK_M, BLOCK_N)


@triton.jit
def _ln_linear_kernel(
    x_ptr, w_ptr, b_ptr, b2_ptr, add_ptr, res_ptr, out_ptr, stats_in_ptr, stats_out_ptr, ws_ptr, cnt_ptr, colsum_ptr,
    M, N, K, M_BUCKET, GELU_COLS, T_IN, STAT_IN_TILE, T_OUT, eps, kappa_max,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_am, stride_an, stride_rm, stride_rn, stride_om, stride_on,
    NORM: tl.constexpr, T_IN_POW2: tl.constexpr, COLSUM_GIVEN: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_GELU: tl.constexpr, HAS_BIAS2: tl.constexpr, HAS_ADD: tl.constexpr,
    HAS_RES: tl.constexpr, EMIT_STATS: tl.constexpr, STAT: tl.constexpr, SPLIT_K: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr = False, PERSISTENT: tl.constexpr = False,
):
    """out = [LN](x)·Wᵀ + b, GELU on columns < GELU_COLS, + b2 + add + res; NORM: 0 none, 1 explicit, 2 auto
    (per row tile: folded while κ ≤ kappa_max), 3 folded.  SPLIT_K > 1: program (tile, s) takes the s-th slice of
    K's tiles, and the last program of a tile to finish reduces the slices (launcher docstring).  PERSISTENT (with
    SPLIT_K = 1): a grid of at most one program per SM, each taking tiles tile, tile + programs, ...; where the
    loop nest allows (one K loop per tile: NORM ≠ 2) triton flattens it, so the next tile's loads are issued during
    this tile's epilogue — what a one-program-per-tile grid cannot overlap when a 128 × 128 tile's registers leave
    room for one program per SM and K is short (384 at DeiT-S)."""
    # Inductor passes a Python float argument as fp64 when it launches the kernel from a compiled graph (triton's
    # own launcher passes fp32), and the IEEE-rounded fp32 math below refuses fp64: one type for both callers.
    eps = tl.cast(eps, tl.float32)
    kappa_max = tl.cast(kappa_max, tl.float32)
    if PERSISTENT and SPLIT_K == 1:
        # (Only offered where tl.range can flatten: `_configs`.)  NORM = 2 has two K loops behind a branch, a nest
        # the flattening pass does not take: that loop stays nested.
        num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=NORM != 2):
            _ln_linear_tile(
                tile,
                x_ptr, w_ptr, b_ptr, b2_ptr, add_ptr, res_ptr, out_ptr, stats_in_ptr, stats_out_ptr, ws_ptr,
                cnt_ptr, colsum_ptr,
                M, N, K, M_BUCKET, GELU_COLS, T_IN, STAT_IN_TILE, T_OUT, eps, kappa_max,
                stride_xm, stride_xk, stride_wn, stride_wk, stride_am, stride_an,
                stride_rm, stride_rn, stride_om, stride_on,
                NORM, T_IN_POW2, COLSUM_GIVEN, HAS_BIAS, HAS_GELU, HAS_BIAS2, HAS_ADD, HAS_RES, EMIT_STATS, STAT,
                SPLIT_K,
                INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA,
            )
    else:
        _ln_linear_tile(
            tl.program_id(0),
            x_ptr, w_ptr, b_ptr, b2_ptr, add_ptr, res_ptr, out_ptr, stats_in_ptr, stats_out_ptr, ws_ptr,
            cnt_ptr, colsum_ptr,
            M, N, K, M_BUCKET, GELU_COLS, T_IN, STAT_IN_TILE, T_OUT, eps, kappa_max,
            stride_xm, stride_xk, stride_wn, stride_wk, stride_am, stride_an,
            stride_rm, stride_rn, stride_om, stride_on,
            NORM, T_IN_POW2, COLSUM_GIVEN, HAS_BIAS, HAS_GELU, HAS_BIAS2, HAS_ADD, HAS_RES, EMIT_STATS, STAT,
            SPLIT_K,
            INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA,
        )


_ln_linear_jit = _ln_linear_kernel
# Two autotuners over the one kernel: pointer-load configs (anywhere), and those plus the TMA configs (Hopper, triton
# with device-side tensor descriptors, unit-stride 16-byte-aligned operands, eager launches: `_tma_ok`).
_AUTOTUNE_KEY = ["M_BUCKET", "N", "K", "SPLIT_K"]
_ln_linear_kernel = autotune(_configs(), _AUTOTUNE_KEY)(_ln_linear_jit)
_ln_linear_kernel_tma = autotune(_configs(tma=True), _AUTOTUNE_KEY)(_ln_linear_jit)


# ---------------------------------------------------------------------------------------------- launcher
def _tma_allocation():
    # Triton's allocator module when it has device-side tensor descriptors (triton >= 3.4) and the allocator hook
    # their scratch memory comes from; else None (no TMA candidates).
    try:
        from triton.runtime import _allocation
    except ImportError:
        return None
    ok = (hasattr(tl, "make_tensor_descriptor") and hasattr(triton, "set_allocator")
          and hasattr(getattr(_allocation, "_allocator", None), "get") and hasattr(_allocation, "NullAllocator"))
    return _allocation if ok else None


_ALLOCATION = _tma_allocation()


def _scratch(size: int, alignment: int, stream):
    # Global scratch for the descriptors a launch creates (128 bytes each): from torch's caching allocator, which
    # hands out 512-byte-aligned blocks and keeps CUDA-graph captures in their private pool.
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _tma_ok(x2: torch.Tensor, weight: torch.Tensor, wrap) -> bool:
    """Whether this launch may use the TMA autotuner: an eager launch (not traced: inductor would have to provide the
    scratch allocator) on a Hopper-or-later GPU, with triton's descriptor runtime, and operands a bulk tensor copy
    can read: unit inner stride, 16-byte-aligned base and row stride.  On such a GPU it sets triton's scratch
    allocator when none is set in this thread, also for a wrapped launch (a `forced_config` may pick a TMA config)."""
    if _INTERPRET or _ALLOCATION is None or not real_cuda(x2) or cuda_properties(x2.device).major < 9:
        return False
    if isinstance(_ALLOCATION._allocator.get(), _ALLOCATION.NullAllocator):
        triton.set_allocator(_scratch)
    if wrap is not None:
        return False
    size = x2.element_size()
    return all(t.stride(1) == 1 and (t.stride(0) * size) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (x2, weight))


def _grid(m: int, n: int, split: int, programs: int):
    # Sizes from the launcher, not from `meta`: triton 3.6's interpreter hands the grid function converted args.
    # A persistent config (split 1) runs at most `programs` programs (`_persistent_programs`).
    def grid(meta):
        tiles = cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"])
        if meta.get("PERSISTENT", False) and split == 1:
            return (min(tiles, programs), 1)
        return (tiles, split)
    return grid


def _persistent_programs(device: torch.device) -> int:
    # One program per SM; 2 without a GPU (the interpreter), so that each program still loops over several tiles.
    sms = sm_count(device)
    return sms if sms > 0 else 2


# Split-K heuristic constants (split_k_factor).
_NOMINAL_TILE = 128      # the first (default) config's BLOCK_M and BLOCK_N
_MIN_SPLIT_COLS = 256    # K columns per slice at least: 4 steps of BLOCK_K = 64, enough to fill a 3-stage pipeline
MAX_SPLIT_K = 8
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (cached); 0 for a CPU tensor (the interpreter: never split) and for
    fake CUDA tensors on a machine without a GPU."""
    props = cuda_properties(device)
    return props.multi_processor_count if props is not None else 0


def split_k_factor(m: int, n: int, k: int, sms: int) -> int:
    """How many K slices the GEMM of an [m, k] × [k, n] problem runs in, on a device with `sms` SMs.

    An output tile is one program; with few rows (batch 1: m = 197) the tile grid of the default 128 × 128 config
    is a few dozen programs, a fraction of an H100's 132 SMs, and each runs the whole K loop alone.  Splitting K
    into S slices gives S programs per tile.  The rule: no split while the grid already covers half the SMs
    (tiles ≥ sms / 2: the rest of the wave is lost in the tail anyway, and a split adds S·m·n fp32 of workspace
    traffic); else S = ⌊sms / tiles⌋, capped so each slice keeps ≥ 256 columns of K (a shorter K loop cannot hide
    its pipeline's prologue) and at MAX_SPLIT_K = 8 (the workspace: S·m·n·4 bytes written and read back, against
    n·k·2 of weights read once).  S < 2 means no split.  Tiles are counted at 128 × 128, the first autotune
    config: the launcher must fix S before the autotuner picks a config (the workspace is sized by it).
    DeiT-B at batch 1 on 132 SMs: qkv (197 × 2304 × 768) 36 tiles → S = 3; proj (197 × 768 × 768) 12 tiles →
    S = 3.  At batch 64 (12608 rows) nothing splits.  Unmeasured on a GPU: the thresholds are what the shapes
    suggest, not timings."""
    tiles = cdiv(max(m, 1), _NOMINAL_TILE) * cdiv(max(n, 1), _NOMINAL_TILE)
    if sms <= 0 or 2 * tiles >= sms:
        return 1
    split = min(sms // tiles, k // _MIN_SPLIT_COLS, MAX_SPLIT_K)
    return split if split >= 2 else 1


# Per-device tile counters of the split-K reduction (int32, all zero between launches: the last program of each
# tile resets its own).  Zeroed once when allocated or grown, so a launch issues no memset (and CUDA-graph replays,
# which reuse the captured buffer, find it zero).  Launches of one device are assumed to be stream-ordered, as
# every vitfast forward is: two split-K launches running at once on two streams would share counters.
_COUNTERS: dict = {}


def _counters(device: torch.device, tiles: int) -> torch.Tensor:
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < tiles:
        buf = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf


# colsum [N] fp32 per weight version (`_colsum`; vitfast/_derived.py: when a vector goes stale).
_COLSUMS = DerivedCache()


def _capturing(x: torch.Tensor) -> bool:
    """Whether x's launch is being recorded into a CUDA graph (torch.cuda.graph / vitfast.cuda_graph)."""
    return x.is_cuda and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _colsum(weight: torch.Tensor) -> torch.Tensor:
    """colsum(W)[n] = Σ_k W[n, k] as an fp32 sum of the stored fp16/bf16 W (the exact operands of x·Wᵀ), kept per
    weight version: the folded LayerNorm's correction term, read by the GEMM's first K slice (`_folded_tile`).
    An inference tensor has no version to key on: summed per call (one small reduction kernel more)."""
    if weight.is_inference():
        return torch.sum(weight, dim=1, dtype=torch.float32)
    return _COLSUMS.get(weight, None, _sum_rows)


def _sum_rows(w: torch.Tensor) -> torch.Tensor:
    return torch.sum(w, dim=1, dtype=torch.float32)


def _check_vector(name, t, n, x):
    if t is not None and (t.dim() != 1 or t.shape[0] != n or t.device != x.device):
        raise ValueError(f"{name}: expected a [{n}] tensor on {x.device}, got shape {list(t.shape)} on {t.device}")


def ln_linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                     eps: float | None = None, stats: RowStats | None = None, gelu_cols: int = 0,
                     bias2: torch.Tensor | None = None, add: torch.Tensor | None = None,
                     residual: torch.Tensor | None = None, emit_stats: bool = False, norm: str = "auto",
                     split_k: int | None = None, _colsum_in_kernel: bool = False, _wrap=None):
    """out = LN(x)·weightᵀ + bias (LN non-affine, only when `eps` is given), GELU on the first `gelu_cols` columns,
    + bias2 + add + residual; x [..., K], weight [N, K] (nn.Linear layout, any strides), add / residual [..., N].

    `stats`: x's row statistics (`RowStats`, from a producer's `emit_stats` or `row_stats_triton`); computed here
    (one more launch) when `eps` is given without them.  `emit_stats=True` returns (out, RowStats of out) instead of
    out.  `norm`: "auto" (fold while the cancellation bound allows, module docstring), "explicit" or "fold".

    `split_k`: K slices per output tile (None: `split_k_factor` of the shape and the device's SM count; an int
    forces it, 1 to MAX_SPLIT_K).  With S > 1 each slice's fp32 partial goes to a workspace [S, M, N], and the last
    program of a tile to finish adds the S partials in the fixed order s = 0 .. S − 1 and runs the epilogue: still
    one launch, deterministic (no float atomics; the schedule decides only which program adds, not the order).
    Folded LayerNorm splits too: rstd ⊙ (x·Wᵀ − μ·colsum(W)) is linear in the slices' x·Wᵀ and colsum(W).

    colsum(W) of the folded LayerNorm: for fp16/bf16 weights, summed once per weight version and kept (`_colsum`),
    or by a reduction inside the graph when the launch is captured into a CUDA graph or traced by torch.compile; for
    fp32 (or with `_colsum_in_kernel=True`, tests) inside the kernel from the W tiles it reads (`_folded_tile`).

    `_wrap`: the registered op's launch wrapper (`torch.library.wrap_triton`, vitfast/ops/triton_ops.py).  Under it
    the split-K counters are allocated zeroed per call (a traced graph cannot hold the module's cached buffer)."""
    if norm not in _NORM_MODES:
        raise ValueError(f"norm: expected one of {sorted(_NORM_MODES)}, got {norm!r}")
    if split_k is not None and (isinstance(split_k, bool) or not isinstance(split_k, int)
                                or not 1 <= split_k <= MAX_SPLIT_K):
        raise ValueError(f"split_k: expected None or an int in [1, {MAX_SPLIT_K}], got {split_k!r}")
    check_device(x)
    k = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"weight: expected shape [N, {k}] (K = x.shape[-1]), got {list(weight.shape)}")
    if weight.dtype != x.dtype:
        raise ValueError(f"weight: expected dtype {x.dtype} (x's), got {weight.dtype}")
    n = weight.shape[0]
    lead = tuple(x.shape[:-1])
    x2 = _rows(x, k)
    m = x2.shape[0]
    for name, vec in (("bias", bias), ("bias2", bias2)):
        _check_vector(name, vec, n, x)
    if not 0 <= gelu_cols <= n:
        raise ValueError(f"gelu_cols: expected 0 <= gelu_cols <= N = {n}, got {gelu_cols}")
    add2 = _rows(add, n) if add is not None else None
    res2 = _rows(residual, n) if residual is not None else None
    for name, t in (("add", add2), ("residual", res2)):
        if t is not None and t.shape[0] != m:
            raise ValueError(f"{name}: expected {m} rows of {n} (x's leading shape), got shape {list(t.shape)}")
    out = torch.empty(lead + (n,), dtype=x.dtype, device=x.device)
    out2 = out.view(m, n)
    t_out = cdiv(n, STAT_TILE)
    stats_out = torch.empty((2, t_out, m), dtype=torch.float32, device=x.device) if emit_stats else None
    result = (out, RowStats(stats_out, STAT_TILE, n)) if emit_stats else out
    if m == 0 or n == 0:
        return result
    if eps is not None:
        if k == 0:
            raise ValueError("x: expected a non-empty last dimension for the LayerNorm, got 0")
        if stats is None:
            stats = row_stats_triton(x2, _wrap=_wrap)
        if stats.width != k or stats.partials.shape[-1] != m:
            raise ValueError(f"stats: expected the statistics of {m} rows of width {k}, got {stats.partials.shape[-1]} "
                             f"rows of width {stats.width}")
    precision = input_precision(x.dtype)
    dummy = out2
    split = split_k if split_k is not None else split_k_factor(m, n, k, sm_count(x.device))
    if split > 1:
        workspace = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
        # One counter per program of the tile grid, for the smallest tile any config has (16 × 32 bounds them all).
        tiles = cdiv(m, 16) * cdiv(n, 32)
        counters = (_counters(x.device, tiles) if _wrap is None
                    else torch.zeros(tiles, dtype=torch.int32, device=x.device))
    else:
        workspace = counters = dummy
    t_in = stats.partials.shape[1] if eps is not None else 1
    colsum_given = eps is not None and not _colsum_in_kernel and x.dtype in (torch.float16, torch.bfloat16)
    if not colsum_given:
        colsum = dummy
    elif traced(x) or _capturing(x):
        # Inside a CUDA-graph capture, or traced into a compiled graph (fake tensors), the sum is part of the graph
        # (one small reduction kernel): a replay reads the parameters in place (vitfast.cuda_graph's contract), so a
        # kept vector would go stale after an in-place weight update, and a replaced one would leave the graph
        # reading freed memory.
        colsum = torch.sum(weight, dim=1, dtype=torch.float32)
    else:
        colsum = _colsum(weight)
    with _on_device(x):
        kernel = _ln_linear_kernel_tma if _tma_ok(x2, weight, _wrap) else _ln_linear_kernel
        _launcher(kernel, _wrap)[_grid(m, n, split, _persistent_programs(x.device))](
            x2, weight, bias if bias is not None else dummy, bias2 if bias2 is not None else dummy,
            add2 if add2 is not None else dummy, res2 if res2 is not None else dummy, out2,
            stats.partials if eps is not None else dummy, stats_out if stats_out is not None else dummy,
            workspace, counters, colsum,
            m, n, k, _m_bucket(m), gelu_cols, t_in, stats.tile if eps is not None else 1, t_out,
            float(eps) if eps is not None else 0.0,
            fold_kappa_max(x.dtype, precision, k),
            x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1),
            add2.stride(0) if add2 is not None else 0, add2.stride(1) if add2 is not None else 0,
            res2.stride(0) if res2 is not None else 0, res2.stride(1) if res2 is not None else 0,
            out2.stride(0), out2.stride(1),
            NORM=_NORM_MODES[norm] if eps is not None else 0, T_IN_POW2=max(2, next_pow2(t_in)),
            COLSUM_GIVEN=colsum_given,
            HAS_BIAS=bias is not None, HAS_GELU=gelu_cols > 0, HAS_BIAS2=bias2 is not None, HAS_ADD=add2 is not None,
            HAS_RES=res2 is not None, EMIT_STATS=emit_stats, STAT=STAT_TILE, SPLIT_K=split,
            INPUT_PRECISION=precision, INTERPRET_BF16=_INTERPRET and x.dtype == torch.bfloat16,
        )
    count_launch()
    return result
