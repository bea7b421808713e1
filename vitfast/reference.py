"""Reference implementations: the ground truth for every `torch.ops.vitfast.*` op.

Same signature as the op; plain PyTorch (autograd works), computed in the input dtype.  Tests compare every
kernel against these, benchmarks use them as the eager baseline, and `VITFAST_BACKEND=reference` routes fused
modules through them.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .ops.attention import check_attention_args
from .ops.batch_gate import check_batch_gate_args, check_gate_select_args
from .ops.channel_idle_ffn import check_channel_idle_ffn_args
from .ops.dwconv_attention import check_dwconv_attention_args
from .ops.gated import check_gated_ffn_args, check_gated_mhsa_args
from .ops.layer_norm import check_layer_norm_args
from .ops.linear import check_linear_args
from .ops.vit_block import check_vit_block_args
from .ops.xwx_attention import check_xwx_attention_args

__all__ = ["attention", "channel_idle_ffn", "layer_norm", "linear", "vit_block", "xwx_attention", "batch_gate",
           "batch_gate_logits", "gate_select"]


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
    check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, residual)
    return channel_idle_ffn_unchecked(x, w_in, b_in, w_out, b_out, residual)


# The formulas without their argument checks: what the checked functions here run, and what a caller that has
# validated the arguments already runs (vitfast.ops.vit_block_cuda_eager checks a whole block once, then runs these).
def channel_idle_ffn_unchecked(x, w_in, b_in, w_out, b_out=None, residual=None):
    active = w_out.shape[1]
    h = F.linear(x, w_in, b_in)
    z = F.linear(F.gelu(h[..., :active]), w_out)
    if w_in.shape[0] > active:
        z = z + h[..., active:]
    if b_out is not None:
        z = z + b_out
    if residual is not None:
        z = z + residual
    return z


def linear_unchecked(x, weight, bias=None, residual=None):
    y = F.linear(x, weight, bias)
    if residual is not None:
        y = y + residual
    return y


def layer_norm_unchecked(x, weight=None, bias=None, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def attention_unchecked(qkv, num_heads, scale=None):
    batch, tokens, width = qkv.shape
    head_dim = width // (3 * num_heads)
    q, k, v = qkv.reshape(batch, tokens, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    out = F.scaled_dot_product_attention(q, k, v, scale=scale)
    return out.transpose(1, 2).reshape(batch, tokens, num_heads * head_dim)


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
    return linear_unchecked(x, weight, bias, residual)


def layer_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, eps: float = 1e-5
) -> torch.Tensor:
    """LayerNorm over the last dimension (the fused blocks' pre-norms, usually without an affine: it is folded
    into the next linear layer):  y = (x − mean) / √(var + eps) · weight + bias  (= F.layer_norm)."""
    check_layer_norm_args(x, weight, bias, eps)
    return layer_norm_unchecked(x, weight, bias, eps)


def attention(qkv: torch.Tensor, num_heads: int, scale: Optional[float] = None) -> torch.Tensor:
    """Multi-head self-attention from timm's packed qkv projection output, in the layout proj reads.

        q, k, v = qkv [B, N, 3, H, D] split;  out_h = softmax(q_h k_hᵀ · scale) v_h   (scale default D^-1/2)
        returns [B, N, H·D] with head h in columns [h·D, (h+1)·D)  (= timm Attention before proj)
    """
    heads, _ = check_attention_args(qkv, num_heads, scale)
    return attention_unchecked(qkv, heads, scale)


def vit_block(x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out, b_out,
              ffn_residual) -> torch.Tensor:
    """The fused ViT block (`vitfast.nn.FusedBlock` with its default attention) as one function:

        x1  = x + linear(attention(linear(LN(x), w_qkv, b_qkv), num_heads), w_proj, b_proj)   LN non-affine
        out = channel_idle_ffn(LN(x1) if ffn_norm_eps is not None else x1, w_in, b_in, w_out, b_out,
                               residual = x1 if ffn_residual else None)
    """
    args = (x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out, b_out,
            ffn_residual)
    check_vit_block_args(*args)
    return compose_vit_block((layer_norm, linear, attention, channel_idle_ffn), *args)


def compose_vit_block(fns, x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out,
                      b_out, ffn_residual):
    """`vit_block`'s formula on the given (layer_norm, linear, attention, channel_idle_ffn) functions: the
    reference's, the ops' (`vitfast.ops`, with autograd) or the dispatcher's (`torch.ops.vitfast`, on CUDA)."""
    layer_norm_fn, linear_fn, attention_fn, channel_idle_ffn_fn = fns
    qkv = linear_fn(layer_norm_fn(x, None, None, norm1_eps), w_qkv, b_qkv)
    x1 = linear_fn(attention_fn(qkv, num_heads), w_proj, b_proj, x)
    y = layer_norm_fn(x1, None, None, ffn_norm_eps) if ffn_norm_eps is not None else x1
    return channel_idle_ffn_fn(y, w_in, b_in, w_out, b_out, x1 if ffn_residual else None)


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


# ---------------------------------------------------------------------------------------------- dwconv_attention
__all__ += ["dwconv_attention"]


