"""The USDC gate ops: `torch.ops.vitfast.batch_gate`, the batch-level decision [MHSA, FFN], and
`torch.ops.vitfast.gate_select`, the device-side select that applies it.

batch_gate: CPU = C++ (csrc/ops/batch_gate.cpp), CUDA = Triton (kernels/batch_gate.py).  gate_select: CPU = the
reference (the CPU block branches on the decision instead, see vitfast/nn/gates.py), CUDA = Triton.  Neither ever
copies the decision to the host, so a CUDA graph of a gated model stays valid.

gate_select has its own autograd formula, registered on the op (a direct `torch.ops` call differentiates too): the
picked input gets the output's gradient, the other one zeros, and the gate none (a 0/1 decision read through a
comparison, as in the reference).  batch_gate has no gradient at all (a threshold).
"""
from __future__ import annotations

import torch

from ..reference.batch_gate import check_batch_gate_args, check_gate_select_args
from ._spec import call_reference, define_op, use_reference


def _batch_gate_fake(*args):
    check_batch_gate_args(*args)
    return args[0].new_empty((2,))


def _batch_gate_cuda(*args):
    from ..kernels.batch_gate import batch_gate_triton

    return batch_gate_triton(*args)


def _batch_gate_entry(args):
    if use_reference():
        return call_reference("batch_gate", args)
    with torch.no_grad():  # a 0/1 decision: no gradient, as for a comparison (and no autograd recording)
        return torch.ops.vitfast.batch_gate(*args)


batch_gate = define_op(
    "batch_gate(Tensor x, Tensor w1, Tensor? b1, Tensor? w2=None, Tensor? b2=None, bool layer_norm=False, "
    "str act='none', float eps=1e-05) -> Tensor",
    check=check_batch_gate_args, fake=_batch_gate_fake, cuda=_batch_gate_cuda, entry=_batch_gate_entry,
    doc="`torch.ops.vitfast.batch_gate` (USDC batch-level decision [MHSA, FFN], 1 = execute), or the reference\n"
        "    when VITFAST_BACKEND=reference.",
)


def _gate_select_fake(gate, index, taken, skipped):
    check_gate_select_args(gate, index, taken, skipped)
    return taken.new_empty(taken.shape)


def _gate_select_cuda(*args):
    from ..kernels.batch_gate import gate_select_triton

    return gate_select_triton(*args)


def _gate_select_setup_context(ctx, inputs, output):
    gate, index, _, _ = inputs
    # The decision as it was at the forward: a decision buffer refilled in place (a replayed CUDA graph) must not
    # route the gradient of an earlier batch.
    ctx.save_for_backward(gate[index] != 0)


def _gate_select_backward(ctx, grad):
    (open_,) = ctx.saved_tensors
    zero = grad.new_zeros(())
    taken = torch.where(open_, grad, zero) if ctx.needs_input_grad[2] else None
    skipped = torch.where(open_, zero, grad) if ctx.needs_input_grad[3] else None
    return None, None, taken, skipped


def _gate_select_entry(args):
    if use_reference():
        return call_reference("gate_select", args)
    return torch.ops.vitfast.gate_select(*args)  # recorded for autograd by the op's own formula


gate_select = define_op(
    "gate_select(Tensor gate, int index, Tensor taken, Tensor skipped) -> Tensor",
    check=check_gate_select_args, fake=_gate_select_fake, cuda=_gate_select_cuda, entry=_gate_select_entry,
    doc="`torch.ops.vitfast.gate_select`: taken if gate[index] != 0 else skipped, decided on the device.",
)
# (Its kernel on the Autograd key costs ~2.5 µs of Python per call under no_grad, nothing under inference_mode;
# gate_select is Python on both devices anyway.)
torch.library.register_autograd("vitfast::gate_select", _gate_select_backward,
                                setup_context=_gate_select_setup_context)
