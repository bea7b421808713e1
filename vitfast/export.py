"""ONNX export of (fused) vitfast models with standard ONNX ops, checked in ONNX Runtime.

    from vitfast.export import to_onnx
    report = to_onnx(vitfast.load("fused.safetensors"), "model.onnx")        # dynamic batch axis
    print(report.max_abs_diff)                                               # ORT vs vitfast's own output

How it works
------------
1. The model is traced with vitfast's backend switched to "reference" (`vitfast.set_backend`): fused modules
   then run plain PyTorch ops (F.linear, F.gelu, scaled_dot_product_attention, ...), which every exporter
   maps to standard ONNX operators.  No `vitfast::*` custom op reaches the graph; this is checked, and a
   node in any non-standard domain is an error (`ExportError`), not a file that only vitfast could run.
   A plain `torch.onnx.export(model, ...)` of a fused model gives the same graph, with either exporter: while
   torch's "ONNX export in progress" flag is set (`vitfast.ops.onnx_exporting`), the ops' entries run their
   reference.
2. The exported file is checked before it is put in place: `onnx.checker`, then ONNX Runtime (CPU) runs it on
   random images at two batch sizes (1 and 3 for a dynamic batch axis, so the axis is really exercised) and
   its output is compared with the model's own forward on the backend it normally uses (the C++ kernels
   on CPU).  max |Δ| must stay within `atol + rtol * max|output|`, else `ExportMismatchError` (the report
   is attached) and nothing is written at `path`.
3. The file is written atomically: a temporary name in the target directory, `os.replace` after the check.  A
   full disk or a read-only directory raises an OSError naming `path` (not an ExportError: no exporter is to blame).

onnx, onnxruntime and onnxscript are optional (`pip install 'vitfast[export]'`); without one, `to_onnx` raises
`MissingExportPackagesError` (an ImportError) with one line naming the extra, and `vitfast export` prints it.

Exporter choice (`exporter="auto"`)
-----------------------------------
Both of torch's exporters were tried with torch 2.14 (onnx 1.23, onnxruntime 1.32, the only torch installed here:
torch 2.4 itself was not run): on fused DeiT-Ti and tiny test models both produce standard-op graphs that ONNX
Runtime runs within ~1e-6 of vitfast; fused DeiT-S/B went through the TorchScript exporter in `vitfast bench`
(max |Δ| ~4e-6).

* TorchScript (`torch.onnx.export(..., dynamo=False)`): in torch since 1.2, so in all of 2.4..2.14 (deprecated
  since 2.9, where it warns), exports DeiT-Ti in ~3 s, opset 17 (LayerNormalization) by default, dynamic batch
  through `dynamic_axes`.
* torch.export-based (`dynamo=True`): from torch 2.5 (its tutorial: "PyTorch 2.5.0 or newer is required"; torch
  2.4's `dynamo=True` is the older dynamo_export, without `dynamic_shapes`, and is not used), needs onnxscript,
  took ~12 s for DeiT-Ti (3-4x longer), opset 18 by default, dynamic batch through `dynamic_shapes`.

"auto" therefore uses the TorchScript exporter where torch still has it (the one path that exists on the
whole supported range, torch>=2.4) and the torch.export-based one otherwise or if the TorchScript export
raises; the report records which one produced the file.  ONNX Runtime ran the two DeiT-Ti graphs at about the
same speed (38 vs 41 ms, batch 1, one thread, one noisy run; the TorchScript graph the faster).
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from .io.atomic import atomic_write, os_error_of
from .onnx_qdq import ort_int8_saturates
from .reference._int8 import WEIGHT_QMAX

__all__ = ["to_onnx", "ExportReport", "ExportError", "ExportMismatchError", "model_input_shape",
           "check_standard_ops", "ort_session", "reference_backend", "STANDARD_DOMAINS", "EXPORTERS",
           "MissingExportPackagesError", "require_export_packages"]

# Operator domains of the ONNX standard (the empty string is "ai.onnx").
STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})
EXPORTERS = ("auto", "torchscript", "dynamo")
DEFAULT_OPSET = {"torchscript": 17, "dynamo": 18}  # 17: first opset with LayerNormalization


# The optional packages export needs (the `export` extra): onnx (checker, load), onnxruntime (the check),
# onnxscript (torch's dynamo=True exporter, and "auto"'s fallback).
EXPORT_PACKAGES = ("onnx", "onnxruntime", "onnxscript")
MISSING_PACKAGES_MESSAGE = "vitfast export needs onnx, onnxruntime and onnxscript: pip install 'vitfast[export]'"


class MissingExportPackagesError(ImportError):
    """An optional package of the `export` extra is not installed (one line naming the extra)."""


def require_export_packages() -> None:
    """MissingExportPackagesError unless onnx, onnxruntime and onnxscript are installed.  Looked up, not imported
    (onnxscript alone takes ~1.5 s to import): a missing one surfaced as a raw ModuleNotFoundError traceback from
    deep inside an export."""
    missing = [name for name in EXPORT_PACKAGES if _find_spec(name) is None]
    if missing:
        raise MissingExportPackagesError(f"{MISSING_PACKAGES_MESSAGE} (missing: {', '.join(missing)})")


def _find_spec(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a broken entry in sys.modules (no __spec__): not usable either
        return None


class ExportError(RuntimeError):
    """The model could not be exported to a standard-op ONNX graph."""


class ExportMismatchError(RuntimeError):
    """ONNX Runtime's output of the exported graph differs from the model's own beyond the tolerance."""

    def __init__(self, message: str, report: "ExportReport") -> None:
        super().__init__(message)
        self.report = report


@dataclass
class ExportReport:
    path: str
    exporter: str               # "torchscript" | "dynamo": the one that produced the file
    opset: int
    input_shape: Tuple[int, ...]  # one image (C, H, W)
    dynamic_batch: bool
    batch: Optional[int]        # the fixed batch size, None when dynamic
    checked_batches: List[int]
    max_abs_diff: float         # ORT vs the model's own output, over the checked batches
    max_abs_output: float
    tolerance: float            # atol + rtol * max_abs_output
    op_types: List[str]
    nodes: int
    bytes: int
    seconds: float
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def reference_backend() -> Iterator[None]:
    """Run fused modules on vitfast.reference (plain torch ops) inside the block; restores the previous backend."""
    from ._env import get_backend, set_backend

    previous = get_backend()
    set_backend("reference")
    try:
        yield
    finally:
        set_backend(previous)


def model_input_shape(model: nn.Module) -> Tuple[int, int, int]:
    """(C, H, W) of one input image, read from a timm model's patch embedding."""
    patch_embed = getattr(model, "patch_embed", None)
    size = getattr(patch_embed, "img_size", None)
    proj = getattr(patch_embed, "proj", None)
    if size is None or proj is None or not hasattr(proj, "in_channels"):
        raise ValueError(
            f"input_shape: could not read the input size from {type(model).__name__} (no timm patch_embed with "
            "img_size and proj); pass input_shape=(C, H, W)"
        )
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    return int(proj.in_channels), int(h), int(w)


