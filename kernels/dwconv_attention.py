"""Triton kernels for `dwconv_attention` (dropin-depthwise-conv-attention eq. 11 and 13, output projection fused).

    V = x · w_vᵀ + b_v            [HW, D]  (the replaced heads' values, over the grid tokens)
    U = Conv_DW(V, kernel)         [HW, D]  (k×k per channel, "same" size, zero padding)
    out = U · w_oᵀ + b_o + residual         (prefix tokens: U = mean of V over the grid, see the reference)

The halo tile (`_conv_chunk`): a k×k window around token t reaches the tokens t + dr·W + dc (|dr|, |dc| ≤ k//2),
i.e. at most HALO = (k//2)·(W + 1) positions before and after a tile of BLOCK_M consecutive grid tokens in
flattened order.  For one chunk of BLOCK_D value channels a program
  1. computes V for the BLOCK_M + 2·HALO positions of the tile and its halo (two tl.dot passes: the BLOCK_M rows
     starting HALO before the tile, then HALO_ROWS ≥ 2·HALO rows after them), positions outside the grid set to
     0 (the convolution's zero padding), into its own scratch tile;
  2. reads that scratch tile back at the k² shifts (a column mask stops row wrap-around) and accumulates U.
So V never exists in full: only BLOCK_M + HALO_ROWS rows of one channel chunk per program, written and re-read
at once by the same program (L1/L2 resident; Triton has no register shuffles at arbitrary shifts, hence the
scratch and the barriers around it).  The price is the halo: V is computed for (BLOCK_M + HALO_ROWS) / BLOCK_M
times the tile's rows (2× for BLOCK_M = 64 at W ≤ 31, k = 3).

Two paths (`_plan` chooses by program count):
  * fused (`_dwconv_attention_kernel`): one program per (image, token tile) loops over the channel chunks,
    keeps U in a per-program [BLOCK_M, D] strip, then runs the output GEMM U · w_oᵀ with the bias/residual
    epilogue.  Nothing but the output leaves the program; right when batch × tiles fills the GPU.
  * split (`_dwconv_values_kernel` then `_dwconv_project_kernel`): batch 1 has only ~9 token tiles per image
    (24×24 grid), far fewer than SMs, so step 1 runs one program per (image, tile, channel chunk) and writes U,
    and step 2 is the output GEMM over (tile, column tile) programs.  V still never exists in full; U makes one
    round trip through memory.

The prefix rows (cls/register tokens, P per image) are one row per image: the launcher computes them with
torch (mean of x over the grid, then the two projections — exact by linearity, V's mean = mean(x)·w_vᵀ + b_v).

Scratch and U are stored in x's dtype, like the reference rounds V and U (F.linear and conv2d outputs); every
accumulation is fp32 and the epilogue casts once.
"""
import contextlib
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from vitfast.kernels._common import (
    INTERPRET as _INTERPRET,
    cdiv,
    check_device,
    cuda_properties,
    input_precision,
    next_pow2,
    to_dtype,
)

from vitfast.reference.dwconv_attention import check_dwconv_attention_args

__all__ = ["dwconv_attention_triton"]


