"""`vitfast.cuda_graph(model)`: GPU inference replayed from CUDA graphs, one graph per input signature.

    model = vitfast.cuda_graph(vitfast.load("fused.safetensors").cuda())
    logits = model(images)        # first call per (shape, dtype, autocast): warm-up + capture; later calls: replay

Why: a fused model at batch 1 is launch-bound on a GPU.  Each op is one kernel (or a few) issued from Python, and
the host takes longer to issue them than the GPU takes to run them: eager, fused DeiT-Ti/B ran slower than timm eager
at batch 1 while winning at batch 64 (docs/performance.md, the CUDA-graph table).  A CUDA graph issues the whole
forward as one launch.

Semantics (the same as capturing by hand with torch.cuda.graph):
* Inference only.  The module must be in eval mode (dropout and batch statistics would be frozen into the graph)
  and no input may require grad: the graph records no autograd history.  Outputs never require grad.
* One graph per input signature: the shapes and dtypes of the tensor inputs, the device and the autocast state.
  Each new signature costs `warmup` eager calls on a side stream (cuBLAS handles, Triton compiles and autotuning
  happen there, never inside a capture) and one capture.  At most `max_graphs` graphs are kept; the least
  recently used one is dropped past that.
* The inputs are copied into the graph's own input buffers, so callers may pass any tensor of the signature.
* The parameters are read in place at every replay: `load_state_dict`, `copy_` and other in-place updates are
  seen by later replays.  Moving the wrapper (`.to()`, `.cuda()`, `.half()`) drops every graph (the parameters
  get new storage); replacing a parameter object of the inner module behind the wrapper's back is not detected:
  call `reset()` after doing that.
* `clone_output=True` (default) returns fresh tensors.  With False, the graph's own output buffers are returned;
  the next call with the same signature overwrites them in place, and a call with another signature may too
  (the graphs share one memory pool, so that memory is not paid once per batch size).
* A forward that synchronises with the host (`.item()`, `.tolist()`, data-dependent Python control flow) cannot
  be captured; the error says so.  vitfast's fused blocks do not, USDC's gates included (their decision stays
  on the device: see vitfast.nn.gated).
"""
from __future__ import annotations

import collections
import contextlib
from typing import Any, Callable, Hashable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

__all__ = ["CudaGraphModule", "cuda_graph"]


def _autocast_state(device_type: str) -> Tuple[bool, Optional[torch.dtype]]:
    """(enabled, dtype) of autocast for this device type, on torch >= 2.4 (where the per-device APIs exist)."""
    from .ops import _autocast_enabled

    if not _autocast_enabled(device_type):
        return False, None
    try:
        return True, torch.get_autocast_dtype(device_type)
    except AttributeError:  # torch < 2.4
        return True, torch.get_autocast_gpu_dtype()


def _flatten_output(out: Any, where: str = "output") -> Tuple[List[torch.Tensor], Callable[[List[torch.Tensor]], Any]]:
    """The tensors of a forward's output (a tensor, or tuples/lists/dicts of them) and a function that rebuilds
    the same structure from a list of tensors."""
    if isinstance(out, torch.Tensor):
        return [out], lambda ts: ts[0]
    if isinstance(out, (tuple, list)):
        parts = [_flatten_output(o, f"{where}[{i}]") for i, o in enumerate(out)]
        sizes = [len(p[0]) for p in parts]
        kind = type(out)

        def rebuild(ts: List[torch.Tensor]) -> Any:
            items, start = [], 0
            for (_, build), n in zip(parts, sizes):
                items.append(build(ts[start:start + n]))
                start += n
            # a namedtuple takes its fields positionally; tuple, list and torch.return_types take one sequence
            return kind(*items) if hasattr(kind, "_fields") else kind(items)

        return [t for p in parts for t in p[0]], rebuild
    if isinstance(out, dict):
        keys = list(out)
        tensors, rebuild_values = _flatten_output([out[k] for k in keys], where)
        return tensors, lambda ts: dict(zip(keys, rebuild_values(ts)))
    raise TypeError(f"{where}: a CUDA graph can only return tensors (or tuples, lists and dicts of them), "
                    f"got {type(out).__name__}")


