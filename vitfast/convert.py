"""Model conversion: timm ViT/DeiT/Swin, or an official RePaViT checkpoint → a vitfast train-time model.

    model = vitfast.convert.from_timm(timm_model, channel_idle=0.75, norm="batch")   # then train / finetune
    model = vitfast.convert.from_repavit(torch.load("repavit_base.pth")["model"])    # official weights
    model = vitfast.convert.from_timm(timm_model, branches=2)                        # non-deep ViT, 12 → 6 blocks
    fused = vitfast.fuse(model)

The result is the same timm model class (a deep copy: the argument is never modified) whose transformer blocks
are `vitfast.nn.ChannelIdleBlock` (ViT/DeiT, distilled DeiT included) or `vitfast.nn.ChannelIdleSwinBlock`
(Swin).  Attention sub-blocks are copied unchanged (RePaViT only reparameterizes the FFN); the FFNs become
`ChannelIdleMlp` with fc1/fc2 copied.
"""
from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

if TYPE_CHECKING:
    from .nn.nondeep import JoinSchedule

from .nn.channel_idle import FFN_NORMS, HEURISTICS, ChannelIdleBlock, ChannelIdleMlp, ChannelIdleSwinBlock, idle_ratios
from ._copy import deepcopy_model
from .nn._timm import vit_block_spec

__all__ = ["from_timm", "from_repavit", "REPAVIT_HEADS"]
__all__ += ["remove_prefix_tokens", "default_idle_ratio"]

# Official RePaViT ViT/DeiT variants: embedding width -> number of heads (Tiny, Small, Base, Large, Huge).
REPAVIT_HEADS = {192: 3, 384: 6, 768: 12, 1024: 16, 1280: 16}


def _model_blocks(model: nn.Module) -> List[Tuple[nn.Module, str, nn.Module]]:
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
    return _paper_default_idle_ratio(_model_blocks(model))


def _paper_default_idle_ratio(blocks) -> float:
    """RePaViT sec. 3.2: "μ is set to 1 by default ... leading to the default θ = 1 − 1/ρ (e.g., θ = 0.75 when
    ρ = 4)": as many active channels as the block's width.  A fixed 0.75 gave an mlp_ratio-2 model half that."""
    ratios = {1.0 - b.mlp.fc1.in_features / b.mlp.fc1.out_features
              for _, _, b in blocks if isinstance(getattr(getattr(b, "mlp", None), "fc1", None), nn.Linear)}
    if len(ratios) != 1:
        return 0.75  # no FFN to read, or blocks of different ratios: the paper's figure at ρ = 4
    return min(max(ratios.pop(), 0.0), 1.0)


def _resolve_ratios(channel_idle, depth: int, heuristic: str, spread: float) -> List[float]:
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


def _remembers_source(fn):
    """from_timm's result carries the description of the timm model it came from (vitfast.arch.SOURCE_ATTR)."""
    import functools

    @functools.wraps(fn)
    def wrapper(model, *args, **kwargs):
        from .arch import remember_source

        converted = fn(model, *args, **kwargs)
        remember_source(converted, model)
        return converted

    return wrapper


