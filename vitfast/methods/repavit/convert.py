"""RePaViT conversion: a timm ViT/DeiT/Swin, or an official RePaViT checkpoint, → train-time channel-idle blocks.

`convert_timm` is what `vitfast.convert.from_timm` runs when no other method is asked for (and under DW-conv and
USDC models, which are built on channel-idle blocks): every block becomes a `ChannelIdleBlock` /
`ChannelIdleSwinBlock` with idle ratio θ, optionally with its BatchNorms calibrated on real tokens.  `from_repavit`
reads the official checkpoints' layout.
"""
from __future__ import annotations

import math
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from ..._copy import deepcopy_model
from .modules import FFN_NORMS, HEURISTICS, ChannelIdleBlock, ChannelIdleMlp, ChannelIdleSwinBlock, idle_ratios

# Official RePaViT ViT/DeiT variants: embedding width -> number of heads (Tiny, Small, Base, Large, Huge).
REPAVIT_HEADS = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}


def model_blocks(model: nn.Module) -> List[Tuple[nn.Module, str, nn.Module]]:
    """(parent container, child name, block) for every transformer block, in depth order."""
    from timm.models.swin_transformer import SwinTransformer
    from timm.models.vision_transformer import VisionTransformer

    if isinstance(model, VisionTransformer):
        return [(model.blocks, name, block) for name, block in model.blocks.named_children()]
    if isinstance(model, SwinTransformer):
        found = []
        for stage in model.layers:
            found.extend((stage.blocks, name, block) for name, block in stage.blocks.named_children())
        return found
    raise TypeError(
        "model: expected a timm VisionTransformer (ViT, DeiT, distilled DeiT) or SwinTransformer, "
        f"got {type(model).__module__}.{type(model).__qualname__}"
    )


def default_idle_ratio(model: nn.Module) -> float:
    """θ that `from_timm` uses when `channel_idle` is not given: 1 − 1/ρ for the model's MLP ratio ρ."""
    return _paper_default_idle_ratio(model_blocks(model))


def _paper_default_idle_ratio(blocks) -> float:
    """RePaViT sec. 3.2: "μ is set to 1 by default ... leading to the default θ = 1 − 1/ρ (e.g., θ = 0.75 when
    ρ = 4)": as many active channels as the block's width.  A fixed 0.75 gave an mlp_ratio-2 model half that."""
    ratios = {1.0 - b.mlp.fc1.in_features / b.mlp.fc1.out_features
              for _, _, b in blocks if isinstance(getattr(getattr(b, "mlp", None), "fc1", None), nn.Linear)}
    if len(ratios) != 1:
        return 0.75  # no FFN to read, or blocks of different ratios: the paper's figure at ρ = 4
    return min(max(ratios.pop(), 0.0), 1.0)


def resolve_ratios(channel_idle, depth: int, heuristic: str, spread: float) -> List[float]:
    # Options the chosen form ignores are refused (as _check_method_options does for whole methods): a list
    # with heuristic="linear", or a spread with heuristic="static", used to give a model without the asked ramp.
    if spread != 0.25 and heuristic == "static":
        raise ValueError(f"spread: only used with heuristic='linear', got spread={spread!r} with heuristic='static'")
    if heuristic != "static" and isinstance(channel_idle, Sequence) and not isinstance(channel_idle, (str, bytes)):
        raise ValueError(f"heuristic: only applies to one channel_idle ratio (a list already gives every block "
                         f"its own), got heuristic={heuristic!r} with a list")
    if isinstance(channel_idle, (int, float)) and not isinstance(channel_idle, bool):
        if not 0.0 <= channel_idle <= 1.0:  # named as from_timm's argument (idle_ratios says "theta")
            raise ValueError(f"channel_idle: expected a number in [0, 1], got {channel_idle!r}")
        return idle_ratios(depth, float(channel_idle), heuristic, spread=spread)
    if isinstance(channel_idle, Sequence) and not isinstance(channel_idle, (str, bytes)):
        ratios = list(channel_idle)
        if len(ratios) != depth:
            raise ValueError(
                f"channel_idle: expected one idle ratio per block ({depth} blocks), got {len(ratios)} values"
            )
        for i, r in enumerate(ratios):
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= r <= 1.0:
                raise ValueError(f"channel_idle[{i}]: expected a number in [0, 1], got {r!r}")
        return [float(r) for r in ratios]
    raise ValueError(
        f"channel_idle: expected an idle ratio θ in [0, 1] or a sequence of per-block ratios, got {channel_idle!r}"
    )


