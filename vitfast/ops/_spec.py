"""One spec per op: `define_op(schema, ...)` defines `torch.ops.vitfast.<op>` and everything derived from its schema.

The schema string is the one place an op's argument list is written.  From it `define_op`
- defines the op on the `vitfast` library and registers its fake impl (shape/dtype propagation, so
  `torch.compile(fullgraph=True)` and `torch.export` trace it), its CUDA impl, an optional Python CPU impl (the C++
  ones register themselves from `vitfast._C`) and the autocast rule (`_autocast.py`);
- completes the trailing defaults the dispatcher leaves out, so impls take every argument positionally;
- builds the Python entry `vitfast.ops.<op>` with the schema's signature: the reference under
  VITFAST_BACKEND=reference, else the op, recorded for autograd with the reference's gradient when needed.

Scalar arguments: the dispatcher converts them before any impl sees them, and generously (pybind11: None, 2 or 0.5
become a `bool`, True or np.float32(2.0) an `int`, a one-element tensor a `float`), so no impl can refuse what the
reference refuses.  The Python entry therefore runs the op's argument check (`check_<op>_args`, the reference's)
first whenever a scalar is not of its plain Python type, and when the dispatcher itself refuses an argument ("Expected
a value of type ..."), it raises the reference's message for it instead: the entry accepts and refuses what the
reference does, with its words.  Direct `torch.ops.vitfast.<op>` calls keep the dispatcher's conversion.

The Python impls run below autograd, as the C++ ones do: an impl that recorded its torch calls for autograd gave
direct `torch.ops` calls a gradient on some paths (a closed gate's copy, the reference at the CPU key) and none on
others, and failed opcheck's autograd-registration test.  Autograd belongs to the Autograd key: the entry's
reference gradient (`_autograd.py`), or an op's own formula (`gate_select`).
"""
from __future__ import annotations

import sys
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


_IS_COMPILING = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)  # torch >= 2.3


def _onnx_export_flag() -> Callable[[], bool] | None:
    """A reader of torch's "ONNX export in progress" flags, once torch.onnx is imported (None before).

    The TorchScript exporter's flag is read only outside torch.compile / torch.export: that exporter never runs
    under dynamo, and dynamo refuses to trace the flag's getter (fullgraph=True failed on it)."""
    if "torch.onnx" not in sys.modules:
        return None
    try:  # torch >= 2.9: the two flags torch.onnx.is_in_onnx_export reads, read directly (it costs ~0.9 µs a call)
        from torch.onnx._internal.exporter import _flags
        from torch.onnx._internal.torchscript_exporter._globals import GLOBALS
    except ImportError:  # other layouts: the public function (which covers only the TorchScript exporter there)
        return lambda: not _IS_COMPILING() and torch.onnx.is_in_onnx_export()
    return lambda: _flags._is_onnx_exporting or (not _IS_COMPILING() and GLOBALS.in_onnx_export)


_export_flag: Callable[[], bool] | None = None


def onnx_exporting() -> bool:
    """Whether `torch.onnx.export` is tracing, with either exporter (TorchScript, or dynamo=True where torch's flag
    covers it, as in torch 2.14; older versions were not run).  The ops then run their reference (plain torch ops,
    which both exporters map to standard ONNX operators): a `vitfast::*` node had no ONNX translation, so exporting
    a fused model failed."""
    global _export_flag
    if _export_flag is None:
        _export_flag = _onnx_export_flag()
        if _export_flag is None:  # torch imports torch.onnx lazily: no export has begun before it is imported
            return False
    return _export_flag()


def use_reference() -> bool:
    """Whether the ops' entries run the reference: VITFAST_BACKEND=reference, or an ONNX export in progress."""
    return get_backend() == "reference" or onnx_exporting()


def standard_entry(name: str) -> Callable:
    """The Python entry's body for most ops: the reference or the op (see `run`)."""
    def entry(args):
        if use_reference():
            return call_reference(name, args)
        return run(name, args)

    return entry


def below_autograd(fn: Callable) -> Callable:
    """A Python impl for a backend key, run with the autograd keys excluded (as the dispatcher's own autograd
    kernels redispatch): its torch calls record nothing, the Autograd key decides about gradients (module doc)."""
    def kernel(*args):
        with torch._C._AutoDispatchBelowAutograd():
            return fn(*args)

    return kernel


