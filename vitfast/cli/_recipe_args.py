"""The RePaViT recipe options (`convert`, `train`, `bench` on timm model names): θ, FFN norm, per-layer heuristic,
and the timm constructor arguments."""
from __future__ import annotations

from vitfast.cli._common import CLIError
from vitfast.cli._common import json_object
from vitfast.cli._common import positive_int
from vitfast.cli._common import unit_float


def add_recipe_args(p, *, convert: bool) -> None:
    g = p.add_argument_group("model recipe (timm model names)")
    g.add_argument("--img-size", type=positive_int, default=None, help="input resolution (default: the timm model's)")
    g.add_argument("--num-classes", type=positive_int, default=None, help="classifier outputs (default: the timm model's; `train` uses the data's)")
    g.add_argument("--model-kwargs", type=json_object, default=None, metavar="JSON",
                   help="more timm constructor arguments, e.g. '{\"depth\": 4, \"embed_dim\": 96}'")
    g.add_argument("--channel-idle", type=unit_float, default=None, metavar="θ",
                   help="channel idle ratio θ in [0, 1]: the fraction of FFN hidden channels without GELU "
                        "(RePaViT; when converting the paper's default 1 - 1/mlp_ratio, 0.75 for ratio 4"
                        + (")" if convert else "; omit to train the plain timm model)"))
    g.add_argument("--norm", choices=("batch", "layer"), default="batch",
                   help="FFN normalisation: batch (foldable, the paper's) or layer (keeps an explicit shortcut)")
    g.add_argument("--heuristic", choices=("static", "linear"), default="static",
                   help="per-layer θ: static (same everywhere) or linear (ramps with depth around θ)")


def ffn_flags_need_channel_idle(settings, alone: str) -> None:
    """--norm / --heuristic shape RePaViT FFNs: without --channel-idle these methods keep timm's FFNs (θ = 0)."""
    if settings.get("channel_idle") is not None:
        return
    for flag, key, default in (("--norm", "norm", "batch"), ("--heuristic", "heuristic", "static")):
        if settings.get(key) not in (None, default):
            raise CLIError(f"{flag}: only used with --channel-idle (RePaViT FFNs); {alone}")
