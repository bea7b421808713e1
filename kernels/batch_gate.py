"""Triton kernels for the USDC gate ops: `batch_gate` (the decision) and `gate_select` (applying it on the device).

    batch_gate:   f = mean of the B·N tokens of x;  h = act(LN(f·w1ᵀ + b1));  d = h·w2ᵀ + b2;  out = (d > 0)
    gate_select:  out = taken if gate[index] != 0 else skipped

Why these kernels, and what "no host synchronisation" means here: the decision is written to a 2-element device
tensor and every consumer reads it on the device, so nothing waits for the GPU and a CUDA graph captured with
one decision replays correctly with another (the graph holds the kernels, not the branch taken).

`batch_gate` is two launches:
  1. `_pool_partial_kernel`, grid (row chunks P, column tiles): column sums of a chunk of the B·N token rows into
     partial[P, C] (fp32).  Deterministic (no atomics): the same input gives the same decision every time, which
     matters because the decision is a threshold.
  2. `_gate_head_kernel`, one program: sums the P partials per column tile, divides by B·N, multiplies into the
     first layer tile by tile (the hidden vector h [H] stays in registers), LayerNorm + activation, the two
     output rows, the threshold.  The gate network is tiny (H ≤ C), one program is enough; the token pass
     (B·N·C reads) is the only part that needs the whole GPU.

`gate_select` is a streaming select: every program reads the flag once and loads only the chosen source
(masked loads do not touch memory for the other one), so it costs one read and one write of the activation —
the price of the skipped residual path without a host round-trip.  GatedBlock uses it only on its fallback path
(attention with a mask / qk-norm, or VITFAST_CUDA_KERNELS=torch), where the sub-block runs on cuBLAS/SDPA and is
then discarded; its normal CUDA path is the gated kernels of kernels/gated.py, which read the same flag and return
early, so a skipped sub-block is not computed at all (see vitfast/nn/usdc.py).
"""

import torch
import triton
import triton.language as tl
from vitfast.kernels._common import (
    INTERPRET as _INTERPRET,
    SQRT1_2,
    cdiv,
    check_device,
    next_pow2,
    on_device as _on_device,
)

from vitfast.reference.batch_gate import check_batch_gate_args, check_gate_select_args

__all__ = ["batch_gate_triton", "batch_gate_logits_triton", "gate_select_triton"]

_ACT_CODES = {"none": 0, "relu": 1, "gelu": 2}


