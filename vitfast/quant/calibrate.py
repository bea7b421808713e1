"""Calibration: run a few batches through the fp32 fused model and record, at the input of every quantizable GEMM,
what the quantizer needs: per-channel |x| maxima (SmoothQuant's migration scales), the tensor's |x| maximum (static
per-tensor scales), and — in a second pass, with the int8 candidates built — each layer's own output error on those
inputs (the `skip=` error budget and the per-layer report).

The recorders stand in for the layers while the model runs: a fused attention calls a non-`nn.Linear` qkv/proj as a
module (vitfast.nn.block), timm's window attention always does, and a block calls its FFN as a module; the recorder
computes exactly the fp32 layer's output, so every later layer sees fp32 activations.
"""
from __future__ import annotations

import sys
from typing import Callable, Dict, Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import ops
from ..nn.ffn import FusedChannelIdleFFN
from ..nn._base import apply_norm
from ..nn.patch_embed import patch_rows
from .structure import set_submodule


class Stats:
    """Running |x| maxima of one GEMM input: per channel (last dim) and over the tensor."""

    def __init__(self) -> None:
        self.channel: Optional[torch.Tensor] = None
        self.tensor = 0.0

    def add(self, x: torch.Tensor) -> None:
        m = x.detach().float().abs().reshape(-1, x.shape[-1]).amax(dim=0)
        self.channel = m if self.channel is None else torch.maximum(self.channel, m)
        self.tensor = max(self.tensor, float(m.max()) if m.numel() else 0.0)


class ErrorSum:
    """Σ‖y_q − y‖² and Σ‖y‖² over the calibration batches: the layer's relative output error."""

    def __init__(self) -> None:
        self.num = 0.0
        self.den = 0.0
        self.count = 0

    def add(self, y_q: torch.Tensor, y: torch.Tensor) -> None:
        self.num += float((y_q.double() - y.double()).pow(2).sum())
        self.den += float(y.double().pow(2).sum())
        self.count += 1

    @property
    def relative(self) -> Optional[float]:
        """None when the layer never ran on the calibration images (a gated block whose gate skipped it)."""
        if self.count == 0:
            return None
        return (self.num / self.den) ** 0.5 if self.den > 0 else 0.0


class LinearRecorder(nn.Module):
    """Stands in for an nn.Linear: fp32 output (+ residual), input statistics, optionally the candidate's error."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear
        self.stats = Stats()
        self.candidate: Optional[nn.Module] = None
        self.error = ErrorSum()

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        y = ops.linear(x, self.linear.weight, self.linear.bias, residual)
        self.stats.add(x)
        if self.candidate is not None:
            self.error.add(self.candidate(x, residual), y)
        return y


class FfnRecorder(nn.Module):
    """Stands in for a FusedChannelIdleFFN: statistics of both GEMM inputs (the normed x, the GELU channels)."""

    def __init__(self, ffn: FusedChannelIdleFFN) -> None:
        super().__init__()
        self.ffn = ffn
        self.stats_in, self.stats_out = Stats(), Stats()
        self.candidate: Optional[nn.Module] = None
        self.error = ErrorSum()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ffn = self.ffn
        y = ffn(x)
        xn = apply_norm(ffn.norm, x)
        self.stats_in.add(xn)
        a = ffn.active_features
        if a > 0:
            self.stats_out.add(F.gelu(F.linear(xn.float(), ffn.w_in[:a].float(), ffn.b_in[:a].float())))
        if self.candidate is not None:
            self.error.add(self.candidate(x), y)
        return y


class PatchRecorder(nn.Module):
    """Stands in for the patch projection (a patch conv): its fp32 output, statistics of its GEMM input — the patch
    rows, each patch's values in the conv weight's (channel, row, column) order — and the candidate's error."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv = conv
        self.stats = Stats()
        self.candidate: Optional[nn.Module] = None
        self.error = ErrorSum()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        self.stats.add(patch_rows(x, self.conv.kernel_size)[0])
        if self.candidate is not None:
            self.error.add(self.candidate(x), y)
        return y


_RECORDERS = {"linear": (LinearRecorder, "linear"), "ffn": (FfnRecorder, "ffn"), "patch": (PatchRecorder, "conv")}


def batches(calibration, limit: Optional[int] = None) -> Iterator[torch.Tensor]:
    """Image batches from `calibration`: a tensor [B, C, H, W], or an iterable of tensors / (images, labels, ...)."""
    if isinstance(calibration, torch.Tensor):
        if calibration.dim() != 4:
            raise ValueError(f"calibration: expected images [B, C, H, W], got shape {list(calibration.shape)}")
        yield calibration
        return
    try:
        iterator = iter(calibration)
    except TypeError:
        raise TypeError(f"calibration: expected a tensor of images, or an iterable (a DataLoader) of image tensors or "
                        f"(images, labels) pairs, got {type(calibration).__name__}") from None
    for i, item in enumerate(iterator):
        if limit is not None and i >= limit:
            return
        images = item[0] if isinstance(item, (tuple, list)) and item else item
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            got = list(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(f"calibration: expected batches of images [B, C, H, W], got {got} at batch {i}")
        yield images


def run_model(model: nn.Module, calibration, *, max_batches: Optional[int], progress: bool, what: str) -> int:
    """One pass of `model` over the calibration batches; returns the number of images."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    count = 0
    with torch.no_grad():
        for i, images in enumerate(batches(calibration, max_batches)):
            model(images.to(device=device, dtype=torch.float32))
            count += images.shape[0]
            if progress and sys.stderr.isatty():  # one line rewritten in place on a terminal, the total in a log
                print(f"\rvitfast.quantize: {what}: {count} images", end="", file=sys.stderr, flush=True)
    if progress and count:
        print(("\r" if sys.stderr.isatty() else "") + f"vitfast.quantize: {what}: {count} images", file=sys.stderr)
    if count == 0:
        raise ValueError("calibration: expected at least one image, got none")
    return count


def install(model: nn.Module, layers: Dict[str, str]) -> Dict[str, nn.Module]:
    """Put a recorder in place of every layer in `layers` (path -> "linear" | "ffn" | "patch"); returns them by
    path."""
    recorders: Dict[str, nn.Module] = {}
    for path, kind in layers.items():
        recorder = _RECORDERS[kind][0](model.get_submodule(path))
        set_submodule(model, path, recorder)
        recorders[path] = recorder
    return recorders


def recorded_layer(recorder: nn.Module) -> nn.Module:
    """The fp32 layer a recorder stands in for."""
    return next(getattr(recorder, attr) for cls, attr in _RECORDERS.values() if isinstance(recorder, cls))


def remove(model: nn.Module, recorders: Dict[str, nn.Module]) -> None:
    for path, recorder in recorders.items():
        set_submodule(model, path, recorded_layer(recorder))


def with_recorders(model: nn.Module, layers: Dict[str, str], body: Callable[[Dict[str, nn.Module]], None]) -> None:
    recorders = install(model, layers)
    try:
        body(recorders)
    finally:
        remove(model, recorders)


