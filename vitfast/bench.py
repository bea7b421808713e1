"""`vitfast bench`: end-to-end latency of a timm baseline and its fused vitfast model on several runtimes.

    report = run_bench(baseline, fused, threads=(1, 2), batch_sizes=(1, 8))   # see `vitfast bench --help`
    print(format_report(report)); plot_report(report, "chart.png")

Providers (keys for `providers=` / `--providers`):

    timm       timm eager PyTorch (the baseline, random weights)
    compile    the baseline under torch.compile (inductor, default mode; compiled again per thread count)
    ort-timm   ONNX Runtime running the baseline exported to ONNX
    ort-fused  ONNX Runtime running the fused model exported through the reference path (vitfast.export)
    vitfast    the fused model on vitfast's kernels
    reference  the fused model on vitfast.reference ops (eager PyTorch; shows what the kernels add)
    timm-graph     timm eager replayed from CUDA graphs (CUDA only; vitfast.cuda_graph, one graph per batch size)
    vitfast-graph  the fused model on vitfast's kernels, replayed from CUDA graphs (CUDA only)

What a CPU user deploys instead of vitfast fp32, all on the SAME fused graph (the ONNX file ort-fused runs; opt-in,
not in the defaults):

    ort-int8      ONNX Runtime on onnxruntime.quantization.quantize_dynamic(fused ONNX, weight_type=QInt8): the one
                  call with ORT's defaults (per-tensor weights, per_channel=False; activations quantized per call)
    ort-qdq       ONNX Runtime on quantize_static(fused ONNX, QDQ format, per-channel QInt8 weights, QInt8
                  activations = ORT's S8S8 default), calibrated (MinMax) on the bench's own input batches
    openvino-f32  OpenVINO (CPU) on the fused ONNX, INFERENCE_PRECISION_HINT=f32
    openvino      OpenVINO on the fused ONNX at its default precision (bf16 on CPUs with AVX512_BF16/AMX; the
                  precision it compiled to is read back with compiled_model.get_property and reported)
                  Both: INFERENCE_NUM_THREADS = threads, PERFORMANCE_HINT=LATENCY, NUM_STREAMS=1.
    vitfast-int8  vitfast.quantize(copy of the fused model, dtype="int8") on vitfast's kernels
    vitfast-bf16  vitfast.quantize(copy of the fused model, dtype="bf16") on vitfast's kernels
                  (run_bench(quantize=vitfast.quantize): this module sits below the package's front and does not
                  import it; `vitfast bench` passes it where this vitfast has it)

A provider whose optional package is missing (onnxruntime, openvino, vitfast.quantize) is skipped with a one-line
reason (report["skipped"], printed as SKIPPED); it is not a failure.

What is measured, per (threads, batch):
* latency: every provider is warmed up (at least one untimed call: compiles, ORT's first run), then the
  timed calls are interleaved — one call of each provider per round, the order rotated every round — so load
  from other processes slows all providers alike instead of whichever happened to run during a busy moment.
  Reported: median, p10 and p90 over the rounds, images/s = batch / median.
* GFLOP per forward: PyTorch's FlopCounterMode (matmuls, convolutions, attention; 2 FLOPs per multiply-add;
  norms, GELU and softmax not counted), on one image, times the batch.  The fused model is counted on its
  reference path (plain torch ops, the same arithmetic as the kernels), so the count does not depend on which
  ops have FLOP formulas.  Providers that run the same graph share its count: timm/compile/ort-timm the
  baseline's, vitfast/reference/ort-fused the fused model's.
* floor: FLOPs / the machine's fp32 GEMM rate, measured in the same run at the same thread count just before
  and just after the rounds of that (threads, batch) (torch.mm of 2048x2048 fp32, median of those calls).
  "% floor" = floor / median latency = achieved GFLOP/s as a share of sgemm GFLOP/s.
* speed-up: timm eager's median / the provider's median, both from the same rounds.
* paired speed-up vs an anchor (ort-fused, ort-int8, ort-qdq, openvino-f32, openvino; those timed): the median
  and p10-p90 of the per-round ratios anchor time / provider time.  Both calls of a ratio ran in the same round,
  so a slow phase of the host (this project's shared machines drift by 30% between minutes) scales both and
  cancels, where the ratio of two medians keeps whatever drift fell unevenly on the two lists.  Above 1.00: faster
  than that runtime on the same fused graph; the p10-p90 says whether 1.00 is inside the round-to-round spread.
  Every row also names the fastest anchor of its (threads, batch) (smallest median) and its paired ratio to it; a
  vitfast row below 1.00 is marked SLOWER in the table.  ("paired_vs_ort_fused" is kept: = paired_vs["ort-fused"].)
* accuracy (the fused-graph providers other than vitfast itself): on the bench's own inputs (every timed batch,
  at the first thread count), ‖y − y_fp32‖ / ‖y_fp32‖ over all logits and the share of images whose top-1
  class (argmax) agrees, where y_fp32 is the fused model's fp32 output on vitfast's kernels.

The ONNX exports are checked against their PyTorch source in ONNX Runtime (`vitfast.export.to_onnx`); their
max |Δ| goes into the report.  Torch providers run under torch.set_num_threads(threads); ORT sessions use
intra_op_num_threads = threads, inter_op_num_threads = 1, all graph optimisations.
"""
from __future__ import annotations

import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .io.atomic import atomic_write

__all__ = ["PROVIDERS", "DEFAULT_PROVIDERS", "ANCHORS", "TABLE_ANCHORS", "ProviderSkipped", "cpu_only", "DTYPES",
           "SCHEMA", "run_bench", "format_report", "plot_report", "sgemm_gflops",
           "parse_providers", "paired_speedups"]

