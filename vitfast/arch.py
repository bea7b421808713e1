"""Describe a timm model skeleton as JSON, and rebuild it from that description.

timm does not keep the keyword arguments a model was built with, so `describe_timm` reads them back from the
model's attributes and tensor shapes.  The result is plain JSON (it goes into checkpoint metadata, which must
never need pickle) and `build_timm` turns it back into an identically shaped model whose weights are to be
overwritten (it is built with `weight_init='skip'`).

Submodules that are registered vitfast fused modules (`vitfast.nn.registry`) are skipped when reading: the
skeleton's own module at that path is replaced on load, so its shape does not matter.  Values that cannot be
read because every instance was fused away fall back to a default that builds (e.g. `num_heads=1`).

Description format (all keys always present unless noted):

    {"class": "VisionTransformer" | "VisionTransformerDistilled" | "SwinTransformer",
     "kwargs": {...},                    # passed to the timm constructor as is (lists become tuples)
     "norm_layer": {"type": "timm.LayerNorm" | "timm.LayerNormFp32" | "torch.nn.LayerNorm", "eps": float,
                    "affine": false, "bias": false},   # the last two optional: written only when false
     "act_layer": "torch.nn.GELU" | ...,  # see ACT_LAYERS; ViT only (Swin's constructor has no act_layer)
     "embed_norm_layer": null | {...},   # ViT only: a norm inside the patch embedding
     "patch_embed_bias": bool,           # timm ties it to `not pre_norm`; RePaViT has no bias without pre_norm
     "pretrained_cfg": {...}}            # optional: timm's data config (mean/std/input_size/...), JSON subset

Only a closed set of classes, norms and activations is accepted: a checkpoint is untrusted input, and naming
a class by import path would let a file choose what code runs.
"""
from __future__ import annotations

import functools
import inspect
import json
import math
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn

from .nn.registry import is_fused_module

__all__ = ["describe_timm", "build_timm", "SUPPORTED_CLASSES", "NORM_LAYERS", "ACT_LAYERS"]

SUPPORTED_CLASSES = ("VisionTransformer", "VisionTransformerDistilled", "SwinTransformer")

# Constructor arguments that are callables, or that build_timm sets itself: never taken from a file's kwargs.
_RESERVED_KWARGS = frozenset({
    "norm_layer", "act_layer", "embed_layer", "embed_norm_layer", "block_fn", "mlp_layer", "attn_layer",
    "device", "dtype", "weight_init",
})

# pretrained_cfg keys worth keeping: what timm.data.resolve_data_config reads to build the preprocessing.
_PRETRAINED_CFG_KEYS = (
    "architecture", "tag", "input_size", "fixed_input_size", "interpolation", "crop_pct", "crop_mode",
    "mean", "std", "num_classes", "pool_size", "first_conv", "classifier",
)


def _timm_classes() -> Dict[str, type]:
    # Imported lazily: `import vitfast` must stay light, and timm is only needed by the model tools.
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.swin_transformer import SwinTransformer
    from timm.models.vision_transformer import VisionTransformer

    return {
        "VisionTransformer": VisionTransformer,
        "VisionTransformerDistilled": VisionTransformerDistilled,
        "SwinTransformer": SwinTransformer,
    }


def _norm_classes() -> Dict[str, type]:
    from timm.layers import LayerNorm as TimmLayerNorm, LayerNormFp32

    return {"timm.LayerNorm": TimmLayerNorm, "timm.LayerNormFp32": LayerNormFp32, "torch.nn.LayerNorm": nn.LayerNorm}


NORM_LAYERS = ("timm.LayerNorm", "timm.LayerNormFp32", "torch.nn.LayerNorm")
ACT_LAYERS = (
    "torch.nn.GELU", "torch.nn.GELU(tanh)", "torch.nn.SiLU", "torch.nn.ReLU",
    "timm.GELU", "timm.GELUTanh", "timm.QuickGELU",
)


