"""The gated USDC sub-blocks: `torch.ops.vitfast.gated_mhsa` / `gated_ffn`, a whole MHSA / FFN sub-block that runs
only if gate[index] != 0, the decision staying on the device (see `vitfast.reference.gated_mhsa` / `gated_ffn`).

CUDA = the gated Triton kernels (kernels/gated.py: every kernel reads the flag and returns at once when closed, the
last one writes x), so a skipped sub-block costs no GEMM and no host synchronisation, and a CUDA graph of the model
stays valid.  CPU = read the flag (no device to wait for) and run the C++ ops or copy x.
"""
from __future__ import annotations

import torch

from ._check import as_integer, check_tokens, describe, fmt_shape, is_positive_number, number
from ._policy import HALF_DTYPES, forced
from ._spec import define_op, standard_entry
from .batch_gate import check_gate_select_args
from .channel_idle_ffn import check_channel_idle_ffn_args
from .linear import check_linear_args


def _check_block_input(gate, index, x, norm_eps) -> None:
    check_tokens(x)
    check_gate_select_args(gate, index, x, x)
    if norm_eps is not None and not is_positive_number(norm_eps):
        raise ValueError(f"norm_eps: expected None (no LayerNorm) or a number > 0, got {norm_eps!r}")


def check_gated_mhsa_args(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj) -> int:
    """`gated_mhsa` arguments: gate [G] and index as in `gate_select`; x [B, N, C]; w_qkv [3·H·D, C] (timm's
    [3, H, D] row layout), b_qkv [3·H·D]; w_proj [C, H·D], b_proj [C].  Returns the head dim D."""
    _check_block_input(gate, index, x, norm_eps)
    width = check_linear_args(x, w_qkv, b_qkv, None)
    heads = as_integer(num_heads)
    if heads is None or heads < 1 or width % (3 * heads):
        raise ValueError(f"num_heads: expected an int >= 1 dividing w_qkv.shape[0] / 3 = {width / 3:g}, "
                         f"got {num_heads!r}")
    c, attn_dim = x.shape[-1], width // 3
    if not isinstance(w_proj, torch.Tensor) or tuple(w_proj.shape) != (c, attn_dim):
        raise ValueError(f"w_proj: expected shape [{c}, {attn_dim}] (C, H·D), got {describe(w_proj)}")
    if b_proj is not None and tuple(b_proj.shape) != (c,):
        raise ValueError(f"b_proj: expected shape [{c}], got {fmt_shape(b_proj)}")
    for name, t in (("w_proj", w_proj), ("b_proj", b_proj)):
        if t is not None and (t.dtype != x.dtype or t.device != x.device):
            raise ValueError(f"{name}: expected dtype {x.dtype} on {x.device} (same as x), got {t.dtype} on "
                             f"{t.device}")
    return attn_dim // heads


def check_gated_ffn_args(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual) -> tuple:
    """`gated_ffn` arguments: gate/index as in `gate_select`; x [B, N, C]; the `channel_idle_ffn` weights with
    C_out = C (a skipped sub-block returns x, so the sub-block must keep the width); `residual` a bool.
    Returns (A, L): active (GELU) and linear hidden columns."""
    _check_block_input(gate, index, x, norm_eps)
    if not isinstance(residual, bool):
        raise ValueError(f"residual: expected a bool, got {residual!r}")
    active, linear, c_out = check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, x if residual else None)
    if c_out != x.shape[-1]:
        raise ValueError(f"w_out: expected {x.shape[-1]} output features (C = x.shape[-1]: a skipped sub-block "
                         f"returns x), got {c_out}")
    if active + linear == 0:
        raise ValueError(f"w_in: expected at least one row (active or linear), got shape {fmt_shape(w_in)}")
    return active, linear


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


def _gated_entry(name):
    """The standard entry once norm_eps is a float (or None) and, for gated_ffn, residual a bool."""
    standard = standard_entry(name)

    def entry(args):
        gate, index, x, norm_eps, *rest = args
        eps = number("norm_eps", norm_eps) if norm_eps is not None else None
        if name == "gated_ffn":
            rest[-1] = bool(rest[-1])
        return standard((gate, index, x, eps, *rest))

    return entry


gated_mhsa = define_op(
    "gated_mhsa(Tensor gate, int index, Tensor x, float? norm_eps, Tensor w_qkv, Tensor? b_qkv, int num_heads, "
    "Tensor w_proj, Tensor? b_proj) -> Tensor",
    fake=_fake(check_gated_mhsa_args), cuda=_cuda("gated_mhsa"), cpu=_gated_mhsa_cpu, entry=_gated_entry("gated_mhsa"),
    doc="`torch.ops.vitfast.gated_mhsa`: x + proj(attention(qkv(LN(x)))) if gate[index] != 0 else x, decided on the\n"
        "    device (see `vitfast.reference.gated_mhsa`), or the reference when VITFAST_BACKEND=reference.",
)
gated_ffn = define_op(
    "gated_ffn(Tensor gate, int index, Tensor x, float? norm_eps, Tensor w_in, Tensor? b_in, Tensor w_out, "
    "Tensor? b_out, bool residual) -> Tensor",
    fake=_fake(check_gated_ffn_args), cuda=_cuda("gated_ffn"), cpu=_gated_ffn_cpu, entry=_gated_entry("gated_ffn"),
    doc="`torch.ops.vitfast.gated_ffn`: channel_idle_ffn(LN(x), …, x if residual) if gate[index] != 0 else x, decided\n"
        "    on the device (see `vitfast.reference.gated_ffn`), or the reference when VITFAST_BACKEND=reference.",
)
