"""`vitfast convert`: a timm model (or official RePaViT weights) -> a train-time vitfast model file."""
from __future__ import annotations

import os
import textwrap

import vitfast
from vitfast.cli._common import EXIT_OK
from vitfast.cli._common import CLIError
from vitfast.cli._common import Formatter
from vitfast.cli._common import existing_file
from vitfast.cli._common import output_path
from vitfast.cli._common import positive_int
from vitfast.cli._dwconv_args import add_dwconv_args
from vitfast.cli._dwconv_args import dwconv_convert
from vitfast.cli._dwconv_args import dwconv_given
from vitfast.cli._models import build_timm_model
from vitfast.cli._models import describe
from vitfast.cli._models import read_state_dict
from vitfast.cli._recipe_args import add_recipe_args
from vitfast.cli._usdc_args import add_gate_args
from vitfast.cli._usdc_args import check_gate_options
from vitfast.cli._usdc_args import usdc_convert
from vitfast.cli._dwconv_args import dwconv_recipe
from vitfast.io.trainable import save_trainable


def add_parser(sub) -> None:
    p = sub.add_parser(
        "convert", formatter_class=Formatter, help="timm model or RePaViT weights -> train-time vitfast model",
        description=textwrap.dedent("""\
            Build a timm ViT/DeiT/Swin and turn its FFNs into RePaViT channel-idle FFNs (a train-time model that
            `vitfast fuse` later collapses exactly), or rebuild one from an official RePaViT state dict.
            Weights are random unless --pretrained names a local file: nothing is downloaded.
            Writes a train-time .safetensors (JSON description inside, no pickle)."""),
        epilog=textwrap.dedent("""\
            examples:
              vitfast convert vit_tiny_patch16_224 --img-size 32 --num-classes 10 -o vit.safetensors
              vitfast convert deit_small_patch16_224 --pretrained deit_small.pth --channel-idle 0.5 --norm layer -o ds.safetensors
              vitfast convert --repavit repavit_deit_base.pth -o repa_base.safetensors"""),
    )
    p.add_argument("model", nargs="?", metavar="MODEL", help="timm model name, e.g. deit_tiny_patch16_224")
    p.add_argument("-o", "--output", required=True, help="output .safetensors path (train-time model)")
    p.add_argument("--pretrained", type=existing_file, default=None, metavar="PATH",
                   help="local weights for MODEL (.safetensors, or a torch state dict loaded with weights_only)")
    p.add_argument("--repavit", type=existing_file, default=None, metavar="PATH",
                   help="official RePaViT ViT/DeiT state dict to convert instead of MODEL")
    p.add_argument("--num-heads", type=positive_int, default=None, help="--repavit only: heads (default: from the width)")
    add_recipe_args(p, convert=True)
    add_gate_args(p)
    add_dwconv_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    out = output_path(args.output)
    check_gate_options(args)
    if args.repavit is not None:
        if getattr(args, "gates", False):
            raise CLIError("--gates: only for timm ViT/DeiT names (MODEL), not --repavit")
        if dwconv_given(args):
            raise CLIError("--dwconv-blocks/--dwconv-heads: only for timm ViT/DeiT names (MODEL), not --repavit")
        if args.model is not None or args.pretrained is not None or args.model_kwargs:
            raise CLIError("--repavit: builds the model from the RePaViT state dict alone; drop MODEL/--pretrained/--model-kwargs")
        if args.norm != "batch" or args.heuristic != "static":
            raise CLIError("--repavit: official RePaViT models use norm=batch and one θ (heuristic=static)")
        state = read_state_dict(args.repavit, "--repavit")
        theta = 0.75 if args.channel_idle is None else args.channel_idle
        model = vitfast.convert.from_repavit(
            state, num_heads=args.num_heads, num_classes=args.num_classes, img_size=args.img_size, idle_ratio=theta
        )
        recipe = {"source": "repavit", "file": os.path.basename(args.repavit), "channel_idle": theta}
    else:
        if args.model is None:
            raise CLIError("MODEL: expected a timm model name (e.g. deit_tiny_patch16_224) or --repavit PATH, got neither")
        if args.num_heads is not None:
            raise CLIError("--num-heads: only used with --repavit (timm names fix their head count)")
        timm_model = build_timm_model(
            args.model, pretrained=args.pretrained, img_size=args.img_size, num_classes=args.num_classes,
            model_kwargs=args.model_kwargs,
        )
        theta = vitfast.convert.default_idle_ratio(timm_model) if args.channel_idle is None else args.channel_idle
        if dwconv_given(args):
            model, theta = dwconv_convert(args, timm_model), args.channel_idle
        elif getattr(args, "gates", False):
            model = usdc_convert(args, timm_model)
        else:
            model = vitfast.convert.from_timm(timm_model, channel_idle=theta, norm=args.norm, heuristic=args.heuristic)
        recipe = {
            "source": "timm", "model": args.model, "pretrained": os.path.basename(args.pretrained) if args.pretrained else None,
            "img_size": args.img_size, "num_classes": args.num_classes, "model_kwargs": args.model_kwargs or {},
            "channel_idle": theta, "norm": args.norm, "heuristic": args.heuristic,
        }
        if getattr(args, "gates", False):
            recipe.update(channel_idle=args.channel_idle, gates=True, flops_target=args.flops_target,
                          gate_level=args.gate_level, gate_kind=args.gate_kind)
        if dwconv_given(args):
            recipe.update(dwconv_recipe(vars(args)))
    save_trainable(model, out, recipe=recipe)
    print(f"converted: {describe(model)}")
    print(f"wrote {out} (train-time; next: `vitfast train {out} ...` or `vitfast fuse {out} -o fused.safetensors`)")
    return EXIT_OK