@_remembers_source
def from_timm(
    model: nn.Module,
    channel_idle: Union[float, Sequence[float], None] = None,
    norm: Optional[str] = None,
    heuristic: str = "static",
    *,
    spread: float = 0.25,
    calibration_images: Optional[torch.Tensor] = None,
    branches: Optional[int] = None,
    schedule: Union[str, "JoinSchedule"] = "linear",
    join_values: bool = False,
    diversity_weight: float = 0.05,
    dwconv_blocks: Union[int, Sequence[int], None] = None,
    dwconv_heads: Union[int, Mapping[int, Sequence[int]], Sequence[Tuple[int, int]], None] = None,
    ranking=None,
    dwconv_kernel_size: int = 3,
    dwconv_ensemble: bool = False,
    dwconv_kernel_init_std: Optional[float] = None,
    remove_cls_token: bool = False,
    gates: bool = False,
    flops_target: Optional[float] = None,
    gate_level: str = "group",
    gate_search: bool = True,
    gate_kind: str = "G0",
) -> nn.Module:
    """Train-time RePaViT model from a timm ViT/DeiT (incl. distilled) or Swin model.

    channel_idle: the idle ratio θ (fraction of FFN hidden channels without GELU), or one ratio per block (depth
        order; for Swin, over all stages).  Default: the paper's θ = 1 − 1/ρ for MLP ratio ρ (μ = 1: as many
        active channels as the width), 0.75 at ρ = 4.
    norm: FFN normalisation — "batch" (RePaViT: BatchNorm1d before fc1 and before fc2, both foldable, the
        shortcut folds too) or "layer" (keep the LayerNorm; the shortcut stays explicit after fusing).
    heuristic: per-layer θ from one number — "static" (same θ everywhere, the paper's) or "linear" (θ ramps
        with depth from θ − δ to θ + δ, δ = min(spread, θ, 1 − θ); see `vitfast.nn.idle_ratios`).

    BatchNorm initialisation (norm="batch"):
      * without data: the pre-norm BN takes the LayerNorm's γ, β with running statistics (0, 1); the hidden BN
        is the identity.  BN ≠ LN (one normalises each channel over tokens, the other each token over
        channels), so this does not reproduce the pretrained function; it is the neutral data-free start.
      * with `calibration_images` (a [B, 3, H, W] batch): one eval-mode pass, block by block in depth order
        (each block sees the outputs of the already-calibrated blocks before it).  The pre-norm BN becomes the
        per-channel least-squares affine fit of the pretrained LayerNorm's output on these tokens
        (a_c = cov(x_c, LN(x)_c) / var(x_c)), with running statistics = the tokens' mean/variance, so the BN
        is as close to the LN as a per-channel affine map can be; the hidden BN's statistics are set to its
        input's and its affine to (√(σ² + ε), μ), making it the identity in eval mode.  What remains different
        from the pretrained model is only what the method changes: LN → per-channel affine, and the idle
        channels losing their GELU.
    norm="layer" with θ = 0 reproduces the timm model exactly.  Train/eval mode is kept.

    Defaults: channel_idle = 1 − 1/ρ (0.75 at ρ = 4) and norm = "batch" (RePaViT); with `branches`, channel_idle = 0 and
    norm = "layer" (a plain non-deep model) unless given.

    branches: n ≥ 2 makes a non-deep ViT (non-deep-vit-progressive-reparam; `vitfast.nn.nondeep`): the L timm
    blocks become L/n `NonDeepBlock`s of n parallel branches (L divisible by n; ViT/DeiT only), each branch
    initialised from one pretrained layer, composing with `channel_idle` (θ per non-deep block) and `norm`.
    Mapping: block g's branch b ← layer g·n + b (consecutive layers side by side).  Consecutive layers see
    nearly the same residual stream, and x + f_1(x) + f_2(x) is the first-order approximation of
    x + f_1(x) + f_2(x + f_1(x)), so at λ = 0 the converted model is the closest parallel version of the
    pretrained one; an interleaved mapping (branch b of block g ← layer b·L/n + g) would feed deep layers with
    shallow features.  λ starts at 0 and follows `schedule` (a `vitfast.nn.JoinSchedule` or its kind: "linear",
    "cosine", "exp", "sqrt") through the Trainer's `set_step`; `join_values` joins the value path too (the fused
    attention then has value width d_h instead of n·d_h; see the module doc); `diversity_weight` is α of the
    diversity regulariser (each block's `extra_loss_weight` is α / number of blocks, so the Trainer adds α × the
    mean over blocks).

    Drop-in depthwise convolution (dropin-depthwise-conv-attention; ViT/DeiT only): `dwconv_blocks` replaces every
    head of these blocks (a list of block indices, or a count k = the k blocks with the lowest Σ_b of `ranking`),
    `dwconv_heads` replaces single heads (scattered: {block: [heads]}, [(block, head), ...], or a count p = the
    p heads with the lowest Σ_h of `ranking`); both may be given.  `ranking`: a
    `vitfast.head_selection.HeadRanking`, its JSON dict, or the path of its JSON file (`vitfast select-heads`).
    Replaced blocks become `vitfast.nn.DWConvBlock` (k = `dwconv_kernel_size`, Gaussian kernels with std
    `dwconv_kernel_init_std` (default 1/k), head ensembling of eq. 12-13 with `dwconv_ensemble`); the others
    stay as they are.  It composes with `channel_idle`: θ given → every FFN is a channel-idle FFN (norm "batch"
    unless given); θ not given → θ = 0 with norm "layer", timm's FFN exactly, so only the replaced heads
    change the function.  `remove_cls_token=True` removes the cls token as the paper does (appendix A.3.2:
    pooling becomes the mean of the tokens; see `remove_prefix_tokens`).

    gates=True makes a USDC model (usdc-static-dynamic-compression; `vitfast.usdc.convert_timm`): per-layer
    decision networks that skip MHSA/FFN sub-blocks (`gate_level` "group"/"sample"/"batch" in training,
    `gate_search` over G0…G6 or a fixed `gate_kind`), and with `flops_target` (f_t, a FLOPs ratio) static
    keep/prune logits plus the resource loss γ(F − f_t)², γ = 100.  Composes with `channel_idle`.
    """
    blocks = _model_blocks(model)  # type check first, before copying anything
    _check_method_options(
        branches=branches, schedule=schedule, join_values=join_values, diversity_weight=diversity_weight,
        gates=gates, gate_level=gate_level, gate_search=gate_search, gate_kind=gate_kind,
        dwconv=dwconv_blocks is not None or dwconv_heads is not None, ranking=ranking,
        dwconv_kernel_size=dwconv_kernel_size, dwconv_ensemble=dwconv_ensemble,
        dwconv_kernel_init_std=dwconv_kernel_init_std, remove_cls_token=remove_cls_token,
        channel_idle=channel_idle, heuristic=heuristic, spread=spread,
    )
    if gates:
        if dwconv_blocks is not None or dwconv_heads is not None:
            raise ValueError("gates: not supported together with dwconv_blocks/dwconv_heads yet, got both")
        return _from_timm_usdc(model, channel_idle, norm, heuristic, spread, calibration_images, flops_target,
                               gate_level, gate_search, gate_kind, branches)
    if flops_target is not None:
        raise ValueError(f"flops_target: only used with gates=True (USDC), got {flops_target!r}")
    if dwconv_blocks is not None or dwconv_heads is not None or remove_cls_token:
        if branches is not None:
            raise ValueError("dwconv_blocks/dwconv_heads: not supported together with branches (non-deep ViT), got both")
        return _from_timm_dwconv(
            model, channel_idle, norm, heuristic, spread, calibration_images, dwconv_blocks, dwconv_heads, ranking,
            dwconv_kernel_size, dwconv_ensemble, dwconv_kernel_init_std, remove_cls_token,
        )
    if branches is not None:
        if calibration_images is not None:
            raise ValueError("calibration_images: not supported with branches (BatchNorm calibration is per RePaViT "
                             "block), got a tensor")
        return _from_timm_nondeep(
            model, blocks, branches, 0.0 if channel_idle is None else channel_idle, norm or "layer", heuristic,
            spread, schedule, join_values, diversity_weight,
        )
    channel_idle = _paper_default_idle_ratio(blocks) if channel_idle is None else channel_idle
    norm = "batch" if norm is None else norm
    if norm not in FFN_NORMS:
        raise ValueError(f"norm: expected one of {FFN_NORMS}, got {norm!r}")
    if heuristic not in HEURISTICS:
        raise ValueError(f"heuristic: expected one of {HEURISTICS}, got {heuristic!r}")
    if not blocks:
        raise ValueError("model: expected at least one transformer block, got none")
    ratios = _resolve_ratios(channel_idle, len(blocks), heuristic, spread)
    if calibration_images is not None:
        if norm != "batch":
            raise ValueError(f"calibration_images: only used with norm='batch' (LayerNorms are copied), got norm={norm!r}")
        if not isinstance(calibration_images, torch.Tensor) or calibration_images.dim() != 4:
            got = list(calibration_images.shape) if isinstance(calibration_images, torch.Tensor) else type(calibration_images).__name__
            raise ValueError(f"calibration_images: expected a [B, C, H, W] image tensor, got {got}")

    from timm.models.swin_transformer import SwinTransformerBlock

    converted = deepcopy_model(model)
    replacements = []
    for i, ((parent, name, block), ratio) in enumerate(zip(_model_blocks(converted), ratios)):
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