def _act_factories() -> Dict[str, Any]:
    from timm.layers.activations import GELU, GELUTanh, QuickGELU

    return {
        "torch.nn.GELU": nn.GELU,
        "torch.nn.GELU(tanh)": functools.partial(nn.GELU, approximate="tanh"),
        "torch.nn.SiLU": nn.SiLU,
        "torch.nn.ReLU": nn.ReLU,
        "timm.GELU": GELU,
        "timm.GELUTanh": GELUTanh,
        "timm.QuickGELU": QuickGELU,
    }


# --------------------------------------------------------------------------------------------- reading


def _plain_modules(root: nn.Module) -> Iterator[Tuple[str, nn.Module]]:
    """named_modules() of `root`, skipping registered fused modules and everything below them."""
    fused_prefixes = []
    for name, module in root.named_modules():
        if any(name == p or name.startswith(p + ".") for p in fused_prefixes):
            continue
        if is_fused_module(module):
            fused_prefixes.append(name)
            continue
        yield name, module


def _first(root: nn.Module, cls: type) -> Optional[nn.Module]:
    """The first non-fused module of exactly type `cls` under root (subclasses may change behaviour)."""
    for _, module in _plain_modules(root):
        if type(module) is cls:
            return module
    return None


# Train-time classes that stand where timm's Mlp / SwinTransformerBlock stand (a RePaViT FFN keeps the source width):
# the description reads the skeleton's sizes from them.  This module sits below the methods, so a method registers its
# classes here (vitfast.methods.repavit does at import) instead of being imported; a model holding one of them has
# imported its method already.
_STAND_INS: Dict[str, List[type]] = {"mlp": [], "swin_block": []}


def register_stand_in(role: str, cls: type) -> type:
    """Declare `cls` a train-time stand-in for timm's "mlp" (Mlp) or "swin_block" (SwinTransformerBlock)."""
    if role not in _STAND_INS:
        raise ValueError(f"role: expected one of {tuple(_STAND_INS)}, got {role!r}")
    if cls not in _STAND_INS[role]:
        _STAND_INS[role].append(cls)
    return cls


def _first_stand_in(root: nn.Module, role: str) -> Optional[nn.Module]:
    for cls in _STAND_INS[role]:
        found = _first(root, cls)
        if found is not None:
            return found
    return None


def _describe_norm_module(module: nn.Module, name: str) -> Dict[str, Any]:
    spec = {"type": name, "eps": float(module.eps)}
    # A norm_layer built with elementwise_affine=False or bias=False has no such tensors: say so, or the rebuilt
    # skeleton has tensors the file does not fill (and the save-time check refuses the model).
    if not module.elementwise_affine:
        spec["affine"] = False
    elif module.bias is None:
        spec["bias"] = False
    return spec


def _describe_norm(model: nn.Module, where: str) -> Dict[str, Any]:
    classes = _norm_classes()
    by_type = {cls: name for name, cls in classes.items()}
    # The skeleton's own top-level norms are built by timm from norm_layer: they say what it is, flags included.
    # (Inside train-time blocks there are other norms, e.g. a non-deep block's affine-free LayerNorm.)
    for attr in ("norm", "fc_norm", "norm_pre"):
        module = getattr(model, attr, None)
        if type(module) in by_type and not is_fused_module(module):
            return _describe_norm_module(module, by_type[type(module)])
    for path, module in _plain_modules(model):
        # A ViT's patch-embedding norm is embed_norm_layer (described on its own), not norm_layer.
        if where == "vit" and (path == "patch_embed" or path.startswith("patch_embed.")):
            continue
        # The most derived class wins: timm.LayerNorm subclasses nn.LayerNorm.  Only its type and eps: the
        # flags of a norm deep inside some block need not be norm_layer's.
        if type(module) in by_type:
            return {"type": by_type[type(module)], "eps": float(module.eps)}
    # Everything normalised was fused away: any norm builds, the skeleton's own norms are all replaced.
    return {"type": "timm.LayerNorm" if where == "vit" else "torch.nn.LayerNorm", "eps": 1e-6 if where == "vit" else 1e-5}


