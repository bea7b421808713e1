"""`vitfast export`: a fused model -> ONNX with standard operators, checked in ONNX Runtime (vitfast/export.py)."""
from __future__ import annotations

import argparse
import sys
import textwrap

import torch

import vitfast
from vitfast.cli._common import EXIT_CHECK_FAILED
from vitfast.cli._common import EXIT_OK
from vitfast.cli._common import EXIT_SYSTEM_ERROR
from vitfast.cli._common import CLIError
from vitfast.cli._common import Formatter
from vitfast.cli._common import existing_file
from vitfast.cli._common import nonneg_float
from vitfast.cli._common import not_the_input
from vitfast.cli._common import output_path
from vitfast.cli._common import positive_int
from vitfast.cli._models import file_kind
from vitfast.export import ExportError
from vitfast.export import ExportMismatchError
from vitfast.export import MissingExportPackagesError
from vitfast.export import require_export_packages
from vitfast.export import to_onnx


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export", formatter_class=Formatter, help="fused .safetensors -> ONNX (standard ops), checked in ONNX Runtime",
        description=textwrap.dedent("""\
            Export a fused model to ONNX with standard ONNX operators only: it is traced on vitfast's reference
            path (plain PyTorch ops), so no vitfast custom op reaches the graph (checked: a custom-domain node is
            an error).  The file is then run in ONNX Runtime against vitfast's own output (its kernels) at two
            batch sizes; if max |Δ| > atol + rtol x max|output| nothing is written and the exit status is 1.
            Exporter: "auto" uses torch's TorchScript exporter where torch has it (torch 2.4 and later) and the
            torch.export-based one (dynamo=True) otherwise and when the TorchScript export fails.  USDC gated models
            export with both: the graph decides per batch, as the model does."""),
        epilog="examples:\n  vitfast export fused.safetensors -o model.onnx\n"
               "  vitfast export fused.safetensors -o model_b8.onnx --batch 8 --opset 18 --exporter dynamo",
    )
    p.add_argument("fused", type=existing_file, metavar="FUSED", help="fused .safetensors (from `vitfast fuse`)")
    p.add_argument("-o", "--output", required=True, help="output .onnx path")
    p.add_argument("--batch", type=_export_batch, default="dynamic", help="'dynamic' (a symbolic batch axis) or a fixed batch size")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset [default: 17 TorchScript exporter, 18 dynamo]")
    p.add_argument("--exporter", choices=("auto", "torchscript", "dynamo"), default="auto", help="torch ONNX exporter")
    p.add_argument("--atol", type=nonneg_float, default=1e-4, help="absolute tolerance of the ONNX Runtime check")
    p.add_argument("--rtol", type=nonneg_float, default=1e-4, help="tolerance relative to the largest |output|")
    p.add_argument("--no-check", action="store_true", help="skip the ONNX Runtime comparison (onnx.checker still runs)")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads")
    p.set_defaults(func=run)


def _export_batch(text: str):
    if text == "dynamic":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'dynamic' or a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 'dynamic' or a positive integer, got {value}")
    return value


def run(args) -> int:
    try:  # before loading the model: the request is fine, this environment cannot carry it out
        require_export_packages()
    except MissingExportPackagesError as exc:
        print(exc, file=sys.stderr)
        return EXIT_SYSTEM_ERROR
    out = output_path(args.output)
    not_the_input(out, args.fused, what="FUSED")
    if file_kind(args.fused) != "fused":
        raise CLIError(f"FUSED: expected a fused .safetensors (from `vitfast fuse`), got a train-time file {args.fused!r} "
                       "(fuse it first)")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = vitfast.load(args.fused)
    # The ONNX graph is float32 (what to_onnx exports and checks); a bf16/fp16 file is widened here, since the
    # command line has no way to follow to_onnx's "call .float() first".
    low = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters() if p.dtype != torch.float32})
    if low:
        print(f"FUSED holds {', '.join(low)} weights: exported as float32 (the ONNX graph's dtype)")
        model = model.float()
    try:
        report = to_onnx(model, out, batch=args.batch, opset=args.opset, exporter=args.exporter,
                         check=not args.no_check, atol=args.atol, rtol=args.rtol)
    except ExportMismatchError as exc:
        print(f"vitfast export: MISMATCH: {exc}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    except ExportError as exc:
        print(f"vitfast export: error: {exc}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    batch = "dynamic batch axis" if report.dynamic_batch else f"batch {report.batch}"
    print(f"wrote {out} ({report.bytes / 1e6:.2f} MB): {report.exporter} exporter, opset {report.opset}, {batch}, "
          f"input {report.input_shape}, {report.nodes} nodes, standard ONNX ops only: {', '.join(report.op_types)}")
    if report.notes:
        print("notes: " + "; ".join(report.notes))
    if args.no_check:
        print("not checked in ONNX Runtime (--no-check)")
    else:
        print(f"check: ONNX Runtime vs vitfast at batch {' and '.join(map(str, report.checked_batches))}: "
              f"max |Δ| = {report.max_abs_diff:.3e} (tolerance {report.tolerance:.3e} = atol {args.atol:g} + "
              f"rtol {args.rtol:g} x max|output| {report.max_abs_output:.3g}): OK")
    return EXIT_OK