def _with_defaults(fn: Callable, defaults: tuple) -> Callable:
    """`fn` called with every argument: the dispatcher passes a Python kernel only those up to the last one given."""
    count = len(defaults)

    def kernel(*args):
        return fn(*args, *defaults[len(args):]) if len(args) < count else fn(*args)

    return kernel


# Per schema scalar type, the test that a value is its plain Python type (the dispatcher passes it on unchanged).
# An int for a float goes through the check: it is converted, and an int beyond float range is refused.
_PLAIN_SCALAR = {"bool": "type({0}) is bool", "int": "type({0}) is int", "float": "type({0}) is float",
                 "Optional[float]": "({0} is None or type({0}) is float)", "str": "type({0}) is str"}


def _refused_by_dispatcher(error: RuntimeError, check: Callable, args: tuple) -> None:
    """When the dispatcher refused an argument's type, raise the reference's message for it instead of
    "vitfast::op() Expected a value of type 'Tensor' for argument 'w_in' but instead found type 'list'. ..."."""
    if "Expected a value of type" not in str(error):
        return
    try:
        check(*args)
    except (TypeError, ValueError) as named:
        raise named from None


def _python_entry(name: str, arguments, body: Callable, check: Callable, doc: str) -> Callable:
    """`def <name>(<the schema's arguments and defaults>): return body((<arguments>,))`, written out as source (as
    dataclasses write __init__) so a call costs one frame, keyword calls work and help() shows the signature.
    Before it, `check(<arguments>)` when a scalar argument is not of its plain type; around it, the reference's
    message when the dispatcher refuses an argument (module doc)."""
    params = ", ".join(f"{a.name}={a.default_value!r}" if a.has_default_value() else a.name for a in arguments)
    names = "".join(a.name + ", " for a in arguments)
    plain = [_PLAIN_SCALAR[str(a.type)].format(a.name) for a in arguments if str(a.type) in _PLAIN_SCALAR]
    guard = f"    if not ({' and '.join(plain)}):\n        check({names})\n" if plain else ""
    namespace = {"body": body, "check": check, "refused": _refused_by_dispatcher}
    exec(f"def {name}({params}):\n{guard}"
         f"    try:\n        return body(({names}))\n"
         f"    except RuntimeError as error:\n        refused(error, check, ({names}))\n        raise\n", namespace)
    fn = namespace[name]
    fn.__module__, fn.__doc__ = "vitfast.ops", doc
    fn.__annotations__ = {**{a.name: _PY_TYPES[str(a.type)] for a in arguments}, "return": torch.Tensor}
    return fn


def define_op(schema: str, *, check: Callable, fake: Callable, cuda: Callable, doc: str,
              cpu: Optional[Callable] = None, entry: Optional[Callable] = None) -> Callable:
    """Define `torch.ops.vitfast.<op>` from `schema` with its impls (each taking every argument positionally);
    return the Python entry, whose body is `entry(args)` (default: `standard_entry`).  `check`: the op's argument
    check (`check_<op>_args`, taking every argument positionally), which the entry runs for scalars the dispatcher
    would convert (module doc)."""
    name = schema.split("(", 1)[0]
    LIB.define(schema)
    SCHEMAS[name] = schema
    arguments = getattr(torch.ops.vitfast, name).default._schema.arguments
    defaults = tuple(a.default_value if a.has_default_value() else None for a in arguments)
    register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract
    register_fake(f"vitfast::{name}")(_with_defaults(fake, defaults))
    LIB.impl(name, below_autograd(_with_defaults(cuda, defaults)), "CUDA")
    if cpu is not None:
        LIB.impl(name, below_autograd(_with_defaults(cpu, defaults)), "CPU")
    _autograd.AUTOCAST_KEEP[name] = tuple(i for i, a in enumerate(arguments) if a.name == "gate")
    for device in ("cpu", "cuda"):
        register_autocast_fp32(LIB, name, device)
    return _python_entry(name, arguments, entry or standard_entry(name), check, doc)
