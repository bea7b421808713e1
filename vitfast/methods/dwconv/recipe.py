"""Drop-in depthwise-convolution heads in the train-time file format and on the command line.

`describe_dwconv` / `build_dwconv` are the "dwconv" entry of `vitfast.io.describe_trainable` /
`build_trainable`: which blocks hold a `DWConvBlock`, which of their heads are convolutions, k, the token grid
and whether the heads are ensembled (eq. 12-13).  The rest of the model is described by what is already there:
the timm skeleton (`class_token=False, global_pool="avg"` once the cls token is removed, so the skeleton itself
rebuilds without it) and the channel-idle FFN of every block (a DW-conv conversion makes every FFN a
`ChannelIdleMlp`: θ = 0 with LayerNorm, timm's FFN exactly, unless `channel_idle` was given).

`dwconv_request` / `convert_dwconv` turn the command-line options (`vitfast convert` / `vitfast train`:
--dwconv-blocks, --dwconv-heads, --ranking, --dwconv-kernel, --ensemble, --remove-cls) into
`vitfast.convert.from_timm` arguments.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Union

if TYPE_CHECKING:  # the CLI imports DWCONV_SETTINGS at start-up: no torch import here
    import torch.nn as nn

__all__ = ["describe_dwconv", "build_dwconv", "DWCONV_SETTINGS", "dwconv_request", "check_dwconv_options",
           "convert_dwconv", "dwconv_recipe", "describe_dwconv_model", "parse_dwconv_blocks", "parse_dwconv_heads"]

# The settings (argparse dests) of the DW-conv recipe, in `vitfast train`'s stored-settings form.
DWCONV_SETTINGS = ("dwconv_blocks", "dwconv_heads", "ranking", "dwconv_kernel", "ensemble", "remove_cls")


# ---------------------------------------------------------------------------------------------- file format
def describe_dwconv(model: nn.Module, architecture: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """The DW-conv part of a train-time model description, or None when `model` has no `DWConvBlock`.

    {"blocks": [{"path", "conv_heads", "kernel_size", "ensemble", "grid_size", "prefix_tokens"}, ...]}: enough to rebuild every
    replaced block with `DWConvBlock.from_block` on the rebuilt channel-idle skeleton (the weights, kernels and
    γ are then overwritten from the file).  With `architecture` (describe_timm's dict), its num_heads, qkv_bias
    and proj_bias are taken from a DW-conv attention: when every block has one, describe_timm sees no timm
    Attention and would guess them.
    """
    from .modules import DWConvAttention, DWConvBlock

    blocks: List[Dict[str, Any]] = []
    for name, module in model.named_modules():
        if isinstance(module, DWConvBlock):
            attn = module.attn
            blocks.append({
                "path": name,
                "conv_heads": [int(h) for h in attn.conv_heads],
                "kernel_size": int(attn.kernel_size),
                "ensemble": bool(attn.ensemble),
                "grid_size": [int(g) for g in attn.grid_size],
                "prefix_tokens": attn.prefix_tokens,
            })
    stray = [name for name, m in model.named_modules()
             if isinstance(m, DWConvAttention) and not any(name == f"{b['path']}.attn" for b in blocks)]
    if stray:
        raise ValueError(f"model: expected DWConvAttention only inside DWConvBlocks (what the file format rebuilds), "
                         f"got it at {', '.join(stray[:5])}")
    if blocks and architecture is not None:
        attn = model.get_submodule(f"{blocks[0]['path']}.attn")
        architecture.setdefault("kwargs", {}).update(
            num_heads=int(attn.num_heads), qkv_bias=attn.value.bias is not None, proj_bias=attn.proj.bias is not None)
    return {"blocks": blocks} if blocks else None


def build_dwconv(model: nn.Module, desc: Dict[str, Any]) -> nn.Module:
    """Replace the blocks listed by `describe_dwconv` on a rebuilt skeleton whose blocks are `ChannelIdleBlock`s
    (`build_trainable` converts them first).  In place; returns the model."""
    from ...nn.dwconv import follow_patch_grid
    from ..repavit.modules import ChannelIdleBlock
    from .modules import DWConvBlock

    blocks = desc.get("blocks") if isinstance(desc, dict) else None
    if not blocks:
        raise ValueError(f"description['dwconv']['blocks']: expected at least one block, got {blocks!r}")
    for spec in blocks:
        path = spec["path"]
        parent, _, child = path.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        block = getattr(owner, child, None)  # ModuleList children are attributes named "0", "1", ...
        if not isinstance(block, ChannelIdleBlock) or isinstance(block, DWConvBlock):
            got = type(block).__name__ if block is not None else "nothing"
            raise ValueError(f"description['dwconv']: expected a ChannelIdleBlock at {path!r} to replace, got {got}")
        new = DWConvBlock.from_block(block, [int(h) for h in spec["conv_heads"]], tuple(spec["grid_size"]),
                                     kernel_size=int(spec["kernel_size"]), ensemble=bool(spec["ensemble"]),
                                     prefix_tokens=spec.get("prefix_tokens"), name=path)
        setattr(owner, child, new)
    follow_patch_grid(model)
    return model


# ---------------------------------------------------------------------------------------------- command line
def parse_dwconv_blocks(text: str) -> Union[int, List[int]]:
    """--dwconv-blocks: K (the K lowest-Σ_b blocks of --ranking) or a JSON list of block indices, '[2, 5]'."""
    value = _parse(text, "a block count K (with --ranking) or a JSON list of block indices such as '[2, 5]'")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    raise ValueError(f"expected a block count K >= 1 (with --ranking) or a JSON list of block indices such as "
                     f"'[2, 5]', got {text!r}")


def parse_dwconv_heads(text: str) -> Union[int, Dict[str, List[int]], List[List[int]]]:
    """--dwconv-heads: P (the P lowest-Σ_h heads of --ranking), a JSON object {block: [heads]} such as
    '{"0": [1, 3]}', or a JSON list of [block, head] pairs.  Kept in its JSON form (string keys), which is what
    `vitfast train` stores and compares on --resume."""
    expected = ("a head count P >= 1 (with --ranking), a JSON object {block: [heads]} such as '{\"0\": [1, 3]}', "
                "or a JSON list of [block, head] pairs")
    value = _parse(text, expected)
    ints = lambda xs: isinstance(xs, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in xs)  # noqa: E731
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, dict) and value and all(k.lstrip("-").isdigit() and ints(v) and v for k, v in value.items()):
        return value
    if isinstance(value, list) and value and all(ints(p) and len(p) == 2 for p in value):
        return value
    raise ValueError(f"expected {expected}, got {text!r}")


def _parse(text: str, expected: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"expected {expected}, got {text!r}") from None


def dwconv_request(settings: Mapping[str, Any]) -> bool:
    """Whether the options ask for drop-in DW-conv heads (--dwconv-blocks / --dwconv-heads / --remove-cls)."""
    return any(settings.get(k) not in (None, False) for k in ("dwconv_blocks", "dwconv_heads", "remove_cls"))


def check_dwconv_options(settings: Mapping[str, Any]) -> None:
    """Options that only mean something with --dwconv-blocks/--dwconv-heads: ValueError naming the flag."""
    if dwconv_request(settings):
        return
    for k in ("ranking", "dwconv_kernel", "ensemble"):
        if settings.get(k) not in (None, False):
            raise ValueError(f"--{k.replace('_', '-')}: only used with --dwconv-blocks/--dwconv-heads, got it alone")


def convert_dwconv(timm_model: nn.Module, settings: Mapping[str, Any]) -> nn.Module:
    """`vitfast.convert.from_timm` with the DW-conv options of `settings` (argparse dests, JSON forms); FFNs:
    --channel-idle θ with --norm (default batch), else θ = 0 with LayerNorm (timm's FFN exactly)."""
    from ...convert import from_timm

    heads = settings.get("dwconv_heads")
    if isinstance(heads, dict):
        heads = {int(b): list(hs) for b, hs in heads.items()}
    elif isinstance(heads, list):
        heads = [tuple(p) for p in heads]
    theta = settings.get("channel_idle")
    return from_timm(
        timm_model, channel_idle=theta, norm=(settings.get("norm") or "batch") if theta is not None else None,
        heuristic=settings.get("heuristic") or "static", dwconv_blocks=settings.get("dwconv_blocks"),
        dwconv_heads=heads, ranking=settings.get("ranking"), dwconv_kernel_size=settings.get("dwconv_kernel") or 3,
        dwconv_ensemble=bool(settings.get("ensemble")), remove_cls_token=bool(settings.get("remove_cls")),
    )


def dwconv_recipe(settings: Mapping[str, Any]) -> Dict[str, Any]:
    """The recipe entries (plain JSON values) stored with a converted model."""
    import os

    ranking = settings.get("ranking")
    return {
        "dwconv_blocks": settings.get("dwconv_blocks"), "dwconv_heads": settings.get("dwconv_heads"),
        "ranking": os.path.basename(ranking) if ranking else None, "dwconv_kernel": settings.get("dwconv_kernel") or 3,
        "ensemble": bool(settings.get("ensemble")), "remove_cls": bool(settings.get("remove_cls")),
    }


def describe_dwconv_model(model: nn.Module) -> str:
    """One line for the CLI: which blocks / heads are convolutions."""
    desc = describe_dwconv(model)
    if desc is None:
        return ""
    parts = []
    for b in desc["blocks"]:
        parts.append(f"{b['path']}: heads {','.join(map(str, b['conv_heads']))}")
    first = desc["blocks"][0]
    return (f", DW-conv heads (k={first['kernel_size']}, grid {first['grid_size'][0]}x{first['grid_size'][1]}"
            f"{', ensembled' if first['ensemble'] else ''}): {'; '.join(parts)}")
