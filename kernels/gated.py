"""Gated Triton kernels: the USDC fused block's sub-blocks on CUDA, skipped on the device.

USDC (usdc-static-dynamic-compression eq. 5) skips a whole MHSA or FFN sub-block when its gate is closed; at
inference the gate is one decision per batch (`batch_gate`, a [2] tensor on the GPU).  Reading it on the host
would synchronise every layer and break CUDA-graph capture, so instead every kernel of a gated sub-block takes a
pointer to the decision, and each program loads that one flag first and returns at once when it is 0:

    MHSA sub-block (`gated_mhsa_triton`, op `vitfast::gated_mhsa`):
        y   = LN(x)                                   gated_layernorm      closed: returns, y never written
        qkv = y · W_qkvᵀ + b_qkv                      gated_linear         closed: returns
        a   = softmax(q_h k_hᵀ / √D) v_h per head     gated_attention      closed: returns
        out = x + a · W_projᵀ + b_proj                gated_linear(skip=x) closed: out = x
    FFN sub-block (`gated_ffn_triton`, op `vitfast::gated_ffn`; RePaViT channel-idle layout, θ = 0 is timm's Mlp):
        y   = LN(x)  (LN variant; none when both BNs were folded)          gated_layernorm
        hid = [GELU(y · W_in[:A]ᵀ + b) | y · W_in[A:]ᵀ + b]               gated_linear(gelu_features=A)
        out = GELU-part · W_outᵀ + hid[:, A:] + b_out (+ x)                gated_linear(add=…, skip=x)  closed: out = x

Only the last kernel of a sub-block does anything when closed: it copies x (a skipped sub-block's residual branch
is the identity), so a closed sub-block costs its launches plus one read and one write of the activation — the
same as `gate_select` — instead of its GEMMs and attention.  The kernels are launched unconditionally, so a CUDA
graph captured with one decision replays correctly with any other.

No autotuning here: the autotuner times candidate configs on the first call for a key, and if that call came
with a closed gate every candidate would "finish" in a few microseconds and the choice would be noise.  Tiles are
chosen by size instead (`_gemm_config`), mirroring the first candidates of kernels/channel_idle_ffn.py.

The GEMM core, tile ordering and the interpreter-only bf16 handling are the channel-idle FFN kernel's
(kernels/_common.py: `matmul_tile`, `tile_ids`, `to_dtype`): accumulation in fp32, one cast at the store.  The
attention is flash style (online softmax in fp32, no [N, N] matrix), reading q/k/v straight from the packed qkv
rows (timm's layout [3, H, D] along the features) and writing [B, N, H·D] in proj's layout, like
`vitfast.reference.attention`.
"""

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from vitfast.kernels._common import (
    INTERPRET as _INTERPRET,
    LOG2E,
    cdiv,
    check_device,
    input_precision,
    matmul_tile,
    next_pow2,
    on_device as _on_device,
    rows,
    split_gelu_epilogue,
    tile_ids,
    to_dtype,
    triton_version,
)
from vitfast.kernels.attention import MAX_HEAD_DIM, attention_tile

from vitfast.reference.batch_gate import check_gate_select_args
from vitfast.reference.gated import check_gated_ffn_args, check_gated_mhsa_args

__all__ = [
    "gated_layernorm_triton",
    "gated_linear_triton",
    "gated_attention_triton",
    "gated_mhsa_triton",
    "gated_ffn_triton",
]



@triton.jit
def _gate_closed(gate_ptr, gate_index):
    """The decision of this sub-block, read on the device: True when it is skipped (gate == 0).  Compared in the
    gate's own dtype, as the reference's `gate != 0`: a float64 gate of 1e-300 is open, though it rounds to 0 in
    fp32."""
    return tl.load(gate_ptr + gate_index) == 0


# ---------------------------------------------------------------------------------------------- LayerNorm
@triton.jit
def _gated_layernorm_kernel(
    gate_ptr, gate_index, x_ptr, w_ptr, b_ptr, out_ptr,
    M, C, stride_xm, stride_om, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """out[rows] = (x − mean) / √(var + eps) (· w + b), statistics in fp32; nothing at all when the gate is closed."""
    if _gate_closed(gate_ptr, gate_index):
        return
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_C)
    col_ok = cols < C
    mask = (rows[:, None] < M) & col_ok[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / C
    centred = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(centred * centred, axis=1) / C
    y = centred * (1.0 / tl.sqrt(var + eps))[:, None]
    if HAS_W:
        y = y * tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        y = y + tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :],
             to_dtype(y, out_ptr.dtype.element_ty, INTERPRET_BF16), mask=mask)


