"""`torch.ops.vitfast.vit_block`: the fused ViT block (`vitfast.nn.FusedBlock` with its default attention) as one call.

LN → qkv → attention → proj + x → [LN] → channel-idle FFN [+ shortcut].  On CPU one dispatch instead of six
(csrc/ops/vit_block.cpp), the same kernels and bits as the op-by-op path; on CUDA the composition of the per-op
CUDA impls: each op is one or two launches either way, so merging saves no launch.
"""
from __future__ import annotations

import math
import numbers

import torch

from .. import reference
from .._env import get_backend
from . import _autograd
from ._check import check_float_dtype, check_like_x, check_num_heads, check_shape, check_tensor, fmt_shape
from ._spec import call_reference, define_op
from .attention import attention
from .channel_idle_ffn import channel_idle_ffn, channel_idle_ffn_cuda_unchecked, check_channel_idle_ffn_args
from .layer_norm import layer_norm
from .linear import linear


def check_vit_block_args(x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out,
                         b_out, ffn_residual, *, any_float: bool = False) -> tuple[int, int]:
    """Validate `vit_block` arguments (the fused ViT block as one op); return (H, D).

    x [B, N, C] float32 (float16 / bfloat16 too with `any_float`: the CUDA eager block, `vit_block_cuda_eager`);
    w_qkv [3·H·D, C], b_qkv [3·H·D];  w_proj [C, H·D], b_proj [C];  the FFN's tensors as for `channel_idle_ffn`
    with C_in = C_out = C.  norm1_eps (and ffn_norm_eps unless None): finite, >= 0.
    """
    check_tensor("x", x)
    if x.dim() != 3:
        raise ValueError(f"x: expected 3-D [B, N, C], got shape {fmt_shape(x)}")
    if any_float:
        check_float_dtype("x", x)
    elif x.dtype != torch.float32:
        raise ValueError(f"x: expected dtype torch.float32 (the block op runs in fp32), got {x.dtype}")
    c = x.shape[-1]
    for name, eps in (("norm1_eps", norm1_eps), ("ffn_norm_eps", ffn_norm_eps)):
        if eps is None and name == "ffn_norm_eps":
            continue
        # numbers.Real, not (int, float): the C++ schema's float takes a numpy float32 too (it is not a float subclass);
        # a numpy bool is no numbers.Real, a Python bool is one (hence its own test)
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not (math.isfinite(eps) and eps >= 0):
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
    if not isinstance(ffn_residual, (bool, int)):  # (the op schema's bool takes an int as its truth value)
        raise ValueError(f"ffn_residual: expected a bool, got {ffn_residual!r}")
    _, _, c_out = check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, None)
    if c_out != c:
        raise ValueError(f"w_out: expected shape [{c}, A] (C = x.shape[-1] = {c}: the block keeps its width), "
                         f"got {fmt_shape(w_out)}")
    return heads, attn_dim // heads


def _vit_block_fake(*args):
    check_vit_block_args(*args)
    return args[0].new_empty(args[0].shape)


def _vit_block_composed(*args):
    """vit_block as its six ops (each on its own device impl; the same formula as reference.vit_block)."""
    check_vit_block_args(*args)
    vf = torch.ops.vitfast
    return reference.compose_vit_block((vf.layer_norm, vf.linear, vf.attention, vf.channel_idle_ffn), *args)


def vit_block_cuda_eager(*args):
    """A fused block on CUDA at eager inference, for `vitfast.nn.FusedBlock`: the torch calls of the four CUDA impls
    (LayerNorm, qkv, attention, proj + residual, LayerNorm, FFN), so the same kernels and bits as the op-by-op path,
    with one argument check for the block instead of one `torch.ops` dispatch into a Python impl plus one check per
    op.  That host time is what a launch-bound GPU waits on: op by op, a fused DeiT-B forward in bf16 at batch 64
    took 7.96 ms against 4.60 ms of GPU work (its CUDA-graph replay; docs/performance.md).  Callers make sure
    that nothing the op-by-op path does differently is in play (`nn.block.whole_block_args`: no grad, no
    autocast, no tracing, no hooks).  Takes `vit_block`'s arguments."""
    check_vit_block_args(*args, any_float=True)
    fns = (reference.layer_norm_unchecked, reference.linear_unchecked, reference.attention_unchecked,
           channel_idle_ffn_cuda_unchecked)
    return reference.compose_vit_block(fns, *args)


def _vit_block_entry(args):
    if get_backend() == "reference":
        return call_reference("vit_block", args)
    check_tensor("x", args[0])  # before the dispatcher reads its device
    if torch.is_grad_enabled() and _autograd.any_requires_grad(args):
        check_vit_block_args(*args)  # the block's own rules (fp32, its width), not only each op's
        return reference.compose_vit_block((layer_norm, linear, attention, channel_idle_ffn), *args)
    return torch.ops.vitfast.vit_block(*args)


vit_block = define_op(
    "vit_block(Tensor x, float norm1_eps, Tensor w_qkv, Tensor? b_qkv, int num_heads, Tensor w_proj, "
    "Tensor? b_proj, float? ffn_norm_eps, Tensor w_in, Tensor? b_in, Tensor w_out, Tensor? b_out, "
    "bool ffn_residual) -> Tensor",
    fake=_vit_block_fake, cuda=_vit_block_composed, entry=_vit_block_entry,
    doc="`torch.ops.vitfast.vit_block` (the fused ViT block as one op, see reference.vit_block), or the reference\n"
        "    when VITFAST_BACKEND=reference.  When autograd must record the call it runs as its six ops, each with\n"
        "    its reference gradient (a block op's gradient would be that composition's anyway).",
)
