"""`torch.ops.vitfast.attention_bf16`: multi-head self-attention from timm's packed qkv (as `attention`, fp32 in and
out) with the score and value products on bf16 operands and fp32 accumulation: vitfast/reference/attention_bf16.py.

CPU: csrc/ops/attention.cpp (the bf16 GEMMs: AMX, AVX512_BF16, ARM BF16; on a CPU without one the portable bf16
kernel, exact but slow).  CUDA: the reference.  Traced by an ONNX export: fp32 attention (ONNX has no bf16-operand
product with an fp32 sum); `vitfast.export.to_onnx` refuses a model that uses the op.
"""
from __future__ import annotations

from .. import reference
from ..reference._check import check_tensor
from ..reference.attention_bf16 import check_attention_bf16_args
from ._spec import call_reference, define_op, onnx_exporting, run, use_reference


def _attention_bf16_fake(qkv, num_heads, scale):
    heads, head_dim = check_attention_bf16_args(qkv, num_heads, scale)
    return qkv.new_empty((qkv.shape[0], qkv.shape[1], heads * head_dim))


def _attention_bf16_cuda(*args):
    return reference.attention_bf16(*args)


def _attention_bf16_entry(args):
    if use_reference():  # (an ONNX export traces fp32 attention: the module doc)
        return reference.attention(*args) if onnx_exporting() else call_reference("attention_bf16", args)
    check_tensor("qkv", args[0])  # its only tensor: with None the dispatcher has nothing to dispatch on
    return run("attention_bf16", args)


attention_bf16 = define_op(
    "attention_bf16(Tensor qkv, int num_heads, float? scale=None) -> Tensor",
    check=check_attention_bf16_args, fake=_attention_bf16_fake, cuda=_attention_bf16_cuda,
    entry=_attention_bf16_entry,
    doc="`torch.ops.vitfast.attention_bf16` (heads of packed fp32 qkv → [B, N, H·D], bf16 products), or the\n"
        "    reference when VITFAST_BACKEND=reference.",
)