# ---------------------------------------------------------------------------------------------- linear
@triton.jit
def _gated_linear_kernel(
    gate_ptr, gate_index,
    x_ptr, w_ptr, b_ptr, b2_ptr, add_ptr, res_ptr, skip_ptr, out_ptr,
    M, N, K, GELU_N,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_am, stride_an, stride_rm, stride_rn,
    stride_sm, stride_sn, stride_om, stride_on,
    HAS_BIAS: tl.constexpr, HAS_BIAS2: tl.constexpr, HAS_ADD: tl.constexpr, HAS_RES: tl.constexpr,
    HAS_SKIP: tl.constexpr, INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """Open:   out = GELU_{cols < GELU_N}(x · wᵀ + b) + b2 + add + res   (each term optional).
    Closed: out = skip when given (the last kernel of a sub-block), else nothing is read or written."""
    pid_m, pid_n = tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = (rows[:, None] < M) & col_ok[None, :]
    if _gate_closed(gate_ptr, gate_index):
        if HAS_SKIP:
            tile = tl.load(skip_ptr + rows[:, None] * stride_sm + cols[None, :] * stride_sn, mask=mask)
            tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on, tile, mask=mask)
        return
    acc = matmul_tile(
        x_ptr, w_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, pid_m, pid_n,
        INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, BLOCK_N, BLOCK_K,
    )
    # Split GELU (RePaViT) on the first GELU_N columns.
    acc = split_gelu_epilogue(acc, rows, cols, col_ok, mask, pid_n, b_ptr, b2_ptr, add_ptr, res_ptr, GELU_N,
                              stride_am, stride_an, stride_rm, stride_rn,
                              HAS_BIAS, True, HAS_BIAS2, HAS_ADD, HAS_RES, BLOCK_N)
    out = to_dtype(acc, out_ptr.dtype.element_ty, INTERPRET_BF16)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on, out, mask=mask)


