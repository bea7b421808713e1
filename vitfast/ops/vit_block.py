"""`torch.ops.vitfast.vit_block`: the fused ViT block (`vitfast.nn.FusedBlock` with its default attention) as one call.

LN → qkv → attention → proj + x → [LN] → channel-idle FFN [+ shortcut].  On CPU one dispatch instead of six
(csrc/ops/vit_block.cpp), the same kernels and bits as the op-by-op path; on CUDA the composition of the per-op
CUDA impls: each op is one or two launches either way, so merging saves no launch.

With VITFAST_CUDA_KERNELS=blocks, CUDA blocks run instead on the Triton block path (kernels/vit_block.py): five
launches, the LayerNorms folded into the GEMMs after them, their statistics emitted by the residual epilogue before
them, so a block hands the next one its output's statistics (`_vit_block_triton_chained`).  Opt-in: where
measured (H100, bf16) it is slower than inductor on the same fused graph (kernels/vit_block.py).
"""
from __future__ import annotations

import weakref

import torch

from .. import reference
from .._env import get_cuda_kernels
from ..reference._check import check_tensor
from ..reference.vit_block import check_vit_block_args
from . import _autograd
from ._policy import use_triton_blocks
from ._spec import call_reference, define_op, use_reference
from .attention import attention, attention_cuda_unchecked
from .channel_idle_ffn import channel_idle_ffn, channel_idle_ffn_cuda_unchecked
from .layer_norm import layer_norm
from .linear import linear


def _vit_block_fake(*args):
    check_vit_block_args(*args)
    return args[0].new_empty(args[0].shape)


# The last Triton block's output (weakly) with its version and row statistics: the next block reads them when its
# input is that very tensor, unmodified (nn.Sequential passes each block's output straight on), instead of launching
# the statistics kernel again.  Any other input, or one written to in place since, gets fresh statistics.  Inference
# tensors (torch.inference_mode) have no version counter, so an in-place write could not be seen: they are never
# chained (one statistics launch per block more; vitfast.cuda_graph and no_grad keep the chain).
_chained: tuple | None = None


def _vit_block_triton_chained(*args):
    """vit_block on the Triton block path (checked arguments), chaining row statistics from block to block."""
    global _chained
    from ..kernels.vit_block import vit_block_triton

    x = args[0]
    stats = None
    if _chained is not None and not x.is_inference():
        ref, version, previous = _chained
        if ref() is x and x._version == version:
            stats = previous
    out, out_stats = vit_block_triton(*args, stats=stats)
    _chained = None if out.is_inference() else (weakref.ref(out), out._version, out_stats)
    return out


def _vit_block_composed(*args):
    """vit_block as its six ops (each on its own device impl; the same formula as reference.vit_block), or on
    CUDA with VITFAST_CUDA_KERNELS=blocks the Triton block path."""
    check_vit_block_args(*args)
    if args[0].is_cuda and use_triton_blocks(get_cuda_kernels()):
        return _vit_block_triton_chained(*args)
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
    if use_triton_blocks(get_cuda_kernels()):  # VITFAST_CUDA_KERNELS=blocks: the five-launch Triton block path
        return _vit_block_triton_chained(*args)
    fns = (reference.layer_norm_unchecked, reference.linear_unchecked, attention_cuda_unchecked,
           channel_idle_ffn_cuda_unchecked)
    return reference.compose_vit_block(fns, *args)


def _vit_block_entry(args):
    if use_reference():
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
    check=check_vit_block_args, fake=_vit_block_fake, cuda=_vit_block_composed, entry=_vit_block_entry,
    doc="`torch.ops.vitfast.vit_block` (the fused ViT block as one op, see reference.vit_block), or the reference\n"
        "    when VITFAST_BACKEND=reference.  When autograd must record the call it runs as its six ops, each with\n"
        "    its reference gradient (a block op's gradient would be that composition's anyway).",
)
