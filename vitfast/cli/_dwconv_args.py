"""Drop-in depthwise-convolution head options (dropin-depthwise-conv-attention) of `convert` and `train`."""
from __future__ import annotations

import argparse

from vitfast.cli._common import CLIError
from vitfast.cli._common import checked
from vitfast.cli._common import existing_file
from vitfast.cli._recipe_args import ffn_flags_need_channel_idle
from vitfast.dwconv_recipe import check_dwconv_options
from vitfast.dwconv_recipe import convert_dwconv
from vitfast.dwconv_recipe import dwconv_recipe
from vitfast.dwconv_recipe import dwconv_request
from vitfast.dwconv_recipe import parse_dwconv_blocks
from vitfast.dwconv_recipe import parse_dwconv_heads


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
