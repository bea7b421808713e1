"""Int8 inference modules that `vitfast.quantize` puts in place of a fused model's layers (vitfast/quant):

* `Int8Linear` replaces an `nn.Linear` (the fused attention's qkv and proj, Swin's window attention): int8 weight per
  output channel, int8 activations per token (or one static scale), on `vitfast.ops.linear_int8`.
* `Int8ChannelIdleFFN` replaces a `FusedChannelIdleFFN` (the FFN of every fused block kind): both GEMMs int8, the
  norm, GELU, linear path and shortcut in fp32, on `vitfast.ops.channel_idle_ffn_int8`.
* `Int8PatchProjection` replaces the patch embedding's projection (a patch Conv2d / `GemmPatchProjection`): the same
  one copy of the image into patch rows, then `linear_int8` over them (int8 weight per output channel, int8 patches
  per token), returned in the conv's shape.

They are not fused kinds of their own: the file keeps the fp32 structure (an `Int8ChannelIdleFFN` describes itself
with its fp32 FFN's config, so a block that embeds its FFN's config still writes the same one), and the quantization
is recorded beside it (`quant_config()`, config key "quantization" in vitfast/io/fused.py), from which `vitfast.load`
puts these modules back (`from_quant_config`) before loading the tensors.

A weight is quantized from the fp32 weight (`from_linear`, `from_ffn`), optionally after a SmoothQuant migration:
`smooth` [K] (= 1/s) multiplies the activation inside the quantizer and the weight was multiplied by s per input
channel before it was quantized, so the product is unchanged in exact arithmetic (arXiv 2211.10438).

`split_identity` (a BatchNorm-variant FFN, whose shortcut is folded into the linear path's rows, W_lin = I + W'):
the int8 rows hold W' = W_lin − I only and the shortcut x is added back exactly in fp32 (the op's residual).  With I
inside, each row's int8 scale is set by its diagonal ≈ 1 while the learned W' is an order of magnitude smaller (row
amax/rms ≈ 10 on the digits demo model instead of ≈ 3): the whole residual stream went through an int8 GEMM and the
linear path's weight rounding alone was 1-2% of every block's output (benchmarks/quant_digits.py).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import torch.nn as nn

from .. import ops
from ..reference._int8 import QMAX, quantize_weight
from ._base import ConfigReader, apply_norm
from .ffn import FusedChannelIdleFFN
from .patch_embed import is_patch_projection, patch_rows, tokens_as_conv_output

__all__ = ["Int8Linear", "Int8ChannelIdleFFN", "Int8PatchProjection", "is_int8_module"]


def _smooth_weight(w: torch.Tensor, smooth: Optional[torch.Tensor]) -> torch.Tensor:
    """W · diag(s) for smooth = 1/s (the weight side of the migration), in float64 so only the int8 rounding is left."""
    w = w.detach().double()
    return w if smooth is None else w / smooth.double()


def _load_weight(module: nn.Module, w: torch.Tensor, bias: Optional[torch.Tensor],
                 smooth: Optional[torch.Tensor], qmax: float = QMAX) -> None:
    """module.qweight / w_scale from the weight matrix w [N, K] (after the migration), and its smooth and bias."""
    q, s = quantize_weight(_smooth_weight(w, smooth), qmax)
    with torch.no_grad():
        module.qweight.copy_(q)
        module.w_scale.copy_(s)
        if smooth is not None:
            module.smooth.copy_(smooth.float())
        if bias is not None:
            module.bias.copy_(bias.float())


def _dequantized(module: nn.Module) -> torch.Tensor:
    """diag(w_scale) · qweight · diag(1/smooth) of a module holding them (smooth = 1/s multiplies back)."""
    w = module.qweight.float() * module.w_scale.unsqueeze(1)
    return w if module.smooth is None else w * module.smooth


def _float_or_zero(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) < float("inf"):
        raise ValueError(f"{name}: expected a finite number >= 0 (0: per-token scales), got {value!r}")
    return float(value)


class Int8Linear(nn.Module):
    """y = x · Wᵀ + b (+ residual) with W int8 per output channel and x int8 per token (or `act_scale` > 0: one
    static scale from calibration).  Buffers: `qweight` int8 [out, in], `w_scale` fp32 [out], optional `smooth` fp32
    [in]; `bias` a Parameter like nn.Linear's (fp32).  `forward(x, residual=None)` (the fused attention passes its
    shortcut to proj, as with the fp32 layer)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, smooth: bool = False,
                 act_scale: float = 0.0, device=None) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.act_scale = _float_or_zero("act_scale", act_scale)
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("w_scale", torch.zeros(out_features, dtype=torch.float32, device=device))
        self.register_buffer("smooth", torch.ones(in_features, dtype=torch.float32, device=device) if smooth else None)
        self.bias = nn.Parameter(torch.zeros(out_features, device=device), requires_grad=False) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, smooth: Optional[torch.Tensor] = None,
                    act_scale: float = 0.0, qmax: float = QMAX) -> "Int8Linear":
        w = linear.weight
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, smooth=smooth is not None,
                     act_scale=act_scale, device=w.device)
        _load_weight(module, w, linear.bias, smooth, qmax)
        return module

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        return ops.linear_int8(x, self.qweight, self.w_scale, self.bias, residual, self.smooth, self.act_scale)

    def dequantized_weight(self) -> torch.Tensor:
        """The fp32 weight this layer computes with: diag(w_scale) · qweight · diag(1/smooth)."""
        return _dequantized(self)

    def quant_config(self) -> Dict[str, Any]:
        return {"kind": "int8_linear", "in_features": self.in_features, "out_features": self.out_features,
                "bias": self.bias is not None, "smooth": self.smooth is not None, "act_scale": self.act_scale}

    @classmethod
    def from_quant_config(cls, cfg: Dict[str, Any], device=None) -> "Int8Linear":
        read = ConfigReader(cfg, "int8_linear", ("in_features", "out_features", "bias", "smooth", "act_scale"))
        return cls(read.int("in_features"), read.int("out_features"), read.bool("bias"), smooth=read.bool("smooth"),
                   act_scale=read.eps("act_scale"), device=device)

    def extra_repr(self) -> str:
        acts = f"static scale {self.act_scale:.4g}" if self.act_scale > 0 else "per token"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"int8 weights per channel, int8 activations {acts}{', smoothed' if self.smooth is not None else ''}")


