"""Read the architecture of timm blocks (ViT `Block`, `SwinTransformerBlock`) and refuse what vitfast cannot fuse.

Only the features whose algebra is exact are accepted: pre-norm LayerNorm, erf GELU, the plain `Mlp`, the plain
`Attention`/`WindowAttention`.  Everything else is refused with the attribute named, what was expected and what
was found — never silently approximated.
"""
from __future__ import annotations

import inspect
from functools import partial
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn
from timm.layers import Mlp
from timm.models.swin_transformer import SwinTransformerBlock, WindowAttention
from timm.models.vision_transformer import Attention as TimmAttention, Block as TimmBlock

__all__ = [
    "check_layernorm",
    "check_gelu",
    "check_mlp",
    "vit_block_spec",
    "swin_block_spec",
    "swin_block_args",
    "swin_block_kwargs",
    "layer_scale_gamma",
    "drop_path_prob",
    "dropout_prob",
]


def _layernorm_types() -> tuple:
    import timm.layers as layers

    types = [nn.LayerNorm]
    for name in ("LayerNorm", "LayerNormFp32"):  # same maths as nn.LayerNorm for a last-dim LN
        cls = getattr(layers, name, None)
        if cls is not None:
            types.append(cls)
    return tuple(types)


def check_layernorm(module: nn.Module, name: str, dim: int) -> float:
    """Return the eps of a last-dimension LayerNorm over `dim` channels; refuse anything else."""
    if type(module) not in _layernorm_types():
        raise ValueError(
            f"{name}: expected a LayerNorm over the last dimension (torch.nn.LayerNorm or timm LayerNorm), "
            f"got {type(module).__name__}"
        )
    if tuple(module.normalized_shape) != (dim,):
        raise ValueError(f"{name}: expected normalized_shape ({dim},), got {tuple(module.normalized_shape)}")
    return float(module.eps)


def check_gelu(module: nn.Module, name: str) -> None:
    """The fused op applies the exact (erf) GELU; refuse other activations (tanh-GELU, SiLU, ...)."""
    import timm.layers.activations as acts

    if isinstance(module, nn.GELU) and module.approximate == "none":
        return
    timm_gelu = getattr(acts, "GELU", None)
    if timm_gelu is not None and type(module) is timm_gelu:
        return
    detail = f"GELU(approximate={module.approximate!r})" if isinstance(module, nn.GELU) else type(module).__name__
    raise ValueError(f"{name}: expected the exact GELU (nn.GELU(approximate='none')), got {detail}")


def check_mlp(mlp: nn.Module, name: str, dim: int) -> None:
    """A timm `Mlp` (fc1 → GELU → fc2, no hidden norm) with in = out = dim."""
    if type(mlp) is not Mlp:
        raise ValueError(f"{name}: expected timm.layers.Mlp, got {type(mlp).__name__}")
    if not isinstance(mlp.fc1, nn.Linear) or not isinstance(mlp.fc2, nn.Linear):
        raise ValueError(f"{name}: expected nn.Linear fc1/fc2 (use_conv=False), got {type(mlp.fc1).__name__}")
    check_gelu(mlp.act, f"{name}.act")
    if not isinstance(getattr(mlp, "norm", nn.Identity()), nn.Identity):
        raise ValueError(
            f"{name}.norm: expected nn.Identity (no normalisation inside the MLP: it mixes all hidden channels "
            f"and cannot be folded), got {type(mlp.norm).__name__}"
        )
    if mlp.fc1.in_features != dim or mlp.fc2.out_features != dim:
        raise ValueError(
            f"{name}: expected fc1.in_features = fc2.out_features = {dim}, got "
            f"{mlp.fc1.in_features} and {mlp.fc2.out_features}"
        )


def layer_scale_gamma(module: nn.Module, name: str) -> Optional[torch.Tensor]:
    """γ of a timm LayerScale, None for nn.Identity."""
    if isinstance(module, nn.Identity):
        return None
    gamma = getattr(module, "gamma", None)
    if not isinstance(gamma, torch.Tensor):
        raise ValueError(f"{name}: expected timm LayerScale (with .gamma) or nn.Identity, got {type(module).__name__}")
    return gamma


def drop_path_prob(module: nn.Module) -> float:
    return float(getattr(module, "drop_prob", 0.0)) if not isinstance(module, nn.Identity) else 0.0


def dropout_prob(module: nn.Module) -> float:
    """p of an nn.Dropout (timm's attn_drop / proj_drop), 0 for anything else (Identity)."""
    return float(module.p) if isinstance(module, nn.Dropout) else 0.0


