"""Train-time RePaViT modules (reference PyTorch, autograd): the channel-idle FFN and the blocks that hold it.

RePaViT eq. 2, per FFN sub-block:

    X_in  = BN(X) · W_in                                   (pre-norm: BatchNorm1d over C, or LayerNorm)
    X_act = Concat(GELU(X_in[:, :A]), X_in[:, A:])          A = ceil(hidden · (1 − θ)) active channels
    Y     = BN(X_act) · W_out + X                           (hidden BatchNorm1d: BN variant only)

BatchNorm over tokens treats every token as a sample: statistics over [B·N, C].  Every module here has a
`to_fused()` returning its inference counterpart from `vitfast.nn.block` (eval-mode statistics, eq. 3-6); this is
the hook `vitfast.fuse` looks for.
"""
from __future__ import annotations

import inspect
from typing import List, Optional

import torch
import torch.nn as nn
from timm.layers import DropPath, LayerNorm as TimmLayerNorm, LayerScale, Mlp
from timm.models.swin_transformer import SwinTransformerBlock
from timm.models.vision_transformer import Attention as TimmAttention

from ..._copy import deepcopy_model
from ...arch import register_stand_in
from ...nn import _timm
from ...nn._fold import fold_ffn
from ...nn.block import FusedBlock
from ...nn.ffn import FusedChannelIdleFFN, active_channels
from ...nn.swin import FusedSwinBlock, SwinChannelIdle

__all__ = ["idle_ratios", "ChannelIdleMlp", "ChannelIdleBlock", "ChannelIdleSwinBlock", "FFN_NORMS", "HEURISTICS"]

FFN_NORMS = ("batch", "layer")
HEURISTICS = ("static", "linear")


def idle_ratios(depth: int, theta: float, heuristic: str = "static", *, spread: float = 0.25) -> List[float]:
    """Per-layer channel idle ratios θ_0 … θ_{depth−1}.

    "static" (the paper's): θ_i = θ for every layer.
    "linear" (vitfast's own heuristic; the paper has none): θ ramps linearly with
    depth from θ − δ at the first layer to θ + δ at the last, δ = min(spread, θ, 1 − θ), i.e.

        θ_i = θ − δ + 2δ · i / (depth − 1)

    so shallow layers keep more GELU channels, deep layers are more linear, every θ_i stays in [0, 1], and the
    mean over layers is θ (the same parameter and FLOP budget as "static", up to the per-layer ceil of the
    active channel count).  With depth 1, or θ ∈ {0, 1}, it equals "static".
    """
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise ValueError(f"depth: expected an int >= 1, got {depth!r}")
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not 0.0 <= theta <= 1.0:
        raise ValueError(f"theta: expected a number in [0, 1], got {theta!r}")
    if heuristic not in HEURISTICS:
        raise ValueError(f"heuristic: expected one of {HEURISTICS}, got {heuristic!r}")
    if not isinstance(spread, (int, float)) or not 0.0 <= spread <= 0.5:
        raise ValueError(f"spread: expected a number in [0, 0.5], got {spread!r}")
    theta = float(theta)
    if heuristic == "static" or depth == 1:
        return [theta] * depth
    delta = min(float(spread), theta, 1.0 - theta)
    ratios = [theta - delta + 2.0 * delta * i / (depth - 1) for i in range(depth)]
    return [min(1.0, max(0.0, round(r, 12))) for r in ratios]


def _check_ffn_norm(norm: str, name: str = "norm") -> str:
    if norm not in FFN_NORMS:
        raise ValueError(f"{name}: expected one of {FFN_NORMS}, got {norm!r}")
    return norm


def tokens_batchnorm(bn: nn.BatchNorm1d, x: torch.Tensor) -> torch.Tensor:
    """BatchNorm1d over every token: statistics over all leading dimensions ([B·N, C])."""
    return bn(x.reshape(-1, x.shape[-1])).reshape(x.shape)


