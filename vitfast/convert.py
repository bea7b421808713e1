"""Model conversion: timm ViT/DeiT/Swin, or an official RePaViT checkpoint → a vitfast train-time model.

    model = vitfast.convert.from_timm(timm_model, channel_idle=0.75, norm="batch")   # then train / finetune
    model = vitfast.convert.from_repavit(torch.load("repavit_base.pth")["model"])    # official weights
    model = vitfast.convert.from_timm(timm_model, branches=2)                        # non-deep ViT, 12 → 6 blocks
    fused = vitfast.fuse(model)

The result is the same timm model class (a deep copy: the argument is never modified) whose transformer blocks
are `vitfast.methods.repavit.ChannelIdleBlock` (ViT/DeiT, distilled DeiT included) or `vitfast.methods.repavit.ChannelIdleSwinBlock`
(Swin).  Attention sub-blocks are copied unchanged (RePaViT only reparameterizes the FFN); the FFNs become
`ChannelIdleMlp` with fc1/fc2 copied.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from .methods import dwconv, nondeep, repavit, usdc
from .methods.dwconv import remove_prefix_tokens
from .methods.repavit import REPAVIT_HEADS, default_idle_ratio, from_repavit, model_blocks

if TYPE_CHECKING:
    from .methods.nondeep import JoinSchedule

__all__ = ["from_timm", "create_timm_model", "from_repavit", "REPAVIT_HEADS"]
__all__ += ["remove_prefix_tokens", "default_idle_ratio"]


_TIMM_PREFIXES = ("hf-hub:", "local-dir:")  # names timm resolves itself (a Hub repository, a local directory)


def create_timm_model(name: str, pretrained: bool = False, **timm_kwargs) -> nn.Module:
    """`timm.create_model(name, pretrained=pretrained, **timm_kwargs)` with one-line errors: an unknown name says
    so (with the closest names), and weights or a Hub config that cannot be fetched (no network) raise a
    ConnectionError naming the model and the ways to give local weights."""
    import difflib

    import timm

    if not isinstance(name, str):
        raise TypeError(f"model: expected a timm model name or a timm model, got {type(name).__name__}")
    if not name.startswith(_TIMM_PREFIXES) and not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; vitfast.list_models() lists the supported ones"
        raise ValueError(f"model: expected a timm model name, got {name!r}{hint}")
    try:
        return timm.create_model(name, pretrained=pretrained, **timm_kwargs)
    except OSError as exc:
        # huggingface_hub's LocalEntryNotFoundError, requests' ConnectionError, ... are all OSErrors; a local
        # file named in timm_kwargs that is missing is one too, and keeps its own message.
        if isinstance(exc, FileNotFoundError) and exc.filename is not None:
            raise
        what = "its config from the Hugging Face Hub" if name.startswith("hf-hub:") else "its pretrained weights"
        raise ConnectionError(
            f"model: timm could not fetch {what} for {name!r} (no network or Hugging Face Hub access: "
            f"{type(exc).__name__}); give local weights with checkpoint_path=PATH or "
            f"pretrained_cfg_overlay=dict(file=PATH)"
        ) from exc


def _timm_model(model, pretrained: bool, timm_kwargs: dict) -> nn.Module:
    """The timm model `from_timm` converts: `model` itself, or the one its name builds."""
    if isinstance(model, str):
        return create_timm_model(model, pretrained=pretrained, **timm_kwargs)
    if pretrained is not False:
        raise TypeError(f"pretrained: only used with a timm model name, got a built model (pretrained={pretrained!r})")
    if timm_kwargs:
        # with a name they would go to timm.create_model; with a built model they can only be misspelt options
        raise TypeError(f"from_timm() got unexpected keyword arguments {', '.join(sorted(timm_kwargs))} (with a built "
                        f"model; keyword arguments that are not from_timm's own go to timm.create_model with a name)")
    return model


def from_timm(
    model: Union[str, nn.Module],
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
    dwconv_kernel_form: str = "depthwise",
    remove_cls_token: bool = False,
    global_pool: Optional[str] = None,
    gates: bool = False,
    flops_target: Optional[float] = None,
    gate_level: str = "group",
    gate_search: bool = True,
    gate_kind: str = "G0",
    pretrained: bool = False,
    **timm_kwargs,
) -> nn.Module:
    """Train-time RePaViT model from a timm ViT/DeiT (incl. distilled) or Swin model, or from its timm name.

    model: a timm model (it is copied, never modified), or a timm model name ("deit_tiny_patch16_224",
        "hf-hub:timm/...") built with `timm.create_model(model, pretrained=pretrained, **timm_kwargs)`; timm_kwargs
        are the keyword arguments that are not from_timm's own (img_size, num_classes, checkpoint_path,
        pretrained_cfg_overlay, ...).  `vitfast.list_models()` lists the names each method supports.  Without
        network, pretrained=True or an hf-hub: name raises a one-line ConnectionError; give local weights with
        checkpoint_path=PATH (or pretrained_cfg_overlay=dict(file=PATH)).

        model = vitfast.convert.from_timm("deit_tiny_patch16_224", img_size=32, num_classes=10, channel_idle=0.75)

    channel_idle: the idle ratio θ (fraction of FFN hidden channels without GELU), or one ratio per block (depth
        order; for Swin, over all stages).  Default: the paper's θ = 1 − 1/ρ for MLP ratio ρ (μ = 1: as many
        active channels as the width), 0.75 at ρ = 4.
    norm: FFN normalisation — "batch" (RePaViT: BatchNorm1d before fc1 and before fc2, both foldable, the
        shortcut folds too) or "layer" (keep the LayerNorm; the shortcut stays explicit after fusing).
    heuristic: per-layer θ from one number — "static" (same θ everywhere, the paper's) or "linear" (θ ramps
        with depth from θ − δ to θ + δ, δ = min(spread, θ, 1 − θ); see `vitfast.methods.repavit.idle_ratios`).

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

    branches: n ≥ 2 makes a non-deep ViT (non-deep-vit-progressive-reparam; `vitfast.methods.nondeep`): the L timm
    blocks become L/n `NonDeepBlock`s of n parallel branches (L divisible by n; ViT/DeiT only), each branch
    initialised from one pretrained layer, composing with `channel_idle` (θ per non-deep block) and `norm`.
    Mapping: block g's branch b ← layer g·n + b (consecutive layers side by side).  Consecutive layers see
    nearly the same residual stream, and x + f_1(x) + f_2(x) is the first-order approximation of
    x + f_1(x) + f_2(x + f_1(x)), so at λ = 0 the converted model is the closest parallel version of the
    pretrained one; an interleaved mapping (branch b of block g ← layer b·L/n + g) would feed deep layers with
    shallow features.  λ starts at 0 and follows `schedule` (a `vitfast.methods.nondeep.JoinSchedule` or its kind: "linear",
    "cosine", "exp", "sqrt") through the Trainer's `set_step`; `join_values` joins the value path too (the fused
    attention then has value width d_h instead of n·d_h; see the module doc); `diversity_weight` is α of the
    diversity regulariser (each block's `extra_loss_weight` is α / number of blocks, so the Trainer adds α × the
    mean over blocks).

    Drop-in depthwise convolution (dropin-depthwise-conv-attention; ViT/DeiT only): `dwconv_blocks` replaces every
    head of these blocks (a list of block indices, or a count k = the k blocks with the lowest Σ_b of `ranking`),
    `dwconv_heads` replaces single heads (scattered: {block: [heads]}, [(block, head), ...], or a count p = the
    p heads with the lowest Σ_h of `ranking`); both may be given.  `ranking`: a
    `vitfast.methods.dwconv.HeadRanking`, its JSON dict, or the path of its JSON file (`vitfast select-heads`).
    Replaced blocks become `vitfast.methods.dwconv.DWConvBlock` (k = `dwconv_kernel_size`, Gaussian kernels with std
    `dwconv_kernel_init_std` (default 1/k), head ensembling of eq. 12-13 with `dwconv_ensemble`); the others
    stay as they are.  `dwconv_kernel_form="full"` is the full-convolution variant of eq. 9-10 (one k×k kernel per
    head, shared by its channels) instead of the depthwise one of eq. 11.  It composes with `channel_idle`: θ given
    → every FFN is a channel-idle FFN (norm "batch" unless given); θ not given → θ = 0 with norm "layer", timm's
    FFN exactly, so only the replaced heads change the function.  `remove_cls_token=True` removes the cls token
    as the paper does (appendix A.3.2: pooling becomes the mean of the tokens; see `remove_prefix_tokens`).

    global_pool: None keeps the model's pooling; "avg" drops the class token (its position-embedding row with it)
    and pools the mean of the patch tokens (`remove_prefix_tokens`), as the non-deep ViT paper fine-tunes (section
    4: "global average pooled features replace the class token") and as the DW-conv paper needs (appendix A.3.2;
    the same as remove_cls_token=True); "token" asserts the model pools its class token.  Not with gates=True.

    gates=True makes a USDC model (usdc-static-dynamic-compression; `vitfast.methods.usdc.convert_timm`): per-layer
    decision networks that skip MHSA/FFN sub-blocks (`gate_level` "group"/"sample"/"batch" in training,
    `gate_search` over G0…G6 or a fixed `gate_kind`), and with `flops_target` (f_t, a FLOPs ratio) static
    keep/prune logits plus the resource loss γ(F − f_t)², γ = 100.  Composes with `channel_idle`.
    """
    from .arch import remember_source

    source = _timm_model(model, pretrained, timm_kwargs)
    converted = _convert(
        source, channel_idle, norm, heuristic, spread=spread, calibration_images=calibration_images,
        branches=branches, schedule=schedule, join_values=join_values, diversity_weight=diversity_weight,
        dwconv_blocks=dwconv_blocks, dwconv_heads=dwconv_heads, ranking=ranking, dwconv_kernel_size=dwconv_kernel_size,
        dwconv_ensemble=dwconv_ensemble, dwconv_kernel_init_std=dwconv_kernel_init_std,
        dwconv_kernel_form=dwconv_kernel_form, remove_cls_token=remove_cls_token, global_pool=global_pool,
        gates=gates, flops_target=flops_target, gate_level=gate_level, gate_search=gate_search, gate_kind=gate_kind,
    )
    # the result carries the description of the timm model it came from (vitfast.arch.SOURCE_ATTR)
    remember_source(converted, source)
    return converted


def _convert(model, channel_idle, norm, heuristic, *, spread, calibration_images, branches, schedule, join_values,
             diversity_weight, dwconv_blocks, dwconv_heads, ranking, dwconv_kernel_size, dwconv_ensemble,
             dwconv_kernel_init_std, dwconv_kernel_form, remove_cls_token, global_pool, gates, flops_target,
             gate_level, gate_search, gate_kind) -> nn.Module:
    """from_timm on a built timm model: check the options, then the method's conversion."""
    model_blocks(model)  # type check first, before copying anything
    remove_cls_token = _check_global_pool(model, global_pool, remove_cls_token, gates)
    _check_method_options(
        branches=branches, schedule=schedule, join_values=join_values, diversity_weight=diversity_weight,
        gates=gates, gate_level=gate_level, gate_search=gate_search, gate_kind=gate_kind,
        dwconv=dwconv_blocks is not None or dwconv_heads is not None, ranking=ranking,
        dwconv_kernel_size=dwconv_kernel_size, dwconv_ensemble=dwconv_ensemble,
        dwconv_kernel_init_std=dwconv_kernel_init_std, dwconv_kernel_form=dwconv_kernel_form,
        remove_cls_token=remove_cls_token, channel_idle=channel_idle, heuristic=heuristic, spread=spread,
    )
    if gates:
        if dwconv_blocks is not None or dwconv_heads is not None:
            raise ValueError("gates: not supported together with dwconv_blocks/dwconv_heads yet, got both")
        return _from_timm_usdc(model, channel_idle, norm, heuristic, spread, calibration_images, flops_target,
                               gate_level, gate_search, gate_kind, branches)
    if flops_target is not None:
        raise ValueError(f"flops_target: only used with gates=True (USDC), got {flops_target!r}")
    if dwconv_blocks is not None or dwconv_heads is not None or (remove_cls_token and branches is None):
        if branches is not None:
            raise ValueError("dwconv_blocks/dwconv_heads: not supported together with branches (non-deep ViT), got both")
        return dwconv.convert_timm(
            model, channel_idle, norm, heuristic, spread=spread, calibration_images=calibration_images,
            dwconv_blocks=dwconv_blocks, dwconv_heads=dwconv_heads, ranking=ranking, kernel_size=dwconv_kernel_size,
            ensemble=dwconv_ensemble, kernel_init_std=dwconv_kernel_init_std, remove_cls_token=remove_cls_token,
            kernel_form=dwconv_kernel_form,
        )
    if branches is not None:
        if calibration_images is not None:
            raise ValueError("calibration_images: not supported with branches (BatchNorm calibration is per RePaViT "
                             "block), got a tensor")
        return nondeep.convert_timm(
            model, branches, 0.0 if channel_idle is None else channel_idle, norm or "layer", heuristic, spread=spread,
            schedule=schedule, join_values=join_values, diversity_weight=diversity_weight,
            global_pool="avg" if remove_cls_token else None,
        )
    return repavit.convert_timm(model, channel_idle, norm, heuristic, spread=spread,
                                calibration_images=calibration_images)