class Int8ChannelIdleFFN(nn.Module):
    """The int8 form of a `FusedChannelIdleFFN` (same norm, shortcut and shape attributes: `features`,
    `active_features`, `linear_path`, `residual`, `norm`).  Buffers: `qw_in` int8 [A + L, C], `s_in` fp32 [A + L],
    `qw_out` int8 [C, A], `s_out` fp32 [C], optional `smooth_in` [C] / `smooth_out` [A]; Parameters `b_in`, `b_out`."""

    def __init__(self, ffn_config: Dict[str, Any], *, smooth_in: bool = False, smooth_out: bool = False,
                 act_scale_in: float = 0.0, act_scale_out: float = 0.0, split_identity: bool = False,
                 device=None) -> None:
        super().__init__()
        shape = FusedChannelIdleFFN.from_vitfast_config(ffn_config, device="meta")  # validates the config
        self.features, self.active_features = shape.features, shape.active_features
        self.linear_path, self.residual = shape.linear_path, shape.residual
        self.norm = (nn.LayerNorm(shape.features, eps=shape.norm.eps, elementwise_affine=False)
                     if shape.norm is not None else None)
        self._ffn_config = dict(ffn_config)
        self.act_scale_in = _float_or_zero("act_scale_in", act_scale_in)
        self.act_scale_out = _float_or_zero("act_scale_out", act_scale_out)
        if split_identity and not self.folded_shortcut(shape):
            raise ValueError(f"split_identity: expected an FFN whose shortcut is folded into its linear path (BatchNorm "
                             f"variant: linear_path, no norm, residual=False), got linear_path={shape.linear_path}, "
                             f"norm={shape.norm is not None}, residual={shape.residual}")
        self.split_identity = bool(split_identity)
        rows, c, a = shape.w_in.shape[0], shape.features, shape.active_features
        dd = {"device": device}
        self.register_buffer("qw_in", torch.zeros(rows, c, dtype=torch.int8, **dd))
        self.register_buffer("s_in", torch.zeros(rows, dtype=torch.float32, **dd))
        self.register_buffer("qw_out", torch.zeros(c, a, dtype=torch.int8, **dd))
        self.register_buffer("s_out", torch.zeros(c, dtype=torch.float32, **dd))
        self.register_buffer("smooth_in", torch.ones(c, dtype=torch.float32, **dd) if smooth_in else None)
        self.register_buffer("smooth_out", torch.ones(a, dtype=torch.float32, **dd) if smooth_out else None)
        self.b_in = nn.Parameter(torch.zeros(rows, **dd), requires_grad=False)
        self.b_out = nn.Parameter(torch.zeros(c, **dd), requires_grad=False)

    @staticmethod
    def folded_shortcut(ffn) -> bool:
        """Whether `ffn`'s linear path holds its shortcut (W_lin = I + W': the BatchNorm variant, eq. 5)."""
        return bool(ffn.linear_path and ffn.norm is None and not ffn.residual)

    @staticmethod
    def input_weight(ffn, split_identity: bool) -> torch.Tensor:
        """The first GEMM's weight [A + L, C] that is quantized: w_in, with I taken off the linear rows if split."""
        w = ffn.w_in.detach()
        if not split_identity:
            return w
        a = ffn.active_features
        w = w.double().clone()
        w[a:].diagonal().sub_(1.0)
        return w

    @classmethod
    def from_ffn(cls, ffn: FusedChannelIdleFFN, *, smooth_in: Optional[torch.Tensor] = None,
                 smooth_out: Optional[torch.Tensor] = None, act_scale_in: float = 0.0,
                 act_scale_out: float = 0.0, split_identity: bool = False,
                 qmax: float = QMAX) -> "Int8ChannelIdleFFN":
        module = cls(ffn.vitfast_config(), smooth_in=smooth_in is not None, smooth_out=smooth_out is not None,
                     act_scale_in=act_scale_in, act_scale_out=act_scale_out, split_identity=split_identity,
                     device=ffn.w_in.device)
        q_in, s_in = quantize_weight(_smooth_weight(cls.input_weight(ffn, split_identity), smooth_in), qmax)
        q_out, s_out = quantize_weight(_smooth_weight(ffn.w_out, smooth_out), qmax)
        with torch.no_grad():
            for name, value in (("qw_in", q_in), ("s_in", s_in), ("qw_out", q_out), ("s_out", s_out),
                                ("smooth_in", smooth_in), ("smooth_out", smooth_out), ("b_in", ffn.b_in),
                                ("b_out", ffn.b_out)):
                if value is not None:
                    getattr(module, name).copy_(value.float() if value.is_floating_point() else value)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = apply_norm(self.norm, x)
        return ops.channel_idle_ffn_int8(y, self.qw_in, self.s_in, self.b_in, self.qw_out, self.s_out, self.b_out,
                                         x if self.residual or self.split_identity else None, self.smooth_in,
                                         self.smooth_out,
                                         self.act_scale_in, self.act_scale_out)

    def vitfast_config(self) -> Dict[str, Any]:
        """The fp32 FFN's config: a block that embeds its FFN's config writes the structure it is rebuilt from."""
        return dict(self._ffn_config)

    def quant_config(self) -> Dict[str, Any]:
        return {"kind": "int8_channel_idle_ffn", "ffn": dict(self._ffn_config), "smooth_in": self.smooth_in is not None,
                "smooth_out": self.smooth_out is not None, "act_scale_in": self.act_scale_in,
                "act_scale_out": self.act_scale_out, "split_identity": self.split_identity}

    @classmethod
    def from_quant_config(cls, cfg: Dict[str, Any], device=None) -> "Int8ChannelIdleFFN":
        read = ConfigReader(cfg, "int8_channel_idle_ffn",
                            ("ffn", "smooth_in", "smooth_out", "act_scale_in", "act_scale_out", "split_identity"))
        # split_identity: absent from the first int8 files (written before it existed): False
        split = read.bool("split_identity") if "split_identity" in cfg else False
        return cls(read.dict("ffn"), smooth_in=read.bool("smooth_in"), smooth_out=read.bool("smooth_out"),
                   act_scale_in=read.eps("act_scale_in"), act_scale_out=read.eps("act_scale_out"),
                   split_identity=split, device=device)

    def extra_repr(self) -> str:
        return (f"features={self.features}, active_features={self.active_features}, linear_path={self.linear_path}, "
                f"residual={self.residual}, int8 GEMMs{', shortcut split off the linear path' if self.split_identity else ''}")


