"""Triton kernel for `attention` (vitfast.reference.attention): multi-head softmax attention read straight from the
packed qkv [B, N, 3·H·D] and written straight into the [B, N, H·D] layout the output projection reads — one launch,
no permuted copy, no workspace.

    q, k, v = qkv[b, :, h·D + d], qkv[b, :, H·D + h·D + d], qkv[b, :, 2·H·D + h·D + d]
    out[b, n, h·D + d] = Σ_j softmax_j(q_n · k_j · scale) v_j[d]                      (scale default D^-½)

One program owns BLOCK_M query rows of one (image, head) and streams the keys in tiles of BLOCK_N, flash style
(`attention_tile`; the online softmax step in base 2 is kernels/_common.py `online_softmax_step`: running row
maximum and sum in fp32, the accumulator rescaled when the maximum grows), so no [N, N] matrix exists beyond one
BLOCK_M × BLOCK_N tile; the softmax scale and log₂e are one multiply of the scores.  The probabilities are rounded
to v's dtype before the P·V product (fp16/bf16 tensor cores take 16-bit operands), as SDPA's flash and cuDNN
kernels do; fp32 keeps them fp32 and runs its dots in ieee or TF32 as torch's matmul switch says
(`input_precision`).  Heads wider than MAX_HEAD_DIM run on the reference.  The gated attention of USDC blocks
(kernels/gated.py) is this tile behind its gate check.

Why a kernel of our own when SDPA exists: the fused block's launch budget (kernels/vit_block.py: five per block).
SDPA's cuDNN backend, the fastest on an H200 at DeiT-S shapes (88.7 µs against flash's 125.6 at batch 256), launches a
memset before its kernel (six per block); its flash backend is one launch but the slower one.  Speed of this kernel
on a GPU: unmeasured (benchmarks/gpu_profile_blocks.py, section `sdpa`, times it beside both backends).

Rows past N (a ragged last query tile) are computed on zero queries and never stored; keys past N get −∞ before the
softmax.  NaN or ±∞ in q, k or v propagate as in the reference.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from vitfast.kernels._common import (
    INTERPRET as _INTERPRET,
    LOG2E,
    autotune,
    cdiv,
    check_device,
    input_precision,
    launcher,
    next_pow2,
    on_device,
    online_softmax_step,
    operand,
    to_dtype,
    tuned_configs,
)
from vitfast.reference.attention import check_attention_args

__all__ = ["MAX_HEAD_DIM", "attention_tile", "attention_triton", "candidates"]

# Widest head the kernel takes: one program keeps q and acc BLOCK_D wide in registers, and an uncapped power of two
# of a wide head spills or fails to compile.  Wider heads run on the reference (SDPA); ViT heads are 64.
MAX_HEAD_DIM = 128


def candidates() -> list:
    """Every autotune candidate, whatever VITFAST_TRITON_AUTOTUNE says (the every-candidate parity test forces each);
    the first is the one used with autotuning off.  BLOCK_N = 64 or 128 at N = 197: four or two key tiles;
    BLOCK_M = 64 doubles the programs for small batches (B·H·⌈N / BLOCK_M⌉ in all)."""
    # ptxas at DeiT's D = 64 (sm_90, bf16): 161-244 registers, no spills; 64 × 128 and 128 × 64 at 4 warps spilled
    # 64-72 bytes and are not offered.
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
            for bm, bn, w, s in ((128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (64, 128, 8, 3), (128, 32, 4, 3),
                                 (64, 32, 4, 4))]


def _configs():
    # The interpreter runs numpy per Triton op per program: one GPU-legal tile small enough that the test shapes
    # (a few dozen tokens) still cross query- and key-tile edges.
    interpreter = triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=4)
    return tuned_configs(candidates(), interpreter)


@triton.jit
def attention_tile(
    qkv_ptr, out_ptr, N, H, D, qk_scale, s_qb, s_qn, s_qc, s_ob, s_on, s_oc,
    BLOCK_D: tl.constexpr, INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program's share (module docstring): BLOCK_M query rows of one (image, head), (image, head) on grid axis 0
    and the query tile on axis 1.  qk_scale = scale·log₂e.  Shared with the gated attention (kernels/gated.py)."""
    # (image, head) on axis 0, whose limit is 2³¹ − 1: on axis 1 (65535) a ViT-B at batch >= 5462 did not launch.
    bh = tl.program_id(0).to(tl.int64)  # int64 before any stride product (large batches overflow int32)
    b = bh // H
    h = bh % H
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < N
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    offs_n = tl.arange(0, BLOCK_N)
    base = qkv_ptr + b * s_qb
    q_cols = h * D + offs_d  # q | k | v are H·D columns apart
    q = tl.load(base + rows[:, None] * s_qn + q_cols[None, :] * s_qc, mask=row_ok[:, None] & d_ok[None, :],
                other=0.0)
    q = operand(q, INTERPRET_BF16)
    k_base = base + (H * D + q_cols)[:, None] * s_qc  # [BLOCK_D, 1]: kᵀ tiles, keys along the columns
    v_base = base + (2 * H * D + q_cols)[None, :] * s_qc  # [1, BLOCK_D]
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        keys = n0 + offs_n
        key_ok = keys < N
        kt = tl.load(k_base + keys[None, :] * s_qn, mask=d_ok[:, None] & key_ok[None, :], other=0.0)
        s = tl.dot(q, operand(kt, INTERPRET_BF16), input_precision=INPUT_PRECISION) * qk_scale
        p, alpha, m_i, l_i = online_softmax_step(tl.where(key_ok[None, :], s, float("-inf")), m_i, l_i)
        v = tl.load(v_base + keys[:, None] * s_qn, mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        # p in v's dtype for the second product (tensor cores in fp16/bf16), as SDPA's kernels do.
        p = to_dtype(p, qkv_ptr.dtype.element_ty, INTERPRET_BF16)
        acc = tl.dot(operand(p, INTERPRET_BF16), operand(v, INTERPRET_BF16), acc * alpha[:, None],
                     input_precision=INPUT_PRECISION)
    # Rows past N loaded zero queries (finite scores, l > 0) and are never stored.
    o = acc / l_i[:, None]
    o_ptrs = out_ptr + b * s_ob + rows[:, None] * s_on + (h * D + offs_d)[None, :] * s_oc
    tl.store(o_ptrs, to_dtype(o, out_ptr.dtype.element_ty, INTERPRET_BF16), mask=row_ok[:, None] & d_ok[None, :])


# Tuned per power-of-two bucket of N and of B·H (the programs per query tile: 12 at DeiT-S batch 1, 3072 at batch
# 256, where the best tile differs) and per head width; triton adds the tensors' dtypes to the key.
@autotune(_configs(), ["N_BUCKET", "BH_BUCKET", "BLOCK_D"])
@triton.jit
def _attention_kernel(
    qkv_ptr, out_ptr, N, H, D, qk_scale, N_BUCKET, BH_BUCKET,
    s_qb, s_qn, s_qc, s_ob, s_on, s_oc,
    BLOCK_D: tl.constexpr, INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    attention_tile(qkv_ptr, out_ptr, N, H, D, qk_scale, s_qb, s_qn, s_qc, s_ob, s_on, s_oc,
                   BLOCK_D, INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, BLOCK_N)


def attention_triton(qkv: torch.Tensor, num_heads: int, scale: float | None = None, *, _wrap=None) -> torch.Tensor:
    """`vitfast.reference.attention` on the Triton kernel (CUDA tensors, or CPU under the interpreter): qkv
    [B, N, 3·H·D] in any strides → [B, N, H·D] contiguous, in qkv's dtype.  `_wrap`: the launch wrapper of a
    registered op (`torch.library.wrap_triton`: vitfast/ops/triton_ops.py)."""
    heads, head_dim = check_attention_args(qkv, num_heads, scale)
    check_device(qkv)
    if head_dim > MAX_HEAD_DIM:
        from vitfast import reference

        return reference.attention_unchecked(qkv, heads, scale).contiguous()
    batch, tokens, _ = qkv.shape
    out = torch.empty((batch, tokens, heads * head_dim), dtype=qkv.dtype, device=qkv.device)
    if batch == 0 or tokens == 0:
        return out
    scale = head_dim ** -0.5 if scale is None else float(scale)
    grid = lambda meta: (batch * heads, cdiv(tokens, meta["BLOCK_M"]))  # noqa: E731
    with on_device(qkv):
        launcher(_attention_kernel, _wrap)[grid](
            qkv, out, tokens, heads, head_dim, scale * LOG2E, next_pow2(tokens), next_pow2(batch * heads),
            *qkv.stride(), *out.stride(),
            # tl.dot needs every tile side ≥ 16 and a power of two; the columns past D are masked to zero.
            BLOCK_D=max(16, next_pow2(head_dim)), INPUT_PRECISION=input_precision(qkv.dtype),
            INTERPRET_BF16=_INTERPRET and qkv.dtype == torch.bfloat16,
        )
    return out
