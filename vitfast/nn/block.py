"""Fused (inference) modules: what `vitfast.fuse` and `vitfast.patch_timm` put into timm models.

Each class is registered with `@register_fused(kind)` and round-trips through `vitfast_config()` /
`from_vitfast_config(cfg)` (see `registry.py`): the config holds every non-tensor attribute, the state dict
every tensor.  The kinds "channel_idle_ffn", "block" and "swin_block" are stored in checkpoint files: never
rename them or change the meaning of a config key.

* `FusedChannelIdleFFN` — RePaViT eq. 6 through `vitfast.ops.channel_idle_ffn`, the whole FFN sub-block
  including its normalisation and shortcut (x ↦ x + FFN(norm(x))).
* `FusedAttention` — timm-compatible multi-head self-attention (same child names: qkv, q_norm, k_norm, norm, proj)
  on `vitfast.ops.linear` (qkv, proj with the block's shortcut fused) and `vitfast.ops.attention` (heads read
  straight from the qkv output, no permute/copy); SDPA only for masks and qk-norm.
* `FusedBlock` — drop-in for timm's ViT `Block` (same constructor arguments, forward `block(x) -> x` on [B, N, C]):
  non-affine LayerNorm → FusedAttention (norm1's affine folded into qkv, ls1 folded into proj), then the fused FFN.
* `FusedSwinBlock` — a timm `SwinTransformerBlock` (subclass: isinstance and the window machinery are timm's) whose
  FFN sub-block is a `FusedChannelIdleFFN`.

Fused modules are inference modules: dropout, attention dropout and drop-path arguments are accepted for
signature compatibility and have no effect (they are identities in eval mode, which is the function fused).
"""
from __future__ import annotations

import math
from functools import partial
from types import SimpleNamespace
from typing import Any, Dict, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import LayerNorm as TimmLayerNorm, Mlp
from timm.models.swin_transformer import SwinTransformerBlock
from timm.models.vision_transformer import Attention as TimmAttention
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

from .. import ops
from . import _timm
from ._base import ConfigReader, apply_norm, default_if_none, layernorm_eps, plain_norm_eps, tracing
from ._fold import FoldedFFN, affine_norm_state, fold_attention, fold_ffn
from .registry import register_fused

__all__ = ["FusedChannelIdleFFN", "FusedAttention", "FusedBlock", "FusedSwinBlock", "active_channels"]


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


