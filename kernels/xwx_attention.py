"""Triton kernel for `xwx_attention` (collapsed non-deep attention, non-deep ViT eq. 3, 6-7), flash style.

    out = residual + b_o + Σ_h softmax_j(x W_h xᵀ + 1 (x key_bias[h])ᵀ) · (x w_v[h]) · w_o[h]

The launcher runs the four token projections as batched GEMMs (cuBLAS): L_h = x w_q[h] [N, R], R_h = x w_k[h]
(factored form) or x itself (full form, W_h = w_q[h], R = C), V_h = x w_v[h] [N, D] and the per-key bias
kb_h = x key_bias[h] [N].  One program then owns a tile of BLOCK_M query rows of one image and, for every head:

    streams key tiles of BLOCK_N:  s = L_h[rows] R_h[keys]ᵀ + kb_h[keys]   (R in chunks of BLOCK_R)
                                   online softmax (running max m, running sum l, fp32)
                                   acc = acc · e^(m_old − m) + p V_h[keys]
    then pushes acc / l through that head's block of the output projection, BLOCK_C output columns at a time:
                                   out[rows, cols] += (acc / l) w_o[h][:, cols]

So no [N, N] matrix exists beyond a BLOCK_M × BLOCK_N tile, and the heads are never concatenated: each head's
[BLOCK_M, D] result goes through its own w_o block straight into the output rows, which the program owns
exclusively (no atomics: the sum over heads is deterministic).  The output tile is first set to b_o + residual,
so the kernel is idempotent (autotuning may launch it several times).  The running output is kept in fp32 (a
scratch buffer when x is fp16/bf16, cast once at the end).

Why the projections stay outside: they are ordinary dense GEMMs over all N tokens (every query tile needs every
key's R_h and V_h), best done once by cuBLAS; recomputing them per query tile would multiply their FLOPs by
N / BLOCK_M.
"""
import torch
import triton
import triton.language as tl
from vitfast.kernels._common import (
    INTERPRET as _INTERPRET,
    LOG2E_JIT,
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

from vitfast.reference.xwx_attention import check_xwx_attention_args

__all__ = ["xwx_attention_triton"]



def candidates() -> list:
    """Every autotune candidate, whatever VITFAST_TRITON_AUTOTUNE says (the every-candidate parity test runs each
    through `forced_config`).  The first is the one used with VITFAST_TRITON_AUTOTUNE=0 (kernels/_common.py)."""
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_C": bc}, num_warps=w, num_stages=s)
        for bm, bn, bc, w, s in (
            (64, 64, 64, 4, 2),
            (64, 32, 64, 4, 2),
            (32, 64, 64, 4, 2),
            (128, 64, 64, 8, 2),
            (64, 64, 128, 4, 1),
            # Batch-1 ViTs have only ceil(197 / BLOCK_M) query tiles per image: small tiles fill more SMs.
            (16, 64, 64, 4, 2),
            (32, 32, 64, 4, 2),
        )
    ]


def _configs():
    # The interpreter runs one numpy op per Triton op per program: few, big tiles keep CI fast.
    interpreter = triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_C": 64}, num_warps=4)
    return tuned_configs(candidates(), interpreter)


