"""`vitfast select-heads`: rank attention heads by Σ_h for drop-in depthwise convolution (vitfast/head_selection.py,
which imports timm: imported when the command runs)."""
from __future__ import annotations

import os
import textwrap

import torch

from vitfast.cli._common import EXIT_OK
from vitfast.cli._common import CLIError
from vitfast.cli._common import Formatter
from vitfast.cli._common import json_object
from vitfast.cli._common import output_path
from vitfast.cli._common import positive_int
from vitfast.cli._common import set_threads
from vitfast.cli._models import add_weights_args
from vitfast.cli._models import build_timm_model
from vitfast.cli._models import check_rgb_model
from vitfast.cli._models import load_source
from vitfast.cli._models import model_input
from vitfast.cli._models import weights_args
from vitfast.training.data import digits_loaders
from vitfast.training.data import image_folder_loaders


def add_parser(sub) -> None:
    p = sub.add_parser(
        "select-heads", formatter_class=Formatter,
        help="rank attention heads by Σ_h (drop-in depthwise convolution): which to replace first",
        description=textwrap.dedent("""\
            Score every attention head with Σ_h, the sum over the attention map's entries of their standard
            deviation across N_s input samples (dropin-depthwise-conv-attention eq. 15; one pass, Welford), and
            each block with Σ_b, the mean over its heads (eq. 16).  Lowest first: the most convolution-like
            heads/blocks, the ones to replace.  Prints the ranking and writes it as JSON for
            vitfast.convert.from_timm(..., dwconv_blocks=k / dwconv_heads=p, ranking=PATH)."""),
        epilog=textwrap.dedent("""\
            examples:
              vitfast select-heads deit_tiny_patch16_224 --img-size 32 --checkpoint deit_tiny.pth -o ranking.json
              vitfast select-heads run/model.safetensors --data /data/imagenet/train --num-samples 1000 -o ranking.json"""),
    )
    p.add_argument("source", metavar="SOURCE", help="timm model name, or a train-time .safetensors / trainer checkpoint")
    p.add_argument("-o", "--output", required=True, help="output ranking .json path")
    add_weights_args(p, "a timm SOURCE")
    p.add_argument("--img-size", type=positive_int, default=None, help="input resolution for a timm SOURCE")
    p.add_argument("--num-classes", type=positive_int, default=None, help="classifier outputs for a timm SOURCE")
    p.add_argument("--model-kwargs", type=json_object, default=None, metavar="JSON", help="more timm constructor arguments")
    p.add_argument("--data", default=None, help="'digits' or an image-folder directory (training split) [default: digits]")
    p.add_argument("--num-samples", type=positive_int, default=1000, help="N_s, images scored (the paper's 1000)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="images per forward")
    p.add_argument("--cls", choices=("include", "exclude"), default="include",
                   help="Σ_h over the full N×N map (include) or over the patch tokens only, the class token's (and "
                        "registers') rows and columns left out (exclude: the paper's models have no class token)")
    p.add_argument("--top", type=positive_int, default=10, help="heads listed in the printed ranking")
    p.add_argument("--seed", type=int, default=0, help="data split seed")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads (torch.set_num_threads)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    """Σ_h of every attention head over N_s samples (one Welford pass), printed and saved as JSON."""
    from vitfast.methods.dwconv.head_selection import attention_std_scores

    out = output_path(args.output)
    set_threads(args.threads)
    weights_args(args, "source")
    if os.path.isfile(args.source):
        if args.pretrained or args.checkpoint is not None:
            raise CLIError("--pretrained/--checkpoint: only for a timm SOURCE name, got the file "
                           f"{args.source!r} (it holds its weights)")
        model, _ = load_source(args.source, "SOURCE")
    else:
        model = build_timm_model(args.source, pretrained=args.pretrained, checkpoint=args.checkpoint,
                                 img_size=args.img_size, num_classes=args.num_classes, model_kwargs=args.model_kwargs,
                                 flag="SOURCE")
    img_size, _ = model_input(model)
    data = args.data or "digits"
    check_rgb_model(model, "--data")
    # N_s samples from the training split (appendix A.3.3), without augmentation: the score measures the map's
    # spread over the data, not over random crops.
    if data == "digits":
        loader, _ = digits_loaders(img_size=img_size or 32, batch_size=args.batch_size, augment=False,
                                   drop_last=False, seed=args.seed)
    elif os.path.isdir(data):
        loader, _ = image_folder_loaders(data, img_size=img_size or 224, batch_size=args.batch_size, augment=False,
                                         seed=args.seed)
    else:
        raise CLIError(f"--data: expected 'digits' or a directory of class sub-folders, got {data!r}")
    torch.manual_seed(args.seed)
    ranking = attention_std_scores(model, loader, num_samples=args.num_samples, progress=not args.no_progress,
                                   cls=args.cls)
    ranking.save(out)
    print(ranking.format_table(top=args.top))
    print(f"wrote {out} (use it with vitfast.convert.from_timm(model, dwconv_blocks=k, ranking={out!r}))")
    return EXIT_OK