def _calibrate_batchnorms(model: nn.Module, pairs, images: torch.Tensor) -> None:
    """Fit each ChannelIdleMlp's BatchNorms to its pretrained LayerNorm on real tokens (see from_timm)."""
    def calibrate(mlp: ChannelIdleMlp, layer_norm: nn.Module, x: torch.Tensor) -> None:
        channels = x.shape[-1]
        flat = x.reshape(-1, channels).double()
        target = layer_norm(x).reshape(-1, channels).double()
        mean, var = flat.mean(0), flat.var(0, unbiased=False)
        slope = ((flat - mean) * (target - target.mean(0))).mean(0) / var.clamp_min(1e-12)
        intercept = target.mean(0) - slope * mean
        bn1 = mlp.pre_norm
        # BN(x) = w·(x − μ)/√(σ² + ε) + b  =  slope·x + intercept  for  w = slope·√(σ² + ε), b = slope·μ + intercept
        bn1.running_mean.copy_(mean)
        bn1.running_var.copy_(var)
        bn1.weight.copy_(slope * torch.sqrt(var + bn1.eps))
        bn1.bias.copy_(slope * mean + intercept)
        hidden = mlp.fc1(bn1(flat.to(x.dtype)))
        a = mlp.active_features
        hidden = torch.cat([mlp.act(hidden[:, :a]), hidden[:, a:]], dim=1).double()
        bn2 = mlp.hidden_norm
        h_mean, h_var = hidden.mean(0), hidden.var(0, unbiased=False)
        bn2.running_mean.copy_(h_mean)
        bn2.running_var.copy_(h_var)
        bn2.weight.copy_(torch.sqrt(h_var + bn2.eps))  # identity in eval mode: w·(h − μ)/√(σ² + ε) + μ = h
        bn2.bias.copy_(h_mean)

    was_training = model.training
    model.eval()
    handles = [
        mlp.register_forward_pre_hook(lambda module, args, ln=ln: calibrate(module, ln, args[0]))
        for mlp, ln in pairs
    ]
    try:
        with torch.no_grad():
            model(images)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)


# ------------------------------------------------------------------------------------------------ RePaViT
_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.(.+)$")


_BN_SUFFIXES = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _unwrap_state_dict(state_dict) -> Dict[str, torch.Tensor]:
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict: expected a mapping of parameter names to tensors, got {type(state_dict).__name__}")
    for wrapper in ("model", "state_dict", "model_ema"):
        if wrapper in state_dict and isinstance(state_dict[wrapper], Mapping) and "cls_token" not in state_dict:
            state_dict = state_dict[wrapper]
            break
    out = {}
    for key, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"state_dict[{key!r}]: expected a Tensor, got {type(value).__name__}")
        out[key[len("module."):] if key.startswith("module.") else key] = value
    return out


def _require(sd: Dict[str, torch.Tensor], key: str, ndim: Optional[int] = None) -> torch.Tensor:
    if key not in sd:
        raise ValueError(f"state_dict: expected key {key!r} (official RePaViT ViT/DeiT layout), not found")
    t = sd[key]
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"state_dict[{key!r}]: expected {ndim} dimensions, got shape {list(t.shape)}")
    return t


