"""`vitfast bench`: latency of a timm model against its fused model on several runtimes (vitfast/bench.py).

vitfast.io.fused, vitfast.arch (timm) and matplotlib are imported when the command runs."""
from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from typing import List

import torch

import vitfast
from vitfast.bench import DEFAULT_PROVIDERS
from vitfast.bench import DTYPES
from vitfast.bench import cpu_only
from vitfast.bench import format_report
from vitfast.bench import parse_providers
from vitfast.bench import plot_report
from vitfast.bench import run_bench
from vitfast.bench_runtimes import INDUCTOR
from vitfast.cli._common import EXIT_CHECK_FAILED
from vitfast.cli._common import EXIT_OK
from vitfast.cli._common import CLIError
from vitfast.cli._common import Formatter
from vitfast.cli._common import batch_list
from vitfast.cli._common import output_path
from vitfast.cli._common import parse_device
from vitfast.cli._common import positive_int
from vitfast.cli._common import thread_list
from vitfast.cli._models import build_timm_model
from vitfast.cli._models import file_kind
from vitfast.cli._models import nondeep_blocks
from vitfast.cli._nondeep_args import add_nondeep_args
from vitfast.cli._recipe_args import add_recipe_args
from vitfast.export import model_input_shape
from vitfast.io.atomic import atomic_write_text


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", formatter_class=Formatter, help="latency: timm eager, torch.compile, ONNX Runtime and vitfast",
        description=textwrap.dedent("""\
            Build the baseline (a timm model by name, random weights) and its fused model (the recipe options:
            --channel-idle, --norm, ...), or take a fused .safetensors (the baseline is then the file's timm
            skeleton with vanilla blocks), and time them on several runtimes at every --threads x --batch-sizes:
              timm       timm eager PyTorch (the baseline; always included: speed-ups are against it)
              compile    the baseline under torch.compile
              ort-timm   ONNX Runtime running the baseline
              ort-fused  ONNX Runtime running the fused graph (exported through the reference path)
              vitfast    the fused model on vitfast's kernels
              reference  the fused model on vitfast.reference ops (not in the default set)
            What a CPU user deploys instead, on the same fused ONNX (opt-in; CPU only):
              ort-int8      ORT on quantize_dynamic(QInt8 weights, ORT's defaults: per-tensor)
              ort-qdq       ORT on quantize_static (QDQ, per-channel S8S8, calibrated on the bench inputs)
              openvino-f32  OpenVINO, INFERENCE_PRECISION_HINT=f32 (pip install openvino, in 'vitfast[bench]')
              openvino      OpenVINO at its default precision (bf16 on AVX512_BF16 CPUs; the report says which)
            and vitfast's own: vitfast-int8, vitfast-bf16 (vitfast.quantize of a copy; skipped where this
            vitfast has no quantize).  A provider whose optional package is missing is skipped (SKIPPED line),
            not failed.  Fused-graph rows get their error against the fused fp32 model (relative L2 and top-1
            agreement on the bench inputs) and paired ratios vs ORT fused, ORT int8 and OpenVINO and vs the
            fastest anchor timed; a vitfast row slower than an anchor is marked SLOWER.
            Prints one table: median latency and the p10-p90 spread over interleaved calls (the order rotates
            every round), images/s, GFLOP per forward (FlopCounterMode), % of the FLOP floor (FLOPs / the fp32
            sgemm rate, torch.mm 2048^3, measured in the same run at the same thread count) and the speed-up
            over timm eager.  ORT sessions: intra-op threads = --threads, one inter-op thread, all graph
            optimisations.  Progress goes to stderr.  Exit status 1 if a provider failed (the others are
            still reported)."""),
        epilog="examples:\n"
               "  vitfast bench deit_small_patch16_224 --channel-idle 0.75 --threads 1 --batch-sizes 1 --repeats 20 "
               "--providers timm,ort-fused,ort-int8,ort-qdq,openvino-f32,openvino,vitfast\n"
               "  vitfast bench deit_base_patch16_224 --channel-idle 0.75 --threads 1,2 --batch-sizes 1,8 --json r.json --png r.png\n"
               "  vitfast bench fused.safetensors --threads 1 --batch-sizes 1,64 --providers timm,vitfast,reference\n"
               "  vitfast bench deit_small_patch16_224 --channel-idle 0.75 --batch-sizes 1 --repeats 10",
    )
    p.add_argument("target", metavar="TARGET", help="a timm model name (with the recipe options), or a fused .safetensors")
    p.add_argument("--providers", type=_providers, default=None, metavar="P1,P2",
                   help="runtimes to time [default: timm,compile,ort-timm,ort-fused,vitfast; without ort-* off the CPU; "
                        "on CUDA also timm-graph,vitfast-graph (CUDA-graph replays)]; CUDA only, opt-in: "
                        "inductor-fused,inductor-fused-max-autotune (torch.compile of the same fused graph on its "
                        "reference ops), timm-max-autotune")
    p.add_argument("--threads", type=thread_list, default=None, metavar="T1,T2", help="CPU thread counts [default: torch's]")
    p.add_argument("--batch-sizes", type=batch_list, default="1,8", metavar="B1,B2", help="batch sizes")
    p.add_argument("--repeats", type=positive_int, default=10,
                   help="interleaved rounds at each (threads, batch): each times every provider once")
    p.add_argument("--warmup", type=positive_int, default=2, help="untimed calls first (at least 1: compiles, ORT's first run)")
    p.add_argument("--burst", type=positive_int, default=1,
                   help="calls per provider in each round, timed as the median of calls 2..N: each runtime back to "
                        "back, as a server running one model sees it (1: one call each, right after the others': a "
                        "model that fits in the caches is then timed cold)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the whole report as JSON")
    p.add_argument("--png", default=None, metavar="PATH", help="write a chart (speed-up and %% of floor per provider)")
    p.add_argument("--device", default="cpu", help="device for the torch providers (cpu, cuda, ...); CUDA calls are synchronised")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                   help="dtype of both models and the inputs; float16/bfloat16 with --device cuda only (the floor "
                        "then uses torch.mm in that dtype)")
    p.add_argument("--ort-spinning", action="store_true",
                   help="let ORT's intra-op workers spin after a run (ORT's default; off here because the spinning "
                        "workers hold the cores while the next provider of the interleaved round runs)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_recipe_args(p, convert=True)
    add_nondeep_args(p, train=False)
    p.set_defaults(func=run)


def _providers(text: str) -> List[str]:
    try:
        return parse_providers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None


def run(args) -> int:
    from vitfast.io.fused import read_config

    device = parse_device(args.device)
    if args.dtype != "float32" and device.type != "cuda":
        raise CLIError(f"--dtype: {args.dtype} needs --device cuda (CPU runs float32), got --device {args.device}")
    json_path = output_path(args.json, "--json") if args.json else None
    png_path = _chart_path(args.png) if args.png else None
    threads = args.threads or [torch.get_num_threads()]
    if args.providers is not None:
        providers = args.providers
        if device.type != "cpu" and any(cpu_only(p) for p in providers):
            raise CLIError(f"--providers: ONNX Runtime and OpenVINO providers run on the CPU only, got "
                           f"{','.join(providers)} with --device {args.device}")
        if device.type != "cuda" and any(p.endswith("-graph") for p in providers):
            raise CLIError(f"--providers: the CUDA-graph providers need --device cuda, got {','.join(providers)} "
                           f"with --device {args.device}")
        gpu_compiled = [p for p in providers if p in INDUCTOR]
        if device.type != "cuda" and gpu_compiled:
            raise CLIError(f"--providers: {','.join(gpu_compiled)} compile for the GPU and need --device cuda, got "
                           f"--device {args.device}")
    else:
        providers = [p for p in DEFAULT_PROVIDERS if device.type == "cpu" or not cpu_only(p)]
        if device.type == "cuda":  # launch overhead is most of batch 1 on a GPU: show both models without it
            providers += ["timm-graph", "vitfast-graph"]
    torch.manual_seed(0)
    if os.path.exists(args.target):
        if not os.path.isfile(args.target):
            raise CLIError(f"TARGET: expected a fused .safetensors file or a timm model name, got the directory {args.target!r}")
        if file_kind(args.target) != "fused":
            raise CLIError(f"TARGET: expected a fused .safetensors (from `vitfast fuse`), got {args.target!r}")
        # The recipe options build a model from a timm name; with a file they were silently ignored.
        defaults = {"norm": "batch", "heuristic": "static"}
        for flag in ("channel_idle", "img_size", "num_classes", "model_kwargs", "branches", "join_values", "norm",
                     "heuristic"):
            if getattr(args, flag, None) not in (None, defaults.get(flag)):
                raise CLIError(f"--{flag.replace('_', '-')}: only applies when TARGET is a timm model name")
        fused = vitfast.load(args.target)
        config = read_config(args.target)
        source = config.get("source_architecture")
        try:
            baseline = skeleton_baseline(source if isinstance(source, dict) else config["architecture"])
        except ValueError as exc:
            raise CLIError(f"TARGET: cannot build the baseline from {args.target!r} ({exc})") from None
        if isinstance(source, dict):
            note = "baseline = timm eager on the model the file was converted from (random weights); fused = the file"
        else:
            note = ("baseline = timm eager on the file's own skeleton (random weights): this file does not record "
                    "its source model, so heads, MLP width and depth are the skeleton's defaults where every block "
                    "is fused; pass the timm model name for a faithful baseline")
            print(f"vitfast bench: warning: {note}", file=sys.stderr)
        recipe = {"file": os.path.basename(args.target)}
        title = f"vitfast bench {os.path.basename(args.target)}"
    else:
        baseline = build_timm_model(args.target, pretrained=None, img_size=args.img_size, num_classes=args.num_classes,
                                    model_kwargs=args.model_kwargs, flag="TARGET").eval()
        theta = vitfast.convert.default_idle_ratio(baseline) if args.channel_idle is None else args.channel_idle
        if args.branches is not None:
            return _bench_nondeep(args, baseline, device, threads, providers, json_path, png_path)
        if args.join_values:
            raise CLIError("--join-values: only with --branches (a non-deep model)")
        trainable = vitfast.convert.from_timm(baseline, channel_idle=theta, norm=args.norm, heuristic=args.heuristic).eval()
        fused = vitfast.fuse(trainable)
        del trainable
        note = f"baseline = timm {args.target} (random weights); fused: θ={theta}, norm={args.norm}, heuristic={args.heuristic}"
        recipe = {"model": args.target, "channel_idle": theta, "norm": args.norm, "heuristic": args.heuristic,
                  "img_size": args.img_size, "num_classes": args.num_classes, "model_kwargs": args.model_kwargs or {}}
        title = f"vitfast bench {args.target} θ={theta} ({args.norm} norm)"
    return _bench_and_report(args, baseline, fused, device, threads, providers, json_path, png_path,
                             title=title, recipe=recipe, note=note)


def _chart_path(path: str) -> str:
    """--png checked before the benchmark runs: an extension matplotlib writes (none: .png, which is what it
    saves then; the report once printed the name without it), in an existing directory."""
    from matplotlib.figure import Figure

    output_path(path, "--png")
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if not ext:
        path, ext = path + ".png", "png"
    formats = Figure().canvas.get_supported_filetypes()
    if ext not in formats:
        raise CLIError(f"--png: expected a chart file name ending in one of {', '.join('.' + f for f in sorted(formats))}, "
                       f"got {path!r}")
    return output_path(path, "--png")


def skeleton_baseline(architecture: dict) -> torch.nn.Module:
    """The timm model a fused file was made from, with timm's random init, in eval mode.

    build_timm skips timm's init (a load overwrites every tensor); timed as it came, its uninitialised memory
    (NaN cls_token, 1e31 pos_embed) made every "timm" row time a NaN model and the ONNX check fail."""
    from vitfast.arch import build_timm

    baseline = build_timm(architecture)
    baseline.init_weights()
    return baseline.eval()


def _vitfast_quantize():
    """The package's quantize for the vitfast-int8 / vitfast-bf16 rows, or None where this vitfast has none (the
    rows are then skipped, not failed)."""
    try:
        return getattr(vitfast, "quantize", None)
    except ImportError:  # a lazy attribute whose module is missing
        return None


def _bench_and_report(args, baseline, fused, device, threads, providers, json_path, png_path, *, title, recipe,
                      note) -> int:
    """Time `baseline` against `fused` (vitfast.bench.run_bench), print the table, write --json/--png."""
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    report = run_bench(
        baseline, fused, input_shape=model_input_shape(baseline), threads=threads, batch_sizes=args.batch_sizes,
        providers=providers, repeats=args.repeats, warmup=args.warmup, burst=args.burst, device=device,
        dtype=DTYPES[args.dtype],
        ort_spinning=args.ort_spinning, quantize=_vitfast_quantize(),
        meta={"title": title, "target": args.target, "recipe": recipe, "note": note}, log=log,
    )
    print(format_report(report))
    if json_path:
        atomic_write_text(json_path, json.dumps(report, indent=2))
        print(f"wrote {json_path}")
    if png_path:
        plot_report(report, png_path)
        print(f"wrote {png_path}")
    return EXIT_CHECK_FAILED if report["errors"] else EXIT_OK


def _bench_nondeep(args, baseline, device, threads, providers, json_path, png_path) -> int:
    """`vitfast bench MODEL --branches n`: timm MODEL (L layers) against its fused L/n-layer non-deep model."""
    theta = args.channel_idle or 0.0
    norm = args.norm if args.channel_idle is not None else "layer"
    try:
        trainable = vitfast.convert.from_timm(baseline, branches=args.branches, channel_idle=theta, norm=norm,
                                              heuristic=args.heuristic, join_values=bool(args.join_values)).eval()
    except ValueError as exc:
        raise CLIError(f"--branches: {exc}") from None
    for block in nondeep_blocks(trainable):
        block.set_lambda(1.0)  # random weights, joining finished: what a trained model looks like to fuse
    fused = vitfast.fuse(trainable)
    del trainable
    forms = sorted({m.score_form for m in fused.modules() if isinstance(getattr(m, "score_form", None), str)})
    depth = len(baseline.blocks) // args.branches
    note = (f"baseline = timm {args.target} (random weights, {len(baseline.blocks)} layers); fused: non-deep, "
            f"{args.branches} branches -> {depth} layers, θ={theta}, join_values={bool(args.join_values)}, "
            f"score form {'/'.join(forms)}")
    recipe = {"model": args.target, "branches": args.branches, "channel_idle": theta, "norm": norm,
              "join_values": bool(args.join_values), "score_forms": forms, "img_size": args.img_size,
              "num_classes": args.num_classes, "model_kwargs": args.model_kwargs or {}}
    title = f"vitfast bench {args.target} --branches {args.branches} ({depth} layers)"
    return _bench_and_report(args, baseline, fused, device, threads, providers, json_path, png_path,
                             title=title, recipe=recipe, note=note)
