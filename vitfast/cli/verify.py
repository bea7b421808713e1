"""`vitfast verify`: a fused file against its train-time source, on the same inputs."""
from __future__ import annotations

import textwrap

import torch

import vitfast
from vitfast.cli._common import EXIT_CHECK_FAILED
from vitfast.cli._common import EXIT_OK
from vitfast.cli._common import CLIError
from vitfast.cli._common import Formatter
from vitfast.cli._common import existing_file
from vitfast.cli._common import nonneg_float
from vitfast.cli._common import parse_device
from vitfast.cli._common import positive_int
from vitfast.cli._common import set_threads
from vitfast.cli._common import unit_float
from vitfast.cli._models import check_rgb_model
from vitfast.cli._models import file_kind
from vitfast.cli._models import load_source
from vitfast.cli._models import model_input
from vitfast.cli._models import size_text
from vitfast.measure import argmax_flips
from vitfast.measure import flips_text
from vitfast.training.data import digits_loaders

# The accuracy a low-precision copy must keep against its fp32 source (docs/quantization.md, Accuracy): at most this
# many top-1 points below it, and at least this argmax agreement.  This command's defaults; the demo's verdict.
# (Here, not in vitfast.quant: the CLI's start-up imports no model code.)
MAX_TOP1_DROP_POINTS = 0.3
MIN_ARGMAX_AGREEMENT = 0.995


def meets_accuracy_targets(drop_points: float, agreement: float, max_drop: float = MAX_TOP1_DROP_POINTS,
                           min_agreement: float = MIN_ARGMAX_AGREEMENT) -> bool:
    """Whether a low-precision copy is at most `max_drop` top-1 points below its source (drop_points > 0: below;
    with a margin for the float rounding of count / n · 100) and agrees on at least `min_agreement` of the argmaxes."""
    return drop_points <= max_drop + 1e-9 and agreement >= min_agreement


def add_parser(sub) -> None:
    p = sub.add_parser(
        "verify", formatter_class=Formatter, help="check a fused file against its train-time source",
        description=textwrap.dedent("""\
            Run the fused model (vitfast.load) and its train-time source (eval mode) on the same inputs and
            compare logits: max |Δ|, normalised MSE, argmax agreement.  Passes when
            max |Δ| <= atol + rtol * max |logit|; exit status 1 otherwise.

            An int8 or bf16 file (`vitfast quantize`) is not exact: it is compared with its fp32 source (the fused
            file, or the train-time model) by argmax agreement (>= --min-agreement) and, on the digits, by top-1
            (at most --max-drop points below the source's), with the relative logit error reported."""),
        epilog="examples:\n  vitfast verify fused.safetensors --source run/model.safetensors\n"
               "  vitfast verify fused.safetensors --source run/trainer.pt --inputs digits --atol 1e-5\n"
               "  vitfast verify int8.safetensors --source fused.safetensors --inputs digits",
    )
    p.add_argument("fused", type=existing_file, metavar="FUSED", help="fused .safetensors (from `vitfast fuse`)")
    p.add_argument("--source", type=existing_file, required=True,
                   help="train-time .safetensors or trainer checkpoint it came from (for an int8/bf16 file: also the "
                        "fused fp32 file)")
    p.add_argument("--inputs", choices=("random", "digits"), default="random", help="random normal images, or the digits validation split")
    p.add_argument("--batch-size", type=positive_int, default=16, help="images per batch")
    p.add_argument("--batches", type=positive_int, default=2, help="number of random batches (--inputs random)")
    p.add_argument("--atol", type=nonneg_float, default=1e-4, help="absolute tolerance on logits")
    p.add_argument("--rtol", type=nonneg_float, default=1e-4, help="tolerance relative to the largest |logit|")
    p.add_argument("--seed", type=int, default=0, help="seed for the random inputs")
    p.add_argument("--min-agreement", type=unit_float, default=MIN_ARGMAX_AGREEMENT,
                   help="int8/bf16 files: the least argmax agreement with the source")
    p.add_argument("--max-drop", type=nonneg_float, default=MAX_TOP1_DROP_POINTS,
                   help="int8/bf16 files with --inputs digits: the most top-1 points below the source's")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads")
    p.add_argument("--device", default="cpu", help="run both models on this device (cpu, cuda, cuda:1, ...)")
    p.set_defaults(func=run)