# ---------------------------------------------------------------------------------------------- attention
@triton.jit
def _gated_attention_kernel(
    gate_ptr, gate_index, qkv_ptr, out_ptr,
    N, H, D, qk_scale,
    s_qb, s_qn, s_qc, s_ob, s_on, s_oc,
    INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """kernels/attention.py's tile (BLOCK_M query rows of one (image, head), online softmax over key tiles) behind
    the gate: qk_scale = scale·log₂e."""
    if _gate_closed(gate_ptr, gate_index):
        return
    attention_tile(qkv_ptr, out_ptr, N, H, D, qk_scale, s_qb, s_qn, s_qc, s_ob, s_on, s_oc,
                   BLOCK_D, INPUT_PRECISION, INTERPRET_BF16, BLOCK_M, BLOCK_N)


# ---------------------------------------------------------------------------------------------- launchers
def _gemm_config(m: int, n: int):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) by size (no autotune: see the module doc).

    Big problems take channel_idle_ffn's default 128×128×64 tile; batch-1 ViT shapes (M ≈ 197) have few row
    tiles, so smaller tiles give more programs to fill the SMs.  The interpreter gets one GPU-legal mid-size tile.
    """
    if _INTERPRET:
        return 32, 64, 32, 4, 1
    if m * n >= 128 * 128 * 132:  # at least one full wave of 128×128 tiles on a 132-SM GPU
        return 128, 128, 64, 8, 3
    return 64, 64, 64, 4, 4


def _attention_config(head_dim: int):
    """(BLOCK_M, BLOCK_N, BLOCK_D, num_warps): flash-attention tiles; BLOCK_D pads D to a power of two >= 16
    (tl.dot's minimum), and wide heads take narrower key tiles to keep q, k, v and acc on chip."""
    block_d = max(16, next_pow2(int(head_dim)))
    if _INTERPRET:
        return 32, 32, block_d, 4
    if block_d <= 64:
        return 64, 64, block_d, 4
    # triton 3.0/3.1 (torch 2.4/2.5) abort compiling BLOCK_M = 64 with 8 warps for sm_90 in fp16/bf16 ("mma -> mma
    # layout conversion is only supported on Ampere"): 4 warps there (compiles on 3.0, 3.1 and 3.8).
    return 64, 32, block_d, (8 if triton_version() >= (3, 2) else 4)


_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_gate(gate: torch.Tensor, index: int, x: torch.Tensor) -> torch.Tensor:
    """Validates the gate and x (the launches then pass int(index): a numpy integer, valid for the reference, is no
    kernel argument); returns the gate as the kernels read it: `gate_ptr + index`, so contiguous (a
    strided view such as decisions[::2] once had its wrong element read, running or skipping against it)."""
    check_gate_select_args(gate, index, x, x)
    if x.dim() < 1:
        raise ValueError("x: expected at least 1 dimension, got a 0-d tensor")
    if x.dtype not in _KERNEL_DTYPES:
        raise ValueError(f"x: expected dtype float32, float16 or bfloat16, got {x.dtype}")
    return gate.contiguous()


def _out_buffer(out: Optional[torch.Tensor], shape, like: torch.Tensor, name: str = "out") -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    if tuple(out.shape) != tuple(shape) or out.dtype != like.dtype or out.device != like.device:
        raise ValueError(f"{name}: expected a {like.dtype} tensor of shape {list(shape)} on {like.device}, got "
                         f"{out.dtype} {list(out.shape)} on {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {tuple(out.stride())}")
    return out


def gated_layernorm_triton(gate: torch.Tensor, index: int, x: torch.Tensor, eps: float,
                           weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, *,
                           out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """LayerNorm over the last dimension of x if gate[index] != 0; when closed `out` is returned unwritten."""
    gate = _check_gate(gate, index, x)
    check_device(x)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0:
        raise ValueError(f"eps: expected a number > 0, got {eps!r}")
    c = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and (tuple(t.shape) != (c,) or t.dtype != x.dtype or t.device != x.device):
            raise ValueError(f"{name}: expected a {x.dtype} [{c}] tensor on {x.device}, got {t.dtype} "
                             f"{list(t.shape)} on {t.device}")
    x2 = rows(x, c)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    # The kernel reads weight/bias at w_ptr + column: unit stride (a strided view was read at the wrong places).
    weight, bias = (t.contiguous() if t is not None else None for t in (weight, bias))
    out = _out_buffer(out, x.shape, x)
    out2 = rows(out, c)  # a view: _out_buffer's tensors are contiguous
    m = x2.shape[0]
    if m == 0 or c == 0:
        return out
    block_c = next_pow2(c)
    block_m = max(1, min(16, 4096 // block_c))
    dummy = out2
    with _on_device(x):
        _gated_layernorm_kernel[(cdiv(m, block_m),)](
            gate, int(index), x2, weight if weight is not None else dummy, bias if bias is not None else dummy, out2,
            m, c, x2.stride(0), out2.stride(0), float(eps),
            HAS_W=weight is not None, HAS_B=bias is not None, INTERPRET_BF16=_INTERPRET and x.dtype == torch.bfloat16,
            BLOCK_M=block_m, BLOCK_C=block_c, num_warps=4 if block_c <= 1024 else 8,
        )
    return out


def gated_linear_triton(gate: torch.Tensor, index: int, x: torch.Tensor, weight: torch.Tensor,
                        bias: Optional[torch.Tensor] = None, *, gelu_features: int = 0,
                        bias2: Optional[torch.Tensor] = None, add: Optional[torch.Tensor] = None,
                        residual: Optional[torch.Tensor] = None, skip: Optional[torch.Tensor] = None,
                        out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """out = GELU_{first gelu_features columns}(x · weightᵀ + bias) + bias2 + add + residual if gate[index] != 0;
    when closed: out = skip if given (the last kernel of a sub-block), otherwise `out` is returned unwritten.

    x [..., K]; weight [N, K] (nn.Linear layout, any strides); bias, bias2 [N]; add, residual, skip [..., N].
    """
    gate = _check_gate(gate, index, x)
    check_device(x)
    k = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"weight: expected shape [N, {k}] (K = x.shape[-1]), got {list(weight.shape)}")
    n = weight.shape[0]
    if isinstance(gelu_features, bool) or not isinstance(gelu_features, int) or not 0 <= gelu_features <= n:
        raise ValueError(f"gelu_features: expected an int in [0, {n}], got {gelu_features!r}")
    lead = tuple(x.shape[:-1])
    for name, t, shape in (("weight", weight, None), ("bias", bias, (n,)), ("bias2", bias2, (n,)),
                           ("add", add, lead + (n,)), ("residual", residual, lead + (n,)),
                           ("skip", skip, lead + (n,))):
        if t is None:
            continue
        if shape is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
        if t.dtype != x.dtype or t.device != x.device:
            raise ValueError(f"{name}: expected dtype {x.dtype} on {x.device} (like x), got {t.dtype} on {t.device}")
    x2 = rows(x, k)
    m = x2.shape[0]
    out = _out_buffer(out, lead + (n,), x)
    out2 = rows(out, n)
    if m == 0 or n == 0:
        return out
    add2, res2, skip2 = (rows(t, n) if t is not None else None for t in (add, residual, skip))
    bias_c, bias2_c = (t.contiguous() if t is not None else None for t in (bias, bias2))
    block_m, block_n, block_k, warps, stages = _gemm_config(m, n)
    dummy = out2  # stands in for absent optional pointers; never dereferenced (constexpr flags)

    def strides(t):
        return (t.stride(0), t.stride(1)) if t is not None else (0, 0)

    grid = (cdiv(m, block_m) * cdiv(n, block_n),)
    with _on_device(x):
        _gated_linear_kernel[grid](
            gate, int(index), x2, weight, *(t if t is not None else dummy for t in (bias_c, bias2_c, add2, res2, skip2)),
            out2, m, n, k, gelu_features,
            *strides(x2), *strides(weight), *strides(add2), *strides(res2), *strides(skip2), *strides(out2),
            HAS_BIAS=bias_c is not None, HAS_BIAS2=bias2_c is not None, HAS_ADD=add2 is not None,
            HAS_RES=res2 is not None, HAS_SKIP=skip2 is not None,
            INPUT_PRECISION=input_precision(x.dtype), INTERPRET_BF16=_INTERPRET and x.dtype == torch.bfloat16,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, num_warps=warps, num_stages=stages,
        )
    return out


def gated_attention_triton(gate: torch.Tensor, index: int, qkv: torch.Tensor, num_heads: int,
                           scale: Optional[float] = None, *, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`vitfast.reference.attention(qkv, num_heads, scale)` ([B, N, H·D]) if gate[index] != 0; when closed
    `out` is returned unwritten."""
    from vitfast.reference.attention import check_attention_args

    heads, head_dim = check_attention_args(qkv, num_heads, scale)
    gate = _check_gate(gate, index, qkv)
    check_device(qkv)
    batch, tokens, _ = qkv.shape
    out = _out_buffer(out, (batch, tokens, heads * head_dim), qkv)
    if batch == 0 or tokens == 0:
        return out
    if head_dim > MAX_HEAD_DIM:
        # One program keeps q, k, v tiles and acc BLOCK_D wide on chip: wider heads spill or fail to compile.  The
        # reference (SDPA) then runs whatever the gate says, and the gate picks on the device (no host sync): out
        # keeps its contents when closed, as the kernel leaves it.
        from vitfast import reference

        full = reference.attention(qkv, heads, scale)
        return out.copy_(torch.where(gate[int(index)] != 0, full, out))
    qk_scale = (float(scale) if scale is not None else 1.0 / math.sqrt(head_dim)) * LOG2E
    block_m, block_n, block_d, warps = _attention_config(head_dim)
    grid = (batch * heads, cdiv(tokens, block_m))
    with _on_device(qkv):
        _gated_attention_kernel[grid](
            gate, int(index), qkv, out, tokens, heads, head_dim, qk_scale, *qkv.stride(), *out.stride(),
            INPUT_PRECISION=input_precision(qkv.dtype), INTERPRET_BF16=_INTERPRET and qkv.dtype == torch.bfloat16,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, num_warps=warps, num_stages=2,
        )
    return out


# ---------------------------------------------------------------------------------------------- sub-blocks
def gated_mhsa_triton(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj):
    """`vitfast.reference.gated_mhsa` on the gated kernels: x + proj(attention(qkv(LN(x)))) if gate[index] != 0,
    else a copy of x written by proj's kernel; the other three kernels return at once."""
    check_gated_mhsa_args(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj)
    x = x.contiguous()
    y = gated_layernorm_triton(gate, index, x, norm_eps) if norm_eps is not None else x
    qkv = gated_linear_triton(gate, index, y, w_qkv, b_qkv)
    a = gated_attention_triton(gate, index, qkv, num_heads)
    return gated_linear_triton(gate, index, a, w_proj, b_proj, residual=x, skip=x)


def gated_ffn_triton(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual):
    """`vitfast.reference.gated_ffn` on the gated kernels: channel_idle_ffn(LN(x) or x, …, x if residual) if
    gate[index] != 0, else a copy of x written by the last kernel."""
    active, linear = check_gated_ffn_args(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual)
    x = x.contiguous()
    y = gated_layernorm_triton(gate, index, x, norm_eps) if norm_eps is not None else x
    res = x if residual else None
    if active == 0:
        # θ = 1: one linear; b_out and the residual go into its epilogue.
        return gated_linear_triton(gate, index, y, w_in, b_in, bias2=b_out, residual=res, skip=x)
    hid = gated_linear_triton(gate, index, y, w_in, b_in, gelu_features=active)
    return gated_linear_triton(gate, index, hid[..., :active], w_out, b_out,
                               add=hid[..., active:] if linear else None, residual=res, skip=x)
