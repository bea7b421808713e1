"""GPU report: every Triton kernel vs its eager reference on CUDA, and fused models vs timm, in one run.

Run on a CUDA machine (benchmarks/gpu_check.sh calls it):

    python benchmarks/cuda_report.py [--json PATH] [--no-ops] [--no-models] [--model-dtypes float32,bfloat16]

Op timings are medians of `triton.testing.do_bench` (CUDA events, L2 flushed between calls), fp32 with TF32
off (the kernels then use ieee products, like the eager reference) and bf16.  Ratios are reference / Triton
measured in the same process.  Ops without a Triton kernel in this checkout are listed as missing, not
skipped silently.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys

import torch


def _bench(fn, args):
    import triton.testing

    return triton.testing.do_bench(lambda: fn(*args), warmup=25, rep=200, return_mode="median")


def channel_idle_ffn_cases(dtype):
    from vitfast import reference
    from vitfast.kernels.channel_idle_ffn import channel_idle_ffn_triton

    sys.path.insert(0, "benchmarks")
    from shapes import VIT_SHAPES, channel_idle_dims, channel_idle_ffn_flops

    for shape_name in ("deit_small", "deit_base"):
        shape = VIT_SHAPES[shape_name]
        for theta in (0.5, 0.75):
            for batch in (1, 8, 64):
                active, linear = channel_idle_dims(shape, theta)
                c = shape.width
                g = torch.Generator().manual_seed(0)

                def uni(*s, fan_in):
                    return ((torch.rand(*s, generator=g) * 2 - 1) / fan_in**0.5).to("cuda", dtype)

                x = torch.randn(batch, shape.tokens, c, generator=g).to("cuda", dtype)
                args = (x, uni(active + linear, c, fan_in=c), uni(active + linear, fan_in=c), uni(c, active, fan_in=active),
                        uni(c, fan_in=active), x)
                flops = channel_idle_ffn_flops(shape, theta, batch)
                yield (f"channel_idle_ffn {shape_name} θ{theta} b{batch}", reference.channel_idle_ffn,
                       channel_idle_ffn_triton, args, flops)


OP_CASES = {"channel_idle_ffn": channel_idle_ffn_cases}


def op_report(rows):
    print(f"{'case':<44} {'dtype':<9} {'eager ms':>9} {'triton ms':>10} {'TFLOP/s':>8} {'speed-up':>9}")
    for name, cases in OP_CASES.items():
        for dtype in (torch.float32, torch.bfloat16):
            try:
                generated = list(cases(dtype))
            except ImportError as exc:
                print(f"{name}: no Triton kernel in this checkout ({exc})")
                break
            for case, ref_fn, triton_fn, args, flops in generated:
                with torch.no_grad():
                    out_t, out_r = triton_fn(*args), ref_fn(*args)
                    err = (out_t.float() - out_r.float()).abs().max().item() / max(out_r.float().abs().max().item(), 1e-12)
                    t_ref, t_tri = _bench(ref_fn, args), _bench(triton_fn, args)
                row = {"case": case, "dtype": str(dtype).replace("torch.", ""), "eager_ms": t_ref, "triton_ms": t_tri,
                       "tflops": flops / t_tri / 1e9, "speedup": t_ref / t_tri, "max_rel_err": err}
                rows.append(row)
                print(f"{case:<44} {row['dtype']:<9} {t_ref:9.4f} {t_tri:10.4f} {row['tflops']:8.1f} {row['speedup']:8.2f}x"
                      f"  (max err {err:.1e})")


def model_report(report, dtypes=("float32",)):
    from vitfast.cli import main as cli_main

    for dtype in dtypes:
        for model in ("deit_tiny_patch16_224", "deit_base_patch16_224"):
            print(f"\n== {model} channel_idle=0.75, CUDA {dtype} ==", flush=True)
            # The CUDA-graph rows (vitfast.cuda_graph) take the launch overhead out of both models: at batch 1 that
            # overhead is most of the eager time on a GPU.
            code = cli_main(["bench", model, "--channel-idle", "0.75", "--device", "cuda", "--dtype", dtype,
                             "--providers", "timm,vitfast,timm-graph,vitfast-graph", "--batch-sizes", "1,64",
                             "--repeats", "20", "--quiet"])
            report[(model, dtype)] = code


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the op rows as JSON")
    parser.add_argument("--no-models", action="store_true", help="skip the end-to-end model timings")
    parser.add_argument("--no-ops", action="store_true", help="skip the op table (end-to-end model timings only)")
    parser.add_argument("--model-dtypes", default="float32", metavar="D1,D2",
                        help="dtypes of the end-to-end model timings, e.g. float32,bfloat16 [default: float32]")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("cuda_report.py needs a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {importlib.import_module('triton').__version__}")
    rows = []
    if not args.no_ops:
        op_report(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if not args.no_models:
        model_report({}, dtypes=[d.strip() for d in args.model_dtypes.split(",") if d.strip()])


if __name__ == "__main__":
    main()
