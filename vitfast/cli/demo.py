"""`vitfast demo`: the whole path on the digits (vitfast/demo.py), or with --nondeep the non-deep comparison
(vitfast/nondeep_demo.py)."""
from __future__ import annotations

import textwrap

from vitfast.cli._common import add_threads_arg
from vitfast.cli._common import EXIT_CHECK_FAILED
from vitfast.cli._common import EXIT_OK
from vitfast.cli._common import CLIError
from vitfast.cli._common import Formatter
from vitfast.cli._common import output_dir
from vitfast.cli._common import positive_float
from vitfast.cli._common import positive_int
from vitfast.demos.demo import LATENCY_BURST
from vitfast.demos.demo import run_demo
from vitfast.demos.nondeep_demo import run_nondeep_comparison


def add_parser(sub) -> None:
    p = sub.add_parser(
        "demo", formatter_class=Formatter, help="the whole path on the digits, with a comparison table",
        description=textwrap.dedent("""\
            Train a small timm ViT with channel-idle FFNs (θ=0.75, BatchNorm) on scikit-learn's digits,
            fuse it, save it, load it back with vitfast.load, and print train-time vs fused: validation
            accuracy (must be equal, else exit status 1), max |Δlogits|, parameters, FLOPs per image,
            latency at batch 1 and 64 and throughput.  About 2 minutes on 2 CPU cores; --quick takes seconds."""),
        epilog="examples:\n  vitfast demo\n  vitfast demo --threads 1 --steps 400 --out /tmp/demo\n  vitfast demo --quick",
    )
    p.add_argument("--steps", type=positive_int, default=None, help="training steps [default: 800, --quick: 300]")
    add_threads_arg(p, passive=False)  # it reports latency: OpenMP's default policy
    p.add_argument("--out", default="vitfast-demo", metavar="DIR", help="where the .safetensors files go")
    p.add_argument("--quick", action="store_true", help="tiny model and few steps (an end-to-end smoke test)")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help=f"latency rounds, each {LATENCY_BURST} calls per model [default: 30, --quick: 5]")
    p.add_argument("--seed", type=int, default=0, help="seed for data split, init and training")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--nondeep", action="store_true",
                   help="instead: train a plain ViT of depth L/n and a non-deep ViT (L/n blocks x n branches, "
                        "progressive joining) for the same steps, fuse the latter, compare accuracies "
                        "[default steps: 800, --quick: 60; out dir: vitfast-nondeep]")
    p.add_argument("--branches", type=positive_int, default=None, help="--nondeep: branches n [default: 2]")
    p.add_argument("--join-schedule", choices=("linear", "cosine", "exp", "sqrt"), default=None,
                   help="--nondeep: λ schedule [default: linear]")
    p.add_argument("--lr", type=positive_float, default=None, help="--nondeep: AdamW peak learning rate, both models [default: 3e-3]")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.nondeep:
        return _demo_nondeep(args)
    if args.branches is not None or args.join_schedule is not None or args.lr is not None:
        raise CLIError("--branches/--join-schedule/--lr: only used with --nondeep")
    output_dir(args.out)
    report = run_demo(steps=args.steps, threads=args.threads, out_dir=args.out, quick=args.quick, seed=args.seed,
                      progress=not args.no_progress, repeats=args.repeats)
    if not report["accuracy_equal"]:
        print(f"FAILED: fused accuracy {report['accuracy_fused']:.4f} differs from train-time {report['accuracy_train']:.4f}")
        return EXIT_CHECK_FAILED
    return EXIT_OK


def _demo_nondeep(args) -> int:
    """`vitfast demo --nondeep`: the non-deep vs single-branch comparison on the digits (vitfast/nondeep_demo.py)."""
    out = output_dir(args.out if args.out != "vitfast-demo" else "vitfast-nondeep")
    try:
        report = run_nondeep_comparison(
            branches=args.branches or 2, steps=args.steps, schedule=args.join_schedule or "linear", threads=args.threads,
            lr=args.lr if args.lr is not None else 3e-3,
            out_dir=out, quick=args.quick, seed=args.seed, progress=not args.no_progress,
        )
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if abs(report["nondeep_fused"] - report["nondeep"]) > 1e-9:
        print(f"FAILED: fused accuracy {report['nondeep_fused']:.4f} differs from train-time {report['nondeep']:.4f}")
        return EXIT_CHECK_FAILED
    return EXIT_OK
