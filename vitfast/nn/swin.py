"""`FusedSwinBlock`: a timm `SwinTransformerBlock` (subclass: isinstance and the window machinery stay timm's) whose
FFN sub-block is a `FusedChannelIdleFFN`; `SwinChannelIdle` is what it shares with the train-time channel-idle Swin
block of `vitfast.methods.repavit`."""
from __future__ import annotations

from functools import partial
from typing import Any, Dict, Optional

import torch
import torch.nn as nn
from timm.models.swin_transformer import SwinTransformerBlock

from . import _timm
from ._base import ConfigReader, apply_norm
from ._fold import affine_norm_state
from .ffn import FusedChannelIdleFFN, active_channels
from .registry import register_fused


# ------------------------------------------------------------------------------------------ Swin block
class SwinChannelIdle:
    """What the train-time and fused Swin blocks share (mixed in before timm's `SwinTransformerBlock`): timm's
    block without its norm2 and drop_path2, and a forward in which the FFN module `mlp` owns its norm and shortcut.
    """

    def _init_timm_without_norm2(self, **timm_args) -> float:
        """timm's `SwinTransformerBlock.__init__` (arguments this timm version lacks are dropped), less norm2 and
        drop_path2, which the channel-idle FFN replaces with its own; returns norm2's eps (for an FFN LayerNorm)."""
        super().__init__(**_timm.swin_block_kwargs(**timm_args))
        norm_eps = float(self.norm2.eps)
        del self.norm2, self.drop_path2
        return norm_eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, height, width, channels = x.shape
        x = x + self.drop_path1(self._attn(apply_norm(self.norm1, x)))
        x = self.mlp(x.reshape(batch, -1, channels))
        return x.reshape(batch, height, width, channels)


@register_fused("swin_block")
class FusedSwinBlock(SwinChannelIdle, SwinTransformerBlock):
    """Fused Swin block: timm's `SwinTransformerBlock` (windowed attention unchanged, norm1 kept — its affine
    cannot be folded because padded window tokens are zeros *after* the norm) with a `FusedChannelIdleFFN` as
    `mlp` replacing norm2 → Mlp → shortcut.  Same constructor arguments as timm's, plus the FFN shape
    keywords of `FusedBlock`; `ffn_config` (used by checkpoint loading) gives the FFN's exact config instead.
    """

    def __init__(
        self,
        dim: int,
        input_resolution,
        num_heads: int = 4,
        head_dim: Optional[int] = None,
        window_size=7,
        shift_size=0,
        always_partition: bool = False,
        dynamic_mask: bool = False,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        act_layer=nn.GELU,
        norm_layer=nn.LayerNorm,
        device=None,
        dtype=None,
        *,
        idle_ratio: float = 0.0,
        ffn_norm: str = "layer",
        active_features: Optional[int] = None,
        ffn_config: Optional[Dict[str, Any]] = None,
    ) -> None:
        _timm.check_gelu(act_layer(), "act_layer")
        norm_eps = self._init_timm_without_norm2(  # no drop-path/dropout: inference identities
            dim=dim, input_resolution=input_resolution, num_heads=num_heads, head_dim=head_dim,
            window_size=window_size, shift_size=shift_size, always_partition=always_partition,
            dynamic_mask=dynamic_mask, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, drop_path=0.0,
            act_layer=act_layer, norm_layer=norm_layer, device=device, dtype=dtype,
        )
        dd = {"device": device, "dtype": dtype}
        if ffn_config is not None:
            self.mlp = FusedChannelIdleFFN.from_vitfast_config(ffn_config, **dd)
        else:
            hidden = int(dim * mlp_ratio)
            active = active_features if active_features is not None else active_channels(hidden, idle_ratio)
            self.mlp = FusedChannelIdleFFN.for_structure(dim, hidden, active, ffn_norm, norm_eps, **dd)
        if self.mlp.features != dim:
            raise ValueError(f"ffn_config['features']: expected {dim}, got {self.mlp.features}")

    @classmethod
    def from_parts(cls, block: SwinTransformerBlock, mlp: FusedChannelIdleFFN, name: str) -> "FusedSwinBlock":
        """The fused Swin block from a Swin block (timm's, or a train-time channel-idle one) and its fused FFN."""
        spec = _timm.swin_block_spec(block, name)
        weight = block.attn.qkv.weight
        fused = cls(
            **_timm.swin_block_args(spec),
            ffn_config=mlp.vitfast_config(),
            device=weight.device,
            dtype=weight.dtype,
        )
        state = {"norm1." + k: v for k, v in affine_norm_state(block.norm1, weight).items()}
        state.update({"attn." + k: v for k, v in block.attn.state_dict().items()})
        state.update({"mlp." + k: v for k, v in mlp.state_dict().items()})
        fused.load_state_dict(state, strict=True)
        return fused.eval()

    @classmethod
    def from_timm(cls, block: SwinTransformerBlock, name: str = "block") -> "FusedSwinBlock":
        """Fuse a vanilla timm `SwinTransformerBlock`; outputs equal the timm block's (eval mode)."""
        _timm.swin_block_spec(block, name, require_mlp=True)
        ffn = FusedChannelIdleFFN.from_timm_mlp(block.norm2, block.mlp, name=f"{name}.mlp")
        return cls.from_parts(block, ffn, name)

    def vitfast_config(self) -> Dict[str, Any]:
        spec = _timm.swin_block_spec(self, "block")
        return {
            "kind": self.vitfast_kind,
            "dim": spec["dim"],
            "input_resolution": list(spec["input_resolution"]),
            "num_heads": spec["num_heads"],
            "head_dim": spec["head_dim"],
            "window_size": list(spec["window_size"]),
            "shift_size": list(spec["shift_size"]),
            "always_partition": spec["always_partition"],
            "dynamic_mask": spec["dynamic_mask"],
            "qkv_bias": spec["qkv_bias"],
            "norm_eps": spec["norm_eps"],
            "mlp": self.mlp.vitfast_config(),
        }

    @classmethod
    def from_vitfast_config(cls, cfg: Dict[str, Any], *, device=None, dtype=None) -> "FusedSwinBlock":
        read = ConfigReader(cfg, "swin_block", (
            "dim", "input_resolution", "num_heads", "head_dim", "window_size", "shift_size", "always_partition",
            "dynamic_mask", "qkv_bias", "norm_eps", "mlp",
        ))
        window, shift = read.pair("window_size", 1), read.pair("shift_size", 0)
        if any(s >= w for s, w in zip(shift, window)):
            # timm keeps any shift it is given when the resolution exceeds the window, and torch.roll wraps it:
            # a corrupt shift of 10^9 loaded and computed another model.  A cyclic shift is below the window.
            raise ValueError(f"cfg['shift_size']: expected values below the window size {list(window)}, got {list(shift)}")
        return cls(
            dim=read.int("dim"),
            input_resolution=read.pair("input_resolution", 1),
            num_heads=read.int("num_heads"),
            head_dim=read.int("head_dim"),
            window_size=window,
            shift_size=shift,
            always_partition=read.bool("always_partition"),
            dynamic_mask=read.bool("dynamic_mask"),
            qkv_bias=read.bool("qkv_bias"),
            norm_layer=partial(nn.LayerNorm, eps=read.eps("norm_eps")),
            ffn_config=read.dict("mlp"),
            device=device,
            dtype=dtype,
        )
