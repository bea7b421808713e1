"""The runtimes `vitfast bench` times (vitfast/bench.py runs them): torch eager (`_Torch`, also a quantized copy of the
fused model, `_vitfast_quantized`), CUDA-graph replays (`_Graphed`), torch.compile (`_Compiled`), ONNX Runtime
(`_Ort`, on the fused ONNX as exported or quantized by `quantize_ort_dynamic` / `quantize_ort_static`) and OpenVINO
(`_OpenVINO`).  Each is `prepare(threads)` once per thread count, then `call(batch)` in the interleaved rounds.

A runtime whose optional package is missing raises `ProviderSkipped`: the report lists it as skipped, not failed.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn as nn


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
    "ort-int8-rr": ("ORT int8 dynamic, 7-bit weights", "fused"),
    "ort-qdq": ("ORT int8 QDQ static", "fused"),
    "openvino-f32": ("OpenVINO f32", "fused"),
    "openvino": ("OpenVINO default", "fused"),
    "vitfast-int8": ("vitfast int8", "fused"),
    "vitfast-bf16": ("vitfast bf16", "fused"),
    "vitfast-int8-w7": ("vitfast int8, 7-bit weights", "fused"),
    "inductor-fused": ("inductor fused (same graph)", "fused"),
    "inductor-fused-max-autotune": ("inductor fused max-autotune-no-cg", "fused"),
    "timm-max-autotune": ("timm compile max-autotune", "baseline"),
}
# The GPU analogue of "ORT on the same fused graph": torch.compile of the fused model on its reference ops
# (VITFAST_BACKEND=reference: plain torch ops inductor can see and fuse), and timm under max-autotune (CUDA graphs
# included).  CUDA only: inductor's CPU code is not what a GPU user would deploy, and max-autotune tunes GPU GEMMs.
# key -> torch.compile mode, the backend the model runs under (None: the process's), which model
INDUCTOR: Dict[str, Tuple[Optional[str], Optional[str], str]] = {
    "inductor-fused": (None, "reference", "fused"),
    "inductor-fused-max-autotune": ("max-autotune-no-cudagraphs", "reference", "fused"),
    "timm-max-autotune": ("max-autotune", None, "baseline"),
}
# dtypes the models can be timed in, and their short names in the report
DTYPES: Dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# the runtimes a user would deploy instead of vitfast on the same fused graph: rows get paired ratios against them
ANCHORS = ("ort-fused", "ort-int8", "ort-int8-rr", "ort-qdq", "openvino-f32", "openvino")
# the anchors format_report gives a column of their own (the others are in the JSON and the "fastest anchor" column)
TABLE_ANCHORS = ("ort-fused", "ort-int8", "openvino")
# providers that read the fused model's ONNX export (one export, shared)
_FROM_FUSED_ONNX = ("ort-fused", "ort-int8", "ort-int8-rr", "ort-qdq", "openvino-f32", "openvino")
_SHORT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


class ProviderSkipped(Exception):
    """A provider that cannot run here for want of an optional package (reported as skipped, not as a failure)."""


class _Provider:
    """One runtime: `prepare(threads)` once per thread count (sessions, compiles), then `call(batch)`."""

    def __init__(self, key: str, label: str, flops_of: str) -> None:
        self.key, self.label, self.flops_of = key, label, flops_of

    def prepare(self, threads: int) -> None:
        pass

    def warm(self, x: torch.Tensor) -> None:
        self.call(x)

    def call(self, x: torch.Tensor) -> Any:
        """One timed forward of `x`; every provider class below defines it (this base is never used alone)."""
        raise NotImplementedError(f"{type(self).__name__}.call")

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
    PERFORMANCE_HINT=LATENCY, NUM_STREAMS=1) at `precision` (None: the plugin's default, read back afterwards), and
    per batch size with the input reshaped to that batch: a static shape, as a user serving a fixed batch compiles
    it.  The exported file's batch axis is dynamic (ONNX Runtime's better form: a fixed-batch export ran 1.5-3%
    slower there), and OpenVINO ran it 2-4% slower than the static shape: RePa-DeiT-S / DeiT-B, batch 1, one thread,
    Zen 4 EPYC, paired against vitfast in one process, dynamic ÷ static time 1.04 / 1.02 in f32 and 1.04 / 1.03 in
    its default bf16."""

    def __init__(self, key, label, flops_of, path: str, precision: Optional[str]) -> None:
        super().__init__(key, label, flops_of)
        try:
            import openvino
        except ImportError as exc:
            raise ProviderSkipped(f"openvino is not installed (pip install openvino, or 'vitfast[bench]'): "
                                  f"{exc}") from None
        self.core = openvino.Core()
        self.path = path
        self.core.read_model(path)  # a file OpenVINO cannot read fails here, before any timing
        self.precision, self.config, self.info = precision, {}, {}
        self._requests: Dict[Tuple[int, ...], Any] = {}  # input shape -> (compiled model, infer request)
        self._numpy: Dict[int, Any] = {}

    def prepare(self, threads):
        self.config = {"INFERENCE_NUM_THREADS": int(threads), "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
        if self.precision is not None:
            self.config["INFERENCE_PRECISION_HINT"] = self.precision
        self._requests = {}  # compiled again for the new thread count, per input shape on first use

    def _compiled(self, shape: Tuple[int, ...]):
        if shape not in self._requests:
            model = self.core.read_model(self.path)
            model.reshape(list(shape))
            compiled = self.core.compile_model(model, "CPU", self.config)
            self._requests[shape] = (compiled, compiled.create_infer_request())
            if not self.info:
                self.info = self._describe(compiled)
        return self._requests[shape]

    def _describe(self, compiled) -> Dict[str, Any]:
        import openvino

        info = {"version": openvino.__version__, "config": {k: str(v) for k, v in self.config.items()},
                "input_shape": "static: reshaped to each timed batch"}
        for name in ("INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS", "NUM_STREAMS", "PERFORMANCE_HINT",
                     "ENABLE_CPU_PINNING", "ENABLE_HYPER_THREADING"):
            try:
                value = compiled.get_property(name)
                # an ov.Type prints as "<Type: 'bfloat16'>": its short name ("bf16", "f32") is what the hint takes
                info[name] = value.get_type_name() if hasattr(value, "get_type_name") else str(value)
            except Exception:  # a property this version does not have
                pass
        return info

    def warm(self, x):
        self._compiled(tuple(x.shape))  # compiled here, untimed
        self.call(x)

    def call(self, x):
        key = id(x)
        if key not in self._numpy:
            self._numpy = {key: x.numpy()}
        return self._compiled(tuple(x.shape))[1].infer({0: self._numpy[key]})

    def output(self, x):
        compiled, _ = self._compiled(tuple(x.shape))
        return torch.from_numpy(self.call(x)[compiled.output(0)].copy()).float()


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


def quantize_ort_dynamic(src: str, dst: str, reduce_range: bool = False) -> Dict[str, Any]:
    """ort-int8: quantize_dynamic with ORT's defaults but for the weight type named (QInt8): per-tensor weights
    (per_channel=False is ORT's default), activations quantized on the fly, MatMul/Gemm/... as ORT chooses.
    ort-int8-rr: the same with reduce_range=True, 7-bit weights: ORT's own remedy for its int8 GEMM on x86 without
    VNNI, whose u8 × s8 pair sums saturate with 8-bit weights (vitfast/onnx_qdq.py) — there the exact counterpart of
    vitfast.quantize(weight_bits=7)."""
    q = _onnxruntime_quantization()
    t0 = time.perf_counter()
    q.quantize_dynamic(src, dst, weight_type=q.QuantType.QInt8, reduce_range=reduce_range)
    rr = ", reduce_range=True" if reduce_range else ""
    return {"call": f"onnxruntime.quantization.quantize_dynamic(model, out, weight_type=QuantType.QInt8{rr})",
            "per_channel": False, "weight_type": "QInt8", "reduce_range": reduce_range,
            "seconds": time.perf_counter() - t0,
            "summary": f"quantize_dynamic, QInt8 weights per tensor (ORT's default per_channel=False){rr}, "
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


# vitfast's own low-precision providers -> vitfast.quantize's keyword arguments
VITFAST_LOWP: Dict[str, Dict[str, Any]] = {"vitfast-int8": {"dtype": "int8"}, "vitfast-bf16": {"dtype": "bf16"},
                                           "vitfast-int8-w7": {"dtype": "int8", "weight_bits": 7}}


def _vitfast_quantized(fused: nn.Module, key: str, quantize: Optional[Callable[..., Any]]) -> nn.Module:
    """quantize(a copy of `fused`, **VITFAST_LOWP[key]) (ProviderSkipped without a quantize: this vitfast has none)."""
    import copy

    if not callable(quantize):
        raise ProviderSkipped("vitfast.quantize unavailable")
    model = copy.deepcopy(fused)
    quantized = quantize(model, **VITFAST_LOWP[key])
    return (quantized if quantized is not None else model).eval()
