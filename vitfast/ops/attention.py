"""`torch.ops.vitfast.attention`: multi-head self-attention from timm's packed qkv, in the layout proj reads.

CPU: csrc/ops/attention.cpp.  CUDA: the reference composition (permuted views + SDPA: cuDNN's or flash attention),
or with VITFAST_CUDA_KERNELS=triton the Triton kernel (kernels/attention.py: one launch reading the packed qkv, the
Triton block path's attention).  SDPA stays the default until the kernel has been timed against it on a GPU.
"""
from __future__ import annotations

from .. import reference
from .._env import get_cuda_kernels
from ..reference._check import check_tensor
from ..reference.attention import check_attention_args
from ._policy import forced
from ._spec import call_reference, define_op, onnx_exporting, run, use_reference


def use_triton_attention(policy: str = "auto") -> bool:
    """Whether `attention` runs on the Triton kernel on CUDA: only when `policy` (VITFAST_CUDA_KERNELS) forces the
    Triton kernels; "auto" keeps SDPA, whose kernels are the measured fast ones (kernels/attention.py)."""
    return forced(policy) is True


def attention_cuda_unchecked(qkv, num_heads, scale=None):
    """The CUDA attention for checked arguments: SDPA, or the Triton kernel, by the policy."""
    if not use_triton_attention(get_cuda_kernels()):
        return reference.attention_unchecked(qkv, num_heads, scale)
    from ..kernels.attention import attention_triton

    return attention_triton(qkv, num_heads, scale)


def _attention_cuda(*args):
    check_attention_args(*args)
    return attention_cuda_unchecked(*args)


def define_attention_op(name: str, check, doc: str, *, onnx_as_attention: bool = False, cuda=None):
    """`define_op` for `attention` and its product variants (`attention_int8`, `attention_bf16`): one schema
    `name(Tensor qkv, int num_heads, float? scale=None) -> Tensor`, a fake impl of shape [B, N, H·D], the reference
    as the CUDA impl (or `cuda`), and the entry: the reference under VITFAST_BACKEND=reference (fp32 `attention`'s when
    `onnx_as_attention` and an ONNX export traces the call), else the op on qkv, the only tensor (checked first:
    with None the dispatcher has nothing to dispatch on)."""

    def fake(qkv, num_heads, scale):
        heads, head_dim = check(qkv, num_heads, scale)
        return qkv.new_empty((qkv.shape[0], qkv.shape[1], heads * head_dim))

    if cuda is None:
        def cuda(*args):
            return getattr(reference, name)(*args)

    def entry(args):
        if use_reference():
            return reference.attention(*args) if onnx_as_attention and onnx_exporting() else call_reference(name, args)
        check_tensor("qkv", args[0])
        return run(name, args)

    return define_op(f"{name}(Tensor qkv, int num_heads, float? scale=None) -> Tensor", check=check, fake=fake,
                     cuda=cuda, entry=entry, doc=doc)


attention = define_attention_op(
    "attention", check_attention_args, cuda=_attention_cuda,
    doc="`torch.ops.vitfast.attention` (heads of packed qkv → [B, N, H·D]), or the reference when\n"
        "    VITFAST_BACKEND=reference.",
)