@triton.jit
def _value_rows(
    x_img, wv_ptr, bv_ptr, sv_tile, q0, row_off, HW, P, C, D, d0,
    stride_xn, stride_xc, stride_wd, stride_wc,
    HAS_BV: tl.constexpr, INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    NROWS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Scratch rows [row_off, row_off + NROWS) = V of grid positions q0 … q0 + NROWS − 1, channels d0 … d0 + BLOCK_D.

    Positions outside [0, HW) are the zero padding of the convolution: stored as 0 (bias included)."""
    q = q0 + tl.arange(0, NROWS)
    valid = (q >= 0) & (q < HW)
    tok = (P + tl.where(valid, q, 0)).to(tl.int64)
    dcols = d0 + tl.arange(0, BLOCK_D)
    d_ok = dcols < D
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((NROWS, BLOCK_D), dtype=tl.float32)
    for k in range(0, tl.cdiv(C, BLOCK_K)):
        kk = k * BLOCK_K + rk
        k_ok = kk < C
        a = tl.load(x_img + tok[:, None] * stride_xn + kk[None, :] * stride_xc, mask=valid[:, None] & k_ok[None, :],
                    other=0.0)
        w = tl.load(wv_ptr + dcols[None, :].to(tl.int64) * stride_wd + kk[:, None] * stride_wc,
                    mask=k_ok[:, None] & d_ok[None, :], other=0.0)
        if INTERPRET_BF16:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=INPUT_PRECISION)
    if HAS_BV:
        acc += tl.load(bv_ptr + dcols, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    acc = tl.where(valid[:, None], acc, 0.0)
    rows = row_off + tl.arange(0, NROWS)
    tl.store(sv_tile + rows[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :],
             to_dtype(acc, sv_tile.dtype.element_ty, INTERPRET_BF16))


@triton.jit
def _conv_chunk(
    x_img, wv_ptr, bv_ptr, k_ptr, sv_tile, t0, GW, HW, P, C, D, d0,
    stride_xn, stride_xc, stride_wd, stride_wc, stride_kd,
    HAS_BV: tl.constexpr, KSIZE: tl.constexpr, INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, HALO_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """U[t0 … t0 + BLOCK_M − 1, d0 … d0 + BLOCK_D − 1] (fp32) through the program's V scratch tile."""
    PAD = KSIZE // 2
    halo = PAD * GW + PAD
    # 1. V of the tile and its halo (flattened positions t0 − halo … t0 − halo + BLOCK_M + HALO_ROWS − 1).
    _value_rows(x_img, wv_ptr, bv_ptr, sv_tile, t0 - halo, 0, HW, P, C, D, d0,
                stride_xn, stride_xc, stride_wd, stride_wc,
                HAS_BV, INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, BLOCK_D, BLOCK_K)
    _value_rows(x_img, wv_ptr, bv_ptr, sv_tile, t0 - halo + BLOCK_M, BLOCK_M, HW, P, C, D, d0,
                stride_xn, stride_xc, stride_wd, stride_wc,
                HAS_BV, INPUT_PRECISION, INTERPRET_BF16, HALO_ROWS, BLOCK_D, BLOCK_K)
    tl.debug_barrier()  # the scratch rows were written by other threads of this program
    # 2. eq. 11: U[t] = Σ_(dr,dc) K[dr,dc] ⊙ V[t + dr·W + dc]; rows outside the grid are zeros in the scratch,
    # columns outside it are masked here (in flattened order they would wrap onto the next row).
    m = tl.arange(0, BLOCK_M)
    t = t0 + m
    t_ok = t < HW
    tj = t % GW
    dl = tl.arange(0, BLOCK_D)
    dcols = d0 + dl
    d_ok = dcols < D
    u = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for tap in tl.static_range(KSIZE * KSIZE):
        dr = tap // KSIZE - PAD
        dc = tap % KSIZE - PAD
        ok = t_ok & (tj + dc >= 0) & (tj + dc < GW)
        srow = m + halo + dr * GW + dc
        v = tl.load(sv_tile + srow[:, None] * BLOCK_D + dl[None, :], mask=ok[:, None], other=0.0)
        kw = tl.load(k_ptr + dcols.to(tl.int64) * stride_kd + tap, mask=d_ok, other=0.0)
        u += v.to(tl.float32) * kw.to(tl.float32)[None, :]
    tl.debug_barrier()  # every thread has read the scratch before the next chunk overwrites it
    return u


@triton.jit
def _project_tile(
    u_rows, stride_um, stride_ud, wo_ptr, bo_ptr, res_img, out_img, t0, n0, HW, P, D, C_OUT,
    stride_on_w, stride_od_w, stride_rn, stride_rc, stride_on, stride_oc,
    HAS_BO: tl.constexpr, HAS_RES: tl.constexpr, INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """out[P + t, n0 … n0 + BLOCK_N − 1] = U[t] · w_oᵀ + b_o + residual for the BLOCK_M grid tokens t0 …"""
    m = tl.arange(0, BLOCK_M)
    t = t0 + m
    t_ok = t < HW
    tok = (P + tl.where(t_ok, t, 0)).to(tl.int64)
    dl = tl.arange(0, BLOCK_D)
    ncols = n0 + tl.arange(0, BLOCK_N)
    n_ok = ncols < C_OUT
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_D):
        kk = k0 + dl
        k_ok = kk < D
        a = tl.load(u_rows + m[:, None].to(tl.int64) * stride_um + kk[None, :] * stride_ud,
                    mask=t_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(wo_ptr + ncols[None, :].to(tl.int64) * stride_on_w + kk[:, None] * stride_od_w,
                    mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if INTERPRET_BF16:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=INPUT_PRECISION)
    mask = t_ok[:, None] & n_ok[None, :]
    if HAS_BO:
        acc += tl.load(bo_ptr + ncols, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_RES:
        acc += tl.load(res_img + tok[:, None] * stride_rn + ncols[None, :] * stride_rc, mask=mask,
                       other=0.0).to(tl.float32)
    tl.store(out_img + tok[:, None] * stride_on + ncols[None, :] * stride_oc,
             to_dtype(acc, out_img.dtype.element_ty, INTERPRET_BF16), mask=mask)


@triton.jit
def _dwconv_attention_kernel(
    x_ptr, wv_ptr, bv_ptr, k_ptr, wo_ptr, bo_ptr, res_ptr, out_ptr, sv_ptr, su_ptr,
    GH, GW, P, C, D, C_OUT,
    stride_xb, stride_xn, stride_xc, stride_wd, stride_wc, stride_kd, stride_on_w, stride_od_w,
    stride_rb, stride_rn, stride_rc, stride_ob, stride_on, stride_oc,
    HAS_BV: tl.constexpr, HAS_BO: tl.constexpr, HAS_RES: tl.constexpr, KSIZE: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, HALO_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The fused path: one program per (image, tile of grid tokens) does all three steps."""
    img = tl.program_id(0).to(tl.int64)
    pm = tl.program_id(1)
    pid = img * tl.num_programs(1) + pm
    HW = GH * GW
    t0 = pm * BLOCK_M
    x_img = x_ptr + img * stride_xb
    sv_tile = sv_ptr + pid * ((BLOCK_M + HALO_ROWS) * BLOCK_D)
    su_tile = su_ptr + pid * (BLOCK_M * D)
    m = tl.arange(0, BLOCK_M)
    dl = tl.arange(0, BLOCK_D)
    for d0 in range(0, D, BLOCK_D):
        u = _conv_chunk(x_img, wv_ptr, bv_ptr, k_ptr, sv_tile, t0, GW, HW, P, C, D, d0,
                        stride_xn, stride_xc, stride_wd, stride_wc, stride_kd,
                        HAS_BV, KSIZE, INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, HALO_ROWS, BLOCK_D, BLOCK_K)
        # 3. U chunk into the program's strip (read back by the output GEMM below).
        dcols = d0 + dl
        tl.store(su_tile + m[:, None] * D + dcols[None, :], to_dtype(u, su_tile.dtype.element_ty, INTERPRET_BF16),
                 mask=(dcols < D)[None, :])
    tl.debug_barrier()  # the U strip is complete before the GEMM reads it
    for n0 in range(0, C_OUT, BLOCK_N):
        _project_tile(su_tile, D, 1, wo_ptr, bo_ptr, res_ptr + img * stride_rb, out_ptr + img * stride_ob, t0, n0,
                      HW, P, D, C_OUT, stride_on_w, stride_od_w, stride_rn, stride_rc, stride_on, stride_oc,
                      HAS_BO, HAS_RES, INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, BLOCK_D, BLOCK_N)


@triton.jit
def _dwconv_values_kernel(
    x_ptr, wv_ptr, bv_ptr, k_ptr, u_ptr, sv_ptr,
    GH, GW, P, C, D,
    stride_xb, stride_xn, stride_xc, stride_wd, stride_wc, stride_kd, stride_ub, stride_un, stride_ud,
    HAS_BV: tl.constexpr, KSIZE: tl.constexpr, INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, HALO_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """The split path, step 1: one program per (image, token tile, channel chunk) writes U = Conv_DW(V)."""
    img = tl.program_id(0).to(tl.int64)
    pm = tl.program_id(1)
    pd = tl.program_id(2)
    pid = (img * tl.num_programs(1) + pm) * tl.num_programs(2) + pd
    HW = GH * GW
    t0 = pm * BLOCK_M
    d0 = pd * BLOCK_D
    sv_tile = sv_ptr + pid * ((BLOCK_M + HALO_ROWS) * BLOCK_D)
    u = _conv_chunk(x_ptr + img * stride_xb, wv_ptr, bv_ptr, k_ptr, sv_tile, t0, GW, HW, P, C, D, d0,
                    stride_xn, stride_xc, stride_wd, stride_wc, stride_kd,
                    HAS_BV, KSIZE, INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, HALO_ROWS, BLOCK_D, BLOCK_K)
    t = t0 + tl.arange(0, BLOCK_M)
    dcols = d0 + tl.arange(0, BLOCK_D)
    tl.store(u_ptr + img * stride_ub + t[:, None].to(tl.int64) * stride_un + dcols[None, :] * stride_ud,
             to_dtype(u, u_ptr.dtype.element_ty, INTERPRET_BF16), mask=(t < HW)[:, None] & (dcols < D)[None, :])


@triton.jit
def _dwconv_project_kernel(
    u_ptr, wo_ptr, bo_ptr, res_ptr, out_ptr,
    HW, P, D, C_OUT,
    stride_ub, stride_un, stride_ud, stride_on_w, stride_od_w, stride_rb, stride_rn, stride_rc,
    stride_ob, stride_on, stride_oc,
    HAS_BO: tl.constexpr, HAS_RES: tl.constexpr, INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The split path, step 2: one program per (image, token tile, output column tile): U · w_oᵀ + epilogue."""
    img = tl.program_id(0).to(tl.int64)
    t0 = tl.program_id(1) * BLOCK_M
    n0 = tl.program_id(2) * BLOCK_N
    _project_tile(u_ptr + img * stride_ub + t0.to(tl.int64) * stride_un, stride_un, stride_ud, wo_ptr, bo_ptr,
                  res_ptr + img * stride_rb, out_ptr + img * stride_ob, t0, n0, HW, P, D, C_OUT,
                  stride_on_w, stride_od_w, stride_rn, stride_rc, stride_on, stride_oc,
                  HAS_BO, HAS_RES, INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, BLOCK_D, BLOCK_N)


# ---------------------------------------------------------------------------------------------- launcher
def _sm_count(device: torch.device) -> int:
    props = cuda_properties(device)
    return props.multi_processor_count if props is not None else 1


def _plan(batch: int, hw: int, halo: int, device: torch.device, path: Optional[str]) -> tuple:
    """(path, BLOCK_M, HALO_ROWS).  HALO_ROWS ≥ 2·halo, a power of two ≥ 16 (tl.dot).

    "fused" (one program per image × token tile does everything) when the grid alone fills the GPU: batch ×
    tiles ≥ SMs.  Otherwise (batch 1 has only a handful of token tiles per image) "split": step 1 runs one
    program per (image, token tile, channel chunk) and writes U, step 2 is the output GEMM over (token tile,
    column tile) programs, so both steps have hundreds of programs; V still never exists in full, U makes one
    round trip.  Under the interpreter: fused unless asked (CI runs both through `path`)."""
    if path not in (None, "fused", "split"):
        raise ValueError(f"path: expected None, 'fused' or 'split', got {path!r}")
    halo_rows = max(16, next_pow2(2 * halo)) if halo > 0 else 16
    if _INTERPRET:
        return path or "fused", 32, halo_rows
    block_m = 128 if hw >= 4096 else 64
    if path is None:
        path = "fused" if batch * cdiv(hw, block_m) >= _sm_count(device) else "split"
    return path, block_m, halo_rows


def dwconv_attention_triton(x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual=None, *,
                            path: Optional[str] = None) -> torch.Tensor:
    """`vitfast.reference.dwconv_attention` on the Triton kernels (CUDA tensors, or CPU under the interpreter).

    `path`: "fused" or "split" (see `_plan`); None chooses by the number of programs the grid gives."""
    prefix, width, ksize, c_out = check_dwconv_attention_args(
        x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual
    )
    grid_h, grid_w = int(grid_h), int(grid_w)  # validated; numpy integers are no kernel argument
    check_device(x)
    batch, tokens, channels = x.shape
    out = torch.empty((batch, tokens, c_out), dtype=x.dtype, device=x.device)
    if batch == 0 or c_out == 0:
        return out
    hw = grid_h * grid_w
    if width == 0:  # no replaced channel: the heads contribute nothing
        out.zero_()
        if b_o is not None:
            out += b_o
        if residual is not None:
            out += residual
        return out
    if prefix:
        # One row per image, same value for every prefix token: mean(V over the grid) = mean(x)·w_vᵀ + b_v.
        v_mean = F.linear(x[:, prefix:].float().mean(dim=1), w_v.float(), b_v.float() if b_v is not None else None)
        pre = F.linear(v_mean, w_o.float(), b_o.float() if b_o is not None else None)[:, None, :]
        pre = pre.expand(batch, prefix, c_out)
        if residual is not None:
            pre = pre + residual[:, :prefix].float()
        out[:, :prefix] = pre.to(x.dtype)

    halo = (ksize // 2) * (grid_w + 1)
    path, block_m, halo_rows = _plan(batch, hw, halo, x.device, path)
    block_d = 32 if width >= 32 else 16
    block_k = 32
    block_n = 64
    m_tiles = cdiv(hw, block_m)
    d_tiles = cdiv(width, block_d)
    kflat = kernel.reshape(width, ksize * ksize).contiguous()
    bv = b_v.contiguous() if b_v is not None else None
    bo = b_o.contiguous() if b_o is not None else None
    dummy = out  # stands in for absent optional pointers; never dereferenced (constexpr flags)
    res = residual if residual is not None else dummy
    precision = input_precision(x.dtype)
    interpret_bf16 = _INTERPRET and x.dtype == torch.bfloat16
    with torch.cuda.device(x.device) if x.device.type == "cuda" else contextlib.nullcontext():
        if path == "fused":
            scratch_v = torch.empty((batch * m_tiles, block_m + halo_rows, block_d), dtype=x.dtype, device=x.device)
            scratch_u = torch.empty((batch * m_tiles, block_m, width), dtype=x.dtype, device=x.device)
            _dwconv_attention_kernel[(batch, m_tiles)](
                x, w_v, bv if bv is not None else dummy, kflat, w_o, bo if bo is not None else dummy, res, out,
                scratch_v, scratch_u,
                grid_h, grid_w, prefix, channels, width, c_out,
                x.stride(0), x.stride(1), x.stride(2), w_v.stride(0), w_v.stride(1), kflat.stride(0),
                w_o.stride(0), w_o.stride(1), res.stride(0), res.stride(1), res.stride(2),
                out.stride(0), out.stride(1), out.stride(2),
                HAS_BV=bv is not None, HAS_BO=bo is not None, HAS_RES=residual is not None, KSIZE=ksize,
                INPUT_PRECISION=precision, INTERPRET_BF16=interpret_bf16,
                BLOCK_M=block_m, HALO_ROWS=halo_rows, BLOCK_D=block_d, BLOCK_K=block_k, BLOCK_N=block_n,
                num_warps=4,
            )
            return out
        scratch_v = torch.empty((batch * m_tiles * d_tiles, block_m + halo_rows, block_d), dtype=x.dtype,
                                device=x.device)
        u = torch.empty((batch, hw, width), dtype=x.dtype, device=x.device)
        _dwconv_values_kernel[(batch, m_tiles, d_tiles)](
            x, w_v, bv if bv is not None else dummy, kflat, u, scratch_v,
            grid_h, grid_w, prefix, channels, width,
            x.stride(0), x.stride(1), x.stride(2), w_v.stride(0), w_v.stride(1), kflat.stride(0),
            u.stride(0), u.stride(1), u.stride(2),
            HAS_BV=bv is not None, KSIZE=ksize, INPUT_PRECISION=precision, INTERPRET_BF16=interpret_bf16,
            BLOCK_M=block_m, HALO_ROWS=halo_rows, BLOCK_D=block_d, BLOCK_K=block_k, num_warps=4,
        )
        _dwconv_project_kernel[(batch, m_tiles, cdiv(c_out, block_n))](
            u, w_o, bo if bo is not None else dummy, res, out,
            hw, prefix, width, c_out,
            u.stride(0), u.stride(1), u.stride(2), w_o.stride(0), w_o.stride(1),
            res.stride(0), res.stride(1), res.stride(2), out.stride(0), out.stride(1), out.stride(2),
            HAS_BO=bo is not None, HAS_RES=residual is not None, INPUT_PRECISION=precision,
            INTERPRET_BF16=interpret_bf16, BLOCK_M=block_m, BLOCK_D=block_d, BLOCK_N=block_n, num_warps=4,
        )
    return out
