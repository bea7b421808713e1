"""`vitfast fuse`: a train-time model -> an exact fused .safetensors, with a quick reload check."""
from __future__ import annotations

import os
import textwrap

import torch

import vitfast
from vitfast.cli._common import EXIT_OK
from vitfast.cli._common import Formatter
from vitfast.cli._common import existing_file
from vitfast.cli._common import not_the_input
from vitfast.cli._common import output_path
from vitfast.cli._models import load_source
from vitfast.cli._models import model_input
from vitfast.measure import count_parameters


def add_parser(sub) -> None:
    p = sub.add_parser(
        "fuse", formatter_class=Formatter, help="train-time model -> exact fused .safetensors",
        description=textwrap.dedent("""\
            Collapse a train-time model exactly (RePaViT eq. 3-6: BatchNorms and the idle channels' linear path
            folded into the weights, the shortcut folded too) and write it with vitfast.save; load it anywhere
            with vitfast.load(path).  Prints a quick 2-image check; `vitfast verify` is the thorough one."""),
        epilog="examples:\n  vitfast fuse run/model.safetensors -o fused.safetensors\n  vitfast fuse run/trainer.pt -o fused.safetensors",
    )
    p.add_argument("source", type=existing_file, metavar="SOURCE",
                   help="train-time .safetensors (convert/train output) or a trainer checkpoint (OUT/trainer.pt)")
    p.add_argument("-o", "--output", required=True, help="output fused .safetensors path")
    p.add_argument("--no-check", action="store_true", help="skip the quick 2-image comparison")
    p.set_defaults(func=run)


def run(args) -> int:
    out = output_path(args.output)
    not_the_input(out, args.source)
    model, _ = load_source(args.source, "SOURCE")
    fused = vitfast.fuse(model)
    vitfast.save(fused, out)
    print(f"fused {count_parameters(model):,} -> {count_parameters(fused):,} parameters; wrote {out} "
          f"({os.path.getsize(out) / 1e6:.2f} MB)")
    img_size, _ = model_input(model)
    if not args.no_check and img_size is None:
        print("quick check skipped: the model does not say its input size (no patch_embed.img_size)")
    elif not args.no_check:
        in_chans = getattr(getattr(model, "patch_embed", None), "proj", None)
        in_chans = in_chans.in_channels if in_chans is not None else 3
        x = torch.randn(2, in_chans, *img_size, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            diff = float((model.eval()(x) - vitfast.load(out)(x)).abs().max())
        print(f"quick check (2 random images, the file reloaded): max |Δlogits| = {diff:.2e}; "
              f"full check: `vitfast verify {out} --source {args.source}`")
    return EXIT_OK