@autotune(_configs(), ["N_BUCKET", "R", "D", "C_OUT"])
@triton.jit
def _xwx_attention_kernel(
    l_ptr, r_ptr, kb_ptr, v_ptr, wo_ptr, bo_ptr, res_ptr, out_ptr,
    N, H, R, D, C_OUT, N_BUCKET,
    s_lb, s_lh, s_ln, s_lr,
    s_rb, s_rh, s_rn, s_rr,
    s_kbb, s_kbn, s_kbh,
    s_vb, s_vh, s_vn, s_vd,
    s_woh, s_wod, s_woc,
    s_resb, s_resn, s_resc,
    s_ob, s_on, s_oc,
    HAS_KB: tl.constexpr, HAS_BO: tl.constexpr, HAS_RES: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)  # axis 0 (limit 2³¹ − 1; axis 1's is 65535); int64 before stride products
    pid_m = tl.program_id(1).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < N
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, BLOCK_C)
    d_ok = offs_d < D

    # out[rows] = b_o + residual: the heads then accumulate onto it.
    for c0 in range(0, C_OUT, BLOCK_C):
        cols = c0 + offs_c
        mask = row_ok[:, None] & (cols[None, :] < C_OUT)
        init = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
        if HAS_BO:
            init += tl.load(bo_ptr + cols, mask=cols < C_OUT, other=0.0).to(tl.float32)[None, :]
        if HAS_RES:
            init += tl.load(res_ptr + b * s_resb + rows[:, None] * s_resn + cols[None, :] * s_resc,
                            mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + b * s_ob + rows[:, None] * s_on + cols[None, :] * s_oc, init, mask=mask)

    for h in range(0, H):
        l_base = l_ptr + b * s_lb + h * s_lh
        r_base = r_ptr + b * s_rb + h * s_rh
        v_base = v_ptr + b * s_vb + h * s_vh
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        for n0 in range(0, N, BLOCK_N):
            keys = n0 + offs_n
            key_ok = keys < N
            s = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for r0 in range(0, R, BLOCK_R):
                rr = r0 + offs_r
                r_ok = rr < R
                lq = tl.load(l_base + rows[:, None] * s_ln + rr[None, :] * s_lr,
                             mask=row_ok[:, None] & r_ok[None, :], other=0.0)
                rk = tl.load(r_base + rr[:, None] * s_rr + keys[None, :] * s_rn,
                             mask=r_ok[:, None] & key_ok[None, :], other=0.0)
                s = tl.dot(operand(lq, INTERPRET_BF16), operand(rk, INTERPRET_BF16), s,
                           input_precision=INPUT_PRECISION)
            if HAS_KB:
                s += tl.load(kb_ptr + b * s_kbb + keys * s_kbn + h * s_kbh, mask=key_ok, other=0.0).to(tl.float32)[None, :]
            # Base-2 scores for the shared online-softmax step (kernels/_common.py).
            p, alpha, m_i, l_i = online_softmax_step(tl.where(key_ok[None, :], s * LOG2E_JIT, float("-inf")), m_i, l_i)
            v = tl.load(v_base + keys[:, None] * s_vn + offs_d[None, :] * s_vd,
                        mask=key_ok[:, None] & d_ok[None, :], other=0.0)
            pv = to_dtype(p, v_ptr.dtype.element_ty, INTERPRET_BF16)
            acc = tl.dot(operand(pv, INTERPRET_BF16), operand(v, INTERPRET_BF16), acc * alpha[:, None],
                         input_precision=INPUT_PRECISION)
        # Rows past N are never stored (divided by 1); a real row whose every score is -inf has l = 0 and gets
        # 0/0 = NaN, as softmax gives in the reference.
        head = acc / tl.where(row_ok, l_i, 1.0)[:, None]
        head = operand(to_dtype(head, wo_ptr.dtype.element_ty, INTERPRET_BF16), INTERPRET_BF16)
        for c0 in range(0, C_OUT, BLOCK_C):
            cols = c0 + offs_c
            c_ok = cols < C_OUT
            wo = tl.load(wo_ptr + h * s_woh + offs_d[:, None] * s_wod + cols[None, :] * s_woc,
                         mask=d_ok[:, None] & c_ok[None, :], other=0.0)
            o_ptrs = out_ptr + b * s_ob + rows[:, None] * s_on + cols[None, :] * s_oc
            mask = row_ok[:, None] & c_ok[None, :]
            partial = tl.load(o_ptrs, mask=mask, other=0.0)
            partial = tl.dot(head, operand(wo, INTERPRET_BF16), partial, input_precision=INPUT_PRECISION)
            tl.store(o_ptrs, partial, mask=mask)