SCHEMA = "vitfast.bench/1"
# key -> (label, which model's FLOPs it runs)
PROVIDERS: Dict[str, Tuple[str, str]] = {
    "timm": ("timm eager", "baseline"),
    "compile": ("timm torch.compile", "baseline"),
    "ort-timm": ("ORT timm", "baseline"),
    "ort-fused": ("ORT fused", "fused"),
    "vitfast": ("vitfast fused (kernels)", "fused"),
    "reference": ("vitfast fused (reference ops)", "fused"),
    "timm-graph": ("timm eager, CUDA graph", "baseline"),
    "vitfast-graph": ("vitfast fused, CUDA graph", "fused"),
    "ort-int8": ("ORT int8 dynamic", "fused"),
    "ort-qdq": ("ORT int8 QDQ static", "fused"),
    "openvino-f32": ("OpenVINO f32", "fused"),
    "openvino": ("OpenVINO default", "fused"),
    "vitfast-int8": ("vitfast int8", "fused"),
    "vitfast-bf16": ("vitfast bf16", "fused"),
}
# the runtimes a user would deploy instead of vitfast on the same fused graph: rows get paired ratios against them
ANCHORS = ("ort-fused", "ort-int8", "ort-qdq", "openvino-f32", "openvino")
# the anchors format_report gives a column of their own (the others are in the JSON and the "fastest anchor" column)
TABLE_ANCHORS = ("ort-fused", "ort-int8", "openvino")
# providers that read the fused model's ONNX export (one export, shared)
_FROM_FUSED_ONNX = ("ort-fused", "ort-int8", "ort-qdq", "openvino-f32", "openvino")
# CPU-only runtimes
_CPU_ONLY_PREFIXES = ("ort-", "openvino")
# whose output is compared with the fused fp32 model's (report["accuracy"])
_ACCURACY = ("reference",) + _FROM_FUSED_ONNX + ("vitfast-int8", "vitfast-bf16")
DEFAULT_PROVIDERS = ("timm", "compile", "ort-timm", "ort-fused", "vitfast")
SGEMM_N = 2048


def cpu_only(key: str) -> bool:
    """ONNX Runtime and OpenVINO providers run on the CPU only."""
    return key.startswith(_CPU_ONLY_PREFIXES)


class ProviderSkipped(Exception):
    """A provider that cannot run here for want of an optional package (reported as skipped, not as a failure)."""