def vit_block_spec(block: nn.Module, name: str = "block") -> Dict[str, Any]:
    """Constructor arguments of a timm ViT `Block`, validated for fusing."""
    if type(block) is not TimmBlock:
        raise ValueError(
            f"{name}: expected timm.models.vision_transformer.Block, got {type(block).__name__} "
            "(ResPostBlock, parallel blocks and other variants are not supported)"
        )
    attn = block.attn
    if type(attn) is not TimmAttention:
        raise ValueError(f"{name}.attn: expected timm Attention, got {type(attn).__name__}")
    if getattr(attn, "gate", None) is not None:
        raise ValueError(f"{name}.attn.gate: expected None (gated attention is not supported), got a gate")
    dim = attn.qkv.in_features
    attn_dim = attn.num_heads * attn.head_dim
    if attn.qkv.out_features != 3 * attn_dim or attn.proj.out_features != dim:
        raise ValueError(
            f"{name}.attn: expected qkv [{3 * attn_dim}, {dim}] and proj out {dim}, got qkv "
            f"{list(attn.qkv.weight.shape)} and proj out {attn.proj.out_features}"
        )
    norm_eps = check_layernorm(block.norm1, f"{name}.norm1", dim)
    check_layernorm(block.norm2, f"{name}.norm2", dim)
    qk_norm = not isinstance(attn.q_norm, nn.Identity)
    qk_norm_eps = check_layernorm(attn.q_norm, f"{name}.attn.q_norm", attn.head_dim) if qk_norm else None
    if qk_norm:
        check_layernorm(attn.k_norm, f"{name}.attn.k_norm", attn.head_dim)
    scale_norm = not isinstance(getattr(attn, "norm", nn.Identity()), nn.Identity)
    scale_norm_eps = check_layernorm(attn.norm, f"{name}.attn.norm", attn_dim) if scale_norm else None
    check_mlp(block.mlp, f"{name}.mlp", dim)
    return dict(
        dim=dim,
        num_heads=attn.num_heads,
        head_dim=attn.head_dim,
        hidden_features=block.mlp.fc1.out_features,
        qkv_bias=attn.qkv.bias is not None,
        qk_norm=qk_norm,
        qk_norm_eps=qk_norm_eps,
        scale_attn_norm=scale_norm,
        scale_attn_norm_eps=scale_norm_eps,
        proj_bias=attn.proj.bias is not None,
        mlp_bias=(block.mlp.fc1.bias is not None, block.mlp.fc2.bias is not None),
        norm_eps=norm_eps,
        ffn_norm_eps=float(block.norm2.eps),
        init_values=None if isinstance(block.ls1, nn.Identity) else 1.0,
        drop_path=drop_path_prob(block.drop_path1),
    )


def swin_block_spec(block: nn.Module, name: str = "block", *, require_mlp: bool = False) -> Dict[str, Any]:
    """Constructor arguments of a timm `SwinTransformerBlock`, validated for fusing.

    The FFN entries (hidden_features, ffn_norm_eps) are there when the block still has timm's norm2 → Mlp;
    `require_mlp=True` refuses a block without them (one whose FFN was already replaced).
    """
    if not isinstance(block, SwinTransformerBlock):
        raise ValueError(f"{name}: expected timm SwinTransformerBlock, got {type(block).__name__}")
    attn = block.attn
    if type(attn) is not WindowAttention:
        raise ValueError(f"{name}.attn: expected timm WindowAttention, got {type(attn).__name__}")
    dim = block.dim
    norm_eps = check_layernorm(block.norm1, f"{name}.norm1", dim)
    head_dim = attn.qkv.out_features // (3 * attn.num_heads)
    spec = dict(
        dim=dim,
        input_resolution=tuple(int(r) for r in block.input_resolution),
        num_heads=attn.num_heads,
        head_dim=head_dim,
        # the effective window (already clipped to the resolution) rebuilds the same window and shift
        window_size=tuple(int(w) for w in block.window_size),
        shift_size=_rebuild_shift(block),
        always_partition=bool(getattr(block, "always_partition", False)),
        dynamic_mask=bool(getattr(block, "dynamic_mask", False)),
        qkv_bias=attn.qkv.bias is not None,
        norm_eps=norm_eps,
        drop_path=drop_path_prob(block.drop_path1),
    )
    if hasattr(block, "norm2"):
        check_layernorm(block.norm2, f"{name}.norm2", dim)
        check_mlp(block.mlp, f"{name}.mlp", dim)
        spec["hidden_features"] = block.mlp.fc1.out_features
        spec["ffn_norm_eps"] = float(block.norm2.eps)
    elif require_mlp:
        raise ValueError(f"{name}: expected a vanilla timm SwinTransformerBlock with norm2 and mlp, got none")
    return spec


def _rebuild_shift(block) -> Tuple[int, int]:
    """The shift_size argument that rebuilds `block` (timm clips a shift to 0 where the resolution fits the window).

    * The effective shift, not target_shift_size: set_input_size re-derives the shift from the new window
      (4 -> 6: 2 -> 3) and leaves target_shift_size stale (a resized Swin once fused with the old shift).
    * But a shift clipped to (0, 0) still marks a shifted block: timm shifts it again after a resize that makes
      the resolution larger than the window (window // 2, from the target being non-zero).  Rebuilt with (0, 0),
      it never shifted again (1.4e-2 off).  So then the target goes in: the constructor clips it the same way
      now, and only its being non-zero matters later.
    """
    effective = tuple(int(s) for s in block.shift_size)
    if any(effective):
        return effective
    return tuple(int(s) for s in getattr(block, "target_shift_size", effective))


def swin_block_args(spec: Dict[str, Any]) -> Dict[str, Any]:
    """The `SwinTransformerBlock` constructor arguments that rebuild the attention sub-block a `swin_block_spec`
    describes (windows, heads, qkv bias, norm1's eps); the FFN's are the caller's."""
    keys = ("dim", "input_resolution", "num_heads", "head_dim", "window_size", "shift_size", "always_partition",
            "dynamic_mask", "qkv_bias")
    return dict({k: spec[k] for k in keys}, norm_layer=partial(nn.LayerNorm, eps=spec["norm_eps"]))


def swin_block_kwargs(**kwargs) -> Dict[str, Any]:
    """Keep only the arguments this timm version's SwinTransformerBlock accepts (older ones lack a few)."""
    accepted = inspect.signature(SwinTransformerBlock.__init__).parameters
    dropped = {k: v for k, v in kwargs.items() if k not in accepted}
    for key, value in dropped.items():
        if key in ("always_partition", "dynamic_mask") and value:
            raise ValueError(f"{key}: this timm version's SwinTransformerBlock does not support {key}=True")
    return {k: v for k, v in kwargs.items() if k in accepted}
