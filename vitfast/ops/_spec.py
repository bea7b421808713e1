"""One spec per op: `define_op(schema, ...)` defines `torch.ops.vitfast.<op>` and everything derived from its schema.

The schema string is the one place an op's argument list is written.  From it `define_op`
- defines the op on the `vitfast` library and registers its fake impl (shape/dtype propagation, so
  `torch.compile(fullgraph=True)` and `torch.export` trace it), its CUDA impl, an optional Python CPU impl (the C++
  ones register themselves from `vitfast._C`) and the autocast rule (`_autocast.py`);
- completes the trailing defaults the dispatcher leaves out, so impls take every argument positionally;
- builds the Python entry `vitfast.ops.<op>` with the schema's signature: the reference under
  VITFAST_BACKEND=reference, else the op, recorded for autograd with the reference's gradient when needed.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .. import reference
from .._env import get_backend
from . import _autograd
from ._autocast import autocast_enabled, autocast_input, register_autocast_fp32

LIB = torch.library.Library("vitfast", "DEF")
SCHEMAS: dict = {}  # op name -> schema, in definition order

# Python annotations of the schema types the ops use.
_PY_TYPES = {"Tensor": torch.Tensor, "Optional[Tensor]": Optional[torch.Tensor], "int": int, "float": float,
             "Optional[float]": Optional[float], "bool": bool, "str": str}


def device_type_of(args) -> str:
    return next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")


def call_reference(name: str, args) -> torch.Tensor:
    """vitfast.reference.<name>(*args) for VITFAST_BACKEND=reference, under the ops' autocast rule: inside an
    autocast region fp32 inputs, run in fp32, so the two backends agree (the reference alone refused the bf16
    activations next to fp32 weights)."""
    fn = getattr(reference, name)
    device = device_type_of(args)
    if not autocast_enabled(device):
        return fn(*args)
    args = _autograd.autocast_args(name, args, device, autocast_input)
    with torch.autocast(device, enabled=False):
        return fn(*args)


def run(name: str, args) -> torch.Tensor:
    """`torch.ops.vitfast.<name>(*args)`; when autograd must record the call, with the reference's gradient
    (vitfast/ops/_autograd.py): a fused model can be fine-tuned, no fused weight gets a silent None gradient."""
    op = getattr(torch.ops.vitfast, name)
    if torch.is_grad_enabled() and _autograd.any_requires_grad(args):
        device = device_type_of(args)
        return _autograd.with_reference_gradient(name, op, args, device if autocast_enabled(device) else None)
    return op(*args)


def standard_entry(name: str) -> Callable:
    """The Python entry's body for most ops: the reference or the op (see `run`)."""
    def entry(args):
        if get_backend() == "reference":
            return call_reference(name, args)
        return run(name, args)

    return entry


def _with_defaults(fn: Callable, defaults: tuple) -> Callable:
    """`fn` called with every argument: the dispatcher passes a Python kernel only those up to the last one given."""
    count = len(defaults)

    def kernel(*args):
        return fn(*args, *defaults[len(args):]) if len(args) < count else fn(*args)

    return kernel


def _python_entry(name: str, arguments, body: Callable, doc: str) -> Callable:
    """`def <name>(<the schema's arguments and defaults>): return body((<arguments>,))`, written out as source (as
    dataclasses write __init__) so a call costs one frame, keyword calls work and help() shows the signature."""
    params = ", ".join(f"{a.name}={a.default_value!r}" if a.has_default_value() else a.name for a in arguments)
    namespace = {"body": body}
    exec(f"def {name}({params}):\n    return body(({''.join(a.name + ', ' for a in arguments)}))\n", namespace)
    fn = namespace[name]
    fn.__module__, fn.__doc__ = "vitfast.ops", doc
    fn.__annotations__ = {**{a.name: _PY_TYPES[str(a.type)] for a in arguments}, "return": torch.Tensor}
    return fn


def define_op(schema: str, *, fake: Callable, cuda: Callable, doc: str, cpu: Optional[Callable] = None,
              entry: Optional[Callable] = None) -> Callable:
    """Define `torch.ops.vitfast.<op>` from `schema` with its impls (each taking every argument positionally);
    return the Python entry, whose body is `entry(args)` (default: `standard_entry`)."""
    name = schema.split("(", 1)[0]
    LIB.define(schema)
    SCHEMAS[name] = schema
    arguments = getattr(torch.ops.vitfast, name).default._schema.arguments
    defaults = tuple(a.default_value if a.has_default_value() else None for a in arguments)
    register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract
    register_fake(f"vitfast::{name}")(_with_defaults(fake, defaults))
    LIB.impl(name, _with_defaults(cuda, defaults), "CUDA")
    if cpu is not None:
        LIB.impl(name, _with_defaults(cpu, defaults), "CPU")
    _autograd.AUTOCAST_KEEP[name] = tuple(i for i, a in enumerate(arguments) if a.name == "gate")
    for device in ("cpu", "cuda"):
        register_autocast_fp32(LIB, name, device)
    return _python_entry(name, arguments, entry or standard_entry(name), doc)