def _nodes(graph) -> Iterator[Any]:
    """Every node of an ONNX graph, including those in subgraphs (If/Loop/Scan bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g is not None and len(attr.g.node):
                yield from _nodes(attr.g)
            for g in attr.graphs:
                yield from _nodes(g)


def check_standard_ops(model_proto) -> List[str]:
    """Sorted op types of an ONNX model; ExportError if any node (or local function body) uses a custom domain."""
    custom = sorted({f"{n.domain}::{n.op_type}" for n in _nodes(model_proto.graph) if n.domain not in STANDARD_DOMAINS})
    for function in model_proto.functions:
        custom += sorted({f"{n.domain}::{n.op_type}" for n in function.node if n.domain not in STANDARD_DOMAINS})
    if custom:
        raise ExportError(
            f"exported graph: expected only standard ONNX operators (domains {sorted(STANDARD_DOMAINS)}), "
            f"got custom-domain nodes {sorted(set(custom))}"
        )
    return sorted({n.op_type for n in _nodes(model_proto.graph)})


def ort_session(path: str, threads: Optional[int] = None, *, spinning: bool = True, optimize: bool = True):
    """An ONNX Runtime CPU session: all graph optimisations (none with optimize=False: each node runs as ONNX defines
    it, e.g. a QDQ pair is not fused into an int8 kernel), intra-op threads = `threads`, one inter-op thread."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    if threads is not None:
        options.intra_op_num_threads = int(threads)
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _check_output_path(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ValueError(f"path: expected a file path in an existing directory, got {path!r} ({directory} does not exist)")
    if os.path.isdir(path):
        raise ValueError(f"path: expected a file path, got {path!r} (a directory)")
    return path


def _has_torchscript_exporter() -> bool:
    try:  # torch >= 2.9 keeps it under _internal; earlier versions in torch.onnx.utils
        import torch.onnx.utils  # noqa: F401
    except Exception:
        return False
    return True


def _export_torchscript(model, x, path, opset, dynamic_batch) -> None:
    kwargs: Dict[str, Any] = dict(input_names=["images"], output_names=["logits"], opset_version=opset,
                                  do_constant_folding=True)
    if dynamic_batch:
        kwargs["dynamic_axes"] = {"images": {0: "batch"}, "logits": {0: "batch"}}
    import inspect

    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False
    with warnings.catch_warnings():
        # torch >= 2.9: "You are using the legacy TorchScript-based ONNX export" (a choice made knowingly, above);
        # tracer warnings about Python values baked into the trace are about shapes, fixed for one model.
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), path, **kwargs)