def _describe_act(act: Optional[nn.Module]) -> str:
    if act is None:
        return "torch.nn.GELU"
    factories = _act_factories()
    if type(act) is nn.GELU:
        return "torch.nn.GELU(tanh)" if act.approximate == "tanh" else "torch.nn.GELU"
    for name, factory in factories.items():
        if isinstance(factory, type) and type(act) is factory:
            return name
    raise ValueError(
        f"model: expected an MLP activation in {ACT_LAYERS}, got {type(act).__module__}.{type(act).__qualname__}"
    )


def _mlp_ratio(hidden: int, dim: int) -> float:
    # timm computes hidden = int(dim * mlp_ratio); pick a ratio that truncates back to exactly `hidden`.
    ratio = hidden / dim
    if int(dim * ratio) != hidden:
        ratio = (hidden + 0.5) / dim
    return ratio


def _json_subset(cfg: Any) -> Dict[str, Any]:
    out = {}
    if not isinstance(cfg, dict):
        return out
    for key in _PRETRAINED_CFG_KEYS:
        if key not in cfg:
            continue
        value = cfg[key]
        value = list(value) if isinstance(value, tuple) else value
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            continue  # metadata only: drop what JSON cannot hold rather than fail the save
        out[key] = value
    return out


def saved_class(module: nn.Module) -> type:
    """The class a checkpoint records for `module`: the timm class that a vitfast subclass adding no state or module
    names (`vitfast_timm_class`: vitfast.nn.vit.FusedVisionTransformer), else the module's own."""
    cls = type(module)
    return getattr(cls, "vitfast_timm_class", cls) if cls.__module__.startswith("vitfast.") else cls


def _class_name(model: nn.Module) -> str:
    classes = _timm_classes()
    for name, cls in classes.items():
        if saved_class(model) is cls:  # exact: a subclass may add modules or change forward
            return name
    raise TypeError(
        f"model: expected a timm model of class {', '.join(SUPPORTED_CLASSES)} (exact type, possibly with "
        f"fused submodules), got {type(model).__module__}.{type(model).__qualname__}"
    )


def _patch_embed(model: nn.Module) -> Tuple[nn.Module, nn.Conv2d]:
    """The timm PatchEmbed of a ViT or Swin and its Conv2d projection; refuse anything else."""
    from timm.layers import PatchEmbed

    pe = model.patch_embed
    proj = getattr(pe, "proj", None)
    # Exact type: a hybrid ViT's HybridEmbed (a CNN stem, then a Conv2d 'proj') also has a Conv2d 'proj' but no
    # 'norm' nor the PatchEmbed constructor the rebuild would call.
    # An int8 model's projection (vitfast.quantize) keeps the conv's geometry attributes, which is all read here.
    from .nn.int8 import Int8PatchProjection

    if type(pe) is not PatchEmbed or not isinstance(proj, (nn.Conv2d, Int8PatchProjection)):
        raise ValueError(
            f"model.patch_embed: expected timm PatchEmbed with a Conv2d 'proj' (a hybrid ViT's CNN stem is not "
            f"described), got {type(pe).__qualname__}"
        )
    return pe, proj


def _input_and_head_kwargs(model: nn.Module, pe: nn.Module, proj: nn.Conv2d) -> Dict[str, Any]:
    """The constructor arguments ViT and Swin describe alike: input (image, patch, channels) and head."""
    return {
        "img_size": list(pe.img_size) if pe.img_size is not None else None,
        "patch_size": list(pe.patch_size),
        "in_chans": int(proj.in_channels),
        "num_classes": int(model.num_classes),
        "global_pool": model.global_pool,
    }


