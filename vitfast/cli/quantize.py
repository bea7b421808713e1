"""`vitfast quantize`: a fused .safetensors -> an int8 (or bf16) .safetensors, with its accuracy against fp32."""
from __future__ import annotations

import os
import textwrap

import torch

import vitfast
from vitfast.cli._common import EXIT_OK
from vitfast.cli._common import CLIError
from vitfast.cli._common import Formatter
from vitfast.cli._common import checked
from vitfast.cli._common import existing_file
from vitfast.cli._common import not_the_input
from vitfast.cli._common import output_path
from vitfast.cli._common import positive_int
from vitfast.cli._common import set_threads
from vitfast.cli._models import model_input


def _smooth(text: str):
    if text == "auto":
        return "auto"
    return checked(text, float, "a migration strength in (0, 1) or 'auto'", lambda v: 0.0 < v < 1.0)


def _budget(text: str) -> float:
    return checked(text, float, "a relative error > 0 (e.g. 0.02)", lambda v: 0.0 < v < float("inf"))


def add_parser(sub) -> None:
    p = sub.add_parser(
        "quantize", formatter_class=Formatter, help="fused model -> int8 (or bf16) .safetensors",
        description=textwrap.dedent("""\
            Quantize a fused model (vitfast.quantize): per-channel int8 weights and int8 activations per token
            (dynamic, no data needed) or per tensor from calibration images (static), on the int8 kernels.
            Norms, softmax, GELU, residual adds, the DW-conv heads' convolution and the head stay fp32; the
            attentions' score/value products (the non-deep heads' too) follow --attention.  Prints what is int8,
            each layer's error on the calibration images (when given), and top-1 / argmax agreement against fp32
            on the digits validation set when the model is a digits model (--calibration digits).
            Guide: docs/quantization.md."""),
        epilog=("examples:\n  vitfast quantize fused.safetensors -o int8.safetensors\n"
                "  vitfast quantize fused.safetensors -o int8.safetensors --calibration digits --activations static "
                "--smooth 0.5\n  vitfast quantize fused.safetensors -o int8.safetensors --calibration images/ "
                "--skip-budget 0.02\n  vitfast quantize fused.safetensors -o bf16.safetensors --dtype bf16"),
    )
    p.add_argument("source", type=existing_file, metavar="FUSED", help="fused .safetensors (vitfast fuse / demo output)")
    p.add_argument("-o", "--output", required=True, help="output .safetensors path")
    p.add_argument("--dtype", choices=("int8", "bf16"), default="int8", help="target precision")
    p.add_argument("--calibration", default=None, metavar="digits|DIR",
                   help="calibration images: 'digits' (scikit-learn digits, training split) or an image folder "
                        "(class sub-folders); needed for --activations static, --smooth and --skip-budget")
    p.add_argument("--activations", choices=("dynamic", "static"), default="dynamic",
                   help="int8 activation scales: per token at run time, or per tensor from calibration")
    p.add_argument("--smooth", type=_smooth, default=None, metavar="ALPHA|auto",
                   help="SmoothQuant migration strength α in (0, 1), or 'auto' (chosen per layer); needs calibration")
    p.add_argument("--skip", nargs="+", default=None, metavar="PATTERN",
                   help="module paths or patterns kept in fp32, e.g. 'blocks.0.*'")
    p.add_argument("--skip-budget", type=_budget, default=None, metavar="ERR",
                   help="keep in fp32 every layer whose own relative output error on the calibration images exceeds ERR")
    p.add_argument("--attention", choices=("auto", "int8", "bf16", "fp32"), default=None,
                   help="the attentions' score and value products [default: auto with dynamic activations (int8 where "
                        "int8 products measured faster on this CPU at the model's shape), fp32 with static ones (a "
                        "QDQ-exportable model)]")
    p.add_argument("--weight-bits", type=int, choices=(8, 7), default=8,
                   help="int8 weight codes in [-127, 127] (8) or [-64, 64] (7: faster int8 GEMMs on CPUs with AVX2 "
                        "and no VNNI, where ONNX Runtime also runs the exported graph exactly; twice the weights' "
                        "rounding step)")
    p.add_argument("--calibration-images", type=positive_int, default=256, metavar="N",
                   help="calibration images read")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads")
    p.set_defaults(func=run)


