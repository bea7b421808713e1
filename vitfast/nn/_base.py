"""What the fused modules share (private to `vitfast.nn`): the typed reader of file-borne configs, the LayerNorm
call that takes the CPU kernel, and the checks that decide whether an nn layer may leave its torch forward for the
kernels (not under tracing or torch.compile, whose graphs keep the standard ops)."""
from __future__ import annotations

import math
from typing import Any, Dict, Optional

import torch
import torch.nn as nn
from timm.layers import LayerNorm as TimmLayerNorm

from .. import ops
from . import _timm

_IS_COMPILING = getattr(getattr(torch, "compiler", None), "is_compiling", None)  # torch >= 2.3


def tracing() -> bool:
    """Whether a graph is being recorded (TorchScript trace, torch.compile / torch.export, either ONNX exporter):
    the modules then keep the standard ops and host-side decisions stay out of the graph."""
    return (torch.jit.is_tracing() or (_IS_COMPILING is not None and _IS_COMPILING())
            or ops.onnx_exporting())


def cpu_kernel_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether an nn layer turned fast (GemmPatchProjection, PackedLinear) may run x through the CPU kernels
    instead of its own torch forward: not under tracing / torch.compile (exported graphs keep the standard op),
    a CPU float input of the weight's dtype, the C++ extension loaded, and the auto backend (under
    VITFAST_BACKEND=reference the layer is its own reference).  Autograd needs no check: `ops.*` differentiate
    their reference."""
    return (
        not tracing()  # first: under tracing the checks below would warn (tensor -> bool)
        and x.is_cpu
        and x.dtype == weight.dtype
        and x.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and ops.extension_loaded()
        and ops.get_backend() != "reference"
    )


# LayerNorm modules whose forward is F.layer_norm over normalized_shape (timm's, unless its fast_norm is on).
PLAIN_LAYER_NORMS = (nn.LayerNorm, TimmLayerNorm)


def apply_norm(norm: Optional[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """`norm(x)` for the fused modules' LayerNorms (most without an affine: it was folded into the next linear).

    On CPU an nn.LayerNorm over the last dimension runs `vitfast.ops.layer_norm` (kernels/layer_norm.h): torch's
    CPU kernel took 20.0 µs at [1, 197, 192] with an affine and 38.9 µs without one (a slower path), the op
    10.4 µs (one thread, measured together).  Traced / compiled graphs keep the plain module call.
    """
    if norm is None:
        return x
    # Called twice per block per forward: the checks read the parameter dict and x.is_cpu directly (each
    # nn.Module attribute fallback or torch.device object costs ~0.3 µs, ~5% of a DeiT-Ti block's Python time).
    params = norm._parameters
    weight, bias = params.get("weight"), params.get("bias")
    # (timm's LayerNorm keeps _fast_norm in its instance dict; getattr's miss on nn.LayerNorm raised and caught an
    # AttributeError inside nn.Module.__getattr__: ~3 µs per call.)
    if (type(norm) not in PLAIN_LAYER_NORMS or not x.is_cpu or len(norm.normalized_shape) != 1
            or (weight is not None and weight.dtype != x.dtype) or norm.__dict__.get("_fast_norm", False)
            or tracing()):
        return norm(x)
    return ops.layer_norm(x, weight, bias, norm.eps)


def layernorm_eps(norm_layer, dim: int, name: str = "norm_layer") -> float:
    """Instantiate `norm_layer(dim)` once to read its eps (timm passes classes or partials)."""
    return _timm.check_layernorm(norm_layer(dim), name, dim)


def check_kind(cfg: Dict[str, Any], kind: str) -> None:
    if not isinstance(cfg, dict) or cfg.get("kind") != kind:
        got = cfg.get("kind") if isinstance(cfg, dict) else type(cfg).__name__
        raise ValueError(f"cfg['kind']: expected {kind!r}, got {got!r}")


def default_if_none(value, default):
    return default if value is None else value


class ConfigReader:
    """Typed access to a (possibly untrusted, file-borne) config: every bad value is a ValueError naming the key.

    Unknown keys are refused too: a config this code cannot fully interpret must not load as something else.
    """

    def __init__(self, cfg: Dict[str, Any], kind: str, keys: tuple) -> None:
        check_kind(cfg, kind)
        unknown = sorted(set(cfg) - set(keys) - {"kind"})
        if unknown:
            raise ValueError(f"cfg: unexpected keys {unknown} for kind {kind!r}")
        self.cfg = cfg

    def _get(self, key: str):
        if key not in self.cfg:
            raise ValueError(f"cfg[{key!r}]: expected a value, not found")
        return self.cfg[key]

    def int(self, key: str, minimum: int = 1, optional: bool = False) -> Optional[int]:
        if optional and key not in self.cfg:
            return None
        value = self._get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"cfg[{key!r}]: expected an int >= {minimum}, got {value!r}")
        return value

    def bool(self, key: str) -> bool:
        value = self._get(key)
        if not isinstance(value, bool):
            raise ValueError(f"cfg[{key!r}]: expected true or false, got {value!r}")
        return value

    def eps(self, key: str, optional: bool = False) -> Optional[float]:
        value = self._get(key) if not optional or key in self.cfg else None
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"cfg[{key!r}]: expected a finite number >= 0, got {value!r}")
        return float(value)

    def pair(self, key: str, minimum: int) -> tuple:
        value = self._get(key)
        if (not isinstance(value, (list, tuple)) or len(value) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in value)):
            raise ValueError(f"cfg[{key!r}]: expected two ints >= {minimum}, got {value!r}")
        return tuple(value)

    def choice(self, key: str, choices: tuple):
        value = self._get(key)
        if value not in choices:
            raise ValueError(f"cfg[{key!r}]: expected one of {choices}, got {value!r}")
        return value

    def dict(self, key: str) -> Dict[str, Any]:
        value = self._get(key)
        if not isinstance(value, dict):
            raise ValueError(f"cfg[{key!r}]: expected an object, got {type(value).__name__}")
        return value


# ------------------------------------------------------------------------------------------ ViT block
def plain_norm_eps(norm: Optional[nn.Module]) -> Optional[float]:
    """eps of a LayerNorm without an affine that `layer_norm` runs as `ops.layer_norm`; None for anything else."""
    if (type(norm) not in PLAIN_LAYER_NORMS or len(norm.normalized_shape) != 1
            or norm.__dict__.get("_fast_norm", False)):
        return None
    params = norm._parameters
    if params.get("weight") is not None or params.get("bias") is not None:
        return None
    return float(norm.eps)
