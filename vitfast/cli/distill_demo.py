"""`vitfast distill-demo`: Table IX of swin-distillation-compression on the digits (vitfast/distill_demo.py, which
imports timm: imported when the command runs)."""
from __future__ import annotations

import json
import textwrap

from vitfast.cli._common import add_threads_arg
from vitfast.cli._common import EXIT_CHECK_FAILED
from vitfast.cli._common import EXIT_OK
from vitfast.cli._common import Formatter
from vitfast.cli._common import output_path
from vitfast.cli._common import positive_int
from vitfast.cli._common import set_threads
from vitfast.io.atomic import atomic_write_text


def add_parser(sub) -> None:
    p = sub.add_parser(
        "distill-demo", formatter_class=Formatter, help="Table IX on the digits: scratch vs distilled vs copied students",
        description=textwrap.dedent("""\
            The distillation framework of swin-distillation-compression on scikit-learn's digits: train a ViT teacher
            (depth 6), then four half-depth students for the same steps, data order and optimiser: random init,
            random init + harmonic-mean distillation (eq. 4, MSE on logits, w_d=13, w_s=1), the teacher's blocks
            copied before the cut (Algorithm 1), and copied + distillation.  Prints validation accuracies and whether
            the paper's ordering holds.  Fixed seeds: the same numbers for the same torch version and --threads.
            About 8 minutes on one busy CPU core; --quick is a smoke test (too short to show anything)."""),
        epilog="examples:\n  vitfast distill-demo\n  vitfast distill-demo --json table9.json --check",
    )
    p.add_argument("--teacher-steps", type=positive_int, default=None, help="teacher training steps [default: 600]")
    p.add_argument("--student-steps", type=positive_int, default=None, help="steps per student [default: 600]")
    p.add_argument("--seed", type=int, default=0, help="seed for data split, init and training")
    add_threads_arg(p)
    p.add_argument("--quick", action="store_true", help="tiny models and few steps (a smoke test)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the numbers as JSON")
    p.add_argument("--check", action="store_true", help="exit status 1 if scratch < scratch+KD < copied does not hold")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args) -> int:
    from vitfast.demos.distill_demo import format_distill_table
    from vitfast.demos.distill_demo import run_distill_demo
    from vitfast.demos.distill_demo import target_ordering_holds

    set_threads(args.threads)
    json_out = output_path(args.json, "--json") if args.json else None  # checked before minutes of training
    report = run_distill_demo(quick=args.quick, teacher_steps=args.teacher_steps, student_steps=args.student_steps,
                              seed=args.seed, progress=not args.no_progress, log=lambda *a: None)
    print(format_distill_table(report))
    holds = target_ordering_holds(report)
    acc = [r["acc"] for r in report["students"]]
    print(f"Table IX ordering (scratch < scratch+KD < copied): {'holds' if holds else 'does NOT hold'}; "
          f"copied+KD vs copied (row 4, reported only): {acc[3]:.4f} vs {acc[2]:.4f}")
    if json_out:
        atomic_write_text(json_out, json.dumps(report, indent=2))
        print(f"wrote {json_out}")
    return EXIT_CHECK_FAILED if (args.check and not holds) else EXIT_OK