class _TorchGraphs:
    """The CUDA side of the wrapper: warm-up on a side stream, capture into a shared pool, replay.  Kept apart so
    that the wrapper's bookkeeping (signatures, buffers, eviction, errors) is tested on machines without a GPU
    through a stand-in with the same three methods."""

    device_type = "cuda"

    def __init__(self) -> None:
        self.pool = None

    def warm(self, fn: Callable[[], Any], device: torch.device, calls: int) -> None:
        # Lazy initialisation (cuBLAS workspaces, Triton compiles and autotuning) must not happen inside a
        # capture; the side stream keeps these calls out of the current stream's order, as torch's docs ask.
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(calls):
                fn()
        torch.cuda.current_stream(device).wait_stream(stream)

    def capture(self, fn: Callable[[], Any], device: torch.device) -> Tuple[Any, Any]:
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(device), torch.cuda.graph(graph, pool=self.pool):
            out = fn()
        return graph, out

    def replay(self, graph: Any, device: torch.device) -> None:
        with torch.cuda.device(device):  # the graph's device's current stream, also when another device is current
            graph.replay()


class _Captured:
    __slots__ = ("graph", "inputs", "outputs", "rebuild")

    def __init__(self, graph: Any, inputs: List[torch.Tensor], outputs: List[torch.Tensor],
                 rebuild: Callable[[List[torch.Tensor]], Any]) -> None:
        self.graph, self.inputs, self.outputs, self.rebuild = graph, inputs, outputs, rebuild