def _check_method_options(*, branches, schedule, join_values, diversity_weight, gates, gate_level, gate_search,
                          gate_kind, dwconv, ranking, dwconv_kernel_size, dwconv_ensemble,
                          dwconv_kernel_init_std, remove_cls_token, channel_idle, heuristic, spread) -> None:
    """A method's options without the method would be ignored (a silently different model): refuse them, as the
    CLI does.  Values are checked here under from_timm's own argument names (deeper code names its own)."""
    from .nn.gates import GATE_KINDS, GATE_LEVELS
    from ._checks import check_nonnegative_weight
    from .nn.nondeep import JOIN_SCHEDULES, JoinSchedule

    def refuse_unused(given, method):
        unused = [name for name, is_given in given if is_given]
        if unused:
            raise ValueError(f"{', '.join(unused)}: only used with {method}, got {'it' if len(unused) == 1 else 'them'} "
                             f"without")

    if branches is None:
        refuse_unused([("schedule", not (isinstance(schedule, str) and schedule == "linear")),
                       ("join_values", join_values is not False), ("diversity_weight", diversity_weight != 0.05)],
                      "branches (non-deep ViT)")
    else:
        if not isinstance(schedule, JoinSchedule) and schedule not in JOIN_SCHEDULES:
            raise ValueError(f"schedule: expected a JoinSchedule or one of {tuple(JOIN_SCHEDULES)}, got {schedule!r}")
        if not isinstance(join_values, bool):
            raise ValueError(f"join_values: expected True or False, got {join_values!r}")
        check_nonnegative_weight("diversity_weight", diversity_weight)
    if not gates:
        refuse_unused([("gate_level", gate_level != "group"), ("gate_search", gate_search is not True),
                       ("gate_kind", gate_kind != "G0")], "gates=True (USDC)")
    else:
        if gate_level not in GATE_LEVELS:
            raise ValueError(f"gate_level: expected one of {GATE_LEVELS}, got {gate_level!r}")
        if gate_kind not in GATE_KINDS:
            raise ValueError(f"gate_kind: expected one of {GATE_KINDS}, got {gate_kind!r}")
    if not dwconv:
        refuse_unused([("ranking", ranking is not None), ("dwconv_kernel_size", dwconv_kernel_size != 3),
                       ("dwconv_ensemble", dwconv_ensemble is not False),
                       ("dwconv_kernel_init_std", dwconv_kernel_init_std is not None)],
                      "dwconv_blocks/dwconv_heads")
    if remove_cls_token and (gates or branches is not None):
        raise ValueError(f"remove_cls_token: not supported together with "
                         f"{'gates=True (USDC)' if gates else 'branches (non-deep ViT)'}, got both")
    if channel_idle is None and (gates or branches is not None or dwconv or remove_cls_token):
        # These methods keep timm's FFN (θ = 0) unless channel_idle is given: a per-layer θ rule has nothing to act on.
        refuse_unused([("heuristic", heuristic != "static"), ("spread", spread != 0.25)], "channel_idle")