def from_repavit(
    state_dict: Mapping[str, torch.Tensor],
    num_heads: Optional[int] = None,
    num_classes: Optional[int] = None,
    img_size: Optional[int] = None,
    *,
    idle_ratio: float = 0.75,
    active_features: Optional[int] = None,
    norm_eps: float = 1e-6,
    attn_norm_eps: float = 1e-5,
) -> nn.Module:
    """Train-time vitfast model (timm VisionTransformer + `ChannelIdleBlock`s) from an official RePaViT ViT/DeiT
    state dict (`repavit.py` of the RePaViT repository; a {"model": ...} wrapper and "module." prefixes are
    accepted).

    Inferred from the tensors: width (cls_token), depth (blocks.*), FFN hidden width (fc1), class count (head),
    patch size and input channels (patch_embed.proj), image size (pos_embed length = 1 + (img/patch)²), biases
    and LayerScale (present keys).  Heads come from the width by the official table (192→3, 384→6, 768→12,
    1024→16, 1280→16) unless `num_heads` is given.  `num_classes` / `img_size`, when given, must agree with
    the tensors.

    Not inferable: which hidden channels are active.  The official models put GELU on the first
    ceil(hidden · (1 − idle_ratio)) channels with idle_ratio = 0.75 (one active channel per embedding channel
    at mlp_ratio 4), which is the default; pass `idle_ratio` or an explicit `active_features` for others.
    Norm eps follow the official code: `norm_eps` (1e-6) for norm_pre and the final norm, `attn_norm_eps`
    (torch's default 1e-5) for each attention pre-norm; BatchNorms keep their default eps 1e-5.

    Layout mapped: blocks.i.attn.norm → norm1, attn.qkv/proj → attn.qkv/proj, attn.ls → ls1,
    mlp.norm1 → mlp.pre_norm (BatchNorm1d over C), mlp.fc1/fc2, mlp.norm2 → mlp.hidden_norm (BatchNorm1d over
    the hidden width), mlp.ls → mlp.ls.  Unknown keys are an error (listed), never ignored.  The model is
    returned in eval mode (its BatchNorms then use the checkpoint's statistics); call `.train()` to finetune.
    """
    from timm.models.vision_transformer import VisionTransformer

    sd = _unwrap_state_dict(state_dict)
    cls_token = _require(sd, "cls_token", 3)
    dim = int(cls_token.shape[-1])
    patch_w = _require(sd, "patch_embed.proj.weight", 4)
    if tuple(patch_w.shape[:1]) != (dim,) or patch_w.shape[2] != patch_w.shape[3]:
        raise ValueError(
            f"state_dict['patch_embed.proj.weight']: expected shape [{dim}, in_chans, p, p], got {list(patch_w.shape)}"
        )
    patch, in_chans = int(patch_w.shape[-1]), int(patch_w.shape[1])
    pos = _require(sd, "pos_embed", 3)
    grid = math.isqrt(max(int(pos.shape[1]) - 1, 0))
    if pos.shape[1] - 1 != grid * grid or pos.shape[2] != dim or grid == 0:
        raise ValueError(
            f"state_dict['pos_embed']: expected shape [1, 1 + g², {dim}] (class token + a square patch grid), "
            f"got {list(pos.shape)}"
        )
    inferred_img = grid * patch
    if img_size is not None and img_size != inferred_img:
        raise ValueError(
            f"img_size: expected {inferred_img} (pos_embed has {grid}×{grid} patches of {patch} px), got {img_size}"
        )
    head_w = sd.get("head.weight")
    inferred_classes = int(head_w.shape[0]) if head_w is not None else 0
    if num_classes is not None and num_classes != inferred_classes:
        raise ValueError(f"num_classes: expected {inferred_classes} (head.weight rows), got {num_classes}")
    if num_heads is None:
        if dim not in REPAVIT_HEADS:
            raise ValueError(
                f"num_heads: expected an explicit value for embedding width {dim} (known official widths: "
                f"{sorted(REPAVIT_HEADS)}), got None"
            )
        num_heads = REPAVIT_HEADS[dim]
    if not isinstance(num_heads, int) or num_heads <= 0 or dim % num_heads:
        raise ValueError(f"num_heads: expected a positive divisor of the width {dim}, got {num_heads!r}")

    depth_ids = sorted({int(m.group(1)) for m in map(_BLOCK_KEY.match, sd) if m})
    if not depth_ids or depth_ids != list(range(len(depth_ids))):
        raise ValueError(f"state_dict: expected blocks.0 … blocks.N-1, got block indices {depth_ids[:10]}")
    depth = len(depth_ids)
    hidden = int(_require(sd, "blocks.0.mlp.fc1.weight", 2).shape[0])

    model = VisionTransformer(
        img_size=inferred_img,
        patch_size=patch,
        in_chans=in_chans,
        num_classes=inferred_classes,
        global_pool="token",
        embed_dim=dim,
        depth=0,  # blocks are built below as ChannelIdleBlocks
        num_heads=num_heads,
        qkv_bias=True,
        class_token=True,
        pre_norm=True,  # norm_pre present; timm then drops the patch-embedding bias, as RePaViT has none
        fc_norm=False,
        norm_layer=lambda d, **kw: nn.LayerNorm(d, eps=norm_eps, **kw),
    )
    blocks = []
    consumed = set()
    for i in range(depth):
        p = f"blocks.{i}."

        def has(key: str) -> bool:
            return p + key in sd

        qkv_w = _require(sd, p + "attn.qkv.weight", 2)
        fc1_w = _require(sd, p + "mlp.fc1.weight", 2)
        if tuple(qkv_w.shape) != (3 * dim, dim) or tuple(fc1_w.shape) != (hidden, dim):
            raise ValueError(
                f"state_dict[{p + 'attn.qkv.weight'!r} / {p + 'mlp.fc1.weight'!r}]: expected [{3 * dim}, {dim}] "
                f"and [{hidden}, {dim}], got {list(qkv_w.shape)} and {list(fc1_w.shape)}"
            )
        block = ChannelIdleBlock(
            dim,
            num_heads,
            mlp_ratio=hidden / dim,
            qkv_bias=has("attn.qkv.bias"),
            proj_bias=has("attn.proj.bias"),
            init_values=1.0 if has("attn.ls") else None,
            norm_layer=lambda d, **kw: nn.LayerNorm(d, eps=attn_norm_eps, **kw),
            idle_ratio=idle_ratio,
            ffn_norm="batch",
            active_features=active_features,
        )
        block.mlp = ChannelIdleMlp(
            dim,
            hidden,
            idle_ratio,
            "batch",
            active_features=active_features,
            bias=(has("mlp.fc1.bias"), has("mlp.fc2.bias")),
            init_values=1.0 if has("mlp.ls") else None,
        )
        mapping = {
            "attn.norm.weight": "norm1.weight",
            "attn.norm.bias": "norm1.bias",
            "attn.qkv.weight": "attn.qkv.weight",
            "attn.qkv.bias": "attn.qkv.bias",
            "attn.proj.weight": "attn.proj.weight",
            "attn.proj.bias": "attn.proj.bias",
            "attn.ls": "ls1.gamma",
            "mlp.fc1.weight": "mlp.fc1.weight",
            "mlp.fc1.bias": "mlp.fc1.bias",
            "mlp.fc2.weight": "mlp.fc2.weight",
            "mlp.fc2.bias": "mlp.fc2.bias",
            "mlp.ls": "mlp.ls.gamma",
            **{f"mlp.norm1.{s}": f"mlp.pre_norm.{s}" for s in _BN_SUFFIXES},
            **{f"mlp.norm2.{s}": f"mlp.hidden_norm.{s}" for s in _BN_SUFFIXES},
        }
        block_state = {}
        for src, dst in mapping.items():
            if has(src):
                t = sd[p + src]
                block_state[dst] = t.reshape(-1) if dst.endswith("gamma") else t  # official ls may be [1, 1, C]
                consumed.add(p + src)
        for bn in ("mlp.pre_norm", "mlp.hidden_norm"):  # older checkpoints may lack the counter; it is unused
            block_state.setdefault(f"{bn}.num_batches_tracked", torch.zeros((), dtype=torch.long))
        _load_strict(block, block_state, f"state_dict blocks.{i}")
        blocks.append(block)
    model.blocks = nn.Sequential(*blocks)
    model.feature_info = [dict(module=f"blocks.{i}", num_chs=dim, reduction=patch) for i in range(depth)]

    top_state = {}
    for key in ("cls_token", "pos_embed", "patch_embed.proj.weight", "norm_pre.weight", "norm_pre.bias",
                "norm.weight", "norm.bias", "head.weight", "head.bias"):
        if key in sd:
            top_state[key] = sd[key]
            consumed.add(key)
    unknown = sorted(set(sd) - consumed)
    if unknown:
        shown = ", ".join(unknown[:8]) + (f", … ({len(unknown)} in all)" if len(unknown) > 8 else "")
        raise ValueError(f"state_dict: unexpected keys for the RePaViT ViT/DeiT layout: {shown}")
    missing, unexpected = model.load_state_dict(top_state, strict=False)
    missing = [k for k in missing if not k.startswith("blocks.")]
    if missing:
        raise ValueError(f"state_dict: expected keys {missing} (official RePaViT ViT/DeiT layout), not found")
    assert not unexpected, unexpected  # every key in top_state is a VisionTransformer parameter
    return model.eval()