@triton.jit
def _pool_partial_kernel(
    x_ptr, partial_ptr, rows, C, rows_per_chunk,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    chunk = tl.program_id(0).to(tl.int64)
    col_tile = tl.program_id(1)
    cols = col_tile * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < C
    r_begin = chunk * rows_per_chunk
    r_end = tl.minimum(r_begin + rows_per_chunk, rows)
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for r0 in range(r_begin, r_end, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        mask = (r < r_end)[:, None] & col_mask[None, :]
        tile = tl.load(x_ptr + r[:, None] * C + cols[None, :], mask=mask, other=0.0)
        acc += tile.to(tl.float32)
    tl.store(partial_ptr + chunk * C + cols, tl.sum(acc, axis=0), mask=col_mask)


@triton.jit
def _gate_head_kernel(
    partial_ptr, w1_ptr, b1_ptr, w2_ptr, b2_ptr, out_ptr,
    P, C, H, inv_rows, eps,
    HAS_B1: tl.constexpr, TWO_LAYERS: tl.constexpr, HAS_B2: tl.constexpr, LAYER_NORM: tl.constexpr,
    ACT: tl.constexpr, OUT_LOGITS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr,
):
    hid = tl.arange(0, BLOCK_H)
    hid_mask = hid < H
    h = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cols = c0 + tl.arange(0, BLOCK_C)
        col_mask = cols < C
        feat = tl.zeros((BLOCK_C,), dtype=tl.float32)
        for p0 in range(0, P, BLOCK_P):
            p = p0 + tl.arange(0, BLOCK_P)
            part = tl.load(partial_ptr + p[:, None] * C + cols[None, :],
                           mask=(p < P)[:, None] & col_mask[None, :], other=0.0)
            feat += tl.sum(part, axis=0)
        feat = feat * inv_rows
        w = tl.load(w1_ptr + hid[:, None] * C + cols[None, :], mask=hid_mask[:, None] & col_mask[None, :], other=0.0)
        h += tl.sum(w.to(tl.float32) * feat[None, :], axis=1)
    if HAS_B1:
        h += tl.load(b1_ptr + hid, mask=hid_mask, other=0.0).to(tl.float32)
    if LAYER_NORM:
        mean = tl.sum(h, axis=0) / H
        centred = tl.where(hid_mask, h - mean, 0.0)
        var = tl.sum(centred * centred, axis=0) / H
        h = centred / tl.sqrt(var + eps)
    if ACT == 1:
        h = tl.maximum(h, 0.0)
    elif ACT == 2:
        h = 0.5 * h * (1.0 + tl.math.erf(h * SQRT1_2))
    if TWO_LAYERS:
        w_exec = tl.load(w2_ptr + hid, mask=hid_mask, other=0.0).to(tl.float32)
        w_ffn = tl.load(w2_ptr + H + hid, mask=hid_mask, other=0.0).to(tl.float32)
        d0 = tl.sum(tl.where(hid_mask, w_exec * h, 0.0), axis=0)
        d1 = tl.sum(tl.where(hid_mask, w_ffn * h, 0.0), axis=0)
        if HAS_B2:
            d0 += tl.load(b2_ptr).to(tl.float32)
            d1 += tl.load(b2_ptr + 1).to(tl.float32)
    else:
        d0 = tl.sum(tl.where(hid == 0, h, 0.0), axis=0)
        d1 = tl.sum(tl.where(hid == 1, h, 0.0), axis=0)
    if OUT_LOGITS:  # the parity tests' view: the fp32 logits before the threshold
        tl.store(out_ptr, d0)
        tl.store(out_ptr + 1, d1)
    else:
        tl.store(out_ptr, (d0 > 0).to(out_ptr.dtype.element_ty))
        tl.store(out_ptr + 1, (d1 > 0).to(out_ptr.dtype.element_ty))


@triton.jit
def _gate_select_kernel(gate_ptr, taken_ptr, skipped_ptr, out_ptr, numel, index, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    # Compared in the gate's own dtype, as the reference's `gate != 0` (a float64 1e-300 is open: fp32 rounds it
    # to 0).  A NaN gate is open on both.
    is_open = (tl.load(gate_ptr + index) != 0).to(tl.int32)
    take = (tl.zeros((BLOCK,), dtype=tl.int32) + is_open) != 0
    # Only one of the two loads touches memory: the other's mask is all false.
    a = tl.load(taken_ptr + offs, mask=mask & take, other=0.0)
    b = tl.load(skipped_ptr + offs, mask=mask & (take == 0), other=0.0)
    tl.store(out_ptr + offs, tl.where(take, a, b), mask=mask)


def _contiguous(t):
    return None if t is None else t.contiguous()


def batch_gate_triton(x, w1, b1, w2=None, b2=None, layer_norm=False, act="none", eps=1e-5):
    """Launcher with the signature of `vitfast.reference.batch_gate`; returns the [2] decision in x's dtype."""
    return _launch(x, w1, b1, w2, b2, layer_norm, act, eps, logits=False)


def batch_gate_logits_triton(x, w1, b1, w2=None, b2=None, layer_norm=False, act="none", eps=1e-5):
    """The fp32 logits before the threshold (`vitfast.reference.batch_gate_logits`), for parity tests."""
    return _launch(x, w1, b1, w2, b2, layer_norm, act, eps, logits=True)


def _launch(x, w1, b1, w2, b2, layer_norm, act, eps, logits):
    hidden = check_batch_gate_args(x, w1, b1, w2, b2, layer_norm, act, eps)
    check_device(x)
    batch, tokens, channels = x.shape
    rows = batch * tokens
    x, w1, b1, w2, b2 = (_contiguous(t) for t in (x, w1, b1, w2, b2))
    block_c = min(128, next_pow2(max(channels, 1)))  # C = 0: no pooling, the head's biases decide
    block_r = 16 if _INTERPRET else 32
    # ~4 row tiles per program: enough programs to fill the GPU for B·N in the thousands, few partial rows.
    rows_per_chunk = max(block_r, cdiv(rows, 256 if not _INTERPRET else 4))
    rows_per_chunk = cdiv(rows_per_chunk, block_r) * block_r
    chunks = cdiv(rows, rows_per_chunk)
    partial = torch.empty((chunks, channels), device=x.device, dtype=torch.float32)
    out = torch.empty((2,), device=x.device, dtype=torch.float32 if logits else x.dtype)
    block_h = max(16, next_pow2(hidden))
    # Keep the [BLOCK_H, BLOCK_C] weight tile of the head at ≤ 8K elements (registers of one program).
    head_c = max(16, min(block_c, 8192 // block_h))
    dummy = partial
    with _on_device(x):
        if channels > 0:
            _pool_partial_kernel[(chunks, cdiv(channels, block_c))](
                x, partial, rows, channels, rows_per_chunk, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4
            )
        _gate_head_kernel[(1,)](
            partial, w1, b1 if b1 is not None else dummy, w2 if w2 is not None else dummy,
            b2 if b2 is not None else dummy, out,
            chunks, channels, hidden, 1.0 / rows, float(eps),
            HAS_B1=b1 is not None, TWO_LAYERS=w2 is not None, HAS_B2=b2 is not None, LAYER_NORM=bool(layer_norm),
            ACT=_ACT_CODES[act], OUT_LOGITS=logits, BLOCK_P=16, BLOCK_C=head_c, BLOCK_H=block_h, num_warps=4,
        )
    return out


# What the select kernel copies (the activations a gated model selects); any other dtype takes torch.where.
_SELECT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def gate_select_triton(gate, index, taken, skipped):
    """Launcher with the signature of `vitfast.reference.gate_select`."""
    check_gate_select_args(gate, index, taken, skipped)
    check_device(taken)
    taken, skipped, gate = taken.contiguous(), skipped.contiguous(), gate.contiguous()
    out = torch.empty_like(taken)
    numel = taken.numel()
    if numel == 0:
        return out
    block = 1024
    if taken.dtype not in _SELECT_DTYPES:  # e.g. complex: the reference's torch.where, which takes any dtype
        return torch.where(gate[index] != 0, taken, skipped)
    with _on_device(taken):
        # int(index): validated, numpy integers included, which are no kernel argument
        _gate_select_kernel[(cdiv(numel, block),)](gate, taken, skipped, out, numel, int(index), BLOCK=block,
                                                           num_warps=4)
    return out