def _from_timm_usdc(model, channel_idle, norm, heuristic, spread, calibration_images, flops_target, gate_level,
                    gate_search, gate_kind, branches) -> nn.Module:
    """gates=True (usdc-static-dynamic-compression, `vitfast.usdc`): every ViT block gets a decision network
    (searched over G0…G6 unless gate_search=False) and, with a `flops_target`, learnable static keep/prune
    logits and the resource loss.  With `channel_idle`, the RePaViT conversion runs first and its blocks are
    gated (gates and block pruning; FFN channel pruning applies to plain FFNs only)."""
    from .usdc import convert_timm

    if branches is not None:
        raise ValueError(f"branches: not supported with gates=True (non-deep blocks are not gated), got {branches!r}")
    base = model
    if channel_idle is not None:
        base = from_timm(model, channel_idle, norm, heuristic, spread=spread, calibration_images=calibration_images)
    elif norm is not None or calibration_images is not None:
        raise ValueError("norm, calibration_images: only used with channel_idle (RePaViT FFNs), got no channel_idle")
    return convert_timm(base, flops_target=flops_target, level=gate_level, search=gate_search, gate_kind=gate_kind)


def _from_timm_nondeep(model, blocks, branches, channel_idle, norm, heuristic, spread, schedule, join_values,
                       diversity_weight) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    from .nn.nondeep import NonDeepBlock

    if not isinstance(model, VisionTransformer):
        raise ValueError(
            f"branches: only timm VisionTransformer models (ViT/DeiT) can be made non-deep, got {type(model).__name__}"
        )
    if isinstance(branches, bool) or not isinstance(branches, int) or branches < 2:
        raise ValueError(f"branches: expected an int >= 2, got {branches!r}")
    if len(blocks) % branches:
        raise ValueError(f"branches: expected a divisor of the model depth {len(blocks)}, got {branches}")
    if norm not in FFN_NORMS:
        raise ValueError(f"norm: expected one of {FFN_NORMS}, got {norm!r}")
    if heuristic not in HEURISTICS:
        raise ValueError(f"heuristic: expected one of {HEURISTICS}, got {heuristic!r}")
    depth = len(blocks) // branches
    ratios = _resolve_ratios(channel_idle, depth, heuristic, spread)
    converted = deepcopy_model(model)
    timm_blocks = [block for _, _, block in _model_blocks(converted)]
    new_blocks = [
        NonDeepBlock.from_timm_blocks(
            timm_blocks[g * branches:(g + 1) * branches],
            schedule=schedule,
            join_values=join_values,
            idle_ratio=ratio,
            ffn_norm=norm,
            diversity_weight=diversity_weight / depth,
            name=f"model blocks {g * branches}..{(g + 1) * branches - 1}",
        )
        for g, ratio in enumerate(ratios)
    ]
    converted.blocks = nn.Sequential(*new_blocks)
    reduction = getattr(converted.patch_embed, "patch_size", (1,))[0]
    converted.feature_info = [dict(module=f"blocks.{i}", num_chs=converted.embed_dim, reduction=reduction)
                              for i in range(depth)]
    return converted


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


