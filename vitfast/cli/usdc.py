"""`vitfast usdc`: the USDC recipe end to end on the digits, a study over training gate levels and inference batch
sizes (vitfast/usdc_recipe.py)."""
from __future__ import annotations

import json
import os
import textwrap

from vitfast.cli._common import add_threads_arg
from vitfast.cli._common import EXIT_OK
from vitfast.cli._common import Formatter
from vitfast.cli._common import batch_list
from vitfast.cli._common import comma_list
from vitfast.cli._common import output_dir
from vitfast.cli._common import positive_int
from vitfast.cli._usdc_args import ARCH_LR_SCALE
from vitfast.cli._usdc_args import add_arch_lr_scale_arg
from vitfast.cli._usdc_args import ratio
from vitfast.demos.usdc_study import run_usdc_study
from vitfast.io.atomic import atomic_write_text


_level_list = comma_list(str.strip, "comma-separated levels among group,batch,sample",
                         lambda v: all(x in ("group", "batch", "sample") for x in v))


def add_parser(sub) -> None:
    p = sub.add_parser(
        "usdc", formatter_class=Formatter, help="USDC gates + static compression on the digits: batch-size study",
        description=textwrap.dedent("""\
            The USDC recipe end to end on scikit-learn's digits (usdc-static-dynamic-compression): pretrain a
            small ViT, convert it with dynamic gates (searched over G0..G6) and static keep/prune logits, train
            stage 1 with the FLOPs resource loss (target --flops-target, gamma = 100), prune, fine-tune stage 2,
            fuse, then measure the fused model's accuracy and realised FLOPs at inference batch sizes
            (--batch-sizes) for each training gate level (--levels).  Seeded: the same command gives the same
            numbers.  Writes usdc_report.json and usdc_<level>.safetensors (load with vitfast.load)."""),
        epilog="examples:\n  vitfast usdc --out runs/usdc --threads 1\n  vitfast usdc --quick --out /tmp/usdc",
    )
    p.add_argument("--levels", type=_level_list, default=["group", "batch"], help="training gate levels to compare")
    p.add_argument("--batch-sizes", type=batch_list, default=[1, 8, 64], help="inference batch sizes")
    p.add_argument("--flops-target", type=ratio, default=0.6, help="f_t of the resource loss (FLOPs ratio)")
    p.add_argument("--pretrain-steps", type=positive_int, default=None, help="baseline steps [800; --quick: 60]")
    p.add_argument("--stage1-steps", type=positive_int, default=None, help="search + static steps [400; --quick: 40]")
    p.add_argument("--stage2-steps", type=positive_int, default=None, help="fine-tune steps [300; --quick: 30]")
    add_arch_lr_scale_arg(p, default=ARCH_LR_SCALE)
    add_threads_arg(p)
    p.add_argument("--seed", type=int, default=0, help="seed for data split, init and training")
    p.add_argument("--out", default="vitfast-usdc", metavar="DIR", help="where the report and fused models go")
    p.add_argument("--quick", action="store_true", help="tiny model and few steps (a smoke test)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    steps = (args.pretrain_steps, args.stage1_steps, args.stage2_steps)
    if args.quick:
        steps = tuple(s if s is not None else q for s, q in zip(steps, (60, 40, 30)))
        cfg = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=4.0, num_classes=10)
    else:
        steps = tuple(s if s is not None else d for s, d in zip(steps, (800, 400, 300)))
        cfg = None
    output_dir(args.out)
    report = run_usdc_study(
        levels=args.levels, pretrain_steps=steps[0], stage1_steps=steps[1], stage2_steps=steps[2],
        flops_target=args.flops_target, eval_batch_sizes=args.batch_sizes, seed=args.seed, threads=args.threads,
        progress=not args.no_progress, out_dir=args.out, model_cfg=cfg, arch_lr_scale=args.arch_lr_scale,
    )
    path = os.path.join(args.out, "usdc_report.json")
    atomic_write_text(path, json.dumps(report, indent=1, default=str))
    print(f"wrote {path} and the fused models usdc_<level>.safetensors in {args.out}")
    return EXIT_OK