class Int8PatchProjection(nn.Module):
    """The patch embedding's projection (kernel = stride p × q, C → C_out) with int8 weights per output channel and
    int8 patches per token (or `act_scale` > 0: one static scale): y[b, :, i, j] = W · patch(b, i, j) + bias, the conv
    as a dense layer over the flattened patches (vitfast/nn/patch_embed.py), on `linear_int8`.  Buffers: `qweight` int8
    [C_out, C·p·q] (each row in the conv weight's (channel, row, column) order), `w_scale` fp32 [C_out], optional
    `smooth` fp32 [C·p·q]; `bias` a Parameter like the conv's.  Keeps the conv's geometry attributes (`in_channels`,
    `out_channels`, `kernel_size`, `stride`), which the model description and the export read."""

    def __init__(self, in_channels: int, out_channels: int, patch_size, bias: bool = True, *, smooth: bool = False,
                 act_scale: float = 0.0, device=None) -> None:
        super().__init__()
        patch = tuple(int(v) for v in (patch_size if isinstance(patch_size, (tuple, list)) else (patch_size,) * 2))
        if len(patch) != 2 or min(patch) < 1:
            raise ValueError(f"patch_size: expected a positive int or a pair of them, got {patch_size!r}")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = self.stride = patch
        self.in_features = self.in_channels * patch[0] * patch[1]
        self.act_scale = _float_or_zero("act_scale", act_scale)
        dd = {"device": device}
        self.register_buffer("qweight", torch.zeros(self.out_channels, self.in_features, dtype=torch.int8, **dd))
        self.register_buffer("w_scale", torch.zeros(self.out_channels, dtype=torch.float32, **dd))
        self.register_buffer("smooth", torch.ones(self.in_features, dtype=torch.float32, **dd) if smooth else None)
        self.bias = nn.Parameter(torch.zeros(self.out_channels, **dd), requires_grad=False) if bias else None

    @staticmethod
    def weight_matrix(conv: nn.Module) -> torch.Tensor:
        """A patch conv's weight as the [C_out, C·p·q] matrix its GEMM multiplies (columns (channel, row, column))."""
        return conv.weight.detach().reshape(conv.out_channels, -1)

    @classmethod
    def from_conv(cls, conv: nn.Module, *, smooth: Optional[torch.Tensor] = None,
                  act_scale: float = 0.0, qmax: float = QMAX) -> "Int8PatchProjection":
        if not is_patch_projection(conv):
            raise ValueError(f"conv: expected a patch projection (nn.Conv2d or GemmPatchProjection with kernel = "
                             f"stride, no padding, dilation or groups), got {conv!r:.200}")
        module = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.bias is not None,
                     smooth=smooth is not None, act_scale=act_scale, device=conv.weight.device)
        _load_weight(module, cls.weight_matrix(conv), conv.bias, smooth, qmax)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"x: expected images [B, {self.in_channels}, H, W], got shape {list(x.shape)}")
        patches, grid = patch_rows(x, self.kernel_size)
        return tokens_as_conv_output(ops.linear_int8(patches, self.qweight, self.w_scale, self.bias, None, self.smooth,
                                                     self.act_scale), grid)

    def dequantized_weight(self) -> torch.Tensor:
        """The fp32 conv weight [C_out, C, p, q] this layer computes with."""
        return _dequantized(self).reshape(self.out_channels, self.in_channels, *self.kernel_size)

    def quant_config(self) -> Dict[str, Any]:
        return {"kind": "int8_patch_projection", "in_channels": self.in_channels, "out_channels": self.out_channels,
                "patch_size": list(self.kernel_size), "bias": self.bias is not None, "smooth": self.smooth is not None,
                "act_scale": self.act_scale}

    @classmethod
    def from_quant_config(cls, cfg: Dict[str, Any], device=None) -> "Int8PatchProjection":
        read = ConfigReader(cfg, "int8_patch_projection",
                            ("in_channels", "out_channels", "patch_size", "bias", "smooth", "act_scale"))
        return cls(read.int("in_channels"), read.int("out_channels"), read.pair("patch_size", 1),
                   bias=read.bool("bias"), smooth=read.bool("smooth"), act_scale=read.eps("act_scale"), device=device)

    def extra_repr(self) -> str:
        acts = f"static scale {self.act_scale:.4g}" if self.act_scale > 0 else "per token"
        return (f"{self.in_channels}, {self.out_channels}, patch_size={self.kernel_size}, bias={self.bias is not None}, "
                f"int8 weights per channel, int8 patches {acts}{', smoothed' if self.smooth is not None else ''}")


_QUANT_KINDS = {"int8_linear": Int8Linear, "int8_channel_idle_ffn": Int8ChannelIdleFFN,
                "int8_patch_projection": Int8PatchProjection}


def is_int8_module(module: nn.Module) -> bool:
    return type(module) in _QUANT_KINDS.values()


def max_weight_code(model: nn.Module) -> int:
    """The largest |code| of `model`'s int8 weights (0 without any): 64 or less is a 7-bit-weight model
    (`vitfast.quantize(weight_bits=7)`), which AVX2's u8 × s8 multiply takes without saturating."""
    codes = [t for m in model.modules() if is_int8_module(m) for t in m.buffers(recurse=False)
             if t.dtype == torch.int8 and t.numel() > 0]
    return max((int(t.abs().max()) for t in codes), default=0)


def int8_module_from_config(cfg: Dict[str, Any], device=None) -> nn.Module:
    if not isinstance(cfg, dict) or cfg.get("kind") not in _QUANT_KINDS:
        raise ValueError(f"cfg['kind']: expected one of {sorted(_QUANT_KINDS)}, got {cfg!r:.200}")
    return _QUANT_KINDS[cfg["kind"]].from_quant_config(cfg, device=device)