# ------------------------------------------------------------------------------------------ attention
class FusedAttention(nn.Module):
    """timm-compatible multi-head self-attention on the vitfast ops.

    qkv and proj run on `ops.linear` (packed weights; on CPU the C++ GEMM), the heads on `ops.attention`,
    which reads q/k/v straight from the qkv output and writes [B, N, H·D] in proj's layout (on CPU the C++
    kernel beat SDPA at every DeiT-Ti/S/B shape measured: see benchmarks/bench_attention.py).  An attention
    mask, `is_causal` or qk-norm take the SDPA path.  `residual` (keyword, not in timm's signature) is added
    by proj's epilogue: `FusedBlock` passes its shortcut, so `x + attn(norm1(x))` costs no extra pass.

    Child names and qkv layout ([3, heads, head_dim] along the output rows) are timm's, so timm Attention state
    dicts load unchanged.  Not registered on its own: it is part of `FusedBlock`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        head_dim: Optional[int] = None,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        qk_norm_eps: float = 1e-6,
        scale_norm: bool = False,
        scale_norm_eps: float = 1e-6,
        proj_bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"num_heads: expected a divisor of dim = {dim}, got {num_heads}")
            head_dim = dim // num_heads
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.attn_dim = num_heads * head_dim
        self.qkv = nn.Linear(dim, 3 * self.attn_dim, bias=qkv_bias, **dd)
        self.q_norm = nn.LayerNorm(head_dim, eps=qk_norm_eps, **dd) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(head_dim, eps=qk_norm_eps, **dd) if qk_norm else nn.Identity()
        self.norm = nn.LayerNorm(self.attn_dim, eps=scale_norm_eps, **dd) if scale_norm else nn.Identity()
        self.proj = nn.Linear(self.attn_dim, dim, bias=proj_bias, **dd)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
        *,
        residual: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        qkv_layer, proj_layer, norm = self.qkv, self.proj, self.norm
        qkv = ops.linear(x, qkv_layer.weight, qkv_layer.bias)
        if attn_mask is None and not is_causal and type(self.q_norm) is nn.Identity:
            x = ops.attention(qkv, self.num_heads)
        else:
            batch, tokens, _ = x.shape
            q, k, v = qkv.reshape(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            q, k = self.q_norm(q), self.k_norm(k)
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
            x = x.transpose(1, 2).reshape(batch, tokens, self.attn_dim)
        if type(norm) is not nn.Identity:  # scale_norm; the Identity's module call alone is ~1.5 µs per block
            x = norm(x)
        return ops.linear(x, proj_layer.weight, proj_layer.bias, residual)

    def vitfast_prepack(self) -> bool:
        """Pack qkv's and proj's weights for the CPU kernel now (see `vitfast.ops.prepack`)."""
        if self.qkv.weight.device.type != "cpu":
            return False
        for layer in (self.qkv, self.proj):
            ops.linear(layer.weight.new_zeros(1, layer.in_features), layer.weight, layer.bias)
        return True


# The forwards the block op replaces, as defined here: a later patch of either makes FusedBlock call the modules.
_ATTENTION_FORWARD = FusedAttention.forward
_FFN_FORWARD = FusedChannelIdleFFN.forward


class WholeBlockPlan(NamedTuple):
    """Whether a block's structure lets it run as the one `torch.ops.vitfast.vit_block` call, decided once when the
    block is built (by `vitfast.fuse`, `vitfast.load`, `vitfast.patch_timm`), not per forward.  The children it was
    decided for are kept: a block whose children were replaced since plans again.

    `runs_as_one_op` is False when the structure rules the op out: another attention or FFN class, qk_norm /
    scale_norm, LayerNorms with an affine or a fast-norm path.  (The norms' eps are read at each call: they are
    plain attributes a user may set.)
    """

    children: tuple
    runs_as_one_op: bool


def _children(block: nn.Module) -> tuple:
    modules = block._modules
    attn, mlp = modules.get("attn"), modules.get("mlp")  # (a pruned FusedGatedBlock sub-block is None, maybe unregistered)
    attn_modules = attn._modules if isinstance(attn, nn.Module) else {}
    mlp_modules = mlp._modules if isinstance(mlp, nn.Module) else {}
    return (modules.get("norm1"), attn, mlp, attn_modules.get("q_norm"), attn_modules.get("norm"),
            mlp_modules.get("norm"))


def plan_whole_block(block: nn.Module) -> WholeBlockPlan:
    """Decide, from its structure alone, whether `block` (a `FusedBlock`, or a `FusedGatedBlock` whose gates are both open) may
    run as `torch.ops.vitfast.vit_block` (csrc/ops/vit_block.cpp: the same kernels and bits as the six-op path,
    without its per-op Python and dispatch cost, ~35 µs per block: docs/performance.md), and store the decision."""
    children = _children(block)
    norm1, attn, mlp, q_norm, scale_norm, ffn_norm = children
    plan = WholeBlockPlan(children, type(attn) is FusedAttention and type(mlp) is FusedChannelIdleFFN
                          and type(q_norm) is nn.Identity and type(scale_norm) is nn.Identity
                          and plain_norm_eps(norm1) is not None
                          and (ffn_norm is None or plain_norm_eps(ffn_norm) is not None))
    block.__dict__["_whole_block_plan"] = plan  # not a module attribute: deepcopy maps its children along
    return plan


def whole_block_args(block: nn.Module, x: torch.Tensor) -> Optional[tuple]:
    """The arguments of `torch.ops.vitfast.vit_block` for this forward of `block`, or None to run its sub-blocks.

    The structure was decided when the block was built (`plan_whole_block`); what can change between two forwards
    is checked here: inference (grad mode off), a [B, N, C] input that is CPU fp32 (the C++ op) or CUDA without
    autocast (`ops.vit_block_cuda_eager`: the same torch calls as the six ops' CUDA impls, with one check and no
    dispatch per op), the auto backend, no tracing (exported graphs keep the per-op calls), the planned children
    still in place, and no forward hooks or patched forwards that calling `attn` / `mlp` as modules would run.
    """
    if torch.is_grad_enabled() or x.dim() != 3:
        return None
    if x.is_cpu:
        if x.dtype != torch.float32:
            return None
    elif x.is_cuda:
        if ops._autocast_enabled("cuda"):  # the ops cast to fp32 under autocast (their Autocast kernels)
            return None
    else:
        return None
    plan = block.__dict__.get("_whole_block_plan")
    children = _children(block)
    if plan is None or any(a is not b for a, b in zip(plan.children, children)):
        plan = plan_whole_block(block)  # built without a plan, or children replaced since
    if not plan.runs_as_one_op:
        return None
    norm1, attn, mlp = children[:3]
    if (attn._forward_hooks or attn._forward_pre_hooks or mlp._forward_hooks or mlp._forward_pre_hooks
            or _global_forward_hooks or _global_forward_pre_hooks):
        return None
    # A forward patched on the instance (accelerate's add_hook_to_module does this) or on the class must run.
    if ("forward" in attn.__dict__ or "forward" in mlp.__dict__ or FusedAttention.forward is not _ATTENTION_FORWARD
            or FusedChannelIdleFFN.forward is not _FFN_FORWARD):
        return None
    # Parameters straight from the dicts: each nn.Module attribute lookup costs ~2 µs, and this runs once per block
    # per forward.  (A parametrized tensor is not in the dict, its property is: the six-op path reads it through that.)
    attn_modules = attn._modules
    qkv, proj, ffn = attn_modules["qkv"]._parameters, attn_modules["proj"]._parameters, mlp._parameters
    try:
        tensors = (qkv["weight"], qkv["bias"], proj["weight"], proj["bias"], ffn["w_in"], ffn["b_in"], ffn["w_out"],
                   ffn["b_out"])
    except KeyError:
        return None
    if ops.get_backend() == "reference" or tracing() or tensors[0].dtype != x.dtype:
        return None
    if x.is_cpu and not ops.extension_loaded():
        return None
    w_qkv, b_qkv, w_proj, b_proj, w_in, b_in, w_out, b_out = tensors
    ffn_norm = children[5]
    ffn_norm_eps = float(ffn_norm.eps) if ffn_norm is not None else None
    return (x, float(norm1.eps), w_qkv, b_qkv, attn.num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out, b_out,
            mlp.residual)


@register_fused("block")
class FusedBlock(nn.Module):
    """Fused drop-in for `timm.models.vision_transformer.Block`.

    Same constructor arguments and `forward(x, attn_mask=None, is_causal=False)`; children `norm1` (LayerNorm
    without affine), `attn` (`FusedAttention`) and `mlp` (`FusedChannelIdleFFN`, which owns the FFN's norm and
    shortcut).  Keyword-only extras choose the FFN shape: `idle_ratio` θ (default 0: a vanilla FFN),
    `ffn_norm` ("layer": LN variant with explicit residual; "batch": BN variant, norms and shortcut folded) or
    an explicit `active_features`.  `init_values`, dropout and drop-path arguments are accepted and ignored:
    LayerScale is folded into the projections, the rest are identities at inference.

    Build one from trained weights with `FusedBlock.from_timm(timm_block)` or `vitfast.fuse(model)`.
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
        head_dim: Optional[int] = None,
        idle_ratio: float = 0.0,
        ffn_norm: str = "layer",
        active_features: Optional[int] = None,
    ) -> None:
        super().__init__()
        if scale_mlp_norm:
            raise ValueError("scale_mlp_norm: expected False (a LayerNorm inside the MLP cannot be fused), got True")
        if mlp_layer not in (None, Mlp):
            raise ValueError(f"mlp_layer: expected timm.layers.Mlp, got {getattr(mlp_layer, '__name__', mlp_layer)!r}")
        if attn_layer not in (None, "", "attn", TimmAttention, FusedAttention):
            raise ValueError(
                f"attn_layer: expected timm Attention, got {getattr(attn_layer, '__name__', attn_layer)!r}"
            )
        _timm.check_gelu(act_layer(), "act_layer")
        norm_eps = layernorm_eps(norm_layer, dim)
        hidden = int(dim * mlp_ratio)
        active = active_features if active_features is not None else active_channels(hidden, idle_ratio)
        ffn = FusedChannelIdleFFN.for_structure(dim, hidden, active, ffn_norm, norm_eps, device=device, dtype=dtype)
        head_eps = layernorm_eps(norm_layer, head_dim or dim // num_heads) if qk_norm else norm_eps
        self._build(
            dim=dim,
            num_heads=num_heads,
            head_dim=head_dim,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            qk_norm_eps=head_eps,
            scale_attn_norm=scale_attn_norm,
            scale_attn_norm_eps=norm_eps,
            proj_bias=proj_bias,
            norm_eps=norm_eps,
            mlp=ffn,
            device=device,
            dtype=dtype,
        )

    def _build(
        self, *, dim, num_heads, head_dim, qkv_bias, qk_norm, qk_norm_eps, scale_attn_norm, scale_attn_norm_eps,
        proj_bias, norm_eps, mlp, device=None, dtype=None,
    ) -> None:
        dd = {"device": device, "dtype": dtype}
        self.dim = dim
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps, elementwise_affine=False)
        self.attn = FusedAttention(
            dim,
            num_heads=num_heads,
            head_dim=head_dim,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            qk_norm_eps=qk_norm_eps,
            scale_norm=scale_attn_norm,
            scale_norm_eps=scale_attn_norm_eps,
            proj_bias=proj_bias,
            **dd,
        )
        if mlp.features != dim:
            raise ValueError(f"mlp: expected a FusedChannelIdleFFN over {dim} features, got {mlp.features}")
        self.mlp = mlp
        plan_whole_block(self)

    def forward(
        self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False
    ) -> torch.Tensor:
        if attn_mask is None and not is_causal:
            args = whole_block_args(self, x)
            if args is not None:
                return torch.ops.vitfast.vit_block(*args) if x.is_cpu else ops.vit_block_cuda_eager(*args)
        x = self.attn(apply_norm(self.norm1, x), attn_mask=attn_mask, is_causal=is_causal, residual=x)  # x + attn(...)
        return self.mlp(x)  # the FFN sub-block adds its own shortcut (explicitly, or folded into W̃)

    # -------------------------------------------------------------------------------------- construction
    @classmethod
    def from_parts(cls, norm1: nn.Module, attn: nn.Module, ls1: nn.Module, mlp: FusedChannelIdleFFN, name: str):
        """The fused block from a ViT block's attention parts (norm1's affine and ls1 folded, `fold_attention`) and an
        already fused FFN: what `from_timm` and the train-time channel-idle blocks' `to_fused()` build."""
        folded = fold_attention(norm1, attn, ls1, name)
        tensors = folded.pop("tensors")
        device, dtype = attn.qkv.weight.device, attn.qkv.weight.dtype
        block = cls.__new__(cls)
        nn.Module.__init__(block)
        block._build(**folded, mlp=mlp, device=device, dtype=dtype)
        state = {k: v for k, v in tensors.items() if v is not None}
        state.update({"mlp." + k: v for k, v in mlp.state_dict().items()})
        block.load_state_dict({k: v.to(dtype=dtype) for k, v in state.items()}, strict=True)
        return block.eval()

    @classmethod
    def from_timm(cls, block: nn.Module, name: str = "block") -> "FusedBlock":
        """Fuse a vanilla timm ViT `Block` (eval-mode function): outputs equal the timm block's."""
        _timm.vit_block_spec(block, name)  # validates everything the folding relies on
        ffn = FusedChannelIdleFFN.from_timm_mlp(
            block.norm2, block.mlp, _timm.layer_scale_gamma(block.ls2, f"{name}.ls2"), name=f"{name}.mlp"
        )
        return cls.from_parts(block.norm1, block.attn, block.ls1, ffn, name)

    def vitfast_config(self) -> Dict[str, Any]:
        attn = self.attn
        qk_norm = not isinstance(attn.q_norm, nn.Identity)
        scale_norm = not isinstance(attn.norm, nn.Identity)
        return {
            "kind": self.vitfast_kind,
            "dim": self.dim,
            "num_heads": attn.num_heads,
            "head_dim": attn.head_dim,
            "qkv_bias": attn.qkv.bias is not None,
            "qk_norm": qk_norm,
            "qk_norm_eps": float(attn.q_norm.eps) if qk_norm else None,
            "scale_attn_norm": scale_norm,
            "scale_attn_norm_eps": float(attn.norm.eps) if scale_norm else None,
            "proj_bias": attn.proj.bias is not None,
            "norm_eps": float(self.norm1.eps),
            "mlp": self.mlp.vitfast_config(),
        }

    @classmethod
    def from_vitfast_config(cls, cfg: Dict[str, Any], *, device=None, dtype=None) -> "FusedBlock":
        read = ConfigReader(cfg, "block", (
            "dim", "num_heads", "head_dim", "qkv_bias", "qk_norm", "qk_norm_eps", "scale_attn_norm",
            "scale_attn_norm_eps", "proj_bias", "norm_eps", "mlp",
        ))
        qk_norm, scale_norm = read.bool("qk_norm"), read.bool("scale_attn_norm")
        block = cls.__new__(cls)
        nn.Module.__init__(block)
        block._build(
            dim=read.int("dim"),
            num_heads=read.int("num_heads"),
            head_dim=read.int("head_dim"),
            qkv_bias=read.bool("qkv_bias"),
            qk_norm=qk_norm,
            qk_norm_eps=default_if_none(read.eps("qk_norm_eps", optional=not qk_norm), 1e-6),
            scale_attn_norm=scale_norm,
            scale_attn_norm_eps=default_if_none(read.eps("scale_attn_norm_eps", optional=not scale_norm), 1e-6),
            proj_bias=read.bool("proj_bias"),
            norm_eps=read.eps("norm_eps"),
            mlp=FusedChannelIdleFFN.from_vitfast_config(read.dict("mlp"), device=device, dtype=dtype),
            device=device,
            dtype=dtype,
        )
        return block


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
        return cls(
            dim=read.int("dim"),
            input_resolution=read.pair("input_resolution", 1),
            num_heads=read.int("num_heads"),
            head_dim=read.int("head_dim"),
            window_size=read.pair("window_size", 1),
            shift_size=read.pair("shift_size", 0),
            always_partition=read.bool("always_partition"),
            dynamic_mask=read.bool("dynamic_mask"),
            qkv_bias=read.bool("qkv_bias"),
            norm_layer=partial(nn.LayerNorm, eps=read.eps("norm_eps")),
            ffn_config=read.dict("mlp"),
            device=device,
            dtype=dtype,
        )