# Widest value slice one program keeps in its accumulator (BLOCK_M × BLOCK_D fp32 in registers; an uncapped
# power of two of a wide D spills or fails to compile).  A wider D runs as one launch per slice, each onto the
# last one's output: exact, because the output is linear in V (Σ_h P_h V_h W_o,h = Σ_slices Σ_h P_h V_h[:, s]
# W_o,h[s, :]); every slice recomputes the scores, which only heads wider than 128 pay (ViT heads are 64).
_MAX_BLOCK_D = 128


def _dot_width(n: int) -> int:
    # tl.dot needs every tile dimension >= 16 and a power of two.
    return max(16, next_pow2(int(n)))


def xwx_attention_triton(x, w_q, w_k, key_bias, w_v, w_o, b_o=None, residual=None, *, _wrap=None) -> torch.Tensor:
    """`vitfast.reference.xwx_attention` on the Triton kernel (CUDA tensors, or CPU under the interpreter).
    `_wrap`: a launch wrapper (`forced_config`, or a registered op's `wrap_triton`)."""
    heads, rank, value_dim, c_out = check_xwx_attention_args(x, w_q, w_k, key_bias, w_v, w_o, b_o, residual)
    check_device(x)
    batch, tokens, _ = x.shape
    if batch == 0 or tokens == 0 or c_out == 0:
        return x.new_zeros((batch, tokens, c_out)) + (residual if residual is not None else 0) + (
            b_o if b_o is not None else 0)
    xh = x.unsqueeze(1)  # [B, 1, N, C]: one batched GEMM per projection, heads broadcast over the weights
    left = torch.matmul(xh, w_q)  # [B, H, N, R]
    right = torch.matmul(xh, w_k) if w_k is not None else xh.expand(batch, heads, tokens, rank)  # full: R = x
    values = torch.matmul(xh, w_v)  # [B, H, N, D]
    kb = torch.matmul(x, key_bias.t()) if key_bias is not None else None  # [B, N, H]
    out32 = torch.empty((batch, tokens, c_out), dtype=torch.float32, device=x.device)
    dummy = out32  # stands in for absent optional pointers; never dereferenced (constexpr flags)
    b_o_c = b_o.contiguous() if b_o is not None else None
    interpret_bf16 = _INTERPRET and x.dtype == torch.bfloat16
    n_bucket = next_pow2(tokens)

    def strides(t, n):
        return tuple(t.stride()) if t is not None else (0,) * n

    grid = lambda meta: (batch, cdiv(tokens, meta["BLOCK_M"]))  # noqa: E731

    def launch(v, w_o_slice, bias, res, out):
        # `out` = bias + res + the heads through v and w_o_slice; `res` is never `out` (autotuning reruns it).
        launcher(_xwx_attention_kernel, _wrap)[grid](
            left, right, kb if kb is not None else dummy, v, w_o_slice,
            bias if bias is not None else dummy, res if res is not None else dummy, out,
            tokens, heads, rank, v.shape[-1], c_out, n_bucket,
            *left.stride(), *right.stride(), *strides(kb, 3), *v.stride(), *w_o_slice.stride(),
            *strides(res, 3), *out.stride(),
            HAS_KB=kb is not None, HAS_BO=bias is not None, HAS_RES=res is not None,
            INPUT_PRECISION=input_precision(x.dtype), INTERPRET_BF16=interpret_bf16,
            BLOCK_R=min(64, _dot_width(rank)), BLOCK_D=_dot_width(v.shape[-1]),
        )

    with on_device(x):
        launch(values[..., :_MAX_BLOCK_D], w_o[:, :_MAX_BLOCK_D], b_o_c, residual, out32)
        spare = None
        for d0 in range(_MAX_BLOCK_D, value_dim, _MAX_BLOCK_D):
            spare = torch.empty_like(out32) if spare is None else spare
            d1 = min(value_dim, d0 + _MAX_BLOCK_D)
            launch(values[..., d0:d1], w_o[:, d0:d1], None, out32, spare)
            out32, spare = spare, out32
    return out32 if x.dtype == torch.float32 else out32.to(x.dtype)