def _check_method_options(*, branches, schedule, join_values, diversity_weight, gates, gate_level, gate_search,
                          gate_kind, dwconv, ranking, dwconv_kernel_size, dwconv_ensemble,
                          dwconv_kernel_init_std, dwconv_kernel_form, remove_cls_token, channel_idle, heuristic,
                          spread) -> None:
    """A method's options without the method would be ignored (a silently different model): refuse them, as the
    CLI does.  Values are checked here under from_timm's own argument names (deeper code names its own)."""
    from ._checks import check_nonnegative_weight
    from .methods.nondeep.schedule import JOIN_SCHEDULES, JoinSchedule
    from .methods.usdc.gates import GATE_KINDS, GATE_LEVELS

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
                       ("dwconv_kernel_init_std", dwconv_kernel_init_std is not None),
                       ("dwconv_kernel_form", dwconv_kernel_form != "depthwise")],
                      "dwconv_blocks/dwconv_heads")
    if remove_cls_token and gates:
        raise ValueError("remove_cls_token: not supported together with gates=True (USDC), got both")
    if channel_idle is None and (gates or branches is not None or dwconv or remove_cls_token):
        # These methods keep timm's FFN (θ = 0) unless channel_idle is given: a per-layer θ rule has nothing to act on.
        refuse_unused([("heuristic", heuristic != "static"), ("spread", spread != 0.25)], "channel_idle")