class ChannelIdleMlp(nn.Module):
    """The whole RePaViT FFN sub-block, shortcut included: forward(x) = x + drop_path(ls(FFN(pre_norm(x)))).

    Children: `pre_norm` (BatchNorm1d over C, or LayerNorm), `fc1`, `act` (GELU, applied to the first
    `active_features` hidden channels only), `drop1`, `hidden_norm` (BatchNorm1d over the hidden width for
    norm="batch", nn.Identity for "layer"), `fc2`, `drop2`, `ls` (LayerScale or Identity), `drop_path`.

    active_features = ceil(hidden · (1 − idle_ratio)) unless given explicitly.  θ = 1 removes the
    activation entirely (the FFN becomes one linear map after fusing); θ = 0 is a vanilla FFN.
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: Optional[int] = None,
        idle_ratio: float = 0.75,
        norm: str = "batch",
        *,
        active_features: Optional[int] = None,
        bias: bool = True,
        drop: float = 0.0,
        init_values: Optional[float] = None,
        drop_path: float = 0.0,
        norm_eps: Optional[float] = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        _check_ffn_norm(norm)
        hidden = hidden_features or in_features
        if active_features is None:
            active_features = active_channels(hidden, idle_ratio)
        elif not isinstance(active_features, int) or not 0 <= active_features <= hidden:
            raise ValueError(f"active_features: expected an int in [0, {hidden}], got {active_features!r}")
        self.in_features = in_features
        self.hidden_features = hidden
        self.active_features = active_features
        self.norm_type = norm
        bias1, bias2 = (bias, bias) if isinstance(bias, bool) else tuple(bias)
        if norm == "batch":
            self.pre_norm = nn.BatchNorm1d(in_features, eps=1e-5 if norm_eps is None else norm_eps, **dd)
        else:
            self.pre_norm = nn.LayerNorm(in_features, eps=1e-6 if norm_eps is None else norm_eps, **dd)
        self.fc1 = nn.Linear(in_features, hidden, bias=bias1, **dd)
        self.act = nn.GELU()
        self.drop1 = nn.Dropout(drop)
        self.hidden_norm = (
            nn.BatchNorm1d(hidden, eps=1e-5 if norm_eps is None else norm_eps, **dd)
            if norm == "batch" else nn.Identity()
        )
        self.fc2 = nn.Linear(hidden, in_features, bias=bias2, **dd)
        self.drop2 = nn.Dropout(drop)
        self.ls = LayerScale(in_features, init_values=init_values, **dd) if init_values else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    @property
    def idle_ratio(self) -> float:
        return 1.0 - self.active_features / self.hidden_features

    def _normalize(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return tokens_batchnorm(norm, x) if isinstance(norm, nn.BatchNorm1d) else norm(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(self._normalize(self.pre_norm, x))
        a = self.active_features
        if a == self.hidden_features:
            h = self.act(h)
        elif a > 0:  # eq. 2: GELU on the first A channels, the idle ones pass through linearly
            h = torch.cat([self.act(h[..., :a]), h[..., a:]], dim=-1)
        h = self.drop1(h)
        h = self._normalize(self.hidden_norm, h)
        h = self.drop2(self.fc2(h))
        return x + self.drop_path(self.ls(h))

    @classmethod
    def from_timm(
        cls,
        norm: nn.Module,
        mlp: nn.Module,
        ls: Optional[nn.Module] = None,
        drop_path: Optional[nn.Module] = None,
        *,
        idle_ratio: float = 0.75,
        ffn_norm: str = "batch",
        name: str = "mlp",
    ) -> "ChannelIdleMlp":
        """Train-time channel-idle FFN initialised from a timm FFN sub-block `x + dp(ls(mlp(norm(x))))`.

        fc1/fc2 (and LayerScale) are copied.  ffn_norm="layer" keeps the LayerNorm as is (θ = 0 then reproduces
        the timm sub-block exactly).  ffn_norm="batch": the pre-norm BatchNorm takes the LayerNorm's γ, β as its
        affine and starts with running statistics (0, 1); the hidden BatchNorm starts as the identity (γ = 1,
        β = 0, statistics (0, 1)).  No data-free choice makes a BatchNorm equal a LayerNorm (one normalises each
        channel over tokens, the other each token over channels), so the BN model is *not* the pretrained
        function at step 0; the running statistics calibrate in the first train-mode steps.  For a data-driven
        start, `vitfast.convert.from_timm(..., calibration_images=...)` refits both BatchNorms afterwards.
        """
        _check_ffn_norm(ffn_norm, "ffn_norm")
        dim = mlp.fc1.in_features
        _timm.check_mlp(mlp, name, dim)
        ln_eps = _timm.check_layernorm(norm, f"{name} pre-norm", dim)
        gamma = _timm.layer_scale_gamma(ls, f"{name} layer scale") if ls is not None else None
        weight = mlp.fc1.weight
        module = cls(
            dim,
            mlp.fc1.out_features,
            idle_ratio,
            ffn_norm,
            bias=(mlp.fc1.bias is not None, mlp.fc2.bias is not None),
            drop=float(mlp.drop1.p) if isinstance(mlp.drop1, nn.Dropout) else 0.0,
            init_values=1.0 if gamma is not None else None,
            drop_path=_timm.drop_path_prob(drop_path) if drop_path is not None else 0.0,
            norm_eps=ln_eps if ffn_norm == "layer" else None,
            device=weight.device,
            dtype=weight.dtype,
        )
        with torch.no_grad():
            module.fc1.load_state_dict(mlp.fc1.state_dict())
            module.fc2.load_state_dict(mlp.fc2.state_dict())
            if gamma is not None:
                module.ls.gamma.copy_(gamma)
            # The affine of norm2 as far as it has one: a LayerNorm without (elementwise_affine=False or
            # bias=False) is the identity affine, not a missing state-dict key (load_state_dict raised).
            weight, bias = getattr(norm, "weight", None), getattr(norm, "bias", None)
            if weight is not None:
                module.pre_norm.weight.copy_(weight)
            elif ffn_norm == "layer":
                module.pre_norm.weight.fill_(1.0)
            if bias is not None:
                module.pre_norm.bias.copy_(bias)
            elif ffn_norm == "layer":
                module.pre_norm.bias.zero_()
        return module

    def to_fused(self, name: str = "mlp") -> FusedChannelIdleFFN:
        """The exact fused FFN (eval-mode BatchNorm statistics; eq. 3-6)."""
        folded = fold_ffn(
            fc1_weight=self.fc1.weight,
            fc1_bias=self.fc1.bias,
            fc2_weight=self.fc2.weight,
            fc2_bias=self.fc2.bias,
            active_features=self.active_features,
            pre_norm=self.pre_norm,
            hidden_norm=self.hidden_norm if isinstance(self.hidden_norm, nn.BatchNorm1d) else None,
            layer_scale=self.ls.gamma if isinstance(self.ls, LayerScale) else None,
            name=name,
        )
        return FusedChannelIdleFFN.from_folded(folded, device=self.fc1.weight.device, dtype=self.fc1.weight.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, hidden_features={self.hidden_features}, "
            f"active_features={self.active_features}, norm={self.norm_type!r}"
        )


def _filtered_kwargs(fn, **kwargs):
    accepted = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in accepted}


class ChannelIdleBlock(nn.Module):
    """Train-time ViT block with a channel-idle FFN: x ↦ mlp(x + drop_path1(ls1(attn(norm1(x))))).

    Constructor arguments are timm `Block`'s (so `VisionTransformer(block_fn=partial(ChannelIdleBlock,
    idle_ratio=0.75))` trains a RePaViT from scratch) plus `idle_ratio`, `ffn_norm` ("batch" | "layer") and an
    optional explicit `active_features`.  Children: norm1, attn (timm Attention), ls1, drop_path1, mlp
    (`ChannelIdleMlp`, which owns the FFN's norm, LayerScale, drop-path and shortcut).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_attn_norm: bool = False,
        scale_mlp_norm: bool = False,
        proj_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        init_values: Optional[float] = None,
        drop_path: float = 0.0,
        act_layer=nn.GELU,
        norm_layer=TimmLayerNorm,
        mlp_layer=Mlp,
        attn_layer=TimmAttention,
        depth: int = 0,
        device=None,
        dtype=None,
        *,
        idle_ratio: float = 0.75,
        ffn_norm: str = "batch",
        active_features: Optional[int] = None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if scale_mlp_norm:
            raise ValueError("scale_mlp_norm: expected False (a LayerNorm inside the MLP cannot be fused), got True")
        if mlp_layer not in (None, Mlp):
            raise ValueError(f"mlp_layer: expected timm.layers.Mlp, got {getattr(mlp_layer, '__name__', mlp_layer)!r}")
        if attn_layer not in (None, "", "attn", TimmAttention):
            raise ValueError(
                f"attn_layer: expected timm Attention, got {getattr(attn_layer, '__name__', attn_layer)!r}"
            )
        _timm.check_gelu(act_layer(), "act_layer")
        self.norm1 = norm_layer(dim, **dd)
        self.attn = TimmAttention(
            dim,
            **_filtered_kwargs(
                TimmAttention.__init__, num_heads=num_heads, qkv_bias=qkv_bias, qk_norm=qk_norm,
                scale_norm=scale_attn_norm, proj_bias=proj_bias, attn_drop=attn_drop, proj_drop=proj_drop,
                norm_layer=norm_layer, **dd,
            ),
        )
        self.ls1 = LayerScale(dim, init_values=init_values, **dd) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        norm_eps = None if ffn_norm == "batch" else float(norm_layer(dim).eps)
        self.mlp = ChannelIdleMlp(
            dim,
            int(dim * mlp_ratio),
            idle_ratio,
            ffn_norm,
            active_features=active_features,
            bias=proj_bias,
            drop=proj_drop,
            init_values=init_values,
            drop_path=drop_path,
            norm_eps=norm_eps,
            **dd,
        )

    def forward(
        self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False
    ) -> torch.Tensor:
        if attn_mask is None and not is_causal:
            attn_out = self.attn(self.norm1(x))
        else:
            attn_out = self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal)
        x = x + self.drop_path1(self.ls1(attn_out))
        return self.mlp(x)

    @classmethod
    def from_timm(
        cls, block: nn.Module, *, idle_ratio: float = 0.75, ffn_norm: str = "batch", name: str = "block"
    ) -> "ChannelIdleBlock":
        """Copy a timm ViT `Block`'s attention sub-block unchanged and convert its FFN (see ChannelIdleMlp.from_timm)."""
        _timm.vit_block_spec(block, name)
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.norm1 = deepcopy_model(block.norm1)
        new.attn = deepcopy_model(block.attn)
        new.ls1 = deepcopy_model(block.ls1)
        new.drop_path1 = deepcopy_model(block.drop_path1)
        new.mlp = ChannelIdleMlp.from_timm(
            block.norm2, block.mlp, block.ls2, block.drop_path2,
            idle_ratio=idle_ratio, ffn_norm=ffn_norm, name=f"{name}.mlp",
        )
        new.train(block.training)
        return new

    def to_fused(self, name: str = "block") -> FusedBlock:
        """The exact fused `vitfast.nn.FusedBlock` (eval-mode function)."""
        return FusedBlock.from_parts(self.norm1, self.attn, self.ls1, self.mlp.to_fused(f"{name}.mlp"), name)


class ChannelIdleSwinBlock(SwinChannelIdle, SwinTransformerBlock):
    """Train-time Swin block with a channel-idle FFN: timm's `SwinTransformerBlock` (subclass, so isinstance,
    window shifting, masks and `set_input_size` are timm's) whose norm2 → Mlp → shortcut became `mlp`, a
    `ChannelIdleMlp`.  Constructor: timm's arguments plus `idle_ratio`, `ffn_norm`, `active_features`.
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
        idle_ratio: float = 0.75,
        ffn_norm: str = "batch",
        active_features: Optional[int] = None,
    ) -> None:
        _timm.check_gelu(act_layer(), "act_layer")
        _check_ffn_norm(ffn_norm, "ffn_norm")
        ln_eps = self._init_timm_without_norm2(
            dim=dim, input_resolution=input_resolution, num_heads=num_heads, head_dim=head_dim,
            window_size=window_size, shift_size=shift_size, always_partition=always_partition,
            dynamic_mask=dynamic_mask, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, proj_drop=proj_drop,
            attn_drop=attn_drop, drop_path=drop_path, act_layer=act_layer, norm_layer=norm_layer,
            device=device, dtype=dtype,
        )
        norm_eps = None if ffn_norm == "batch" else ln_eps
        self.mlp = ChannelIdleMlp(
            dim,
            int(dim * mlp_ratio),
            idle_ratio,
            ffn_norm,
            active_features=active_features,
            drop=proj_drop,
            drop_path=drop_path,
            norm_eps=norm_eps,
            device=device,
            dtype=dtype,
        )

    @classmethod
    def from_timm(
        cls, block: SwinTransformerBlock, *, idle_ratio: float = 0.75, ffn_norm: str = "batch", name: str = "block"
    ) -> "ChannelIdleSwinBlock":
        """Copy a timm Swin block's attention sub-block unchanged and convert its FFN."""
        spec = _timm.swin_block_spec(block, name, require_mlp=True)
        weight = block.attn.qkv.weight
        new = cls(
            **_timm.swin_block_args(spec),
            mlp_ratio=spec["hidden_features"] / spec["dim"],
            idle_ratio=idle_ratio,
            ffn_norm=ffn_norm,
            device=weight.device,
            dtype=weight.dtype,
        )
        new.norm1 = deepcopy_model(block.norm1)  # as it is (with or without bias / affine): trained as the source
        new.attn.load_state_dict(block.attn.state_dict())
        new.attn.attn_drop = deepcopy_model(block.attn.attn_drop)
        new.attn.proj_drop = deepcopy_model(block.attn.proj_drop)
        new.drop_path1 = deepcopy_model(block.drop_path1)
        new.mlp = ChannelIdleMlp.from_timm(
            block.norm2, block.mlp, None, block.drop_path2,
            idle_ratio=idle_ratio, ffn_norm=ffn_norm, name=f"{name}.mlp",
        )
        new.train(block.training)
        return new

    def to_fused(self, name: str = "block") -> FusedSwinBlock:
        """The exact fused `vitfast.nn.FusedSwinBlock` (eval-mode function)."""
        return FusedSwinBlock.from_parts(self, self.mlp.to_fused(f"{name}.mlp"), name)


register_stand_in("mlp", ChannelIdleMlp)
register_stand_in("swin_block", ChannelIdleSwinBlock)