# ------------------------------------------------------------------------------------------------ drop-in DW conv
def _dwconv_plan(depth: int, heads: int, dwconv_blocks, dwconv_heads, ranking) -> Dict[int, Tuple[int, ...]]:
    """{block index: replaced heads} from the blockwise and scattered requests (validated, merged)."""
    from .head_selection import HeadRanking

    def need_ranking(arg: str) -> "HeadRanking":
        if ranking is None:
            raise ValueError(f"{arg}: a count needs `ranking` (a HeadRanking, its dict or JSON path), got ranking=None")
        r = ranking
        if isinstance(r, (str, bytes)) or hasattr(r, "__fspath__"):
            r = HeadRanking.load(r)
        elif isinstance(r, dict):
            r = HeadRanking.from_dict(r)
        if not isinstance(r, HeadRanking):
            raise ValueError(f"ranking: expected a HeadRanking, its dict or a JSON path, got {type(r).__name__}")
        if r.num_blocks != depth or any(len(row) != heads for row in r.head_scores):
            raise ValueError(f"ranking: expected scores for {depth} blocks × {heads} heads (this model), got "
                             f"{r.num_blocks} blocks × {len(r.head_scores[0])} heads")
        return r

    plan: Dict[int, set] = {}
    if dwconv_blocks is not None:
        if isinstance(dwconv_blocks, int) and not isinstance(dwconv_blocks, bool):
            chosen = need_ranking("dwconv_blocks").select_blocks(dwconv_blocks)
        elif isinstance(dwconv_blocks, Sequence) and not isinstance(dwconv_blocks, (str, bytes)):
            chosen = list(dwconv_blocks)
        else:
            raise ValueError(f"dwconv_blocks: expected a block count or a list of block indices, got {dwconv_blocks!r}")
        for b in chosen:
            if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < depth:
                raise ValueError(f"dwconv_blocks: expected block indices in [0, {depth}), got {b!r}")
            plan.setdefault(b, set()).update(range(heads))
    if dwconv_heads is not None:
        if isinstance(dwconv_heads, int) and not isinstance(dwconv_heads, bool):
            pairs = [(b, h) for b, hs in need_ranking("dwconv_heads").select_heads(dwconv_heads).items() for h in hs]
        elif isinstance(dwconv_heads, Mapping):
            pairs = []
            for b, hs in dwconv_heads.items():
                if isinstance(hs, (str, bytes)) or not isinstance(hs, Iterable):
                    raise ValueError(f"dwconv_heads[{b!r}]: expected a list of head indices, got {hs!r}")
                pairs.extend((b, h) for h in hs)
        elif isinstance(dwconv_heads, Sequence) and not isinstance(dwconv_heads, (str, bytes)):
            pairs = []
            for p in dwconv_heads:
                if not isinstance(p, (tuple, list)) or len(p) != 2:
                    raise ValueError(f"dwconv_heads: expected (block, head) pairs, got {p!r}")
                pairs.append(tuple(p))
        else:
            raise ValueError(f"dwconv_heads: expected a head count, {{block: [heads]}} or (block, head) pairs, got "
                             f"{dwconv_heads!r}")
        for b, h in pairs:
            if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < depth:
                raise ValueError(f"dwconv_heads: expected block indices in [0, {depth}), got {b!r}")
            if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < heads:
                raise ValueError(f"dwconv_heads: expected head indices in [0, {heads}) (block {b}), got {h!r}")
            plan.setdefault(b, set()).add(h)
    return {b: tuple(sorted(hs)) for b, hs in sorted(plan.items()) if hs}


