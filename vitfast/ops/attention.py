"""`torch.ops.vitfast.attention`: multi-head self-attention from timm's packed qkv, in the layout proj reads.

CPU: csrc/ops/attention.cpp.  CUDA: no Triton kernel yet, the reference composition (permuted views + SDPA, i.e.
flash attention on GPU).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .. import reference
from .._env import get_backend
from ._check import check_float_dtype, check_num_heads, check_tensor, fmt_shape
from ._spec import call_reference, define_op, run


def check_attention_args(qkv: torch.Tensor, num_heads: int, scale: Optional[float]) -> tuple[int, int]:
    """Validate `attention` arguments; return (H, D).

    qkv [B, N, 3·H·D]: timm's qkv Linear output (q | k | v along the last dimension, H heads of D in each).
    """
    check_tensor("qkv", qkv)
    if qkv.dim() != 3:
        raise ValueError(f"qkv: expected 3-D [B, N, 3·H·D], got shape {fmt_shape(qkv)}")
    check_float_dtype("qkv", qkv)
    num_heads = check_num_heads(num_heads)
    width = qkv.shape[-1]
    if width <= 0 or width % (3 * num_heads):
        raise ValueError(
            f"qkv: expected last dimension a positive multiple of 3·num_heads = {3 * num_heads}, "
            f"got shape {fmt_shape(qkv)}"
        )
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite number, got {scale}")
    return num_heads, width // (3 * num_heads)


def _attention_fake(qkv, num_heads, scale):
    heads, head_dim = check_attention_args(qkv, num_heads, scale)
    return qkv.new_empty((qkv.shape[0], qkv.shape[1], heads * head_dim))


def _attention_cuda(*args):
    return reference.attention(*args)


def _attention_entry(args):
    if get_backend() == "reference":
        return call_reference("attention", args)
    check_tensor("qkv", args[0])  # its only tensor: with None the dispatcher has nothing to dispatch on
    return run("attention", args)


attention = define_op(
    "attention(Tensor qkv, int num_heads, float? scale=None) -> Tensor",
    fake=_attention_fake, cuda=_attention_cuda, entry=_attention_entry,
    doc="`torch.ops.vitfast.attention` (heads of packed qkv → [B, N, H·D]), or the reference when\n"
        "    VITFAST_BACKEND=reference.",
)
