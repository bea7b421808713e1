"""The USDC gate ops: `torch.ops.vitfast.batch_gate`, the batch-level decision [MHSA, FFN], and
`torch.ops.vitfast.gate_select`, the device-side select that applies it.

batch_gate: CPU = C++ (csrc/ops/batch_gate.cpp), CUDA = Triton (kernels/batch_gate.py).  gate_select: CPU = the
reference (the CPU block branches on the decision instead, see vitfast/nn/gates.py), CUDA = Triton.  Neither ever
copies the decision to the host, so a CUDA graph of a gated model stays valid.
"""
from __future__ import annotations

import torch

from .._env import get_backend
from ._check import as_integer, check_like_x, check_tensor, check_tokens, describe, fmt_shape, is_positive_number
from ._check import number
from ._spec import call_reference, define_op

GATE_ACTS = ("none", "relu", "gelu")


def check_batch_gate_args(x, w1, b1, w2, b2, layer_norm, act, eps) -> int:
    """Validate `batch_gate` arguments; return the hidden width H (2 for a one-layer gate network).

    x [B, N, C];  w1 [H, C], b1 [H];  w2 [2, H], b2 [2] (both None for a one-layer network, then H = 2 and
    neither a norm nor an activation: the first layer already gives the two gate logits).
    """
    check_tensor("x", x)
    check_tensor("w1", w1)
    check_tokens(x)
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"x: expected at least one sample and one token, got shape {fmt_shape(x)}")
    channels = x.shape[2]
    if w1.dim() != 2 or w1.shape[1] != channels:
        raise ValueError(f"w1: expected shape [H, {channels}] (C = x.shape[-1]), got {describe(w1)}")
    for name, t in (("b1", b1), ("w2", w2), ("b2", b2)):  # optional: a list here failed on `.dim()` unnamed
        if t is not None:
            check_tensor(name, t)
    hidden = w1.shape[0]
    if hidden == 0:  # an empty hidden layer: the C++ kernel took an empty w2 for "no second layer"
        raise ValueError(f"w1: expected at least one hidden unit, shape [H >= 1, {channels}], got {fmt_shape(w1)}")
    if act not in GATE_ACTS:
        raise ValueError(f"act: expected one of {GATE_ACTS}, got {act!r}")
    if not is_positive_number(eps):
        raise ValueError(f"eps: expected a number > 0, got {eps!r}")
    if w2 is None:
        if b2 is not None:
            raise ValueError(f"b2: expected None when w2 is None (one-layer gate network), got {fmt_shape(b2)}")
        if hidden != 2:
            raise ValueError(f"w1: expected shape [2, {channels}] for a one-layer gate network (w2=None), "
                             f"got {fmt_shape(w1)}")
        if layer_norm or act != "none":
            raise ValueError(f"layer_norm, act: expected False and 'none' for a one-layer gate network (w2=None), "
                             f"got {layer_norm!r} and {act!r}")
    elif w2.dim() != 2 or tuple(w2.shape) != (2, hidden):
        raise ValueError(f"w2: expected shape [2, {hidden}] (H = w1.shape[0]), got {fmt_shape(w2)}")
    if b1 is not None and tuple(b1.shape) != (hidden,):
        raise ValueError(f"b1: expected shape [{hidden}], got {fmt_shape(b1)}")
    if b2 is not None and tuple(b2.shape) != (2,):
        raise ValueError(f"b2: expected shape [2], got {fmt_shape(b2)}")
    check_like_x(x, (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)))
    return hidden


def check_gate_select_args(gate, index, taken, skipped) -> None:
    """gate [G] (a `batch_gate` decision vector), 0 <= index < G; taken and skipped of one shape, dtype, device."""
    if not isinstance(gate, torch.Tensor) or gate.dim() != 1 or gate.shape[0] == 0:
        raise ValueError(f"gate: expected a 1-D decision tensor [G], got {describe(gate)}")
    position = as_integer(index)
    if position is None or not 0 <= position < gate.shape[0]:
        raise ValueError(f"index: expected an int in [0, {gate.shape[0]}), got {index!r}")
    if not isinstance(taken, torch.Tensor) or not isinstance(skipped, torch.Tensor):
        raise TypeError(f"taken, skipped: expected Tensors, got {type(taken).__name__} and {type(skipped).__name__}")
    if taken.shape != skipped.shape:
        raise ValueError(f"skipped: expected shape {fmt_shape(taken)} (same as taken), got {fmt_shape(skipped)}")
    if taken.dtype != skipped.dtype:
        raise ValueError(f"skipped: expected dtype {taken.dtype} (same as taken), got {skipped.dtype}")
    for name, t in (("gate", gate), ("skipped", skipped)):
        if t.device != taken.device:
            raise ValueError(f"{name}: expected device {taken.device} (same as taken), got {t.device}")


def _batch_gate_fake(*args):
    check_batch_gate_args(*args)
    return args[0].new_empty((2,))


def _batch_gate_cuda(*args):
    from ..kernels.batch_gate import batch_gate_triton

    return batch_gate_triton(*args)


def _batch_gate_entry(args):
    if get_backend() == "reference":
        return call_reference("batch_gate", args)
    with torch.no_grad():  # a 0/1 decision: no gradient, as for a comparison (and no autograd recording)
        return torch.ops.vitfast.batch_gate(*args[:-1], number("eps", args[-1]))


batch_gate = define_op(
    "batch_gate(Tensor x, Tensor w1, Tensor? b1, Tensor? w2=None, Tensor? b2=None, bool layer_norm=False, "
    "str act='none', float eps=1e-05) -> Tensor",
    fake=_batch_gate_fake, cuda=_batch_gate_cuda, entry=_batch_gate_entry,
    doc="`torch.ops.vitfast.batch_gate` (USDC batch-level decision [MHSA, FFN], 1 = execute), or the reference\n"
        "    when VITFAST_BACKEND=reference.",
)


def _gate_select_fake(gate, index, taken, skipped):
    check_gate_select_args(gate, index, taken, skipped)
    return taken.new_empty(taken.shape)


def _gate_select_cuda(*args):
    from ..kernels.batch_gate import gate_select_triton

    return gate_select_triton(*args)


gate_select = define_op(
    "gate_select(Tensor gate, int index, Tensor taken, Tensor skipped) -> Tensor",
    fake=_gate_select_fake, cuda=_gate_select_cuda,
    doc="`torch.ops.vitfast.gate_select`: taken if gate[index] != 0 else skipped, decided on the device.",
)