def remove_prefix_tokens(model: nn.Module) -> nn.Module:
    """Remove the cls token of a timm ViT in place, as the paper does for its convolutional heads (appendix A.3.2):
    its position embedding row goes with it and class-token pooling becomes the mean of the tokens ("avg").
    Register tokens (if any) stay; a distilled DeiT (dist token) is refused.  Returns the model."""
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(model, VisionTransformer):
        raise ValueError(f"model: expected a timm VisionTransformer, got {type(model).__name__}")
    if getattr(model, "dist_token", None) is not None:
        raise ValueError("model: a distilled DeiT's dist token cannot be removed (its head reads it), got one")
    if model.cls_token is None:
        return model
    if model.pos_embed is not None and not model.no_embed_class:
        # pos_embed rows: [cls, registers..., patches...] in timm's original layout; drop the cls row.
        model.pos_embed = nn.Parameter(model.pos_embed.detach()[:, 1:].clone(),
                                       requires_grad=model.pos_embed.requires_grad)
    model.cls_token = None
    model.has_class_token = False
    model.num_prefix_tokens -= 1
    if model.global_pool == "token":
        model.global_pool = "avg"
    # A 'prr' attention pool reads the cls token itself (pool 'token'); timm builds it with 'avg' for a model
    # without one, which is what the model now is.  ('map' pools' 'token' is their own latent query: kept.)
    import timm.layers

    prr = getattr(timm.layers, "AttentionPoolPrr", None)  # newer timm only
    attn_pool = getattr(model, "attn_pool", None)
    if prr is not None and isinstance(attn_pool, prr) and attn_pool.pool == "token":
        attn_pool.pool = "avg"
    # Everything else that counts the prefix tokens: timm's patch dropout (it kept the first patch as if it were
    # the cls token) and DW-conv heads already in the model (they refused every input as the wrong resolution).
    if hasattr(model.patch_drop, "num_prefix_tokens"):
        model.patch_drop.num_prefix_tokens = model.num_prefix_tokens
    for module in model.modules():
        if getattr(module, "vitfast_counts_prefix_tokens", False) and module.prefix_tokens is not None:
            module.prefix_tokens = int(model.num_prefix_tokens)
    return model


