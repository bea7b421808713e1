"""The fused ViT block (`vitfast.reference.vit_block`) on the LayerNorm-folded GEMM (kernels/ln_linear.py): five
launches per block, no normalised or permuted copy of any activation.

    (a) qkv  = LN(x)·W_qkvᵀ + b_qkv           ln_linear, μ/rstd from x's RowStats; writes [B, N, 3·H·D], which is
                                              already the packed (B, N, 3, H, D) layout attention reads
    (b) o    = attention(qkv)                 kernels/attention.py: reads the packed qkv, writes [B, N, H·D]
                                              (attention="sdpa": torch's SDPA on strided views of qkv instead)
    (c) x1   = o·W_projᵀ + b_proj + x         ln_linear residual epilogue, emitting x1's RowStats (LN variant)
    (d) hid  = [GELU(h[:, :A]) | h[:, A:]],   h = LN(x1)·W_inᵀ + b_in   (split-GELU epilogue)
    (e) out  = GELU(h_A)·W_outᵀ + h_L + b_out [+ x1]                    emitting out's RowStats for the next block

Few rows (batch 1): each GEMM may split K across programs (kernels/ln_linear.py, `split_k_factor`); the slices are
reduced inside the same launch, so the launch count does not change.

The first block of a model has no producer for x's statistics: one `row_stats` launch more.  θ = 1 (A = 0) is one
linear: (d) takes b_out and the shortcut in its epilogue and (e) is not launched.

Attention (b) is vitfast's own Triton kernel by default: one launch, where SDPA's cuDNN backend (the faster of
SDPA's two on an H200 at DeiT-S shapes) launches a memset before its kernel and made the block six launches.
`attention="sdpa"` keeps SDPA for A/B timing (benchmarks/gpu_profile_blocks.py, section `sdpa`; which one is faster
is unmeasured).  There q, k and v are views of qkv with strides (3·H·D·N, D, 3·H·D, 1) — the last dimension
contiguous, which is what SDPA's flash and cuDNN backends require, so no copy is made for them; SDPA's output is
[B, H, N, D] in flash's [B, N, H, D] memory order, so `transpose(1, 2).reshape(B, N, H·D)` is a view there (the math
backend of the CPU interpreter tests returns [B, H, N, D] contiguous, and that reshape copies).  The launch counter
counts SDPA as one launch: on a GPU `benchmarks/gpu_check_blocks.sh` counts the real kernels with the profiler.

Precision: fp32 (ieee, or TF32 when torch allows it for matmuls: `kernels._common.input_precision`), fp16, bf16,
with fp32 accumulation and one rounding per GEMM output (the composition rounds after every op).  Speed: slower than
inductor on the same fused graph where measured (H100, bf16: 0.70–0.92× replayed from a CUDA graph, 0.29–0.47×
eagerly; table `gpu_blocks` in benchmarks/results/2026-11-28-nvidia-h100-80gb-hbm3.json; H200, DeiT-S batch 256:
7.23 ms of kernels against 6.09, 2026-11-30-nvidia-h200.json), and six kernels per block there, not five (cuDNN's
SDPA launched a memset; measured before the Triton attention kernel).  On the H200 with autotuning on its logits
were 7–12% off fp32 (one autotune candidate is wrong natively; the first one, which the parity tests run, is not),
so `VITFAST_CUDA_KERNELS=blocks` only opts in (vitfast/ops/vit_block.py) and the default path is unchanged.
benchmarks/gpu_profile_blocks.py diagnoses where the time goes.
"""
from __future__ import annotations

import torch.nn.functional as F

from vitfast.kernels._common import check_device
from vitfast.kernels.attention import attention_triton
from vitfast.kernels.ln_linear import RowStats, count_launch, ln_linear_triton

__all__ = ["ATTENTION", "vit_block_triton"]

# The block path's attention: "triton" (kernels/attention.py, one launch) or "sdpa" (torch's SDPA).
ATTENTION = ("triton", "sdpa")


def vit_block_triton(x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out, b_out,
                     ffn_residual, *, stats: RowStats | None = None, norm: str = "auto", attention: str = "triton",
                     _wrap=None):
    """`vit_block`'s arguments (already checked: `check_vit_block_args`) → (out, RowStats of out).

    `stats`: x's row statistics when the previous block emitted them (else computed: one launch more).  `norm`:
    the LayerNorm GEMMs' mode (kernels/ln_linear.py: "auto", "explicit", "fold").  `attention`: "triton" or "sdpa"
    (module docstring).  `_wrap`: the registered op's launch wrapper (vitfast/ops/triton_ops.py)."""
    if attention not in ATTENTION:
        raise ValueError(f"attention: expected one of {', '.join(map(repr, ATTENTION))}, got {attention!r}")
    check_device(x)
    batch, tokens, _ = x.shape
    attn_dim = w_proj.shape[1]
    head_dim = attn_dim // num_heads
    # (a) qkv, LN folded in.
    qkv = ln_linear_triton(x, w_qkv, b_qkv, eps=norm1_eps, stats=stats, norm=norm, _wrap=_wrap)
    # (b) attention reading the packed qkv.
    count_launch()
    if attention == "triton":
        o = attention_triton(qkv, num_heads, _wrap=_wrap)
    else:
        q, k, v = qkv.view(batch, tokens, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, tokens, attn_dim)
    # (c) proj + bias + shortcut; x1's statistics only when the FFN normalises x1.
    has_ffn_norm = ffn_norm_eps is not None
    x1 = ln_linear_triton(o, w_proj, b_proj, residual=x, emit_stats=has_ffn_norm, _wrap=_wrap)
    x1, stats1 = x1 if has_ffn_norm else (x1, None)
    shortcut = x1 if ffn_residual else None
    active = w_out.shape[1]
    if active == 0:
        # θ = 1: the FFN is one linear; b_out and the shortcut ride in its epilogue.
        return ln_linear_triton(x1, w_in, b_in, eps=ffn_norm_eps, stats=stats1, bias2=b_out, residual=shortcut,
                                emit_stats=True, norm=norm, _wrap=_wrap)
    # (d) fc1 with the split-GELU epilogue, hid in x's dtype (what fc2's tensor-core dot reads).
    hid = ln_linear_triton(x1, w_in, b_in, eps=ffn_norm_eps, stats=stats1, gelu_cols=active, norm=norm, _wrap=_wrap)
    # (e) fc2 over the active columns, + the linear path (the idle columns of hid), b_out, shortcut.
    linear = hid[..., active:] if w_in.shape[0] > active else None
    return ln_linear_triton(hid[..., :active], w_out, b_out, add=linear, residual=shortcut, emit_stats=True,
                            _wrap=_wrap)

