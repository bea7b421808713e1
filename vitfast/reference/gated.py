"""`vitfast.reference.gated_mhsa` / `gated_ffn` and their argument checks: USDC gated sub-blocks: the MHSA / FFN
sub-block computed only if gate[index] is open, else the stream unchanged."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._check import as_integer, check_bool, check_tokens, describe, fmt_shape, is_finite_non_negative
from .attention import attention
from .batch_gate import check_gate_select_args, gate_select
from .channel_idle_ffn import channel_idle_ffn, check_channel_idle_ffn_args
from .linear import check_linear_args, linear


def _check_block_input(gate, index, x, norm_eps) -> None:
    check_tokens(x)
    check_gate_select_args(gate, index, x, x)
    # The rule of the ungated block's pre-norm (layer_norm's eps, vit_block's norm eps): the CPU impl runs that
    # LayerNorm op, and a gate forced open gives that block's bits.
    if norm_eps is not None and not is_finite_non_negative(norm_eps):
        raise ValueError(f"norm_eps: expected None (no LayerNorm) or a finite number >= 0, got {norm_eps!r}")


def check_gated_mhsa_args(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj) -> int:
    """`gated_mhsa` arguments: gate [G] and index as in `gate_select`; x [B, N, C]; norm_eps None or a finite number
    >= 0; w_qkv [3·H·D, C] (timm's [3, H, D] row layout), b_qkv [3·H·D]; w_proj [C, H·D], b_proj [C].  Returns the
    head dim D."""
    _check_block_input(gate, index, x, norm_eps)
    width = check_linear_args(x, w_qkv, b_qkv, None)
    heads = as_integer(num_heads)
    if heads is None or heads < 1 or width % (3 * heads):
        raise ValueError(f"num_heads: expected an int >= 1 dividing w_qkv.shape[0] / 3 = {width / 3:g}, "
                         f"got {num_heads!r}")
    c, attn_dim = x.shape[-1], width // 3
    if not isinstance(w_proj, torch.Tensor) or tuple(w_proj.shape) != (c, attn_dim):
        raise ValueError(f"w_proj: expected shape [{c}, {attn_dim}] (C, H·D), got {describe(w_proj)}")
    if b_proj is not None and not isinstance(b_proj, torch.Tensor):  # (check_like_x's words)
        raise ValueError(f"b_proj: expected a Tensor or None, got {type(b_proj).__name__}")
    if b_proj is not None and tuple(b_proj.shape) != (c,):
        raise ValueError(f"b_proj: expected shape [{c}], got {fmt_shape(b_proj)}")
    for name, t in (("w_proj", w_proj), ("b_proj", b_proj)):
        if t is not None and (t.dtype != x.dtype or t.device != x.device):
            raise ValueError(f"{name}: expected dtype {x.dtype} on {x.device} (same as x), got {t.dtype} on "
                             f"{t.device}")
    return attn_dim // heads


def check_gated_ffn_args(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual) -> tuple:
    """`gated_ffn` arguments: gate/index as in `gate_select`; x [B, N, C]; the `channel_idle_ffn` weights with
    C_out = C (a skipped sub-block returns x, so the sub-block must keep the width); `residual` a bool;
    norm_eps None or a finite number >= 0.
    Returns (A, L): active (GELU) and linear hidden columns."""
    _check_block_input(gate, index, x, norm_eps)
    check_bool("residual", residual)
    active, linear, c_out = check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, x if residual else None)
    if c_out != x.shape[-1]:
        raise ValueError(f"w_out: expected {x.shape[-1]} output features (C = x.shape[-1]: a skipped sub-block "
                         f"returns x), got {c_out}")
    if active + linear == 0:
        raise ValueError(f"w_in: expected at least one row (active or linear), got shape {fmt_shape(w_in)}")
    return active, linear


def gated_mhsa(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj) -> torch.Tensor:
    """A gated fused MHSA sub-block (USDC eq. 5): the sub-block if gate[index] != 0, else the identity.

        y   = LayerNorm(x) without affine (skipped when norm_eps is None; the affine is folded into w_qkv)
        out = x + attention(y · w_qkvᵀ + b_qkv, num_heads) · w_projᵀ + b_proj     if gate[index] != 0
        out = x                                                                   otherwise

    The oracle computes the sub-block and selects on the device (`gate_select`); the kernels skip it instead.
    """
    check_gated_mhsa_args(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj)
    y = F.layer_norm(x, (x.shape[-1],), eps=norm_eps) if norm_eps is not None else x
    out = linear(attention(linear(y, w_qkv, b_qkv), num_heads), w_proj, b_proj, x)
    return gate_select(gate, index, out, x)


def gated_ffn(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual) -> torch.Tensor:
    """A gated fused FFN sub-block (USDC eq. 5; RePaViT channel-idle layout, θ = 0 is timm's Mlp):

        out = channel_idle_ffn(LN(x) or x, w_in, b_in, w_out, b_out, x if residual else None)   if gate[index] != 0
        out = x                                                                                otherwise
    """
    check_gated_ffn_args(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual)
    y = F.layer_norm(x, (x.shape[-1],), eps=norm_eps) if norm_eps is not None else x
    out = channel_idle_ffn(y, w_in, b_in, w_out, b_out, x if residual else None)
    return gate_select(gate, index, out, x)
