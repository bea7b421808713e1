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
from vitfast.cli._models import add_weights_args
from vitfast.cli._models import build_timm_model
from vitfast.cli._models import describe
from vitfast.cli._models import read_state_dict
from vitfast.cli._models import weights_args
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
            Weights are random unless --checkpoint names a local file (nothing is downloaded) or --pretrained asks
            timm for its own (downloaded: needs network).  MODEL may be an hf-hub:REPO name; --list-models shows
            the timm names each method converts.
            Writes a train-time .safetensors (JSON description inside, no pickle)."""),
        epilog=textwrap.dedent("""\
            examples:
              vitfast convert vit_tiny_patch16_224 --img-size 32 --num-classes 10 -o vit.safetensors
              vitfast convert deit_small_patch16_224 --checkpoint deit_small.pth --channel-idle 0.5 --norm layer -o ds.safetensors
              vitfast convert hf-hub:timm/deit_tiny_patch16_224.fb_in1k --pretrained -o tiny.safetensors
              vitfast convert --repavit repavit_deit_base.pth -o repa_base.safetensors
              vitfast convert --list-models 'deit*'"""),
    )
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="timm model name, e.g. deit_tiny_patch16_224, or hf-hub:REPO")
    p.add_argument("-o", "--output", default=None, help="output .safetensors path (train-time model; required)")
    add_weights_args(p)
    p.add_argument("--list-models", nargs="?", const="*", default=None, metavar="PATTERN",
                   help="list the timm names each method converts (those matching PATTERN, e.g. 'deit*') and exit")
    p.add_argument("--repavit", type=existing_file, default=None, metavar="PATH",
                   help="official RePaViT ViT/DeiT state dict to convert instead of MODEL")
    p.add_argument("--num-heads", type=positive_int, default=None, help="--repavit only: heads (default: from the width)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random initialisation (weights that no file gives, gate logits): the same "
                        "command writes the same file [default: 0]")
    add_recipe_args(p, convert=True)
    add_gate_args(p)
    add_dwconv_args(p)
    p.set_defaults(func=run)


def list_models(pattern: str) -> int:
    """The names per method (`vitfast.list_models`), one method a paragraph."""
    found = vitfast.list_models(pattern)
    for method, names in found.items():
        print(f"{method} ({len(names)}): {' '.join(names) if names else '-'}")
    return EXIT_OK


def run(args) -> int:
    if args.list_models is not None:
        if args.model is not None or args.output is not None:
            raise CLIError("--list-models: lists and exits; drop MODEL/-o")
        return list_models(args.list_models)
    if args.output is None:
        raise CLIError("-o/--output: required (the train-time .safetensors to write)")
    weights_args(args, "model")
    out = output_path(args.output)
    check_gate_options(args)
    from vitfast.training.rng import seed_everything

    seed_everything(args.seed)  # timm's init and the methods' new parameters draw from the global RNGs
    if args.repavit is not None:
        if getattr(args, "gates", False):
            raise CLIError("--gates: only for timm ViT/DeiT names (MODEL), not --repavit")
        if dwconv_given(args):
            raise CLIError("--dwconv-blocks/--dwconv-heads: only for timm ViT/DeiT names (MODEL), not --repavit")
        if args.model is not None or args.pretrained or args.checkpoint is not None or args.model_kwargs:
            raise CLIError("--repavit: builds the model from the RePaViT state dict alone; drop "
                           "MODEL/--pretrained/--checkpoint/--model-kwargs")
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
            args.model, pretrained=args.pretrained, checkpoint=args.checkpoint, img_size=args.img_size,
            num_classes=args.num_classes,
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
            # where the weights came from: the local file's name, "timm" for timm's own, None for random ones
            "source": "timm", "model": args.model,
            "pretrained": os.path.basename(args.checkpoint) if args.checkpoint else "timm" if args.pretrained else None,
            "img_size": args.img_size, "num_classes": args.num_classes, "model_kwargs": args.model_kwargs or {},
            "channel_idle": theta, "norm": args.norm, "heuristic": args.heuristic, "seed": args.seed,
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
