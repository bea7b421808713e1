"""`vitfast.reference.vit_block` and its argument check `check_vit_block_args`: The fused ViT block as one function: LN
→ qkv → attention → proj + x → [LN] → channel-idle FFN [+ shortcut]."""
from __future__ import annotations

import torch

from ._check import (
    check_bool,
    check_float_dtype,
    check_like_x,
    check_num_heads,
    check_shape,
    check_tensor,
    fmt_shape,
    is_finite_non_negative,
)
from .attention import attention
from .channel_idle_ffn import channel_idle_ffn, check_channel_idle_ffn_args
from .layer_norm import layer_norm
from .linear import linear


def check_vit_block_args(x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out,
                         b_out, ffn_residual, *, any_float: bool = False) -> tuple[int, int]:
    """Validate `vit_block` arguments (the fused ViT block as one op); return (H, D).

    x [B, N, C] float32 or bfloat16 (float16 too with `any_float`: the CUDA eager block, `vit_block_cuda_eager`);
    w_qkv [3·H·D, C], b_qkv [3·H·D];  w_proj [C, H·D], b_proj [C];  the FFN's tensors as for `channel_idle_ffn`
    with C_in = C_out = C.  norm1_eps (and ffn_norm_eps unless None): finite, >= 0.
    """
    check_tensor("x", x)
    if x.dim() != 3:
        raise ValueError(f"x: expected 3-D [B, N, C], got shape {fmt_shape(x)}")
    if any_float:
        check_float_dtype("x", x)
    elif x.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"x: expected dtype torch.float32 or torch.bfloat16 (the block op's dtypes), got {x.dtype}")
    c = x.shape[-1]
    for name, eps in (("norm1_eps", norm1_eps), ("ffn_norm_eps", ffn_norm_eps)):
        if eps is None and name == "ffn_norm_eps":
            continue
        if not is_finite_non_negative(eps):  # a numpy float32 too, as the C++ schema's float takes it
            raise ValueError(f"{name}: expected a finite number >= 0, got {eps!r}")
    heads = check_num_heads(num_heads)
    check_tensor("w_qkv", w_qkv)
    check_tensor("w_proj", w_proj)
    if w_qkv.dim() != 2 or w_qkv.shape[1] != c:
        raise ValueError(f"w_qkv: expected shape [3·H·D, {c}] (C = x.shape[-1] = {c}), got {fmt_shape(w_qkv)}")
    width = w_qkv.shape[0]
    if width <= 0 or width % 3 or width // 3 % heads:
        raise ValueError(
            f"w_qkv: expected a first dimension a positive multiple of 3·num_heads = {3 * heads}, "
            f"got shape {fmt_shape(w_qkv)}"
        )
    attn_dim = width // 3
    if tuple(w_proj.shape) != (c, attn_dim):
        raise ValueError(f"w_proj: expected shape [{c}, {attn_dim}] ([C, H·D]), got {fmt_shape(w_proj)}")
    check_like_x(x, (("w_qkv", w_qkv), ("b_qkv", b_qkv), ("w_proj", w_proj), ("b_proj", b_proj)))
    check_shape("b_qkv", b_qkv, (width,))
    check_shape("b_proj", b_proj, (c,))
    check_bool("ffn_residual", ffn_residual)
    _, _, c_out = check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, None)
    if c_out != c:
        raise ValueError(f"w_out: expected shape [{c}, A] (C = x.shape[-1] = {c}: the block keeps its width), "
                         f"got {fmt_shape(w_out)}")
    return heads, attn_dim // heads


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
