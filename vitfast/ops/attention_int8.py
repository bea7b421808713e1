"""`torch.ops.vitfast.attention_int8`: multi-head self-attention from timm's packed qkv (as `attention`) with the
score and value products on int8 (per-token Q and K, per-row softmax, per-channel V; the softmax normalised by the
quantized row's sum): vitfast/reference/attention_int8.py.

CPU: csrc/ops/attention_int8.cpp (the int8 GEMM core).  CUDA: the reference composition.
"""
from __future__ import annotations

from .. import reference
from ..reference._check import check_tensor
from ..reference.attention_int8 import check_attention_int8_args
from ._spec import call_reference, define_op, run, use_reference


def _attention_int8_fake(qkv, num_heads, scale):
    heads, head_dim = check_attention_int8_args(qkv, num_heads, scale)
    return qkv.new_empty((qkv.shape[0], qkv.shape[1], heads * head_dim))


def _attention_int8_cuda(*args):
    return reference.attention_int8(*args)


def _attention_int8_entry(args):
    if use_reference():
        return call_reference("attention_int8", args)
    check_tensor("qkv", args[0])  # its only tensor: with None the dispatcher has nothing to dispatch on
    return run("attention_int8", args)


attention_int8 = define_op(
    "attention_int8(Tensor qkv, int num_heads, float? scale=None) -> Tensor",
    check=check_attention_int8_args, fake=_attention_int8_fake, cuda=_attention_int8_cuda,
    entry=_attention_int8_entry,
    doc="`torch.ops.vitfast.attention_int8` (heads of packed qkv → [B, N, H·D], int8 products), or the reference\n"
        "    when VITFAST_BACKEND=reference.",
)
