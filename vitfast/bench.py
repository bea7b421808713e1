"""`vitfast bench`: end-to-end latency of a timm baseline and its fused vitfast model on several runtimes.

    report = run_bench(baseline, fused, threads=(1, 2), batch_sizes=(1, 8))   # see `vitfast bench --help`
    print(format_report(report)); plot_report(report, "chart.png")

This module measures (rounds, pairing, FLOPs, accuracy); the runtimes themselves are vitfast/bench_runtimes.py and the
text/chart of a report vitfast/bench_report.py.

Providers (keys for `providers=` / `--providers`):

    timm       timm eager PyTorch (the baseline, random weights)
    compile    the baseline under torch.compile (inductor, default mode; compiled again per thread count)
    ort-timm   ONNX Runtime running the baseline exported to ONNX
    ort-fused  ONNX Runtime running the fused model exported through the reference path (vitfast.export)
    vitfast    the fused model on vitfast's kernels
    reference  the fused model on vitfast.reference ops (eager PyTorch; shows what the kernels add)
    timm-graph     timm eager replayed from CUDA graphs (CUDA only; vitfast.cuda_graph, one graph per batch size)
    vitfast-graph  the fused model on vitfast's kernels, replayed from CUDA graphs (CUDA only)

What a GPU user deploys instead of vitfast, the GPU analogue of the ORT anchors (CUDA only, opt-in):

    inductor-fused               torch.compile (default mode) of the SAME fused model on its reference ops
                                 (VITFAST_BACKEND=reference semantics: plain torch ops the compiler sees and fuses)
    inductor-fused-max-autotune  the same, mode="max-autotune-no-cudagraphs"
    timm-max-autotune            torch.compile(baseline, mode="max-autotune") (its CUDA graphs included)

What a CPU user deploys instead of vitfast fp32, all on the SAME fused graph (the ONNX file ort-fused runs; opt-in,
not in the defaults):

    ort-int8      ONNX Runtime on quantize_dynamic(fused ONNX, weight_type=QInt8), ORT's defaults otherwise (per-tensor
                  weights; activations quantized per call); ort-int8-rr: with reduce_range=True (7-bit weights)
    ort-qdq       ONNX Runtime on quantize_static(fused ONNX, QDQ format, per-channel QInt8 weights, QInt8
                  activations = ORT's S8S8 default), calibrated (MinMax) on the bench's own input batches
    openvino-f32  OpenVINO (CPU) on the fused ONNX, INFERENCE_PRECISION_HINT=f32
    openvino      OpenVINO on the fused ONNX at its default precision (bf16 on CPUs with AVX512_BF16/AMX; the
                  precision it compiled to is read back with compiled_model.get_property and reported)
                  Both: INFERENCE_NUM_THREADS = threads, PERFORMANCE_HINT=LATENCY, NUM_STREAMS=1.
    vitfast-int8  vitfast.quantize(copy of the fused model, dtype="int8") on vitfast's kernels
    vitfast-bf16  vitfast.quantize(copy of the fused model, dtype="bf16") on vitfast's kernels
    vitfast-int8-w7  the same with weight_bits=7 (weight codes in [-64, 64]: the AVX2 kernel's narrow form)
                  (run_bench(quantize=vitfast.quantize): this module sits below the package's front and does not
                  import it; `vitfast bench` passes it where this vitfast has it)

A provider whose optional package is missing (onnxruntime, openvino, vitfast.quantize) is skipped with a one-line
reason (report["skipped"], printed as SKIPPED); it is not a failure.

What is measured, per (threads, batch):
* latency: every provider is warmed up (at least one untimed call: compiles, ORT's first run), then the
  timed calls are interleaved — one call of each provider per round, the order rotated every round — so load
  from other processes slows all providers alike instead of whichever happened to run during a busy moment.
  Reported: median, p10 and p90 over the rounds, images/s = batch / median.  `burst` > 1: each provider runs
  `burst` calls back to back in its turn, timed as the median of calls 2..burst (measure.time_turn): one call per
  round times a model that fits in the caches cold (docs/performance.md, "How to measure", has the figures).
* GFLOP per forward: PyTorch's FlopCounterMode (matmuls, convolutions, attention; 2 FLOPs per multiply-add;
  norms, GELU and softmax not counted), on one image, times the batch.  The fused model is counted on its
  reference path (plain torch ops, the same arithmetic as the kernels), so the count does not depend on which
  ops have FLOP formulas.  Providers that run the same graph share its count: timm/compile/ort-timm the
  baseline's, vitfast/reference/ort-fused the fused model's.
* floor: FLOPs / the machine's fp32 GEMM rate, measured in the same run at the same thread count just before
  and just after the rounds of that (threads, batch) (torch.mm of 2048x2048 fp32, median of those calls).
  "% floor" = floor / median latency = achieved GFLOP/s as a share of sgemm GFLOP/s.
* speed-up: timm eager's median / the provider's median, both from the same rounds.
* paired speed-up vs an anchor (vitfast.bench.ANCHORS: ort-fused, ort-int8, ..., openvino; those timed): the median
  and p10-p90 of the per-round ratios anchor time / provider time.  Both calls of a ratio ran in the same round,
  so a slow phase of the host (this project's shared machines drift by 30% between minutes) scales both and
  cancels, where the ratio of two medians keeps whatever drift fell unevenly on the two lists.  Above 1.00: faster
  than that runtime on the same fused graph; the p10-p90 says whether 1.00 is inside the round-to-round spread.
  Every row also names the fastest anchor of its (threads, batch) (smallest median) and its paired ratio to it; a
  vitfast row below 1.00 is marked SLOWER in the table.  ("paired_vs_ort_fused" is kept: = paired_vs["ort-fused"].)
* launches per forward (CUDA): the CUDA kernels (and memsets / copies) of one call, counted by torch.profiler after
  the timed rounds (a graph replay's kernels counted one by one); None on the CPU, shown as "–".
* accuracy (the fused-graph providers other than vitfast itself): on the bench's own inputs (every timed batch,
  at the first thread count), ‖y − y_fp32‖ / ‖y_fp32‖ over all logits and the share of images whose top-1
  class (argmax) agrees, where y_fp32 is the fused model's fp32 output on vitfast's kernels.

The ONNX exports are checked against their PyTorch source in ONNX Runtime (`vitfast.export.to_onnx`); their
max |Δ| goes into the report.  Torch providers run under torch.set_num_threads(threads); ORT sessions use
intra_op_num_threads = threads, inter_op_num_threads = 1, all graph optimisations.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .bench_runtimes import (ANCHORS, DTYPES, INDUCTOR, PROVIDERS, TABLE_ANCHORS, _FROM_FUSED_ONNX, _SHORT, ProviderSkipped, _Provider, _Torch, _Graphed, _Compiled, _Ort, _OpenVINO, _onnxruntime_quantization, quantize_ort_dynamic, quantize_ort_static, _vitfast_quantized, VITFAST_LOWP)
from .bench_report import format_report, plot_report
from .measure import time_turn

__all__ = ["PROVIDERS", "DEFAULT_PROVIDERS", "ANCHORS", "TABLE_ANCHORS", "ProviderSkipped", "cpu_only",
           "launches_per_forward", "DTYPES",
           "SCHEMA", "run_bench", "format_report", "plot_report", "sgemm_gflops",
           "parse_providers", "paired_speedups"]

SCHEMA = "vitfast.bench/1"
# CPU-only runtimes
_CPU_ONLY_PREFIXES = ("ort-", "openvino")
# whose output is compared with the fused fp32 model's (report["accuracy"])
_ACCURACY = ("reference", "inductor-fused", "inductor-fused-max-autotune") + _FROM_FUSED_ONNX + tuple(VITFAST_LOWP)
DEFAULT_PROVIDERS = ("timm", "compile", "ort-timm", "ort-fused", "vitfast")
SGEMM_N = 2048


def cpu_only(key: str) -> bool:
    """ONNX Runtime and OpenVINO providers run on the CPU only."""
    return key.startswith(_CPU_ONLY_PREFIXES)


def launches_per_forward(fn: Callable[[torch.Tensor], Any], x: torch.Tensor, device: torch.device) -> Optional[int]:
    """CUDA-side events (kernels, memsets, copies) of one call fn(x), counted by torch.profiler; None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    _sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(x)
        _sync(device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


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
    fields: Dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:  # the first processor's fields
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    cpu = fields.get("model name", cpu)
    # The core's generation, which the model name does not always give ("AMD EPYC" is a Zen 4 that runs 512-bit
    # instructions as two halves, or a core that does not: 2× apart in every figure): x86 family/model, Arm part.
    if "cpu family" in fields and "model" in fields:
        signature = f"family {fields['cpu family']} model {fields['model']}"
    elif "CPU part" in fields:
        signature = f"implementer {fields.get('CPU implementer', '?')} part {fields['CPU part']}"
    else:
        signature = None
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
    # The extensions inside the path (AVX512_VNNI/BF16, AMX, NEON dot/BF16) pick the low-precision kernels: an
    # int8 or bf16 figure means little without them.
    return {"cpu": cpu, "cpu_signature": signature, "cores": os.cpu_count(), "cpu_isa": ops.cpu_isa(),
            "cpu_extensions": ops.cpu_extensions(),
            "extension_loaded": ops.extension_loaded(), "omp_wait_policy": wait_policy(), "versions": versions}


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
    burst: int = 1,
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
        dtype="int8" | "bf16", weight_bits=7 for vitfast-int8-w7); the model it returns, or the copy when it returns
        None, is timed on the kernels).
        None: those rows are skipped, "vitfast.quantize unavailable".  `vitfast bench` passes the package's own.
    burst: calls per provider per round (module docstring, "latency"); 1: one call each, the order rotated.
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
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise ValueError(f"burst: expected a positive int, got {burst!r}")
    if device.type != "cpu" and any(cpu_only(p) for p in providers):
        raise ValueError(f"providers: ONNX Runtime and OpenVINO providers run on the CPU only, got {providers} with "
                         f"device {device}")
    if device.type != "cuda" and any(p.endswith("-graph") for p in providers):
        raise ValueError(f"providers: the CUDA-graph providers need device cuda, got {providers} with device {device}")
    if device.type != "cuda" and any(p in INDUCTOR for p in providers):
        raise ValueError(f"providers: {', '.join(p for p in providers if p in INDUCTOR)} compile for the GPU and need "
                         f"device cuda, got device {device}")
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
        f"{repeats} interleaved rounds" + (f" of {burst} calls per provider" if burst > 1 else "")
        + f" after {max(1, warmup)} warm-up call(s)"
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
                elif key in INDUCTOR:
                    mode, backend, which = INDUCTOR[key]
                    # Compiled lazily, on the warm-up call, under `backend` (the call sets it every time: dynamo's
                    # guards see the same backend at every call, and the graph holds the reference ops).
                    model = torch.compile(fused if which == "fused" else baseline, mode=mode)
                    built.append(_Torch(key, label, flops_of, model, backend=backend))
                elif key in VITFAST_LOWP:
                    kw = ", ".join(f"{k}={v!r}" for k, v in VITFAST_LOWP[key].items())
                    log(f"bench: vitfast.quantize(copy of the fused model, {kw})")
                    model = _vitfast_quantized(fused, key, quantize)
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
                elif key in ("ort-int8", "ort-int8-rr"):
                    _onnxruntime_quantization()
                    src = export(key)
                    path = os.path.join(workdir, f"{key}.onnx")
                    log(f"bench: quantize_dynamic(fused ONNX, QInt8{', reduce_range' * (key != 'ort-int8')})")
                    provider_info[key] = quantize_ort_dynamic(src, path, reduce_range=key != "ort-int8")
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
                        + (" (torch.compile compiles now, this takes a while)"
                           if any(p.key == "compile" or p.key in INDUCTOR for p in active) else ""))
                    runnable = []
                    with torch.no_grad():
                        for p in active:
                            try:
                                for i in range(max(1, warmup)):
                                    p.warm(x) if i == 0 else p.call(x)
                                _sync(device)
                                runnable.append(p)
                                if isinstance(p, _OpenVINO) and p.key not in provider_info and p.info:
                                    provider_info[p.key] = dict(p.info, summary=(
                                        f"OpenVINO {p.info.get('version', '')} CPU, inference precision "
                                        f"{p.info.get('INFERENCE_PRECISION_HINT', '?')} ("
                                        + ("requested f32" if p.precision else "its default")
                                        + "), LATENCY hint, 1 stream, static input shape per batch"))
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
                                times[p.key].append(time_turn(lambda: p.call(x), burst, lambda: _sync(device)))
                        rates += sgemm_gflops(device, dtype=dtype)
                        launches = {}
                        for p in active:  # after the rounds: the profiler's overhead stays out of the timings
                            try:
                                launches[p.key] = launches_per_forward(p.call, x, device)
                            except Exception as exc:  # a profiler failure costs the column, not the row
                                launches[p.key] = None
                                log(f"bench: {p.label}: launches not counted: {_reason(exc)}")
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
                            # CUDA events per forward (torch.profiler), None off CUDA
                            "launches": launches.get(p.key),
                        })
                        summary.append(f"{p.key} {median * 1e3:.1f}")
                    log(f"bench: [{step}/{len(configs)}] threads {t}, batch {b}: median ms " + ", ".join(summary)
                        + f"; sgemm {rate:.1f} GFLOP/s")
        finally:
            torch.set_num_threads(previous_threads)
            if any(p.key == "compile" or p.key in INDUCTOR for p in built):
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
        "burst": burst,
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