def run(args) -> int:
    set_threads(args.threads)
    device = parse_device(args.device)
    if file_kind(args.fused) != "fused":
        raise CLIError(f"FUSED: expected a fused .safetensors (from `vitfast fuse`), got {args.fused!r}")
    fused = vitfast.load(args.fused).to(device)
    low_precision = (getattr(fused, "vitfast_quantization", None) or {}).get("dtype")
    if low_precision is None and next(fused.parameters()).dtype == torch.bfloat16:
        low_precision = "bf16"
    if low_precision is not None and file_kind(args.source) == "fused":
        source = vitfast.load(args.source)  # the fp32 fused file it was quantized from
        if (getattr(source, "vitfast_quantization", None) or {}).get("dtype"):
            raise CLIError(f"--source: expected the fp32 model {args.fused!r} came from, got another quantized file")
    else:
        source, _ = load_source(args.source, "--source")
    source = source.to(device)
    img_size, _ = model_input(source)
    proj = getattr(getattr(source, "patch_embed", None), "proj", None)
    in_chans = proj.in_channels if proj is not None else 3
    fused_size, _ = model_input(fused)
    if fused_size != img_size:  # once timm's AssertionError from the first forward
        raise CLIError(f"FUSED/--source: expected models of one input size, got {size_text(fused_size)} (fused) "
                       f"and {size_text(img_size)} (source)")
    labels = None
    if args.inputs == "digits":
        check_rgb_model(source, "--inputs digits")
        _, loader = digits_loaders(img_size=img_size, batch_size=args.batch_size, eval_batch_size=args.batch_size)
        batches, labels = zip(*loader)
    else:
        g = torch.Generator().manual_seed(args.seed)
        batches = [torch.randn(args.batch_size, in_chans, *img_size, generator=g) for _ in range(args.batches)]
    max_abs, max_ref, agree, n, err2, ref2 = 0.0, 0.0, 0, 0, 0.0, 0.0
    correct_ref = correct_out = 0
    kept = []  # (source, low-precision) logits: which images flipped, at what fp32 margins
    with torch.no_grad():
        for i, x in enumerate(batches):
            x = x.to(device)
            ref, out = source(x), fused(x)
            if low_precision is not None:
                out = out.float()
            if labels is not None:
                y = labels[i].to(device)
                correct_ref += int((ref.argmax(-1) == y).sum())
                correct_out += int((out.argmax(-1) == y).sum())
            if ref.shape != out.shape:
                print(f"MISMATCH: output shapes differ: source {tuple(ref.shape)}, fused {tuple(out.shape)}")
                return EXIT_CHECK_FAILED
            max_abs = max(max_abs, float((ref - out).abs().max()))
            max_ref = max(max_ref, float(ref.abs().max()))
            err2 += float(((ref - out) ** 2).sum())
            ref2 += float((ref ** 2).sum())
            agree += int((ref.argmax(-1) == out.argmax(-1)).sum())
            n += int(ref.shape[0])
            if low_precision is not None:
                kept.append((ref.cpu(), out.cpu()))
    bound = args.atol + args.rtol * max_ref
    nmse = err2 / ref2 if ref2 > 0 else err2
    finite = all(map(lambda v: v == v and abs(v) != float("inf"), (max_abs, max_ref)))
    ok = finite and max_abs <= bound
    print(f"inputs: {n} {args.inputs} images of {in_chans}x{img_size[0]}x{img_size[1]} on {device}")
    if low_precision is not None:
        flips = argmax_flips(torch.cat([o for _, o in kept]), torch.cat([r for r, _ in kept]))
        return _report_low_precision(args, low_precision, fused, finite, agree, n, err2, ref2, labels is not None,
                                     correct_ref, correct_out, flips)
    print(f"max |Δlogits| = {max_abs:.3e} (tolerance {bound:.3e} = atol {args.atol:g} + rtol {args.rtol:g} x max|logit| {max_ref:.3g})")
    print(f"normalised MSE = {nmse:.3e}; argmax agreement = {agree}/{n} ({agree / n:.2%})")
    print("OK: the fused model matches its source" if ok else "MISMATCH: the fused model does not match its source")
    return EXIT_OK if ok else EXIT_CHECK_FAILED


def _report_low_precision(args, dtype, model, finite, agree, n, err2, ref2, labelled, correct_ref, correct_out,
                          flips) -> int:
    """An int8/bf16 model against its fp32 source: agreement (and top-1 on the digits) instead of exact equality,
    and the flipped images' fp32 margins (near-ties or not)."""
    print(vitfast.quant.describe(model))
    rel = (err2 / ref2) ** 0.5 if ref2 > 0 else float("inf")
    print(f"relative logit error = {rel:.3e}; argmax agreement = {agree}/{n} ({agree / n:.2%}, required "
          f">= {args.min_agreement:.2%})")
    print(flips_text(flips, n))
    drop = (correct_ref - correct_out) / n * 100 if labelled else 0.0  # without labels only agreement counts
    ok = finite and meets_accuracy_targets(drop, agree / n, args.max_drop, args.min_agreement)
    if labelled:
        print(f"top-1: source {correct_ref / n:.4f}, {dtype} {correct_out / n:.4f} "
              f"({(correct_out - correct_ref) / n * 100:+.2f} pt, at most "
              f"-{args.max_drop:g} pt allowed)")
    print(f"OK: the {dtype} model agrees with its source" if ok
          else f"MISMATCH: the {dtype} model is further from its source than allowed")
    return EXIT_OK if ok else EXIT_CHECK_FAILED