def _check_global_pool(model: nn.Module, global_pool, remove_cls_token: bool, gates: bool) -> bool:
    """global_pool checked against the model and the other options -> whether the class token is to be removed."""
    if global_pool is None:
        return remove_cls_token
    if global_pool not in ("avg", "token"):
        raise ValueError(f"global_pool: expected None, 'avg' or 'token', got {global_pool!r}")
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(model, VisionTransformer):
        raise ValueError(f"global_pool: only timm VisionTransformer models (ViT/DeiT), got {type(model).__name__}")
    if global_pool == "token":
        if remove_cls_token:
            raise ValueError("global_pool: 'token' keeps the class token that remove_cls_token=True removes, got both")
        if model.cls_token is None or model.global_pool != "token":
            without = "" if model.cls_token is not None else ", no class token"
            raise ValueError(f"global_pool: 'token' needs a model that pools its class token, got one with "
                             f"global_pool={model.global_pool!r}{without}")
        return False
    if gates:
        raise ValueError("global_pool: 'avg' is not supported together with gates=True (USDC), got both")
    return True


def _from_timm_usdc(model, channel_idle, norm, heuristic, spread, calibration_images, flops_target, gate_level,
                    gate_search, gate_kind, branches) -> nn.Module:
    """gates=True (usdc-static-dynamic-compression, `vitfast.methods.usdc`): every ViT block gets a decision network
    (searched over G0…G6 unless gate_search=False) and, with a `flops_target`, learnable static keep/prune
    logits and the resource loss.  With `channel_idle`, the RePaViT conversion runs first and its blocks are
    gated (gates and block pruning; FFN channel pruning applies to plain FFNs only)."""
    if branches is not None:
        raise ValueError(f"branches: not supported with gates=True (non-deep blocks are not gated), got {branches!r}")
    base = model
    if channel_idle is not None:
        base = repavit.convert_timm(model, channel_idle, norm, heuristic, spread=spread,
                                    calibration_images=calibration_images)
    elif norm is not None or calibration_images is not None:
        raise ValueError("norm, calibration_images: only used with channel_idle (RePaViT FFNs), got no channel_idle")
    return usdc.convert_timm(base, flops_target=flops_target, level=gate_level, search=gate_search, gate_kind=gate_kind)