class CudaGraphModule(nn.Module):
    """Wraps an eval-mode CUDA module; forward replays a CUDA graph captured per input signature (see the module
    docstring for the rules).  `module` stays reachable as `.module`; `graphs` is the number held now."""

    def __init__(self, module: nn.Module, *, max_graphs: int = 8, warmup: int = 2, clone_output: bool = True,
                 _graphs: Any = None) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1:
            raise ValueError(f"max_graphs: expected a positive int, got {max_graphs!r}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"warmup: expected an int >= 1 (calls before each capture), got {warmup!r}")
        self.module = module
        self.max_graphs = max_graphs
        self.warmup = warmup
        self.clone_output = bool(clone_output)
        self._backend = _graphs if _graphs is not None else _TorchGraphs()
        self._captured: "collections.OrderedDict[Hashable, _Captured]" = collections.OrderedDict()

    @property
    def graphs(self) -> int:
        return len(self._captured)

    def reset(self) -> None:
        """Drop every captured graph (the next call of each signature captures again)."""
        self._captured.clear()

    def _apply(self, fn, *args, **kwargs):  # .to() / .cuda() / .half(): the parameters move, the graphs are stale
        self.reset()
        return super()._apply(fn, *args, **kwargs)

    def _module_device(self) -> Optional[torch.device]:
        for t in self.module.parameters():
            return t.device
        for t in self.module.buffers():
            return t.device
        return None

    def _check(self, inputs: Sequence[Any]) -> torch.device:
        if self.module.training:
            raise RuntimeError(f"module: {type(self.module).__name__} is in training mode; a CUDA graph would freeze "
                               "dropout and batch statistics: call .eval() first (the graph path is for inference)")
        if not inputs:
            raise ValueError("inputs: expected at least one tensor, got none")
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"inputs[{i}]: expected a tensor (a graph replays fixed tensor inputs), "
                                f"got {type(x).__name__}")
            if x.device.type != self._backend.device_type:
                raise ValueError(f"inputs[{i}]: expected a {self._backend.device_type.upper()} tensor (CUDA graphs "
                                 f"replay on the GPU), got device {x.device}")
            if x.requires_grad:
                raise ValueError(f"inputs[{i}]: requires_grad=True, but a CUDA graph records no autograd history; "
                                 "call the module itself to train or to differentiate")
        device = inputs[0].device
        if any(x.device != device for x in inputs):
            raise ValueError(f"inputs: expected every tensor on one device, got {[str(x.device) for x in inputs]}")
        module_device = self._module_device()
        if module_device is not None and module_device != device:
            raise ValueError(f"module: its parameters are on {module_device}, the input on {device}: move the "
                             "module with .to(device) / .cuda() (before or after wrapping)")
        return device

    def forward(self, *inputs: torch.Tensor, **kwargs: Any) -> Any:
        if kwargs:
            raise TypeError(f"CudaGraphModule.forward: keyword arguments are not captured, got {sorted(kwargs)}")
        device = self._check(inputs)
        autocast = _autocast_state(self._backend.device_type)
        key = (tuple((tuple(x.shape), x.dtype) for x in inputs), device, autocast)
        entry = self._captured.get(key)
        if entry is None:
            entry = self._capture(inputs, device, autocast)
            self._captured[key] = entry
            while len(self._captured) > self.max_graphs:
                self._captured.popitem(last=False)
        else:
            self._captured.move_to_end(key)
            for static, x in zip(entry.inputs, inputs):
                static.copy_(x)
        self._backend.replay(entry.graph, device)
        outputs = [t.clone() for t in entry.outputs] if self.clone_output else list(entry.outputs)
        return entry.rebuild(outputs)

    def _capture(self, inputs: Sequence[torch.Tensor], device: torch.device,
                 autocast: Tuple[bool, Optional[torch.dtype]]) -> _Captured:
        # The graph's input buffers hold this call's data, so the capture's own replay below answers this call.
        # They are never inference tensors (a first call under torch.inference_mode would make them so), or a
        # later call outside inference mode could not copy into them.
        with torch.inference_mode(False):
            static = [x.detach().clone(memory_format=torch.contiguous_format) for x in inputs]
        enabled, dtype = autocast

        def run() -> Any:
            # Autocast's weight-cast cache would keep tensors allocated outside the graph's pool alive across
            # replays: capture with the cache off (torch's advice for graphs under autocast).
            ctx = (torch.autocast(self._backend.device_type, dtype=dtype, cache_enabled=False) if enabled
                   else contextlib.nullcontext())
            with torch.no_grad(), ctx:
                return self.module(*static)

        self._backend.warm(run, device, self.warmup)
        try:
            graph, out = self._backend.capture(run, device)
        except RuntimeError as exc:
            raise RuntimeError(
                f"cuda_graph: capturing {type(self.module).__name__} for inputs "
                f"{[tuple(x.shape) for x in inputs]} failed. A forward that synchronises with the host (.item(), "
                f".tolist(), data-dependent Python branches) or allocates pinned host memory cannot be captured; "
                f"run the module without cuda_graph. ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            ) from exc
        tensors, rebuild = _flatten_output(out)
        return _Captured(graph, static, tensors, rebuild)

    def extra_repr(self) -> str:
        return f"max_graphs={self.max_graphs}, warmup={self.warmup}, clone_output={self.clone_output}, graphs={self.graphs}"


def cuda_graph(module: nn.Module, *, max_graphs: int = 8, warmup: int = 2, clone_output: bool = True) -> CudaGraphModule:
    """`module` (eval mode, on a CUDA device) wrapped so that its forward replays CUDA graphs: see this module's
    docstring.  Typical use: `vitfast.cuda_graph(vitfast.load(path).cuda())`."""
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_graph: torch.cuda.is_available() is False here; CUDA graphs need a CUDA device")
    return CudaGraphModule(module, max_graphs=max_graphs, warmup=warmup, clone_output=clone_output)