def parse_providers(text: str) -> List[str]:
    """'timm,vitfast' -> ['timm', 'vitfast'] (ValueError naming --providers on an unknown key)."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in PROVIDERS]
    if not keys or unknown:
        raise ValueError(f"--providers: expected a comma-separated subset of {','.join(PROVIDERS)}, got {text!r}")
    return list(dict.fromkeys(keys))


def _quantiles(values: Sequence[float]) -> Tuple[float, float, float]:
    """(median, p10, p90)."""
    values = sorted(values)
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=10, method="inclusive")
    return statistics.median(values), q[0], q[-1]


def paired_speedups(reference: Sequence[float], times: Sequence[float]) -> Tuple[float, float, float]:
    """(median, p10, p90) of reference[r] / times[r] over the rounds r: both calls of a round ran back to back, so
    load that slows a round slows both."""
    if len(reference) != len(times) or not times:
        raise ValueError(f"times: expected one time per round of the reference ({len(reference)}), got {len(times)}")
    return _quantiles([a / b for a, b in zip(reference, times)])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# dtypes the models can be timed in, and their short names in the report
DTYPES: Dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_SHORT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def sgemm_gflops(device: torch.device, calls: int = 3, n: int = SGEMM_N, dtype: torch.dtype = torch.float32) -> List[float]:
    """GFLOP/s of `calls` torch.mm calls on n×n matrices of `dtype` (fp32 by default) at the current thread count
    (one untimed call first)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.mm(a, b)
    rates = []
    for _ in range(calls):
        _sync(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        rates.append(2 * n**3 / (time.perf_counter() - t0) / 1e9)
    return rates


def _has_gates(model: nn.Module) -> bool:
    from .nn.gated import FusedGatedBlock

    return any(isinstance(m, FusedGatedBlock) for m in model.modules())


def _flops(baseline: nn.Module, fused: nn.Module, shape: Sequence[int]) -> Dict[str, int]:
    from .measure import flops_per_image

    return {"baseline": flops_per_image(baseline, shape), "fused": flops_per_image(fused, shape)}


def machine_info() -> Dict[str, Any]:
    """The CPU (model name, cores, the CPU path vitfast runs) and the software versions, as reports record them."""
    from . import ops
    from ._version import __version__

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    versions = {"python": platform.python_version(), "torch": torch.__version__, "vitfast": __version__}
    for name in ("timm", "onnx", "onnxruntime"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    try:  # the installed distribution's version: importing openvino only for this costs ~0.3 s per report
        from importlib.metadata import PackageNotFoundError, version

        versions["openvino"] = version("openvino")
    except (ImportError, PackageNotFoundError):
        versions["openvino"] = None
    from ._threads import wait_policy

    # The OpenMP wait policy changes multi-thread latency by 1.5x on quiet cores and 10x on busy ones
    # (docs/performance.md#threads): a figure without it cannot be compared.
    return {"cpu": cpu, "cores": os.cpu_count(), "cpu_isa": ops.cpu_isa(),
            "extension_loaded": ops.extension_loaded(), "omp_wait_policy": wait_policy(), "versions": versions}


class _Provider:
    """One runtime: `prepare(threads)` once per thread count (sessions, compiles), then `call(batch)`."""

    def __init__(self, key: str, label: str, flops_of: str) -> None:
        self.key, self.label, self.flops_of = key, label, flops_of

    def prepare(self, threads: int) -> None:
        pass

    def warm(self, x: torch.Tensor) -> None:
        self.call(x)

    def call(self, x: torch.Tensor) -> Any:
        raise NotImplementedError

    def output(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of `x` as a CPU float32 tensor (the accuracy check; not timed)."""
        y = self.call(x)
        return (torch.from_numpy(y[0]) if isinstance(y, list) else y).detach().float().cpu()


class _Torch(_Provider):
    def __init__(self, key, label, flops_of, model: nn.Module, backend: Optional[str] = None,
                 input_dtype: Optional[torch.dtype] = None) -> None:
        super().__init__(key, label, flops_of)
        self.model, self.backend, self.input_dtype = model, backend, input_dtype

    def call(self, x):
        if self.input_dtype is not None:  # a bf16 model takes bf16 images (the conversion is timed: a user pays it)
            x = x.to(self.input_dtype)
        if self.backend is None:
            return self.model(x)
        from ._env import get_backend, set_backend

        previous = get_backend()
        set_backend(self.backend)
        try:
            return self.model(x)
        finally:
            set_backend(previous)


class _Graphed(_Torch):
    """A torch provider replayed from CUDA graphs (vitfast.cuda_graphs): the warm-up call of each batch size
    captures (under `backend`), the timed calls replay.  Launch overhead is what this removes at small batches."""

    def __init__(self, key, label, flops_of, model: nn.Module, backend: Optional[str] = None) -> None:
        from .cuda_graphs import CudaGraphModule

        super().__init__(key, label, flops_of, CudaGraphModule(model), backend)


class _Compiled(_Provider):
    """torch.compile of the baseline, compiled afresh per thread count: inductor's CPU code fixes its OpenMP
    thread count when it is generated."""

    def __init__(self, key, label, flops_of, model: nn.Module) -> None:
        super().__init__(key, label, flops_of)
        self.model, self.compiled, self.threads = model, None, None

    def prepare(self, threads):
        torch._dynamo.reset()
        self.compiled, self.threads = torch.compile(self.model), threads

    def _config(self):
        try:
            import torch._inductor.config as inductor_config

            return inductor_config.patch({"cpp.threads": self.threads})
        except Exception:  # an inductor without that option: it reads torch.get_num_threads() itself
            return contextlib.nullcontext()

    def warm(self, x):
        with self._config():
            self.compiled(x)

    def call(self, x):
        return self.compiled(x)


class _Ort(_Provider):
    def __init__(self, key, label, flops_of, path: str, spinning: bool) -> None:
        super().__init__(key, label, flops_of)
        self.path, self.spinning, self.session, self.input_name = path, spinning, None, None
        self._numpy: Dict[int, Any] = {}

    def prepare(self, threads):
        from .export import ort_session

        self.session = ort_session(self.path, threads, spinning=self.spinning)
        self.input_name = self.session.get_inputs()[0].name

    def call(self, x):
        key = id(x)
        if key not in self._numpy:  # the same buffer, viewed once (not timed again per call)
            self._numpy = {key: x.numpy()}
        return self.session.run(None, {self.input_name: self._numpy[key]})


class _OpenVINO(_Provider):
    """OpenVINO's CPU plugin on an ONNX file: compiled per thread count (INFERENCE_NUM_THREADS = threads,
    PERFORMANCE_HINT=LATENCY, NUM_STREAMS=1) at `precision` (None: the plugin's default, read back afterwards)."""

    def __init__(self, key, label, flops_of, path: str, precision: Optional[str]) -> None:
        super().__init__(key, label, flops_of)
        try:
            import openvino
        except ImportError as exc:
            raise ProviderSkipped(f"openvino is not installed (pip install openvino, or 'vitfast[bench]'): "
                                  f"{exc}") from None
        self.core = openvino.Core()
        self.model = self.core.read_model(path)
        self.precision, self.compiled, self.request, self.info = precision, None, None, {}
        self._numpy: Dict[int, Any] = {}

    def prepare(self, threads):
        config = {"INFERENCE_NUM_THREADS": int(threads), "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        if self.precision is not None:
            config["INFERENCE_PRECISION_HINT"] = self.precision
        self.request = None
        self.compiled = self.core.compile_model(self.model, "CPU", config)
        self.request = self.compiled.create_infer_request()
        import openvino

        info = {"version": openvino.__version__, "config": {k: str(v) for k, v in config.items()}}
        for name in ("INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS", "NUM_STREAMS", "PERFORMANCE_HINT",
                     "ENABLE_CPU_PINNING", "ENABLE_HYPER_THREADING"):
            try:
                value = self.compiled.get_property(name)
                # an ov.Type prints as "<Type: 'bfloat16'>": its short name ("bf16", "f32") is what the hint takes
                info[name] = value.get_type_name() if hasattr(value, "get_type_name") else str(value)
            except Exception:  # a property this version does not have
                pass
        self.info = info

    def call(self, x):
        key = id(x)
        if key not in self._numpy:
            self._numpy = {key: x.numpy()}
        return self.request.infer({0: self._numpy[key]})

    def output(self, x):
        return torch.from_numpy(self.call(x)[self.compiled.output(0)].copy()).float()


class _CalibrationReader:
    """onnxruntime.quantization.CalibrationDataReader over a list of input batches (numpy)."""

    def __init__(self, name: str, batches: Sequence[torch.Tensor]) -> None:
        self._feeds = iter([{name: b.detach().float().cpu().numpy()} for b in batches])

    def get_next(self):
        return next(self._feeds, None)


def _onnxruntime_quantization():
    try:
        import onnxruntime.quantization as quantization
    except ImportError as exc:
        raise ProviderSkipped(f"onnxruntime.quantization is not importable ({exc}): "
                              "pip install 'vitfast[export]'") from None
    return quantization


def quantize_ort_dynamic(src: str, dst: str) -> Dict[str, Any]:
    """ort-int8: quantize_dynamic with ORT's defaults but for the weight type named (QInt8): per-tensor weights
    (per_channel=False is ORT's default), activations quantized on the fly, MatMul/Gemm/... as ORT chooses."""
    q = _onnxruntime_quantization()
    t0 = time.perf_counter()
    q.quantize_dynamic(src, dst, weight_type=q.QuantType.QInt8)
    return {"call": "onnxruntime.quantization.quantize_dynamic(model, out, weight_type=QuantType.QInt8)",
            "per_channel": False, "weight_type": "QInt8", "seconds": time.perf_counter() - t0,
            "summary": "quantize_dynamic, QInt8 weights per tensor (ORT's default per_channel=False), "
                       "dynamic activations"}


def quantize_ort_static(src: str, dst: str, input_name: str, batches: Sequence[torch.Tensor]) -> Dict[str, Any]:
    """ort-qdq: quantize_static in QDQ format, per-channel QInt8 weights, QInt8 activations (S8S8, ORT's default
    and first recommendation for QDQ), MinMax calibration on `batches`."""
    q = _onnxruntime_quantization()

    class Reader(_CalibrationReader, q.CalibrationDataReader):
        pass

    t0 = time.perf_counter()
    q.quantize_static(src, dst, Reader(input_name, batches), quant_format=q.QuantFormat.QDQ, per_channel=True,
                      activation_type=q.QuantType.QInt8, weight_type=q.QuantType.QInt8,
                      calibrate_method=q.CalibrationMethod.MinMax)
    images = sum(int(b.shape[0]) for b in batches)
    return {"call": "onnxruntime.quantization.quantize_static(model, out, reader, quant_format=QDQ, per_channel=True, "
                    "activation_type=QInt8, weight_type=QInt8, calibrate_method=MinMax)",
            "per_channel": True, "weight_type": "QInt8", "activation_type": "QInt8", "calibration_images": images,
            "seconds": time.perf_counter() - t0,
            "summary": f"quantize_static QDQ, S8S8, per-channel weights, MinMax calibration on {images} bench image(s)"}


def _vitfast_quantized(fused: nn.Module, dtype: str, quantize: Optional[Callable[..., Any]]) -> nn.Module:
    """quantize(a copy of `fused`, dtype=...) (ProviderSkipped without a quantize: this vitfast has none)."""
    import copy

    if not callable(quantize):
        raise ProviderSkipped("vitfast.quantize unavailable")
    model = copy.deepcopy(fused)
    quantized = quantize(model, dtype=dtype)
    return (quantized if quantized is not None else model).eval()


def _accuracy(reference: torch.Tensor, y: torch.Tensor) -> Dict[str, Any]:
    """‖y − ref‖ / ‖ref‖, top-1 agreement and max |Δ| of logits `y` against `reference` (same shape)."""
    if y.shape != reference.shape:
        raise ValueError(f"output shape {tuple(y.shape)}, expected {tuple(reference.shape)}")
    diff = (y - reference).double()
    return {"rel_err": float(diff.norm() / reference.double().norm().clamp_min(1e-30)),
            "top1_agreement": float((y.argmax(-1) == reference.argmax(-1)).double().mean()),
            "max_abs_diff": float(diff.abs().max()), "images": int(reference.shape[0])}


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _measure_accuracy(active: Sequence[_Provider], fused: nn.Module, inputs: Mapping[int, torch.Tensor],
                      batch_sizes: Sequence[int], errors: Dict[str, str],
                      log: Callable[[str], None]) -> Dict[str, Dict[str, Any]]:
    """Each fused-graph provider's logits on every bench input against the fused model's fp32 output on vitfast's
    kernels (a provider that fails here is moved to `errors`)."""
    from ._env import get_backend, set_backend

    previous = get_backend()
    set_backend("auto")
    try:
        with torch.no_grad():
            reference = torch.cat([fused(inputs[b]).detach().float().cpu() for b in batch_sizes])
    finally:
        set_backend(previous)
    accuracy = {}
    for p in active:
        if p.key not in _ACCURACY:
            continue
        try:
            with torch.no_grad():
                y = torch.cat([p.output(inputs[b]) for b in batch_sizes])
            accuracy[p.key] = _accuracy(reference, y)
            a = accuracy[p.key]
            log(f"bench: {p.label}: rel err vs fused fp32 {a['rel_err']:.2e}, top-1 agreement "
                f"{a['top1_agreement'] * 100:.0f}% ({a['images']} images)")
        except Exception as exc:
            errors[p.key] = _reason(exc)
            log(f"bench: {p.label} left out: {errors[p.key]}")
    return accuracy


def run_bench(
    baseline: nn.Module,
    fused: nn.Module,
    *,
    input_shape: Optional[Sequence[int]] = None,
    threads: Sequence[int] = (1,),
    batch_sizes: Sequence[int] = (1, 8),
    providers: Sequence[str] = DEFAULT_PROVIDERS,
    repeats: int = 10,
    warmup: int = 2,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    workdir: Optional[str] = None,
    ort_spinning: bool = False,
    quantize: Optional[Callable[..., Any]] = None,
    meta: Optional[Mapping[str, Any]] = None,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> Dict[str, Any]:
    """Time every provider at every (threads, batch); returns the report (a JSON-ready dict, schema SCHEMA).

    baseline: the timm model (eval mode, random weights); fused: its fused vitfast model.
    dtype: what both models and the inputs are converted to: float32, or on CUDA float16 / bfloat16 (the floor then
        uses the torch.mm rate in that dtype).  ONNX Runtime providers run float32 only.
    workdir: where the ONNX files go (default: a temporary directory, removed afterwards).
    ort_spinning: let ONNX Runtime's intra-op workers spin after a run (its default).  Off here by default:
        in interleaved rounds the spinning workers hold the cores while the next provider runs (with 2 threads
        on 2 loaded cores, timm eager calls of 0.4 ms took ~200 ms right after an ORT call).  One thread has no
        workers, so it changes nothing there.
    quantize: vitfast.quantize, for the vitfast-int8 / vitfast-bf16 rows (called as quantize(copy of fused,
        dtype="int8" | "bf16"); the model it returns, or the copy when it returns None, is timed on the kernels).
        None: those rows are skipped, "vitfast.quantize unavailable".  `vitfast bench` passes the package's own.
    log: progress lines (default: stderr).  Providers that fail to build or run are reported in
    report["errors"] and left out of the results; the rest still run.
    """
    from .export import model_input_shape, to_onnx

    t_start = time.perf_counter()
    device = torch.device(device)
    providers = list(providers)
    unknown = [p for p in providers if p not in PROVIDERS]
    if not providers or unknown:
        raise ValueError(f"providers: expected a non-empty subset of {list(PROVIDERS)}, got {providers}")
    for name, values in (("threads", threads), ("batch_sizes", batch_sizes)):
        if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise ValueError(f"{name}: expected a non-empty list of positive ints, got {list(values)}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats: expected a positive int, got {repeats!r}")
    if device.type != "cpu" and any(cpu_only(p) for p in providers):
        raise ValueError(f"providers: ONNX Runtime and OpenVINO providers run on the CPU only, got {providers} with "
                         f"device {device}")
    if device.type != "cuda" and any(p.endswith("-graph") for p in providers):
        raise ValueError(f"providers: the CUDA-graph providers need device cuda, got {providers} with device {device}")
    if dtype not in _SHORT:
        raise ValueError(f"dtype: expected one of {list(DTYPES)}, got {dtype}")
    if dtype != torch.float32 and device.type != "cuda":
        # torch's half-precision CPU matmuls without bf16/fp16 hardware are emulated (one 2048³ bf16 mm took 56 s on
        # an AVX2-only CPU, fp32 0.23 s), and vitfast's CPU ops compute in fp32 anyway: no meaningful table there.
        raise ValueError(f"dtype: {dtype} timings need device cuda, got device {device} (CPU runs float32)")
    shape = tuple(input_shape) if input_shape is not None else model_input_shape(baseline)
    baseline, fused = baseline.eval().to(device), fused.eval().to(device)
    if "timm" not in providers:
        providers.insert(0, "timm")  # the speed-up reference
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    log(f"bench: input {shape}, providers {', '.join(providers)}, threads {list(threads)}, batches {list(batch_sizes)}, "
        f"{repeats} interleaved repeats after {max(1, warmup)} warm-up call(s)"
        + (f"; load average at start {load_start[0]:.2f}" if load_start else ""))

    log("bench: counting FLOPs (FlopCounterMode, one image)")
    flops = _flops(baseline, fused, shape)  # (counted in fp32: the count does not depend on the dtype)
    baseline, fused = baseline.to(dtype), fused.to(dtype)
    errors: Dict[str, str] = {}
    skipped: Dict[str, str] = {}
    exports: Dict[str, Any] = {}
    provider_info: Dict[str, Dict[str, Any]] = {}
    cleanup = None
    if workdir is None and any(cpu_only(p) for p in providers):
        cleanup = tempfile.TemporaryDirectory(prefix="vitfast-bench-")
        workdir = cleanup.name
    torch.manual_seed(0)
    inputs = {b: torch.randn(b, *shape, device=device).to(dtype) for b in batch_sizes}
    fused_onnx: Dict[str, str] = {}

    def export(key: str) -> str:
        """The ONNX file of the baseline (ort-timm) or of the fused model (every other ONNX-based provider: one
        export, shared, recorded under "ort-fused"), exported and checked on first use."""
        which = "ort-timm" if key == "ort-timm" else "ort-fused"
        if which in fused_onnx:
            return fused_onnx[which]
        source = baseline if which == "ort-timm" else fused
        path = os.path.join(workdir, f"{which}.onnx")
        log(f"bench: exporting the {'baseline' if which == 'ort-timm' else 'fused model'} to ONNX "
            f"and checking it in ONNX Runtime ({path})")
        report = to_onnx(source, path, input_shape=shape)
        exports[which] = {k: v for k, v in report.to_dict().items() if k != "path"}
        log(f"bench:   {report.exporter} exporter, opset {report.opset}, {report.nodes} nodes, "
            f"max |Δ| vs PyTorch {report.max_abs_diff:.2e} ({report.seconds:.1f} s)")
        fused_onnx[which] = path
        return path

    built: List[_Provider] = []
    try:
        for key in providers:
            label, flops_of = PROVIDERS[key]
            try:
                if key == "timm":
                    built.append(_Torch(key, label, flops_of, baseline))
                elif key == "vitfast":
                    # "auto", not the process's backend: under VITFAST_BACKEND=reference this row, labelled the
                    # kernels, timed the reference ops (the "reference" row is the one for those)
                    built.append(_Torch(key, label, flops_of, fused, backend="auto"))
                elif key == "reference":
                    built.append(_Torch(key, label, flops_of, fused, backend="reference"))
                elif key == "timm-graph":
                    built.append(_Graphed(key, label, flops_of, baseline))
                elif key == "vitfast-graph":
                    built.append(_Graphed(key, label, flops_of, fused, backend="auto"))
                elif key == "compile":
                    built.append(_Compiled(key, label, flops_of, baseline))
                elif key in ("vitfast-int8", "vitfast-bf16"):
                    dt = key.split("-")[1]
                    log(f"bench: vitfast.quantize(copy of the fused model, dtype={dt!r})")
                    model = _vitfast_quantized(fused, dt, quantize)
                    first = next(model.parameters(), None)  # a bf16 model takes bf16 images
                    low = first.dtype if first is not None and first.dtype in (torch.bfloat16, torch.float16) else None
                    built.append(_Torch(key, label, flops_of, model, backend="auto", input_dtype=low))
                elif key in ("openvino", "openvino-f32"):
                    try:
                        import openvino  # noqa: F401  (skipped before exporting anything)
                    except ImportError as exc:
                        raise ProviderSkipped(f"openvino is not installed (pip install openvino, or "
                                              f"'vitfast[bench]'): {exc}") from None
                    built.append(_OpenVINO(key, label, flops_of, export(key), "f32" if key == "openvino-f32" else None))
                elif key == "ort-int8":
                    _onnxruntime_quantization()
                    src = export(key)
                    path = os.path.join(workdir, "ort-int8.onnx")
                    log("bench: quantize_dynamic(fused ONNX, weight_type=QInt8)")
                    provider_info[key] = quantize_ort_dynamic(src, path)
                    built.append(_Ort(key, label, flops_of, path, ort_spinning))
                elif key == "ort-qdq":
                    _onnxruntime_quantization()
                    src = export(key)
                    path = os.path.join(workdir, "ort-qdq.onnx")
                    log(f"bench: quantize_static(fused ONNX, QDQ, per-channel S8S8), calibrated on the bench inputs "
                        f"(batches {list(batch_sizes)})")
                    import onnx

                    name = onnx.load(src, load_external_data=False).graph.input[0].name
                    provider_info[key] = quantize_ort_static(src, path, name, [inputs[b] for b in batch_sizes])
                    built.append(_Ort(key, label, flops_of, path, ort_spinning))
                else:
                    built.append(_Ort(key, label, flops_of, export(key), ort_spinning))
            except ProviderSkipped as exc:
                skipped[key] = str(exc)
                log(f"bench: {label} skipped: {skipped[key]}")
            except ImportError as exc:  # an optional package missing (onnx/onnxruntime/onnxscript: the export extra)
                skipped[key] = _reason(exc)
                log(f"bench: {label} skipped: {skipped[key]}")
            except Exception as exc:  # keep going: one broken runtime must not hide the others' numbers
                errors[key] = _reason(exc)
                log(f"bench: {label} left out: {errors[key]}")

        results: List[Dict[str, Any]] = []
        sgemm: List[Dict[str, Any]] = []
        configs = [(t, b) for t in threads for b in batch_sizes]
        previous_threads = torch.get_num_threads()
        accuracy: Dict[str, Dict[str, Any]] = {}
        # A gated (USDC) model's work depends on its batch (the gates decide from the batch mean): its FLOPs are
        # counted on the very inputs timed, per batch size, not on one all-zeros image (65% off once).
        fused_batch_flops = None
        if _has_gates(fused):
            from .measure import flops_of_input

            log("bench: the fused model is gated: counting its FLOPs on each timed batch")
            fused_batch_flops = {b: flops_of_input(fused, inputs[b]) for b in batch_sizes}
        step = 0
        try:
            for t in threads:
                torch.set_num_threads(t)
                active: List[_Provider] = []
                for p in built:
                    if p.key in errors:
                        continue
                    try:
                        p.prepare(t)
                        active.append(p)
                        if isinstance(p, _OpenVINO) and p.key not in provider_info:
                            provider_info[p.key] = dict(p.info, summary=(
                                f"OpenVINO {p.info.get('version', '')} CPU, inference precision "
                                f"{p.info.get('INFERENCE_PRECISION_HINT', '?')} ("
                                + ("requested f32" if p.precision else "its default") + "), LATENCY hint, 1 stream"))
                    except Exception as exc:
                        errors[p.key] = _reason(exc)
                        log(f"bench: {p.label} left out: {errors[p.key]}")
                if t == threads[0] and any(p.key in _ACCURACY for p in active):
                    accuracy = _measure_accuracy(active, fused, inputs, batch_sizes, errors, log)
                    active = [p for p in active if p.key not in errors]
                for b in batch_sizes:
                    step += 1
                    x = inputs[b]
                    log(f"bench: [{step}/{len(configs)}] threads {t}, batch {b}: warm-up"
                        + (" (torch.compile compiles now, this takes a while)" if any(p.key == "compile" for p in active) else ""))
                    runnable = []
                    with torch.no_grad():
                        for p in active:
                            try:
                                for i in range(max(1, warmup)):
                                    p.warm(x) if i == 0 else p.call(x)
                                _sync(device)
                                runnable.append(p)
                            except Exception as exc:
                                errors[p.key] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                                log(f"bench: {p.label} left out: {errors[p.key]}")
                        active = runnable
                        log(f"bench: [{step}/{len(configs)}] threads {t}, batch {b}: timing {len(active)} providers "
                            f"x {repeats} rounds")
                        rates = sgemm_gflops(device, dtype=dtype)
                        times: Dict[str, List[float]] = {p.key: [] for p in active}
                        for r in range(repeats):
                            order = active[r % len(active):] + active[:r % len(active)]
                            for p in order:
                                _sync(device)
                                t0 = time.perf_counter()
                                p.call(x)
                                _sync(device)
                                times[p.key].append(time.perf_counter() - t0)
                        rates += sgemm_gflops(device, dtype=dtype)
                    rate, rate_lo, rate_hi = _quantiles(rates)
                    sgemm.append({"threads": t, "batch": b, "gflops": rate, "p10_gflops": rate_lo, "p90_gflops": rate_hi,
                                  "calls": len(rates), "n": SGEMM_N})
                    base = _quantiles(times["timm"])[0] if "timm" in times else None
                    ort_fused = times.get("ort-fused")
                    anchors = [k for k in ANCHORS if k in times]
                    fastest = min(anchors, key=lambda k: _quantiles(times[k])[0]) if anchors else None
                    summary = []
                    for p in active:
                        median, p10, p90 = _quantiles(times[p.key])
                        flop = (fused_batch_flops[b] if fused_batch_flops is not None and p.flops_of == "fused"
                                else flops[p.flops_of] * b)
                        floor = flop / (rate * 1e9)
                        results.append({
                            "provider": p.key, "label": p.label, "threads": t, "batch": b,
                            "median_ms": median * 1e3, "p10_ms": p10 * 1e3, "p90_ms": p90 * 1e3,
                            "images_per_s": b / median, "gflop": flop / 1e9, "gflops_per_s": flop / median / 1e9,
                            "floor_ms": floor * 1e3, "pct_of_floor": 100 * floor / median,
                            "speedup_vs_timm": (base / median) if base else None, "repeats": len(times[p.key]),
                            # [median, p10, p90] of ORT fused / this provider, per round (None without ort-fused)
                            "paired_vs_ort_fused": (list(paired_speedups(ort_fused, times[p.key]))
                                                    if ort_fused is not None else None),
                            # anchor -> [median, p10, p90] of anchor time / this provider's, per round
                            "paired_vs": {k: list(paired_speedups(times[k], times[p.key])) for k in anchors},
                            # the anchor with the smallest median at this (threads, batch)
                            "fastest_anchor": fastest,
                            "round_ms": [v * 1e3 for v in times[p.key]],  # in round order
                        })
                        summary.append(f"{p.key} {median * 1e3:.1f}")
                    log(f"bench: [{step}/{len(configs)}] threads {t}, batch {b}: median ms " + ", ".join(summary)
                        + f"; sgemm {rate:.1f} GFLOP/s")
        finally:
            torch.set_num_threads(previous_threads)
            if any(p.key == "compile" for p in built):
                torch._dynamo.reset()
    finally:
        built.clear()
        if cleanup is not None:
            cleanup.cleanup()
    load_end = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "schema": SCHEMA,
        **dict(meta or {}),
        "input_shape": list(shape),
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
        "machine": machine_info(),
        "providers": {k: PROVIDERS[k][0] for k in providers},
        "threads": list(threads),
        "batch_sizes": list(batch_sizes),
        "repeats": repeats,
        "warmup": max(1, warmup),
        "ort_spinning": bool(ort_spinning),
        "flops_per_image": flops,
        # gated models only: the fused model's FLOPs on each timed batch (what its rows use; see above)
        **({"fused_flops_by_batch": {str(b): n for b, n in fused_batch_flops.items()}} if fused_batch_flops else {}),
        "exports": exports,
        # how the quantized / OpenVINO providers were made (the calls, OpenVINO's compiled properties)
        "provider_info": provider_info,
        # provider -> {rel_err, top1_agreement, max_abs_diff, images} against the fused fp32 model
        "accuracy": accuracy,
        "sgemm": sgemm,
        "results": results,
        "errors": errors,
        "skipped": skipped,
        "load_average": {"start": list(load_start) if load_start else None, "end": list(load_end) if load_end else None},
        "seconds": time.perf_counter() - t_start,
    }


def format_report(report: Mapping[str, Any]) -> str:
    """One plain-text table (rows grouped by threads, then batch) with a header saying how it was measured."""
    from .measure import format_table

    lines = []
    m = report["machine"]
    in_dtype = "" if report.get("dtype", "float32") == "float32" else f" in {report['dtype']}"
    lines.append(f"{report.get('title', 'vitfast bench')}: input {tuple(report['input_shape'])}{in_dtype} on {report['device']} "
                 f"({m['cpu']}, {m['cores']} cores; vitfast CPU path {m['cpu_isa']}"
                 + (f"; OpenMP wait policy {m['omp_wait_policy']})" if "omp_wait_policy" in m else ")"))
    if report.get("note"):
        lines.append(report["note"])
    fl = report["flops_per_image"]
    lines.append(f"GFLOP/image: baseline {fl['baseline'] / 1e9:.4g}, fused {fl['fused'] / 1e9:.4g} "
                 f"({fl['baseline'] / fl['fused']:.2f}x fewer); {report['repeats']} interleaved rounds after "
                 f"{report['warmup']} warm-up call(s)")
    by_threads: Dict[int, List[float]] = {}
    for s in report["sgemm"]:
        by_threads.setdefault(s["threads"], []).append(s["gflops"])
    dtype = _SHORT[DTYPES[report.get("dtype", "float32")]]
    lines.append(f"sgemm (torch.mm 2048^3 {dtype}, measured around each row group): "
                 + "; ".join(f"{t} thread(s) {min(v):.1f}-{max(v):.1f} GFLOP/s" for t, v in by_threads.items()))
    for key, e in report.get("exports", {}).items():
        users = [k for k in _FROM_FUSED_ONNX if k in report["providers"]] if key == "ort-fused" else [key]
        lines.append(f"{PROVIDERS[key][0]}" + (f" (the ONNX file of {', '.join(users)})" if users != [key] else "")
                     + f": {e['exporter']} exporter, opset {e['opset']}, max |Δ| vs PyTorch {e['max_abs_diff']:.2e}")
    if any(k.startswith("ort-") for k in report["providers"]):
        lines.append("ORT sessions: intra-op threads = threads, 1 inter-op thread, all graph optimisations, worker "
                     f"spinning {'on' if report.get('ort_spinning') else 'off'}")
    for key, info in report.get("provider_info", {}).items():
        lines.append(f"{PROVIDERS[key][0]}: {info.get('summary', '')}")
    accuracy = report.get("accuracy") or {}
    if accuracy:
        n = next(iter(accuracy.values()))["images"]
        lines.append(f"accuracy vs fused fp32 (vitfast kernels) on the {n} bench image(s): rel err = "
                     "‖y − y_fp32‖ / ‖y_fp32‖ over all logits, top-1 = share of images whose argmax agrees")
    load = report.get("load_average") or {}
    if load.get("start") and load.get("end"):
        lines.append(f"load average (1 min) at start {load['start'][0]:.2f}, at end {load['end'][0]:.2f}")
    timed_anchors = [k for k in ANCHORS if any(k in (r.get("paired_vs") or {}) for r in report["results"])]
    if not timed_anchors and any(r.get("paired_vs_ort_fused") for r in report["results"]):
        timed_anchors = ["ort-fused"]  # a report written before paired_vs existed
    anchors = [k for k in timed_anchors if k in TABLE_ANCHORS]
    paired = bool(timed_anchors)
    if paired:
        lines.append(f"vs {' / '.join(PROVIDERS[k][0] for k in timed_anchors)} (paired): median and p10-p90 over "
                     "the rounds of the anchor's time / this provider's time in the same round (> 1: faster than "
                     "that runtime on the same fused graph; a vitfast row below 1 is marked SLOWER)")
    fastest_column = len(timed_anchors) > 1 or timed_anchors != anchors
    if fastest_column:
        lines.append("vs fastest anchor: the same paired ratio against the anchor with the smallest median at that "
                     "threads/batch (named)")
    rows = []
    for r in report["results"]:
        row = [
            r["label"], str(r["threads"]), str(r["batch"]), f"{r['median_ms']:.2f}",
            f"{r['p10_ms']:.2f}-{r['p90_ms']:.2f}", f"{r['images_per_s']:.1f}", f"{r['gflop']:.3g}",
            f"{r['pct_of_floor']:.0f}%", f"{r['speedup_vs_timm']:.2f}x" if r["speedup_vs_timm"] else "-",
        ]
        if accuracy:
            a = accuracy.get(r["provider"])
            row.append(f"{a['rel_err']:.1e} / {a['top1_agreement'] * 100:.0f}%" if a else "-")
        for k in anchors:
            vs = (r.get("paired_vs") or {}).get(k)
            if vs is None and k == "ort-fused":
                vs = r.get("paired_vs_ort_fused")
            row.append(_paired_cell(r["provider"], vs) if vs and r["provider"] != k else "-")
        if fastest_column:
            k = r.get("fastest_anchor")
            vs = (r.get("paired_vs") or {}).get(k) if k else None
            row.append(f"{PROVIDERS[k][0]}: {_paired_cell(r['provider'], vs)}" if vs and r["provider"] != k
                       else ("(fastest anchor)" if k and r["provider"] == k else "-"))
        rows.append(row)
    lines.append("")
    lines.append(format_table(["provider", "threads", "batch", "median ms", "p10-p90 ms", "img/s", "GFLOP",
                               "% floor", "vs timm eager"]
                              + (["rel err / top-1 vs fused fp32"] if accuracy else [])
                              + [f"vs {PROVIDERS[k][0]} (paired)" for k in anchors]
                              + (["vs fastest anchor (paired)"] if fastest_column else []), rows))
    for key, why in report.get("errors", {}).items():
        lines.append(f"FAILED: {PROVIDERS[key][0]}: {why}")
    for key, why in report.get("skipped", {}).items():
        lines.append(f"SKIPPED: {PROVIDERS[key][0]}: {why}")
    return "\n".join(lines)


def _paired_cell(provider: str, vs: Sequence[float]) -> str:
    """'1.234x (1.10-1.30)'; a vitfast row slower than the anchor (median ratio < 1) says SLOWER."""
    slower = " SLOWER" if provider.startswith("vitfast") and vs[0] < 1.0 else ""
    return f"{vs[0]:.3f}x{slower} ({vs[1]:.2f}-{vs[2]:.2f})"


def plot_report(report: Mapping[str, Any], path: str) -> None:
    """PNG chart: speed-up over timm eager and % of the FLOP floor, grouped by (threads, batch), one bar per provider."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys((r["threads"], r["batch"]) for r in report["results"]))
    keys = [k for k in report["providers"] if any(r["provider"] == k for r in report["results"])]
    cell = {(r["provider"], r["threads"], r["batch"]): r for r in report["results"]}
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(configs) + 4), 4.5))
    width = 0.8 / max(1, len(keys))
    for ax, field, title in ((axes[0], "speedup_vs_timm", "speed-up vs timm eager (x)"),
                             (axes[1], "pct_of_floor", "% of FLOP floor (FLOPs / sgemm rate)")):
        for i, key in enumerate(keys):
            xs, ys = [], []
            for j, (t, b) in enumerate(configs):
                r = cell.get((key, t, b))
                if r is not None and r.get(field) is not None:
                    xs.append(j + (i - (len(keys) - 1) / 2) * width)
                    ys.append(r[field])
            ax.bar(xs, ys, width, label=PROVIDERS[key][0])
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels([f"{t} thr\nbatch {b}" for t, b in configs])
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].axhline(1.0, color="black", linewidth=0.8)
    axes[1].axhline(100.0, color="black", linewidth=0.8, linestyle="--")
    axes[0].legend(fontsize=8)
    fig.suptitle(report.get("title", "vitfast bench"), fontsize=11)
    fig.tight_layout()
    try:  # the temporary file has the name of `path` (in a private directory): the format follows it as before
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110))
    finally:
        plt.close(fig)