def _check_no_patch_dropout(model: nn.Module, name: str) -> None:
    """Convolution heads need the whole patch grid: timm's patch dropout (patch_drop_rate > 0) removes patches in
    training, which the first training forward refused with a misleading "input resolution" error."""
    rate = float(getattr(getattr(model, "patch_drop", None), "prob", 0.0) or 0.0)
    if rate > 0:
        raise ValueError(f"{name}: depthwise-convolution heads need every patch of the grid, but the model drops "
                         f"patches in training (patch_drop_rate = {rate}); build it with patch_drop_rate=0")


def _from_timm_dwconv(model, channel_idle, norm, heuristic, spread, calibration_images, dwconv_blocks, dwconv_heads,
                      ranking, kernel_size, ensemble, kernel_init_std, remove_cls_token) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(model, VisionTransformer):
        given = "dwconv_blocks/dwconv_heads" if dwconv_blocks is not None or dwconv_heads is not None else "remove_cls_token"
        raise ValueError(f"{given}: only timm VisionTransformer models (ViT/DeiT), got {type(model).__name__}")
    if dwconv_blocks is not None or dwconv_heads is not None:  # removing the cls token alone keeps every patch
        _check_no_patch_dropout(model, "dwconv_blocks/dwconv_heads")
    depth = len(model.blocks)
    for i, block in enumerate(model.blocks):  # before any .attn access: parallel blocks have none
        vit_block_spec(block, f"model.blocks[{i}]")
    heads = model.blocks[0].attn.num_heads if depth else 0
    plan = _dwconv_plan(depth, heads, dwconv_blocks, dwconv_heads, ranking)
    if channel_idle is None:
        channel_idle, norm = 0.0, norm or "layer"
    converted = from_timm(model, channel_idle=channel_idle, norm=norm, heuristic=heuristic, spread=spread,
                          calibration_images=calibration_images)
    if remove_cls_token:
        remove_prefix_tokens(converted)
    return replace_dwconv_blocks(converted, plan, kernel_size=kernel_size, ensemble=ensemble,
                                 kernel_init_std=kernel_init_std)


def replace_dwconv_blocks(converted: nn.Module, plan: Mapping[int, Sequence[int]], *, kernel_size: int = 3,
                          ensemble: bool = False, kernel_init_std: Optional[float] = None) -> nn.Module:
    """In place: block b of a converted ViT (ChannelIdleBlocks) becomes a `DWConvBlock` with the heads plan[b]
    replaced, on the model's patch grid and prefix-token count."""
    from .nn.dwconv import DWConvBlock, follow_patch_grid

    grid = tuple(int(g) for g in converted.patch_embed.grid_size)
    for b, hs in plan.items():
        converted.blocks[b] = DWConvBlock.from_block(
            converted.blocks[b], hs, grid, kernel_size=kernel_size, ensemble=ensemble, kernel_init_std=kernel_init_std,
            prefix_tokens=int(converted.num_prefix_tokens), name=f"model block {b}",
        )
    follow_patch_grid(converted)  # under dynamic_img_size, the grid of each input (not only its token count)
    return converted
