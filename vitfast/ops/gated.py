"""The gated USDC sub-blocks: `torch.ops.vitfast.gated_mhsa` / `gated_ffn`, a whole MHSA / FFN sub-block that runs
only if gate[index] != 0, the decision staying on the device (see `vitfast.reference.gated_mhsa` / `gated_ffn`).

CUDA = the gated Triton kernels (kernels/gated.py: every kernel reads the flag and returns at once when closed, the
last one writes x), so a skipped sub-block costs no GEMM and no host synchronisation, and a CUDA graph of the model
stays valid.  CPU = read the flag (no device to wait for) and run the C++ ops or copy x.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import reference
from ..reference.gated import check_gated_ffn_args, check_gated_mhsa_args
from ._policy import HALF_DTYPES, forced
from ._spec import define_op, onnx_exporting, standard_entry


def use_gated_cuda_kernels(dtype: torch.dtype, policy: str = "auto") -> bool:
    """Whether a gated USDC block on CUDA runs its sub-blocks as `gated_mhsa`/`gated_ffn` (Triton kernels that read
    the device decision and return early) or as cuBLAS/SDPA + `gate_select` (computes, then picks on the device).

    Measured (table: vitfast/ops/_policy.py, docs/performance.md#cuda-policy): the gated kernels make a closed
    sub-block nearly free, but their ieee fp32 GEMMs make an open one 2.2–3.5× slower than cuBLAS → gate_select in
    fp32, the gated kernels in fp16/bf16.  Neither beats the ungated model on a GPU (the CPU path does: a closed
    sub-block is skipped outright).  `policy` "triton"/"torch" (VITFAST_CUDA_KERNELS) forces one path.
    """
    if (choice := forced(policy)) is not None:
        return choice
    return dtype in HALF_DTYPES


def _norm(x, norm_eps):
    # The same LayerNorm kernel as the ungated fused block's pre-norm (nn._base.apply_norm): a gate forced open
    # gives that block's bits.
    return torch.ops.vitfast.layer_norm(x, None, None, norm_eps) if norm_eps is not None else x


def _fake(check):
    def fake(*args):
        check(*args)
        x = args[2]
        return x.new_empty(x.shape)

    return fake


def _cuda(name):
    def cuda(*args):
        from ..kernels import gated

        return getattr(gated, f"{name}_triton")(*args)

    return cuda


def _gated_mhsa_cpu(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj):
    check_gated_mhsa_args(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj)
    if not bool(gate[index] != 0):
        return x.clone()  # an op's output never aliases its input
    qkv = torch.ops.vitfast.linear(_norm(x, norm_eps), w_qkv, b_qkv)
    return torch.ops.vitfast.linear(torch.ops.vitfast.attention(qkv, num_heads), w_proj, b_proj, x)


def _gated_ffn_cpu(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual):
    check_gated_ffn_args(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual)
    if not bool(gate[index] != 0):
        return x.clone()
    return torch.ops.vitfast.channel_idle_ffn(_norm(x, norm_eps), w_in, b_in, w_out, b_out, x if residual else None)


def _traced_norm(x, norm_eps, width):
    # The LayerNorm width read from a weight: the reference's (x.shape[-1],) is a traced size in a TorchScript trace,
    # which its ONNX exporter refuses with a dynamic batch axis ("Failed to export ... because it is not constant").
    return F.layer_norm(x, (width,), eps=norm_eps) if norm_eps is not None else x


def _gated_mhsa_traced(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj):
    check_gated_mhsa_args(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj)
    y = _traced_norm(x, norm_eps, w_qkv.shape[1])
    out = reference.linear(reference.attention(reference.linear(y, w_qkv, b_qkv), num_heads), w_proj, b_proj, x)
    return reference.gate_select(gate, index, out, x)


def _gated_ffn_traced(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual):
    check_gated_ffn_args(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual)
    y = _traced_norm(x, norm_eps, w_in.shape[1])
    out = reference.channel_idle_ffn(y, w_in, b_in, w_out, b_out, x if residual else None)
    return reference.gate_select(gate, index, out, x)


def _entry(name, traced):
    """The standard entry, except in the TorchScript ONNX exporter's trace (on either backend): there the
    reference's composition with the LayerNorm width taken from the weight (`_traced_norm`)."""
    standard = standard_entry(name)

    def entry(args):
        if torch.jit.is_tracing() and onnx_exporting():
            return traced(*args)
        return standard(args)

    return entry


gated_mhsa = define_op(
    "gated_mhsa(Tensor gate, int index, Tensor x, float? norm_eps, Tensor w_qkv, Tensor? b_qkv, int num_heads, "
    "Tensor w_proj, Tensor? b_proj) -> Tensor",
    check=check_gated_mhsa_args, fake=_fake(check_gated_mhsa_args), cuda=_cuda("gated_mhsa"), cpu=_gated_mhsa_cpu,
    entry=_entry("gated_mhsa", _gated_mhsa_traced),
    doc="`torch.ops.vitfast.gated_mhsa`: x + proj(attention(qkv(LN(x)))) if gate[index] != 0 else x, decided on the\n"
        "    device (see `vitfast.reference.gated_mhsa`), or the reference when VITFAST_BACKEND=reference.",
)
gated_ffn = define_op(
    "gated_ffn(Tensor gate, int index, Tensor x, float? norm_eps, Tensor w_in, Tensor? b_in, Tensor w_out, "
    "Tensor? b_out, bool residual) -> Tensor",
    check=check_gated_ffn_args, fake=_fake(check_gated_ffn_args), cuda=_cuda("gated_ffn"), cpu=_gated_ffn_cpu,
    entry=_entry("gated_ffn", _gated_ffn_traced),
    doc="`torch.ops.vitfast.gated_ffn`: channel_idle_ffn(LN(x), …, x if residual) if gate[index] != 0 else x, decided\n"
        "    on the device (see `vitfast.reference.gated_ffn`), or the reference when VITFAST_BACKEND=reference.",
)
