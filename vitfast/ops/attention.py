"""`torch.ops.vitfast.attention`: multi-head self-attention from timm's packed qkv, in the layout proj reads.

CPU: csrc/ops/attention.cpp.  CUDA: no Triton kernel yet, the reference composition (permuted views + SDPA, i.e.
flash attention on GPU).
"""
from __future__ import annotations

from .. import reference
from ..reference._check import check_tensor
from ..reference.attention import check_attention_args
from ._spec import call_reference, define_op, run, use_reference


def _attention_fake(qkv, num_heads, scale):
    heads, head_dim = check_attention_args(qkv, num_heads, scale)
    return qkv.new_empty((qkv.shape[0], qkv.shape[1], heads * head_dim))


def _attention_cuda(*args):
    return reference.attention(*args)


def _attention_entry(args):
    if use_reference():
        return call_reference("attention", args)
    check_tensor("qkv", args[0])  # its only tensor: with None the dispatcher has nothing to dispatch on
    return run("attention", args)


attention = define_op(
    "attention(Tensor qkv, int num_heads, float? scale=None) -> Tensor",
    check=check_attention_args, fake=_attention_fake, cuda=_attention_cuda, entry=_attention_entry,
    doc="`torch.ops.vitfast.attention` (heads of packed qkv → [B, N, H·D]), or the reference when\n"
        "    VITFAST_BACKEND=reference.",
)