def calibration_loader(spec: str, img_size, limit: int):
    """Batches of at most 64 calibration images from 'digits' (training split: never the validation images) or an
    image folder; None when `spec` is None."""
    if spec is None:
        return None
    from vitfast.training.data import digits_loaders, image_folder_loaders

    batch = min(64, limit)
    if spec == "digits":
        loader, _ = digits_loaders(img_size=img_size, batch_size=batch, augment=False, seed=0)
    elif os.path.isdir(spec):
        loader, _ = image_folder_loaders(spec, img_size=img_size, batch_size=batch, augment=False, seed=0)
    else:
        raise CLIError(f"--calibration: expected 'digits' or an image folder, got {spec!r} (not a directory)")
    batches = (limit + batch - 1) // batch
    return [b for _, b in zip(range(batches), loader)]


def digits_accuracy(fp32, quantized, img_size) -> str:
    from vitfast.training.data import digits_loaders

    _, val = digits_loaders(img_size=img_size, batch_size=64, seed=0)
    correct_f = correct_q = agree = n = 0
    with torch.no_grad():
        for x, y in val:
            pf, pq = fp32(x).argmax(1), quantized(x).argmax(1)
            correct_f += int((pf == y).sum())
            correct_q += int((pq == y).sum())
            agree += int((pf == pq).sum())
            n += int(y.numel())
    return (f"digits validation ({n} images): top-1 fp32 {correct_f / n:.4f}, {quantized_name(quantized)} "
            f"{correct_q / n:.4f} ({(correct_q - correct_f) / n * 100:+.2f} pt), argmax agreement {agree / n:.2%}")


def quantized_name(model) -> str:
    return (getattr(model, "vitfast_quantization", None) or {}).get("dtype", "int8")


def run(args) -> int:
    set_threads(args.threads)
    out = output_path(args.output)
    not_the_input(out, args.source)
    model = vitfast.load(args.source)
    img_size, _ = model_input(model)
    needs = [flag for flag, on in (("--activations static", args.activations == "static"),
                                   ("--smooth", args.smooth is not None), ("--skip-budget", args.skip_budget is not None))
             if on]
    if needs and args.calibration is None and args.dtype == "int8":
        raise CLIError(f"--calibration: {', '.join(needs)} needs calibration images (digits or an image folder)")
    if args.skip is not None and args.skip_budget is not None:
        raise CLIError("--skip, --skip-budget: give one (patterns, or an error budget)")
    calibration = calibration_loader(args.calibration, img_size, args.calibration_images) if args.dtype == "int8" else None
    try:
        quantized = vitfast.quantize(model, calibration, dtype=args.dtype, activations=args.activations,
                                     smooth=args.smooth, skip=args.skip_budget if args.skip_budget else args.skip,
                                     attention=args.attention, weight_bits=args.weight_bits, progress=True)
    except ValueError as e:
        raise CLIError(str(e)) from None
    vitfast.save(quantized, out)
    print(f"wrote {out} ({os.path.getsize(out) / 1e6:.2f} MB; fp32 file {os.path.getsize(args.source) / 1e6:.2f} MB)")
    print(vitfast.quant.describe(quantized))
    layers = [layer for layer in (quantized.vitfast_quantization or {}).get("layers", [])
              if layer.get("relative_error") is not None]
    if layers:
        worst = sorted(layers, key=lambda layer: -layer["relative_error"])[:5]
        print("largest per-layer errors on the calibration images: " + ", ".join(
            f"{layer['path']} {layer['relative_error']:.2%}{'' if layer['int8'] else ' (fp32)'}" for layer in worst))
    if args.calibration == "digits":
        print(digits_accuracy(model, vitfast.load(out), img_size))
    hint = weight_bits_hint(args.dtype, args.weight_bits, vitfast.ops.int8_kernel())
    if hint:
        print(hint)
    return EXIT_OK


def weight_bits_hint(dtype: str, weight_bits: int, kernel: str) -> str:
    """On a CPU whose int8 kernel is the plain AVX2 one (no VNNI), 8-bit weights need the sign trick and 7-bit ones
    do not: their GEMMs measured 1.30-1.37x faster there and the int8 DeiT model 1.22-1.31x (docs/performance.md,
    "7-bit weights on the AVX2 kernel").  A trade of accuracy, so a hint, not a default."""
    if dtype != "int8" or weight_bits != 8 or kernel != "avx2":
        return ""
    return ("note: this CPU's int8 kernel is AVX2 without VNNI; --weight-bits 7 runs its int8 GEMMs about 1.3x "
            "faster at twice the weights' rounding step (check the result with `vitfast verify`)")