def _describe_vit(model: nn.Module) -> Dict[str, Any]:
    from timm.layers import LayerScale, Mlp
    from timm.layers.attention import Attention
    from timm.models.vision_transformer import Block

    pe, proj = _patch_embed(model)
    embed_dim = int(model.embed_dim)

    attn = _first(model.blocks, Attention)
    mlp = _first(model.blocks, Mlp)
    block = _first(model.blocks, Block)
    attn_pool = getattr(model, "attn_pool", None)
    if attn is not None:
        num_heads = int(attn.num_heads)
    elif attn_pool is not None and hasattr(attn_pool, "num_heads"):
        num_heads = int(attn_pool.num_heads)
    else:
        num_heads = 1  # every block's attention is fused: any divisor of embed_dim builds
    if mlp is not None:
        mlp_ratio = _mlp_ratio(mlp.fc1.out_features, mlp.fc1.in_features)
    elif attn_pool is not None and isinstance(getattr(attn_pool, "mlp", None), Mlp):
        mlp_ratio = _mlp_ratio(attn_pool.mlp.fc1.out_features, attn_pool.mlp.fc1.in_features)
    elif _first_stand_in(model.blocks, "mlp") is not None:
        # A train-time RePaViT FFN keeps the source width: a skeleton with the default 4 could not take the
        # file's fc1 (train-time files of mlp_ratio != 4 models did not load)
        cim = _first_stand_in(model.blocks, "mlp")
        mlp_ratio = _mlp_ratio(cim.hidden_features, cim.fc1.in_features)
    else:
        mlp_ratio = 4.0
    init_values = None
    if block is not None and isinstance(block.ls1, LayerScale):
        init_values = float(block.ls1.init_values)
    elif block is None:
        ls = _first(model.blocks, LayerScale)
        init_values = float(ls.init_values) if ls is not None else None

    use_fc_norm = not isinstance(model.fc_norm, nn.Identity)
    final_norm = use_fc_norm or not isinstance(model.norm, nn.Identity)
    kwargs = {
        **_input_and_head_kwargs(model, pe, proj),
        "embed_dim": embed_dim,
        "depth": len(model.blocks),
        "num_heads": num_heads,
        "mlp_ratio": mlp_ratio,
        "qkv_bias": attn.qkv.bias is not None if attn is not None else True,
        "qk_norm": not isinstance(attn.q_norm, nn.Identity) if attn is not None else False,
        "scale_attn_norm": not isinstance(attn.norm, nn.Identity) if attn is not None else False,
        "scale_mlp_norm": not isinstance(mlp.norm, nn.Identity) if mlp is not None else False,
        "proj_bias": attn.proj.bias is not None if attn is not None else True,
        "init_values": init_values,
        "class_token": model.cls_token is not None,
        "pos_embed": "learn" if model.pos_embed is not None else "none",
        "no_embed_class": bool(model.no_embed_class),
        "reg_tokens": int(model.num_reg_tokens),
        "pre_norm": not isinstance(model.norm_pre, nn.Identity),
        "final_norm": final_norm,
        "fc_norm": use_fc_norm,
        "pool_include_prefix": bool(model.pool_include_prefix),
        "dynamic_img_size": bool(model.dynamic_img_size),
        "dynamic_img_pad": bool(getattr(pe, "dynamic_img_pad", False)),
    }
    embed_norm = None
    if not isinstance(pe.norm, nn.Identity):
        classes = {cls: name for name, cls in _norm_classes().items()}
        if type(pe.norm) not in classes:
            raise ValueError(f"model.patch_embed.norm: expected one of {NORM_LAYERS}, got {type(pe.norm).__qualname__}")
        embed_norm = _describe_norm_module(pe.norm, classes[type(pe.norm)])
    return {
        "kwargs": kwargs,
        "norm_layer": _describe_norm(model, "vit"),
        "act_layer": _describe_act(mlp.act if mlp is not None else None),
        "embed_norm_layer": embed_norm,
        "patch_embed_bias": proj.bias is not None,
    }