def _export_dynamo(model, x, path, opset, dynamic_batch) -> None:
    import inspect

    # `dynamic_shapes` marks the torch.export-based exporter (torch >= 2.5).  torch 2.4 already has `dynamo=`, but
    # there it is the older torch.onnx.dynamo_export, which takes no dynamic_shapes (TypeError) and fails on
    # current onnxscript.
    if "dynamic_shapes" not in inspect.signature(torch.onnx.export).parameters:
        raise ExportError(f"exporter='dynamo': expected torch >= 2.5 (torch.onnx.export(dynamo=True)), got torch {torch.__version__}")
    kwargs: Dict[str, Any] = dict(input_names=["images"], output_names=["logits"], opset_version=opset, dynamo=True)
    if dynamic_batch:
        kwargs["dynamic_shapes"] = ({0: torch.export.Dim("batch", min=1, max=4096)},)
    if "verbose" in inspect.signature(torch.onnx.export).parameters:
        kwargs["verbose"] = False
    with warnings.catch_warnings(), contextlib.redirect_stdout(open(os.devnull, "w")):
        warnings.simplefilter("ignore")  # progress lines and warnings of the exporter: the report says what matters
        program = torch.onnx.export(model, (x,), **kwargs)
    program.save(path)


def _file_system_error(exc: BaseException, path: str) -> Optional[OSError]:
    """The OSError (full disk, read-only, permission) writing `path` behind an exporter's exception: the exception
    itself or one it was raised from (the exporters wrap what they call).  An error about another file (one an
    exporter failed to read) is the exporter's own failure."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        found = os_error_of(exc)
        if found is not None:
            return found if found.filename in (None, path) else None
        exc = exc.__cause__
    return None


# ---------------------------------------------------------------------------------------------- to_onnx
# An int8 model's QDQ graph against its kernels: QuantizeLinear divides where the kernels multiply by the reciprocal,
# so a code can differ by one quantum (vitfast/reference/_int8_qdq.py); the check bounds the relative output error
# instead of max |Δ|.  Measured on the digits models: ~1e-3.
INT8_EXPORT_RTOL = 1e-2


def _int8_layers(model: nn.Module) -> List[str]:
    """The int8 layers of `model`; refuses one with per-token (dynamic) activation scales, which ONNX cannot express."""
    from .nn.int8 import is_int8_module

    layers = [(name, m) for name, m in model.named_modules() if is_int8_module(m)]
    dynamic = [name for name, m in layers
               if getattr(m, "act_scale", None) == 0.0 or getattr(m, "act_scale_in", None) == 0.0
               or (getattr(m, "act_scale_out", 1.0) == 0.0 and getattr(m, "active_features", 0) > 0)]
    dynamic += [name for name, m in model.named_modules() if m.__dict__.get("int8_attention")]  # per-token Q, K, P
    if dynamic:
        raise ValueError(f"model: int8 layers with per-token (dynamic) activation scales have no ONNX operator "
                         f"({len(dynamic)} layers, e.g. {dynamic[0]}); export the fp32 model, or quantize with "
                         f"activations='static' (calibrated scales; attention='fp32', its default there) to export a QDQ graph")
    bf16 = [name for name, m in model.named_modules() if m.__dict__.get("bf16_attention")]
    if bf16:
        raise ValueError(f"model: {len(bf16)} attentions compute on bf16 operands (e.g. {bf16[0]}, quantize(..., "
                         f"attention='bf16')), which ONNX has no operator for; quantize with attention='fp32' to "
                         f"export a QDQ graph")
    return [name for name, _ in layers]


def _compare(session, model, shape, batches, rng_state, *report_args) -> Tuple[float, float, float]:
    """(max |Δ|, max |output|, relative L2 error) of `session` against `model` on random batches drawn from a
    generator in `rng_state`; raises ExportMismatchError (with a report built from `report_args`) on a wrong output
    shape."""
    g = torch.Generator()
    g.set_state(rng_state)
    input_name = session.get_inputs()[0].name
    max_diff, max_out, err2, ref2 = 0.0, 0.0, 0.0, 0.0
    for b in batches:
        xb = torch.randn(b, *shape, generator=g, dtype=torch.float32)
        with torch.no_grad():
            ref = model(xb)
        got = torch.from_numpy(session.run(None, {input_name: xb.numpy()})[0])
        if tuple(got.shape) != tuple(ref.shape):
            path, used, opset, dynamic_batch, fixed, atol, rtol, op_types, nodes, t0, notes = report_args
            raise ExportMismatchError(
                f"exported graph: output shape {tuple(got.shape)} at batch {b}, expected {tuple(ref.shape)}",
                _report(path, used, opset, shape, dynamic_batch, fixed, batches, float("inf"), max_out, atol, rtol,
                        op_types, nodes, 0, t0, notes))
        err2 += float((got.double() - ref.double()).pow(2).sum())
        ref2 += float(ref.double().pow(2).sum())
        diff = float((got - ref).abs().max())
        max_diff = max(max_diff, diff) if diff == diff else float("nan")
        max_out = max(max_out, float(ref.abs().max()))
    rel_err = (err2 / ref2) ** 0.5 if ref2 > 0 else (0.0 if err2 == 0 else float("inf"))
    return max_diff, max_out, rel_err


def to_onnx(
    model: nn.Module,
    path: Union[str, os.PathLike],
    *,
    input_shape: Optional[Sequence[int]] = None,
    batch: Union[str, int] = "dynamic",
    opset: Optional[int] = None,
    exporter: str = "auto",
    check: bool = True,
    atol: float = 1e-4,
    rtol: float = 1e-4,
    seed: int = 0,
) -> ExportReport:
    """Export `model` (a fused vitfast model, or any timm ViT) to ONNX at `path`, then check it in ONNX Runtime.

    input_shape: one image (C, H, W); default: read from the model's patch embedding.
    batch: "dynamic" (a symbolic batch axis named "batch") or a fixed positive int.
    opset: ONNX opset (default: 17 for the TorchScript exporter, 18 for the torch.export-based one).
    exporter: "auto" | "torchscript" | "dynamo" (see the module docstring).
    check: run the export in ONNX Runtime against the model's own forward (kernels) and raise
        `ExportMismatchError` if max |Δ| > atol + rtol * max|output|.  Without it, only `onnx.checker` runs
        and max_abs_diff is NaN.
    Raises ValueError/TypeError for bad arguments (naming them), ExportError when no standard-op graph results,
    MissingExportPackagesError (an ImportError) when onnx, onnxruntime or onnxscript is not installed.
    """
    import time

    require_export_packages()
    import onnx

    t0 = time.perf_counter()
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    path = _check_output_path(path)
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter: expected one of {EXPORTERS}, got {exporter!r}")
    if batch == "dynamic":
        dynamic_batch, fixed = True, None
    elif isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1:
        dynamic_batch, fixed = False, batch
    else:
        raise ValueError(f"batch: expected 'dynamic' or a positive int, got {batch!r}")
    if opset is not None and (isinstance(opset, bool) or not isinstance(opset, int) or not 14 <= opset <= 23):
        raise ValueError(f"opset: expected an int in [14, 23] (17+ keeps LayerNormalization one node), got {opset!r}")
    for name, value in (("atol", atol), ("rtol", rtol)):
        # finite: an infinite tolerance turned the ONNX Runtime check off without a word
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
            raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    if not isinstance(check, bool):
        raise ValueError(f"check: expected True or False, got {check!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed: expected an int, got {seed!r}")
    raw = input_shape if input_shape is not None else model_input_shape(model)
    # ints only: 32.9 or "32" were truncated/parsed silently
    if (not isinstance(raw, (tuple, list)) or len(raw) != 3
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in raw)):
        raise ValueError(f"input_shape: expected (C, H, W), three positive ints, got {raw!r}")
    shape = tuple(int(s) for s in raw)
    params = next(iter(model.parameters()), None)
    if params is not None and (params.device.type != "cpu" or params.dtype != torch.float32):
        raise ValueError(f"model: expected float32 parameters on the CPU for ONNX export, got {params.dtype} on "
                         f"{params.device} (call .float().cpu() first)")

    int8 = _int8_layers(model)
    from .nn.int8 import max_weight_code

    was_training = model.training
    model.eval()
    g = torch.Generator().manual_seed(seed)
    trace_batch = fixed if fixed is not None else 2  # not 1: a size-1 axis invites the tracer to specialise it
    x = torch.randn(trace_batch, *shape, generator=g, dtype=torch.float32)
    candidates = [exporter] if exporter != "auto" else (
        ["torchscript", "dynamo"] if _has_torchscript_exporter() else ["dynamo"])
    notes: List[str] = []
    # USDC gated models export with either exporter: under an export the gates' ops run their reference, which
    # selects on the device (Where), so the graph decides per batch (the TorchScript trace once froze the
    # trace-time decisions of a host-side branch, and then failed on the LayerNorm width with a dynamic batch).
    result: Dict[str, ExportReport] = {}

    def write(tmp: str) -> None:
        # Runs inside atomic_write: any exception (export failure, mismatch) removes the temporary file and
        # leaves whatever was at `path` untouched.
        used = None
        for name in candidates:
            chosen_opset = opset if opset is not None else DEFAULT_OPSET[name]
            try:
                with torch.no_grad(), reference_backend():
                    (_export_torchscript if name == "torchscript" else _export_dynamo)(
                        model, x, tmp, chosen_opset, dynamic_batch)
                used = name
                break
            except ExportError:
                raise
            except Exception as exc:  # an exporter's own failure: try the next one, keep the reason
                disk = _file_system_error(exc, tmp)
                if disk is not None:  # the disk's failure, not the exporter's: the next one would fail too
                    if disk is exc:
                        raise
                    raise disk from exc
                notes.append(f"{name} exporter failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                if len(candidates) == 1 or name == candidates[-1]:
                    raise ExportError(f"model: could not be exported to ONNX ({'; '.join(notes)})") from exc
        proto = onnx.load(tmp)
        if int8:  # the quantized weights as int8 initializers, not fp32 constants through QuantizeLinear
            from .onnx_qdq import fold_weight_quantize

            if fold_weight_quantize(proto):
                onnx.save(proto, tmp)
        onnx.checker.check_model(proto)
        op_types = check_standard_ops(proto)
        actual_opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), chosen_opset)
        if opset is not None and actual_opset != opset:
            # The torch.export-based exporter writes opset 18+ and converts down only for some graphs: it
            # once returned opset 18 for a requested 14 with nothing but a torch warning.
            raise ExportError(f"opset: expected the file to have opset {opset}, the {used} exporter wrote "
                              f"{actual_opset} (the torchscript exporter writes the requested opset)")
        inputs = proto.graph.input
        if len(inputs) != 1:
            raise ExportError(f"exported graph: expected one input (the images), got {len(inputs)}")
        dim0 = inputs[0].type.tensor_type.shape.dim[0]
        if dynamic_batch and not dim0.dim_param:
            raise ExportError(f"exported graph: expected a symbolic batch axis, got a fixed size {dim0.dim_value}")
        nodes = sum(1 for _ in _nodes(proto.graph))
        del proto

        checked: List[int] = [1, 3] if dynamic_batch else [fixed]
        max_diff, max_out, rel_err = float("nan"), 0.0, 0.0
        rng = g.get_state()  # both checks below see the same images
        if check:
            max_diff, max_out, rel_err = _compare(ort_session(tmp), model, shape, checked, rng, path, used,
                                                  actual_opset, dynamic_batch, fixed, atol, rtol, op_types, nodes,
                                                  t0, notes)
        else:
            checked = []
        if (check and int8 and not rel_err <= INT8_EXPORT_RTOL
                and max_weight_code(model) > WEIGHT_QMAX[7] and ort_int8_saturates()):
            # ONNX Runtime's fused int8 GEMM saturates 8-bit weights on this CPU (vitfast/onnx_qdq.py): check the
            # graph by ONNX's definition instead — unfused, DequantizeLinear then an fp32 MatMul — and say so.
            fused = rel_err
            max_diff, max_out, rel_err = _compare(ort_session(tmp, optimize=False), model, shape, checked, rng,
                                                  path, used, actual_opset, dynamic_batch, fixed, atol, rtol,
                                                  op_types, nodes, t0, notes)
            if rel_err <= INT8_EXPORT_RTOL:
                saturated = (f"ONNX Runtime's int8 GEMM on this CPU (x86 without VNNI) saturates 8-bit weights: its "
                             f"optimised session is {fused:.1e} (relative) off the model; the graph itself agrees "
                             f"({rel_err:.1e}, checked unfused); quantize with weight_bits=7 for an export ONNX "
                             f"Runtime runs exactly on such CPUs")
                notes.append(saturated)
                warnings.warn(saturated, RuntimeWarning, stacklevel=4)  # write, atomic_write, to_onnx
        report = _report(path, used, actual_opset, shape, dynamic_batch, fixed, checked, max_diff, max_out, atol,
                         rtol, op_types, nodes, os.path.getsize(tmp), t0, notes)
        if check and int8 and not rel_err <= INT8_EXPORT_RTOL:  # NaN fails too
            raise ExportMismatchError(
                f"exported graph: ONNX Runtime's output differs from the int8 model's: relative error "
                f"{rel_err:.3e}, expected <= {INT8_EXPORT_RTOL:g} (QDQ rounding differs from the kernels' by at most "
                f"a quantum); nothing written at {path!r}", report)
        if check and not int8 and not max_diff <= report.tolerance:  # NaN fails too
            raise ExportMismatchError(
                f"exported graph: ONNX Runtime's output differs from the model's: max |Δ| = {max_diff:.3e}, "
                f"expected <= {report.tolerance:.3e} (atol {atol:g} + rtol {rtol:g} x max|output| {max_out:.3g}); "
                f"nothing written at {path!r}", report)
        result["report"] = report

    try:
        atomic_write(path, write)
        return result["report"]
    finally:
        model.train(was_training)


def _report(path, exporter, opset, shape, dynamic, fixed, checked, max_diff, max_out, atol, rtol, op_types, nodes,
            size, t0, notes) -> ExportReport:
    import time

    return ExportReport(
        path=path, exporter=exporter, opset=int(opset), input_shape=tuple(shape), dynamic_batch=dynamic, batch=fixed,
        checked_batches=list(checked), max_abs_diff=max_diff, max_abs_output=max_out,
        tolerance=atol + rtol * max_out, op_types=op_types, nodes=nodes, bytes=int(size),
        seconds=time.perf_counter() - t0, notes=list(notes),
    )
