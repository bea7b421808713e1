"""`FusedChannelIdleFFN`: the whole FFN sub-block of every fused block (norm, channel-idle FFN, shortcut) through
`vitfast.ops.channel_idle_ffn` (RePaViT eq. 6), built from a folded FFN (`_fold.fold_ffn`), a timm Mlp or its config."""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, Dict, Optional

import torch
import torch.nn as nn

from .. import ops
from . import _timm
from ._base import ConfigReader, apply_norm
from ._fold import FoldedFFN, fold_ffn
from .registry import register_fused


def active_channels(hidden_features: int, idle_ratio: float) -> int:
    """Number of GELU channels for an idle ratio θ: ceil(hidden·(1 − θ)) (RePaViT: θ = 1 − μ/ρ).

    Rounded to 9 decimals first so that e.g. 768·(1 − 0.75) is 192, not 193 from float noise.
    """
    if not isinstance(idle_ratio, (int, float)) or isinstance(idle_ratio, bool) or not 0.0 <= idle_ratio <= 1.0:
        raise ValueError(f"idle_ratio: expected a number in [0, 1], got {idle_ratio!r}")
    return int(math.ceil(round(hidden_features * (1.0 - float(idle_ratio)), 9)))


# ------------------------------------------------------------------------------------------ FFN
@register_fused("channel_idle_ffn")
class FusedChannelIdleFFN(nn.Module):
    """x ↦ channel_idle_ffn(norm(x), w_in, b_in, w_out, b_out, residual = x if residual else None).

    Tensors (nn.Linear layout, [out, in]): w_in [A + L, C] (A GELU rows, then L ∈ {0, C} linear rows),
    b_in [A + L], w_out [C, A], b_out [C].  `norm="layer"`: a non-affine LayerNorm in front (the affine was
    folded into w_in/b_in) — LN variant, whose shortcut must stay explicit (`residual=True`).  `norm=None`: the
    BatchNorm variant, both BNs and the shortcut already folded into the linear rows (eq. 5), so `residual`
    is False unless there is no linear path (θ = 0), where the shortcut is cheaper as an add than as an I GEMM.
    """

    def __init__(
        self,
        features: int,
        active_features: int,
        linear_path: bool,
        *,
        norm: Optional[str] = None,
        norm_eps: float = 1e-6,
        residual: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if not isinstance(features, int) or features <= 0:
            raise ValueError(f"features: expected a positive int, got {features!r}")
        if not isinstance(active_features, int) or active_features < 0:
            raise ValueError(f"active_features: expected an int >= 0, got {active_features!r}")
        if active_features == 0 and not linear_path:
            raise ValueError("active_features, linear_path: expected at least one path, got 0 active and no linear path")
        if norm not in (None, "layer"):
            raise ValueError(f"norm: expected None or 'layer', got {norm!r}")
        dd = {"device": device, "dtype": dtype}
        self.features = features
        self.active_features = active_features
        self.linear_path = bool(linear_path)
        self.residual = bool(residual)
        rows = active_features + (features if linear_path else 0)
        self.norm = nn.LayerNorm(features, eps=norm_eps, elementwise_affine=False) if norm == "layer" else None
        self.w_in = nn.Parameter(torch.empty(rows, features, **dd))
        self.b_in = nn.Parameter(torch.empty(rows, **dd))
        self.w_out = nn.Parameter(torch.empty(features, active_features, **dd))
        self.b_out = nn.Parameter(torch.empty(features, **dd))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.w_in, std=0.02)
        nn.init.trunc_normal_(self.w_out, std=0.02)
        nn.init.zeros_(self.b_in)
        nn.init.zeros_(self.b_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = apply_norm(self.norm, x)
        return ops.channel_idle_ffn(
            y, self.w_in, self.b_in, self.w_out, self.b_out, x if self.residual else None
        )

    def __getattr__(self, name: str):
        # timm's `VisionTransformer(fix_init=True)` rescales `block.mlp.fc2.weight` in place.  With no linear
        # path (θ = 0) fc2 is w_out/b_out exactly (any hidden BatchNorm folded in is a per-column scale, so
        # scaling fc2 scales w_out alike); with one, fc2's idle columns live inside w_in's linear rows.
        if name == "fc2":
            if self.linear_path:
                raise AttributeError(
                    "fc2: a fused channel-idle FFN (θ > 0) has no separate fc2 (its idle channels are folded into "
                    "w_in's linear rows, RePaViT eq. 6), so timm's fix_init=True cannot rescale it; build with "
                    "fix_init=False, or train the ChannelIdleBlock form (which has fc2) and vitfast.fuse it"
                )
            return SimpleNamespace(weight=self.w_out, bias=self.b_out)
        return super().__getattr__(name)

    def vitfast_prepack(self) -> bool:
        """Pack this FFN's weights for the CPU kernel now (see `vitfast.ops.prepack`); False when not on CPU."""
        if self.w_in.device.type != "cpu":
            return False
        x = self.w_in.new_zeros(1, self.features)
        ops.channel_idle_ffn(x, self.w_in, self.b_in, self.w_out, self.b_out, x if self.residual else None)
        return True

    @classmethod
    def from_folded(cls, folded: FoldedFFN, *, device=None, dtype=None) -> "FusedChannelIdleFFN":
        """Build from float64 folded tensors (see `_fold.fold_ffn`), cast once to `dtype`."""
        features = folded.b_out.shape[0]
        module = cls(
            features,
            folded.active_features,
            folded.linear_path,
            norm="layer" if folded.norm_eps is not None else None,
            norm_eps=folded.norm_eps if folded.norm_eps is not None else 1e-6,
            residual=folded.residual,
            device=device,
            dtype=dtype,
        )
        with torch.no_grad():
            for name in ("w_in", "b_in", "w_out", "b_out"):
                getattr(module, name).copy_(getattr(folded, name))
        return module

    @classmethod
    def from_timm_mlp(
        cls, norm: nn.Module, mlp: nn.Module, layer_scale: Optional[torch.Tensor] = None, name: str = "mlp"
    ) -> "FusedChannelIdleFFN":
        """Fuse a vanilla timm FFN sub-block `x + ls(mlp(norm(x)))` (θ = 0: all channels active, LN variant)."""
        dim = mlp.fc1.in_features
        _timm.check_mlp(mlp, name, dim)
        _timm.check_layernorm(norm, f"{name} pre-norm", dim)
        folded = fold_ffn(
            fc1_weight=mlp.fc1.weight,
            fc1_bias=mlp.fc1.bias,
            fc2_weight=mlp.fc2.weight,
            fc2_bias=mlp.fc2.bias,
            active_features=mlp.fc1.out_features,
            pre_norm=norm,
            layer_scale=layer_scale,
            name=name,
        )
        return cls.from_folded(folded, device=mlp.fc1.weight.device, dtype=mlp.fc1.weight.dtype)

    @classmethod
    def for_structure(
        cls, features: int, hidden_features: int, active_features: int, ffn_norm: str, norm_eps: float, **dd
    ) -> "FusedChannelIdleFFN":
        """The fused shape of an FFN with `active_features` of `hidden_features` GELU channels."""
        if ffn_norm not in ("layer", "batch"):
            raise ValueError(f"ffn_norm: expected 'layer' or 'batch', got {ffn_norm!r}")
        if not 0 <= active_features <= hidden_features:
            raise ValueError(f"active_features: expected 0..{hidden_features}, got {active_features}")
        linear_path = active_features < hidden_features
        return cls(
            features,
            active_features,
            linear_path,
            norm="layer" if ffn_norm == "layer" else None,
            norm_eps=norm_eps,
            residual=ffn_norm == "layer" or not linear_path,
            **dd,
        )

    def vitfast_config(self) -> Dict[str, Any]:
        return {
            "kind": self.vitfast_kind,
            "features": self.features,
            "active_features": self.active_features,
            "linear_path": self.linear_path,
            "norm": "layer" if self.norm is not None else None,
            "norm_eps": float(self.norm.eps) if self.norm is not None else None,
            "residual": self.residual,
        }

    @classmethod
    def from_vitfast_config(cls, cfg: Dict[str, Any], *, device=None, dtype=None) -> "FusedChannelIdleFFN":
        read = ConfigReader(
            cfg, "channel_idle_ffn", ("features", "active_features", "linear_path", "norm", "norm_eps", "residual")
        )
        norm = read.choice("norm", (None, "layer"))
        norm_eps = read.eps("norm_eps", optional=norm is None)
        return cls(
            read.int("features"),
            read.int("active_features", minimum=0),
            read.bool("linear_path"),
            norm=norm,
            norm_eps=norm_eps if norm_eps is not None else 1e-6,
            residual=read.bool("residual"),
            device=device,
            dtype=dtype,
        )

    def extra_repr(self) -> str:
        return (
            f"features={self.features}, active_features={self.active_features}, "
            f"linear_path={self.linear_path}, residual={self.residual}"
        )
