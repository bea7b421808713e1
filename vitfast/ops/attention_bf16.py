"""`torch.ops.vitfast.attention_bf16`: multi-head self-attention from timm's packed qkv (as `attention`, fp32 in and
out) with the score and value products on bf16 operands and fp32 accumulation: vitfast/reference/attention_bf16.py.

CPU: csrc/ops/attention.cpp (the bf16 GEMMs: AMX, AVX512_BF16, ARM BF16; on a CPU without one the portable bf16
kernel, exact but slow).  CUDA: the reference.  Traced by an ONNX export: fp32 attention (ONNX has no bf16-operand
product with an fp32 sum); `vitfast.export.to_onnx` refuses a model that uses the op.
"""
from __future__ import annotations

from ..reference.attention_bf16 import check_attention_bf16_args
from .attention import define_attention_op

# (an ONNX export traces fp32 attention: the module doc)
attention_bf16 = define_attention_op(
    "attention_bf16", check_attention_bf16_args, onnx_as_attention=True,
    doc="`torch.ops.vitfast.attention_bf16` (heads of packed fp32 qkv → [B, N, H·D], bf16 products), or the\n"
        "    reference when VITFAST_BACKEND=reference.",
)
