"""Triton kernels for `channel_idle_ffn` (RePaViT eq. 6): two GEMMs with fused epilogues.

    h   = x · w_inᵀ + b_in                   [M, A + L]   (A active columns first, then L = 0 or C_out linear ones)
    out = GELU(h[:, :A]) · w_outᵀ + h[:, A:] + b_out + residual          [M, C_out], in x's dtype

Kernel 1 (`_channel_idle_ffn_in_kernel`): GEMM over C_in with bias and a split-GELU epilogue (erf GELU on columns
< A only); writes the buffer `hid` = [GELU(h[:, :A]) | h[:, A:]].
Kernel 2 (`_channel_idle_ffn_out_kernel`): GEMM over the A active columns of `hid` against w_out; its epilogue
adds the linear columns `hid[:, A:]`, b_out and residual, and writes the output.

Why this split (and not the linear path folded into kernel 2's K loop, or one fused kernel): the idle path's
work (M × C_out × C_in) sits in kernel 1, whose N = A + L is wide and gives many output tiles, instead of
lengthening the K loop of kernel 2, whose N = C_out is narrow (a ViT-B batch-1 kernel 2 has only ~12 tiles of
128 × 128 for 132 SMs).  A fully fused kernel would have to recompute the first GEMM per output tile or hold a
[BLOCK_M, A] strip of GELU(h) on chip, which does not fit for A = 3072.

θ = 1 (A = 0) is one linear: kernel 1 alone, with b_out and residual added in its epilogue, so kernel 2 (and its
zero-length K loop) is never launched.

`hid` is stored in x's dtype, not fp32: (a) it is what the reference does (F.linear rounds h to the input dtype),
so low-precision results follow PyTorch's; (b) kernel 2's tl.dot needs fp16/bf16 operands to use tensor cores, so
GELU(h) would be rounded to the input dtype before the dot anyway; (c) it halves the bytes of the only
intermediate.  Accumulation is fp32 throughout and every epilogue runs in fp32 with one cast at the store.
"""
import torch
import triton
import triton.language as tl
from vitfast.kernels._common import (
    INTERPRET as _INTERPRET,
    autotune,
    cdiv,
    check_device,
    input_precision,
    launcher,
    load_tile_f32,
    matmul_tile,
    next_pow2,
    on_device,
    rows,
    split_gelu_epilogue,
    tile_ids,
    to_dtype,
    tuned_configs,
)

from vitfast.reference.channel_idle_ffn import check_channel_idle_ffn_args

__all__ = ["channel_idle_ffn_triton"]



# ---------------------------------------------------------------------------------------------- autotune configs
def candidates() -> list:
    """Every autotune candidate of both kernels, whatever VITFAST_TRITON_AUTOTUNE says (the every-candidate parity
    test runs each through `forced_config`).  The first is the one used when autotuning is off: a middle tile that
    is legal and reasonable for every shape."""
    cfgs = []
    for bm, bn, bk, warps, stages in (
        (128, 128, 64, 8, 3),
        # Large tiles for big M (batched inference) ...
        (128, 256, 64, 8, 3),
        (128, 128, 32, 4, 4),
        (128, 64, 64, 4, 4),
        (64, 128, 64, 4, 4),
        (64, 64, 64, 4, 4),
        # ... and small ones for batch-1 ViT (M = 197) where N = C_out gives few tiles: more, smaller tiles
        # fill the SMs.
        (64, 64, 32, 4, 5),
        (32, 64, 64, 4, 4),
        (32, 128, 64, 4, 4),
    ):
        cfgs.append(
            triton.Config(
                {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=warps, num_stages=stages
            )
        )
    return cfgs


def _configs():
    # The interpreter runs one numpy op per Triton op per program: few, big tiles keep CI fast.  Still
    # GPU-legal shapes.
    interpreter = triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_warps=4)
    return tuned_configs(candidates(), interpreter)


def _m_bucket(m: int) -> int:
    # Autotune key on the power-of-two bucket of M rather than M itself, so every batch size of a ViT
    # (M = B·197) does not trigger a new tuning run.
    return next_pow2(max(int(m), 1))


# ---------------------------------------------------------------------------------------------- kernel 1
@autotune(_configs(), ["M_BUCKET", "N", "K"])
@triton.jit
def _channel_idle_ffn_in_kernel(
    x_ptr, w_ptr, b_ptr, hid_ptr, b_out_ptr, res_ptr,
    M, N, K, A, M_BUCKET,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_hm, stride_hn, stride_rm, stride_rn,
    HAS_BIAS: tl.constexpr, HAS_B_OUT: tl.constexpr, HAS_RES: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """hid = [GELU(h[:, :A]) | h[:, A:]],  h = x · wᵀ + b.  When A = 0 this is the whole op (HAS_B_OUT/HAS_RES)."""
    pid_m, pid_n = tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = matmul_tile(
        x_ptr, w_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, pid_m, pid_n,
        INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, BLOCK_N, BLOCK_K,
    )
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows[:, None] < M) & col_ok[None, :]
    # Split GELU on the A active columns; b_out (when A = 0) and the residual as the second bias and the residual.
    acc = split_gelu_epilogue(acc, rows, cols, col_ok, mask, pid_n, b_ptr, b_out_ptr, res_ptr, res_ptr, A,
                              stride_rm, stride_rn, stride_rm, stride_rn,
                              HAS_BIAS, True, HAS_B_OUT, False, HAS_RES, BLOCK_N)
    hid = to_dtype(acc, hid_ptr.dtype.element_ty, INTERPRET_BF16)
    tl.store(hid_ptr + rows[:, None] * stride_hm + cols[None, :] * stride_hn, hid, mask=mask)