def _load_strict(module: nn.Module, state: Dict[str, torch.Tensor], where: str) -> None:
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    if missing:
        raise ValueError(f"{where}: expected keys {missing} (official RePaViT layout), not found")
    for key, value in state.items():
        if tuple(own[key].shape) != tuple(value.shape):
            raise ValueError(f"{where}: {key} expected shape {list(own[key].shape)}, got {list(value.shape)}")
    module.load_state_dict(state, strict=True)


def convert_timm(model: nn.Module, channel_idle: Union[float, Sequence[float], None] = None, norm: Optional[str] = None,
                 heuristic: str = "static", *, spread: float = 0.25,
                 calibration_images: Optional[torch.Tensor] = None) -> nn.Module:
    """RePaViT conversion (`vitfast.convert.from_timm` without another method): every transformer block becomes a
    `ChannelIdleBlock` / `ChannelIdleSwinBlock` with idle ratio θ (per block), FFN norm `norm`, BatchNorms optionally
    calibrated on `calibration_images`.  The argument is deep-copied, never modified; see from_timm for the options."""
    blocks = model_blocks(model)
    channel_idle = _paper_default_idle_ratio(blocks) if channel_idle is None else channel_idle
    norm = "batch" if norm is None else norm
    if norm not in FFN_NORMS:
        raise ValueError(f"norm: expected one of {FFN_NORMS}, got {norm!r}")
    if heuristic not in HEURISTICS:
        raise ValueError(f"heuristic: expected one of {HEURISTICS}, got {heuristic!r}")
    if not blocks:
        raise ValueError("model: expected at least one transformer block, got none")
    ratios = resolve_ratios(channel_idle, len(blocks), heuristic, spread)
    if calibration_images is not None:
        if norm != "batch":
            raise ValueError(f"calibration_images: only used with norm='batch' (LayerNorms are copied), got norm={norm!r}")
        if not isinstance(calibration_images, torch.Tensor) or calibration_images.dim() != 4:
            got = list(calibration_images.shape) if isinstance(calibration_images, torch.Tensor) else type(calibration_images).__name__
            raise ValueError(f"calibration_images: expected a [B, C, H, W] image tensor, got {got}")

    from timm.models.swin_transformer import SwinTransformerBlock

    converted = deepcopy_model(model)
    replacements = []
    for i, ((parent, name, block), ratio) in enumerate(zip(model_blocks(converted), ratios)):
        where = f"model block {i}"
        if isinstance(block, SwinTransformerBlock):
            new = ChannelIdleSwinBlock.from_timm(block, idle_ratio=ratio, ffn_norm=norm, name=where)
        else:
            new = ChannelIdleBlock.from_timm(block, idle_ratio=ratio, ffn_norm=norm, name=where)
        replacements.append((parent, name, new, block.norm2))
    for parent, name, new, _ in replacements:
        setattr(parent, name, new)
    if calibration_images is not None:
        _calibrate_batchnorms(converted, [(new.mlp, ln) for _, _, new, ln in replacements], calibration_images)
    return converted
