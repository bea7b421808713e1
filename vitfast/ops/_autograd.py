"""Gradients through the fused ops: the forward runs the fast kernel, the backward differentiates the op's
reference (`vitfast.reference`, same signature, plain PyTorch) at the saved inputs.

Why: the kernels have no backward of their own, and without an autograd formula backprop through a fused model
(fine-tuning a loaded checkpoint, a loss on its features) gave `None` gradients for every fused weight, with only
a torch warning.  Recomputing the op in reference form inside the backward gives the gradients of
`VITFAST_BACKEND=reference` at the cost of one more forward per op, which only training pays.

Applied by the functional API (`vitfast.ops.*`, which every fused module calls) only when autograd needs it:
grad mode on and some tensor argument requiring grad.  Inference (`torch.no_grad()`, `torch.inference_mode()`,
or weights without requires_grad) calls the op directly: one `torch.is_grad_enabled()` check per call.  (An
autograd kernel registered on the op itself ran Python on every call, no_grad included: 2.6 -> 6.0 µs per
`linear` call on a tiny input, measured.)  Direct `torch.ops.vitfast.*` calls stay inference-only, except
`gate_select`, whose formula is registered on the op (vitfast/ops/batch_gate.py): a select has an exact gradient
without the reference, and its CPU and CUDA impls run Python anyway.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Optional, Sequence

import torch

from .. import reference


def any_requires_grad(args: Sequence) -> bool:
    """Whether some tensor argument requires grad (with grad mode on: autograd must record the call)."""
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


# Arguments the autocast rule (fp32 inputs, vitfast/ops/_autocast.py) leaves in their own dtype: an op's `gate`, a
# decision compared in its own dtype (a float64 1e-300 is open; cast to fp32 it read as closed).  Op name -> the
# gate's position, filled from the schemas by _spec.define_op.
AUTOCAST_KEEP: dict = {}


def autocast_args(name: str, args: Sequence, device: str, cast: Callable) -> list:
    """`args` with `cast` applied to the floating tensors on `device`, except the ones AUTOCAST_KEEP names."""
    keep = AUTOCAST_KEEP.get(name, ())
    return [a if i in keep or not (isinstance(a, torch.Tensor) and a.is_floating_point() and a.device.type == device)
            else cast(a) for i, a in enumerate(args)]


class _ReferenceGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name: str, fast: Callable, autocast_device: Optional[str], *args):
        ctx.name = name
        ctx.autocast_device = autocast_device
        ctx.tensor_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.constants = {i: a for i, a in enumerate(args) if not isinstance(a, torch.Tensor)}
        ctx.num_args = len(args)
        ctx.save_for_backward(*[args[i] for i in ctx.tensor_positions])
        return fast(*args)

    @staticmethod
    def backward(ctx, grad):
        # Under backward(create_graph=True) grad mode is on here: the gradient must itself be differentiable
        # (gradient penalties, double backward), so the reference is recomputed on the saved inputs still
        # attached to their graph.  Otherwise on detached copies: first-order training builds no graph it would
        # throw away.  (Detaching always made every second-order term of the op silently vanish.)
        higher_order = torch.is_grad_enabled()
        args = [None] * ctx.num_args
        for i, a in ctx.constants.items():
            args[i] = a
        wanted = []
        for i, t in zip(ctx.tensor_positions, ctx.saved_tensors):
            # needs_input_grad counts forward's three leading non-tensor arguments (name, fast, autocast_device).
            needed = ctx.needs_input_grad[3 + i] and t.is_floating_point()
            # One node per argument position: the same tensor passed twice (x as input and residual) must get
            # each position's partial gradient, not the total twice.  A detached copy is that node in
            # first-order backward; a view (still differentiable back to the tensor) is it in higher order.
            t = t.view_as(t) if higher_order else t.detach().requires_grad_(needed)
            if needed:
                wanted.append((i, t))
            args[i] = t
        grads = [None] * ctx.num_args
        if wanted:
            with torch.enable_grad(), _autocast_rule(ctx.autocast_device):
                if ctx.autocast_device is not None:
                    # The forward ran under the ops' autocast rule (fp32 inputs): so does its reference, through a
                    # differentiable cast, so a bf16 leaf gets its gradient (the mixed dtypes were refused here).
                    args = autocast_args(ctx.name, args, ctx.autocast_device, lambda a: a.float())
                out = getattr(reference, ctx.name)(*args)
            found = torch.autograd.grad(out, [t for _, t in wanted], grad, allow_unused=True,
                                        create_graph=higher_order)
            for (i, _), g in zip(wanted, found):
                grads[i] = g
        return (None, None, None, *grads)


def _autocast_rule(device: Optional[str]):
    return torch.autocast(device, enabled=False) if device is not None else contextlib.nullcontext()


def with_reference_gradient(name: str, fast: Callable, args: Sequence,
                            autocast_device: Optional[str] = None) -> torch.Tensor:
    """`fast(*args)`, recorded for autograd with the gradient of `vitfast.reference.<name>` (see the module doc).
    `autocast_device`: the call runs inside an autocast region of that device type, whose rule (fp32 inputs, see
    vitfast/ops/_autocast.py) the backward's reference follows too."""
    return _ReferenceGradient.apply(name, fast, autocast_device, *args)