# ---------------------------------------------------------------------------------------------- kernel 2
@autotune(_configs(), ["M_BUCKET", "N", "K"])
@triton.jit
def _channel_idle_ffn_out_kernel(
    g_ptr, w_ptr, lin_ptr, b_ptr, res_ptr, out_ptr,
    M, N, K, M_BUCKET,
    stride_gm, stride_gk, stride_wn, stride_wk, stride_lm, stride_ln, stride_rm, stride_rn, stride_om, stride_on,
    HAS_LINEAR: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """out = g · wᵀ (+ lin) (+ b) (+ res), with g = GELU(h[:, :A]) and lin = h[:, A:] read from kernel 1's buffer."""
    pid_m, pid_n = tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = matmul_tile(
        g_ptr, w_ptr, M, N, K, stride_gm, stride_gk, stride_wn, stride_wk, pid_m, pid_n,
        INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, BLOCK_N, BLOCK_K,
    )
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows[:, None] < M) & col_ok[None, :]
    if HAS_LINEAR:
        acc += load_tile_f32(lin_ptr, rows, cols, stride_lm, stride_ln, mask)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_RES:
        acc += load_tile_f32(res_ptr, rows, cols, stride_rm, stride_rn, mask)
    out = to_dtype(acc, out_ptr.dtype.element_ty, INTERPRET_BF16)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on, out, mask=mask)


# ---------------------------------------------------------------------------------------------- launcher
def _grid(m: int, n: int):
    # Sizes from the launcher, not from `meta`: older interpreters (triton 3.6) hand the grid function the
    # kernel arguments already converted to interpreter tensors.
    return lambda meta: (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)


def channel_idle_ffn_triton(x, w_in, b_in, w_out, b_out=None, residual=None, *, _wrap=None) -> torch.Tensor:
    """`vitfast.reference.channel_idle_ffn` on the Triton kernels (CUDA tensors, or CPU under the interpreter).
    `_wrap`: a launch wrapper (`forced_config`, or a registered op's `wrap_triton`)."""
    active, linear, c_out = check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, residual)
    check_device(x)
    lead = tuple(x.shape[:-1])
    c_in = x.shape[-1]
    x2 = rows(x, c_in)
    m = x2.shape[0]
    out = torch.empty((m, c_out), dtype=x.dtype, device=x.device)
    if m == 0 or c_out == 0:
        return out.reshape(lead + (c_out,))
    res2 = rows(residual, c_out) if residual is not None else None
    if active == 0 and linear == 0:
        # No weights at all (w_in has 0 rows): the op is b_out + residual, no GEMM to run.
        out.zero_()
        if b_out is not None:
            out += b_out
        if res2 is not None:
            out += res2
        return out.reshape(lead + (c_out,))

    # Biases are tiny; contiguous copies keep the kernels to a unit-stride 1-D load.
    b_in_c = b_in.contiguous() if b_in is not None else None
    b_out_c = b_out.contiguous() if b_out is not None else None
    precision = input_precision(x.dtype)
    interpret_bf16 = _INTERPRET and x.dtype == torch.bfloat16
    m_bucket = _m_bucket(m)
    n_hid = active + linear
    dummy = out  # stands in for absent optional pointers; never dereferenced (constexpr flags)

    with on_device(x):
        if active == 0:
            # θ = 1: the op is one linear, h is the output.
            launcher(_channel_idle_ffn_in_kernel, _wrap)[_grid(m, n_hid)](
                x2, w_in, b_in_c if b_in_c is not None else dummy, out,
                b_out_c if b_out_c is not None else dummy, res2 if res2 is not None else dummy,
                m, n_hid, c_in, 0, m_bucket,
                x2.stride(0), x2.stride(1), w_in.stride(0), w_in.stride(1), out.stride(0), out.stride(1),
                res2.stride(0) if res2 is not None else 0, res2.stride(1) if res2 is not None else 0,
                HAS_BIAS=b_in_c is not None, HAS_B_OUT=b_out_c is not None, HAS_RES=res2 is not None,
                INPUT_PRECISION=precision, INTERPRET_BF16=interpret_bf16,
            )
            return out.reshape(lead + (c_out,))

        hid = torch.empty((m, n_hid), dtype=x.dtype, device=x.device)
        launcher(_channel_idle_ffn_in_kernel, _wrap)[_grid(m, n_hid)](
            x2, w_in, b_in_c if b_in_c is not None else dummy, hid, dummy, dummy,
            m, n_hid, c_in, active, m_bucket,
            x2.stride(0), x2.stride(1), w_in.stride(0), w_in.stride(1), hid.stride(0), hid.stride(1), 0, 0,
            HAS_BIAS=b_in_c is not None, HAS_B_OUT=False, HAS_RES=False,
            INPUT_PRECISION=precision, INTERPRET_BF16=interpret_bf16,
        )
        lin = hid[:, active:] if linear else dummy
        launcher(_channel_idle_ffn_out_kernel, _wrap)[_grid(m, c_out)](
            hid, w_out, lin, b_out_c if b_out_c is not None else dummy, res2 if res2 is not None else dummy, out,
            m, c_out, active, m_bucket,
            hid.stride(0), hid.stride(1), w_out.stride(0), w_out.stride(1),
            lin.stride(0), lin.stride(1),
            res2.stride(0) if res2 is not None else 0, res2.stride(1) if res2 is not None else 0,
            out.stride(0), out.stride(1),
            HAS_LINEAR=bool(linear), HAS_BIAS=b_out_c is not None, HAS_RES=res2 is not None,
            INPUT_PRECISION=precision, INTERPRET_BF16=interpret_bf16,
        )
    return out.reshape(lead + (c_out,))