def _describe_swin(model: nn.Module) -> Dict[str, Any]:
    from timm.layers import Mlp
    from timm.models.swin_transformer import SwinTransformerBlock, WindowAttention

    pe, proj = _patch_embed(model)
    if not isinstance(model.embed_dim, int):
        raise ValueError(f"model.embed_dim: expected an int (timm doubles it per stage), got {model.embed_dim!r}")

    depths, heads, head_dims, ratios, windows = [], [], [], [], []
    ref_windows = getattr(model, "_ref_window_sizes", None)
    qkv_bias, always_partition = True, False
    found_attn = found_block = False
    for i, stage in enumerate(model.layers):
        depths.append(len(stage.blocks))
        dim = int(model.embed_dim * 2 ** i)
        attn = _first(stage.blocks, WindowAttention)
        # timm's block, or vitfast's train-time ChannelIdleSwinBlock (a subclass that keeps mlp_ratio and
        # always_partition): matched by exact type only, its mlp_ratio 3 and always_partition were written as the
        # defaults 4 and False, and the file did not load (or loaded with other windows)
        block = _first(stage.blocks, SwinTransformerBlock) or _first_stand_in(stage.blocks, "swin_block")
        mlp = _first(stage.blocks, Mlp) or _first_stand_in(stage.blocks, "mlp")
        if attn is not None:
            heads.append(int(attn.num_heads))
            head_dim = attn.qkv.out_features // 3 // attn.num_heads
            head_dims.append(None if head_dim == dim // attn.num_heads else int(head_dim))
            if not found_attn:
                qkv_bias, found_attn = attn.qkv.bias is not None, True
        else:
            heads.append(1)
            head_dims.append(None)
        if block is not None:
            ratios.append(float(block.mlp_ratio))
            if not found_block:
                always_partition, found_block = bool(block.always_partition), True
        elif mlp is not None:  # ChannelIdleMlp's fc1 may be narrower than its hidden width (folded form)
            ratios.append(_mlp_ratio(getattr(mlp, "hidden_features", mlp.fc1.out_features), mlp.fc1.in_features))
        else:
            ratios.append(4.0)
        if ref_windows is not None:
            windows.append([int(w) for w in ref_windows[i]])
        elif attn is not None:
            windows.append([int(w) for w in attn.window_size])
        else:
            windows.append([7, 7])
    kwargs = {
        **_input_and_head_kwargs(model, pe, proj),
        "embed_dim": int(model.embed_dim),
        "depths": depths,
        "num_heads": heads,
        "head_dim": head_dims,
        "window_size": windows,
        "always_partition": always_partition,
        "strict_img_size": _swin_strict_img_size(model, pe),
        "mlp_ratio": ratios,
        "qkv_bias": qkv_bias,
    }
    desc = {
        "kwargs": kwargs,
        "norm_layer": _describe_norm(model, "swin"),
        "act_layer": "torch.nn.GELU",
        "embed_norm_layer": None,
        "patch_embed_bias": proj.bias is not None,
    }
    # A Swin resized with set_input_size (timm >= 1.0.31 keeps the reference grid its windows are relative to):
    # built at its *current* size with the reference windows, a later resize derived other windows than timm's
    # (0.2 off after a resize back), and a plain resized Swin was refused by save.  So: the reference size and
    # windows, and the current size as "input_size", which build_timm applies with set_input_size.
    ref_grid = getattr(model, "_ref_grid_size", None)
    current = kwargs.get("img_size")
    if ref_windows is not None and ref_grid is not None and current is not None:
        reference = [int(ref_grid[0]) * int(pe.patch_size[0]), int(ref_grid[1]) * int(pe.patch_size[1])]
        if reference != list(current):
            kwargs["img_size"] = reference
            desc["input_size"] = [int(v) for v in current]
    return desc


def _swin_strict_img_size(model: nn.Module, pe: nn.Module) -> bool:
    # timm >= 1.0.31 keeps `dynamic_img_size` on the model; earlier 1.0.x (e.g. 1.0.29) only on its PatchEmbed as
    # `strict_img_size` (the model passes the same flag on to its stages as `dynamic_mask`).
    dynamic = getattr(model, "dynamic_img_size", None)
    if dynamic is None:
        return bool(getattr(pe, "strict_img_size", True))
    return not bool(dynamic)


def describe_timm(model: nn.Module) -> Dict[str, Any]:
    """JSON-serialisable description of a timm ViT/DeiT/distilled DeiT/Swin skeleton; see the module doc."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    name = _class_name(model)
    desc = _describe_swin(model) if name == "SwinTransformer" else _describe_vit(model)
    desc = {"class": name, **desc}
    cfg = _json_subset(getattr(model, "pretrained_cfg", None))
    if cfg:
        desc["pretrained_cfg"] = cfg
    # Fail here, with the offending value, rather than in json.dumps deep inside save().
    try:
        json.dumps(desc, allow_nan=False)
    except (TypeError, ValueError) as e:  # pragma: no cover - every value above is a JSON type
        raise ValueError(f"model: description is not JSON-serialisable: {e}") from None
    return desc


# --------------------------------------------------------------------------------------------- building


def _tuples(value: Any) -> Any:
    # JSON has no tuples; timm compares/stores some sizes as tuples, so give it what its own factories give.
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def _norm_factory(spec: Any, key: str):
    if spec is None:
        return None
    if not isinstance(spec, dict) or not {"type", "eps"} <= set(spec) <= {"type", "eps", "affine", "bias"}:
        raise ValueError(f"architecture[{key!r}]: expected {{'type': ..., 'eps': ...}} (and optionally 'affine', "
                         f"'bias'), got {spec!r:.200}")
    classes = _norm_classes()
    if spec["type"] not in classes:
        raise ValueError(f"architecture[{key!r}]['type']: expected one of {NORM_LAYERS}, got {spec['type']!r}")
    eps = spec["eps"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"architecture[{key!r}]['eps']: expected a finite number >= 0, got {eps!r}")
    kwargs: Dict[str, Any] = {"eps": float(eps)}
    for flag in ("affine", "bias"):
        if flag in spec and not isinstance(spec[flag], bool):
            raise ValueError(f"architecture[{key!r}][{flag!r}]: expected true or false, got {spec[flag]!r:.100}")
    if spec.get("affine", True) is False:
        # timm's LayerNorms name it `affine`, torch's `elementwise_affine`.
        kwargs["elementwise_affine" if spec["type"] == "torch.nn.LayerNorm" else "affine"] = False
    if spec.get("bias", True) is False:
        kwargs["bias"] = False
    return functools.partial(classes[spec["type"]], **kwargs)


def build_timm(desc: Dict[str, Any], device: Optional[torch.device | str] = None) -> nn.Module:
    """Rebuild the skeleton described by `describe_timm` (weights uninitialised in spirit: overwrite them).

    `device="meta"` builds without allocating (used to check that a model can be rebuilt before saving it).
    """
    if not isinstance(desc, dict):
        raise ValueError(f"architecture: expected a dict from describe_timm(), got {type(desc).__name__}")
    name = desc.get("class")
    if name not in SUPPORTED_CLASSES:
        raise ValueError(f"architecture['class']: expected one of {SUPPORTED_CLASSES}, got {name!r}")
    cls = _timm_classes()[name]
    kwargs = desc.get("kwargs")
    if not isinstance(kwargs, dict):
        raise ValueError(f"architecture['kwargs']: expected a dict, got {type(kwargs).__name__}")
    params = inspect.signature(cls.__init__).parameters
    if name == "VisionTransformerDistilled":  # takes *args/**kwargs and forwards them to VisionTransformer
        params = inspect.signature(_timm_classes()["VisionTransformer"].__init__).parameters
    bad = sorted(k for k in kwargs if k not in params or k in _RESERVED_KWARGS or k == "self")
    if bad:
        raise ValueError(f"architecture['kwargs']: unexpected keys {bad} for timm {name}")
    kwargs = {k: _tuples(v) for k, v in kwargs.items()}

    norm = _norm_factory(desc.get("norm_layer"), "norm_layer")
    if norm is not None:
        kwargs["norm_layer"] = norm
    if name != "SwinTransformer":
        act = desc.get("act_layer", "torch.nn.GELU")
        factories = _act_factories()
        if act not in factories:
            raise ValueError(f"architecture['act_layer']: expected one of {ACT_LAYERS}, got {act!r}")
        kwargs["act_layer"] = factories[act]
        embed_norm = _norm_factory(desc.get("embed_norm_layer"), "embed_norm_layer")
        if embed_norm is not None:
            kwargs["embed_norm_layer"] = embed_norm
    elif desc.get("embed_norm_layer") is not None:
        raise ValueError("architecture['embed_norm_layer']: expected null for SwinTransformer (it uses norm_layer)")
    else:
        windows = kwargs.get("window_size")
        if isinstance(windows, tuple) and windows and all(w == windows[0] for w in windows) and isinstance(
                windows[0], tuple):
            # One (h, w) for every stage.  timm < 1.0.31 reads a per-stage list of length 2 (a 2-stage Swin) as
            # a single (h, w) window, so the per-stage form would not rebuild such a model there.
            kwargs["window_size"] = windows[0]

    try:
        if device is not None:
            with torch.device(device):
                model = cls(**kwargs, weight_init="skip")
        else:
            model = cls(**kwargs, weight_init="skip")
    except (AssertionError, TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"architecture: timm {name} rejected the description ({type(e).__name__}: {e})") from e

    bias = desc.get("patch_embed_bias")
    if not isinstance(bias, bool):
        raise ValueError(f"architecture['patch_embed_bias']: expected true or false, got {bias!r}")
    proj = model.patch_embed.proj
    if (proj.bias is not None) != bias:
        # timm ties the patch-embedding bias to pre_norm; RePaViT-style models drop it without pre_norm.
        model.patch_embed.proj = nn.Conv2d(
            proj.in_channels, proj.out_channels, kernel_size=proj.kernel_size, stride=proj.stride,
            padding=proj.padding, bias=bias, device=proj.weight.device, dtype=proj.weight.dtype,
        )
    input_size = desc.get("input_size")
    if input_size is not None:  # a resized Swin (see _describe_swin): built at its reference size, then resized
        if (name != "SwinTransformer" or not isinstance(input_size, list) or len(input_size) != 2
                or not all(isinstance(v, int) and v > 0 for v in input_size)):
            raise ValueError(f"architecture['input_size']: expected [height, width] of a SwinTransformer, got "
                             f"{input_size!r}")
        try:
            if device is not None:
                with torch.device(device):
                    model.set_input_size(img_size=tuple(input_size))
            else:
                model.set_input_size(img_size=tuple(input_size))
        except (AssertionError, TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"architecture['input_size']: timm refused {input_size} ({type(e).__name__}: {e})") from e
    cfg = desc.get("pretrained_cfg")
    if isinstance(cfg, dict):
        cfg = {k: _tuples(v) for k, v in cfg.items() if k in _PRETRAINED_CFG_KEYS}
        model.pretrained_cfg = cfg
        model.default_cfg = cfg
    return model


# ------------------------------------------------------------------------------------------ the source model
# Fusing replaces every block, so a fused model's own skeleton no longer says how many heads, how wide an MLP or
# how many blocks its source had (describe_timm falls back to num_heads=1, mlp_ratio=4, the fused depth): a
# baseline rebuilt from it is not the model the file came from.  The timm model's description is therefore
# taken at conversion (from_timm, patch_timm) and carried as this attribute through fuse, train-time files
# (describe_trainable) and fused files (config "source_architecture"); `vitfast bench FILE` builds its
# baseline from it.
SOURCE_ATTR = "vitfast_source_architecture"


def remember_source(converted: nn.Module, source: nn.Module) -> None:
    """Record on `converted` the description of the timm model `source` (or the one `source` already carries)."""
    desc = getattr(source, SOURCE_ATTR, None)
    if desc is None:
        try:
            desc = describe_timm(source)
        except (ValueError, TypeError):
            return  # not a describable timm model: nothing is recorded, and nothing wrong is either
    object.__setattr__(converted, SOURCE_ATTR, desc)


def source_architecture(model: nn.Module) -> Optional[Dict[str, Any]]:
    desc = getattr(model, SOURCE_ATTR, None)
    return desc if isinstance(desc, dict) else None


def set_source_architecture(model: nn.Module, desc: Any) -> None:
    """Attach a stored description (a file's); anything but a dict clears it."""
    if isinstance(desc, dict):
        object.__setattr__(model, SOURCE_ATTR, desc)
    elif SOURCE_ATTR in vars(model):
        object.__delattr__(model, SOURCE_ATTR)