def dwconv_attention(
    x: torch.Tensor,
    w_v: torch.Tensor,
    b_v: Optional[torch.Tensor],
    kernel: torch.Tensor,
    w_o: torch.Tensor,
    b_o: Optional[torch.Tensor],
    grid_h: int,
    grid_w: int,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Drop-in depthwise-convolution heads (dropin-depthwise-conv-attention eq. 11, 13), output projection fused.

        x         [B, N, C]     tokens: P = N − grid_h·grid_w prefix tokens (cls, registers) first, then the
                                grid_h × grid_w patch grid in row-major order (timm's layout)
        w_v, b_v  [D, C], [D]   value projection of the replaced heads (their rows of W^V, heads side by side:
                                D = heads·d_h; the ensembled form of eq. 12-13 is one head, D = d_h)
        kernel    [D, k, k]     one k×k filter per value channel (eq. 11's K^h, k odd)
        w_o, b_o  [C_out, D]    those heads' columns of the output projection W^O (and a bias, optional)
        residual  [B, N, C_out] added to the output (the block's shortcut), optional

        V = x · w_vᵀ + b_v;   U_grid = Conv_DW(V_grid, kernel)   ("same" size, zero padding, eq. 6)
        U_prefix = mean over the grid tokens of V                (vitfast's rule for kept prefix tokens)
        out = U · w_oᵀ + b_o + residual

    Prefix tokens have no grid position, so eq. 8 gives them no neighbourhood.  vitfast gives a kept cls/register
    token the average of the head's values over the patch grid: the input-independent attention map that is
    uniform over the patches (what an input-invariant head, Σ_h = 0, can do for a token without position), at
    O(D) cost.  The paper itself removes the cls token (appendix A.3.2; `vitfast.convert` supports both).
    """
    prefix, width, ksize, _ = check_dwconv_attention_args(x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual)
    batch = x.shape[0]
    v = F.linear(x, w_v, b_v)  # [B, N, D]
    if width:
        grid = v[:, prefix:].transpose(1, 2).reshape(batch, width, grid_h, grid_w)
        u = F.conv2d(grid, kernel.unsqueeze(1), padding=ksize // 2, groups=width)  # cross-correlation = eq. 6
        u = u.flatten(2).transpose(1, 2)  # [B, HW, D]
    else:  # no replaced channel (conv2d refuses 0 groups): nothing to convolve
        u = v[:, prefix:]
    if prefix:
        u = torch.cat([v[:, prefix:].mean(dim=1, keepdim=True).expand(batch, prefix, width), u], dim=1)
    return linear(u, w_o, b_o, residual)

# ---------------------------------------------------------------------------------------------- USDC gates
def batch_gate_logits(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: Optional[torch.Tensor],
    w2: Optional[torch.Tensor] = None,
    b2: Optional[torch.Tensor] = None,
    layer_norm: bool = False,
    act: str = "none",
    eps: float = 1e-5,
) -> torch.Tensor:
    """The two gate logits d = (execute − skip) of a batch, in float32 ([2]); `batch_gate` thresholds them."""
    check_batch_gate_args(x, w1, b1, w2, b2, layer_norm, act, eps)
    # Token mean-pool then batch mean (USDC batch-level gate): every sample has N tokens, so this is the mean of
    # all B·N token vectors.  float32 whatever the input dtype: the result is thresholded, keep it stable.
    feature = x.float().mean(dim=(0, 1))
    h = F.linear(feature, w1.float(), None if b1 is None else b1.float())
    if layer_norm:
        h = F.layer_norm(h, (h.shape[-1],), eps=float(eps))
    if act == "relu":
        h = F.relu(h)
    elif act == "gelu":
        h = F.gelu(h)
    if w2 is not None:
        h = F.linear(h, w2.float(), None if b2 is None else b2.float())
    return h


def batch_gate(x, w1, b1, w2=None, b2=None, layer_norm=False, act="none", eps=1e-5) -> torch.Tensor:
    """USDC batch-level gate decision (USDC eq. 5 at inference): one decision per batch for [MHSA, FFN].

        f = mean over the B·N tokens of x [B, N, C]        (token mean-pool, then batch mean)
        h = f · w1ᵀ + b1                                    [H]
        h = act(LayerNorm(h))                               (non-affine LN if layer_norm; act ∈ none/relu/gelu)
        d = h · w2ᵀ + b2                                    [2]  (skipped when w2 is None: then H = 2, d = h)
        out = (d > 0) as x.dtype                            1 = execute the sub-block, 0 = skip it

    The gate network is given in its folded form (`vitfast.nn.gates`): an eval BatchNorm folded into the layer
    before it, a LayerNorm's affine into the layer after it, the two softmax logits (execute, skip) of each gate
    subtracted into one row, so that argmax of a hard Gumbel-softmax without noise is `d > 0`.
    """
    return (batch_gate_logits(x, w1, b1, w2, b2, layer_norm, act, eps) > 0).to(x.dtype)


def gate_select(gate: torch.Tensor, index: int, taken: torch.Tensor, skipped: torch.Tensor) -> torch.Tensor:
    """`taken` where gate[index] != 0 else `skipped` — read on the device, never synchronised to the host."""
    check_gate_select_args(gate, index, taken, skipped)
    return torch.where(gate[index] != 0, taken, skipped)


__all__ += ["gated_mhsa", "gated_ffn"]


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
