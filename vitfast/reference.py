"""Reference implementations: the ground truth for every `torch.ops.vitfast.*` op.

Same signature as the op; plain PyTorch (autograd works), computed in the input dtype.  Tests compare every
kernel against these, benchmarks use them as the eager baseline, and `VITFAST_BACKEND=reference` routes fused
modules through them.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._validate import check_attention_args, check_channel_idle_ffn_args, check_linear_args
from ._validate import check_xwx_attention_args

__all__ = ["attention", "channel_idle_ffn", "linear", "xwx_attention"]


def channel_idle_ffn(
    x: torch.Tensor,
    w_in: torch.Tensor,
    b_in: Optional[torch.Tensor],
    w_out: torch.Tensor,
    b_out: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Fused RePaViT FFN at inference (RePaViT eq. 6, plus optional bias/residual).

        h = x · w_inᵀ + b_in                 # [..., A + L]: A active columns, then L linear ones
        z = GELU(h[..., :A]) · w_outᵀ        # erf GELU on the active channels only
        z += h[..., A:]                      # the folded idle path  Y·W̃  (only when L = C_out)
        z += b_out;  z += residual           # both optional

    `A = w_out.shape[1]`.  θ = 0 (vanilla FFN) is L = 0 with `b_out` = fc2's bias; θ = 1 is A = 0 (one linear).
    The LayerNorm variant passes its un-foldable shortcut as `residual`.
    """
    active, linear, _ = check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, residual)
    h = F.linear(x, w_in, b_in)
    z = F.linear(F.gelu(h[..., :active]), w_out)
    if linear:
        z = z + h[..., active:]
    if b_out is not None:
        z = z + b_out
    if residual is not None:
        z = z + residual
    return z


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Dense layer with a fused shortcut:  y = x · weightᵀ + bias + residual  (bias, residual optional).

    The fused ViT block runs qkv, proj (residual = the block input: `x + attn(...)`) and the head on it.
    """
    check_linear_args(x, weight, bias, residual)
    y = F.linear(x, weight, bias)
    if residual is not None:
        y = y + residual
    return y


def attention(qkv: torch.Tensor, num_heads: int, scale: Optional[float] = None) -> torch.Tensor:
    """Multi-head self-attention from timm's packed qkv projection output, in the layout proj reads.

        q, k, v = qkv [B, N, 3, H, D] split;  out_h = softmax(q_h k_hᵀ · scale) v_h   (scale default D^-1/2)
        returns [B, N, H·D] with head h in columns [h·D, (h+1)·D)  (= timm Attention before proj)
    """
    heads, head_dim = check_attention_args(qkv, num_heads, scale)
    batch, tokens, _ = qkv.shape
    q, k, v = qkv.reshape(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    out = F.scaled_dot_product_attention(q, k, v, scale=scale)
    return out.transpose(1, 2).reshape(batch, tokens, heads * head_dim)


def xwx_attention(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_k: Optional[torch.Tensor],
    key_bias: Optional[torch.Tensor],
    w_v: torch.Tensor,
    w_o: torch.Tensor,
    b_o: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Collapsed non-deep attention (non-deep ViT eq. 3, 6-7), heads summed through their own output blocks.

        x         [B, N, C]   the (already normalised) tokens
        w_q, w_k  [H, C, R]   score matrices in factored form, W_h = w_q[h] · w_k[h]ᵀ (R = rank, e.g. the branch
                              factors side by side, R = n·d_h); or w_q [H, C, C] = W_h itself with w_k = None
                              (the full X W_h Xᵀ form).  The softmax scale is already folded in.
        key_bias  [H, C]      or None: per-key score bias, s[h, i, j] += x_j · key_bias[h] — what a q-bias
                              becomes (q_i·k_j ∋ b_q·(x_j W_K)); the k-bias term depends on the query only and
                              cancels in the softmax, so it has no argument.
        w_v       [H, C, D]   value map per head (D = value width: d_h, or n·d_h for concatenated branches)
        w_o       [H, D, C']  that head's block of the output projection
        b_o       [C']        or None: output bias (proj bias plus the value biases pushed through w_o, exact
                              because softmax rows sum to 1)
        residual  [B, N, C']  or None: added to the output (the block's shortcut)

        out = residual + b_o + Σ_h softmax_j(x W_h xᵀ + 1 (x key_bias[h])ᵀ) · (x w_v[h]) · w_o[h]

    The softmax runs in float32 whatever the input dtype; everything else in the input dtype.  The op
    `torch.ops.vitfast.xwx_attention` has this signature; its kernels (C++ on CPU, Triton on CUDA) never form the
    [N, N] matrix beyond a tile and never concatenate heads.
    """
    check_xwx_attention_args(x, w_q, w_k, key_bias, w_v, w_o, b_o, residual)
    left = torch.einsum("bnc,hcr->bhnr", x, w_q)
    right = torch.einsum("bnc,hcr->bhnr", x, w_k) if w_k is not None else x.unsqueeze(1)
    scores = left @ right.transpose(-1, -2)  # [B, H, N, N]
    if key_bias is not None:
        scores = scores + torch.einsum("bnc,hc->bhn", x, key_bias).unsqueeze(-2)
    probs = torch.softmax(scores.float(), dim=-1).to(x.dtype)
    heads = probs @ torch.einsum("bnc,hcd->bhnd", x, w_v)  # [B, H, N, D]
    out = torch.einsum("bhnd,hdc->bnc", heads, w_o)  # eq. 3: Σ_h H_h W_O,h, no concatenation
    if b_o is not None:
        out = out + b_o
    if residual is not None:
        out = out + residual
    return out
