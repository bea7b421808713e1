"""`torch.ops.vitfast.attention_int8`: multi-head self-attention from timm's packed qkv (as `attention`) with the
score and value products on int8 (per-token Q and K, per-row softmax, per-channel V; the softmax normalised by the
quantized row's sum): vitfast/reference/attention_int8.py.

CPU: csrc/ops/attention_int8.cpp (the int8 GEMM core).  CUDA: the reference composition.
"""
from __future__ import annotations

from ..reference.attention_int8 import check_attention_int8_args
from .attention import define_attention_op

attention_int8 = define_attention_op(
    "attention_int8", check_attention_int8_args,
    doc="`torch.ops.vitfast.attention_int8` (heads of packed qkv → [B, N, H·D], int8 products), or the reference\n"
        "    when VITFAST_BACKEND=reference.",
)
