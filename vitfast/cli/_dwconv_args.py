"""Drop-in depthwise-convolution head options (dropin-depthwise-conv-attention) of `convert` and `train`."""
from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Union

from vitfast.cli._common import CLIError
from vitfast.cli._common import checked
from vitfast.cli._common import existing_file
from vitfast.cli._recipe_args import ffn_flags_need_channel_idle

if TYPE_CHECKING:
    import torch.nn as nn



def _dwconv_blocks_arg(text: str):
    try:
        return parse_dwconv_blocks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dwconv_heads_arg(text: str):
    try:
        return parse_dwconv_heads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _odd_kernel(text: str) -> int:
    return checked(text, int, "an odd kernel size >= 1", lambda v: v >= 1 and v % 2 == 1)


def add_dwconv_args(p) -> None:
    g = p.add_argument_group("drop-in depthwise-convolution heads (dropin-depthwise-conv-attention; timm ViT/DeiT names)")
    g.add_argument("--dwconv-blocks", type=_dwconv_blocks_arg, default=None, metavar="K|JSON",
                   help="replace every head of K blocks (the K lowest-Σ_b blocks of --ranking) or of the blocks of a "
                        "JSON list such as '[2, 5]'")
    g.add_argument("--dwconv-heads", type=_dwconv_heads_arg, default=None, metavar="P|JSON",
                   help="replace single heads: P (the P lowest-Σ_h heads of --ranking), '{\"0\": [1, 3]}' "
                        "(block: heads) or '[[0, 1], [4, 2]]' ([block, head] pairs); with --dwconv-blocks both apply")
    g.add_argument("--ranking", type=existing_file, default=None, metavar="PATH",
                   help="the Σ_h ranking .json from `vitfast select-heads` (needed for the counts K / P)")
    g.add_argument("--dwconv-kernel", type=_odd_kernel, default=None, metavar="k",
                   help="depthwise kernel size k (odd) [default: 3]")
    g.add_argument("--dwconv-form", choices=("depthwise", "full"), default=None,
                   help="depthwise: one k×k filter per value channel (eq. 11, the paper's method); full: the "
                        "full-convolution variant, one k×k kernel per head shared by its channels (eq. 9-10; "
                        "computed and fused as the equivalent depthwise convolution) [default: depthwise]")
    g.add_argument("--ensemble", action="store_true", default=None,
                   help="head ensembling (eq. 12-13): a block's replaced heads become one head of width d_h "
                        "with softmax(γ) weights")
    g.add_argument("--remove-cls", action="store_true", default=None,
                   help="remove the cls token and pool the mean of the tokens, as the paper does (appendix A.3.2)")


def dwconv_given(args_or_settings) -> bool:
    settings = args_or_settings if isinstance(args_or_settings, dict) else vars(args_or_settings)
    try:
        check_dwconv_options(settings)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    return dwconv_request(settings)


def dwconv_convert(args, timm_model):
    """A timm ViT/DeiT with DW-conv heads; the FFNs: --channel-idle θ (with --norm), else timm's exactly (θ = 0,
    LayerNorm) so only the replaced heads change the function."""
    settings = vars(args)
    if getattr(args, "gates", False):
        given = [flag for flag, key in (("--dwconv-blocks", "dwconv_blocks"), ("--dwconv-heads", "dwconv_heads"),
                                        ("--remove-cls", "remove_cls")) if settings.get(key) not in (None, False)]
        raise CLIError(f"--gates: not supported together with {'/'.join(given)} yet, got "
                       f"{'both' if len(given) == 1 else 'them together'}")
    ffn_flags_need_channel_idle(settings, "DW-conv alone keeps timm's FFNs")
    try:
        return convert_dwconv(timm_model, settings)
    except ValueError as exc:
        raise CLIError(f"--dwconv-blocks/--dwconv-heads: {exc}") from None


def dwconv_source(timm_model, settings, recipe):
    ffn_flags_need_channel_idle(settings, "DW-conv alone keeps timm's FFNs")
    try:
        model = convert_dwconv(timm_model, settings)
    except ValueError as exc:
        raise CLIError(f"--dwconv-blocks/--dwconv-heads: {exc}") from None
    recipe.update(channel_idle=settings.get("channel_idle"), **dwconv_recipe(settings))
    if settings.get("channel_idle") is not None:
        recipe.update(norm=settings.get("norm") or "batch", heuristic=settings.get("heuristic") or "static")
    return model, recipe


# The settings (argparse dests) of the DW-conv recipe, in `vitfast train`'s stored-settings form; `dwconv_request` /
# `convert_dwconv` turn them into `vitfast.convert.from_timm` arguments.
DWCONV_SETTINGS = ("dwconv_blocks", "dwconv_heads", "ranking", "dwconv_kernel", "ensemble", "remove_cls", "dwconv_form")


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
    for k in ("ranking", "dwconv_kernel", "ensemble", "dwconv_form"):
        if settings.get(k) not in (None, False):
            raise ValueError(f"--{k.replace('_', '-')}: only used with --dwconv-blocks/--dwconv-heads, got it alone")


def convert_dwconv(timm_model: nn.Module, settings: Mapping[str, Any]) -> nn.Module:
    """`vitfast.convert.from_timm` with the DW-conv options of `settings` (argparse dests, JSON forms); FFNs:
    --channel-idle θ with --norm (default batch), else θ = 0 with LayerNorm (timm's FFN exactly)."""
    from vitfast.convert import from_timm

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
        dwconv_kernel_form=settings.get("dwconv_form") or "depthwise",
    )


def dwconv_recipe(settings: Mapping[str, Any]) -> Dict[str, Any]:
    """The recipe entries (plain JSON values) stored with a converted model."""
    ranking = settings.get("ranking")
    return {
        "dwconv_blocks": settings.get("dwconv_blocks"), "dwconv_heads": settings.get("dwconv_heads"),
        "ranking": os.path.basename(ranking) if ranking else None, "dwconv_kernel": settings.get("dwconv_kernel") or 3,
        "ensemble": bool(settings.get("ensemble")), "remove_cls": bool(settings.get("remove_cls")),
        "dwconv_form": settings.get("dwconv_form") or "depthwise",
    }


def describe_dwconv_model(model: nn.Module) -> str:
    """One line for the CLI: which blocks / heads are convolutions."""
    from vitfast.methods.dwconv.recipe import describe_dwconv  # imports timm: not at `vitfast --help` time

    desc = describe_dwconv(model)
    if desc is None:
        return ""
    parts = []
    for b in desc["blocks"]:
        parts.append(f"{b['path']}: heads {','.join(map(str, b['conv_heads']))}")
    first = desc["blocks"][0]
    return (f", DW-conv heads (k={first['kernel_size']}, grid {first['grid_size'][0]}x{first['grid_size'][1]}"
            f"{', ensembled' if first['ensemble'] else ''}): {'; '.join(parts)}")
