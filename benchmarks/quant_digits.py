"""int8 accuracy of `vitfast.quantize` on the digits models of every method, against fp32 and ONNX Runtime's
one-call dynamic quantization of the same fused model.

    cd <repo> && PYTHONPATH=$PWD python benchmarks/quant_digits.py --work runs/quant-digits      # ~13 min cold, 1 thread

Models (each trained once, seeded, on scikit-learn's digits with the project's loaders and Trainer, then fused; the
fused file is cached under --work, so a rerun only measures):
  * channel-idle: the demo model (`vitfast.demos.demo.run_demo`: RePaViT θ = 0.75, BatchNorm FFNs, 800 steps);
  * non-deep:     depth 4 as 2 blocks × 2 branches, the "paper" recipe of benchmarks/nondeep_digits.py, lr 2e-3;
  * dwconv:       drop-in DW-conv heads in blocks 2 and 3 (`vitfast.cli._dwconv_args.convert_dwconv`, k = 3), timm's
                  FFNs, the demo's optimiser and steps;
  * usdc:         `vitfast.demos.usdc_study.run_usdc_study` at the batch gate level (800 + 400 + 300 steps).
For each: fp32 top-1 on the 360 validation images, then int8 copies (`vitfast.quantize`, calibration = the first
CALIB_BATCHES unaugmented training batches, never validation images) — dynamic, dynamic + smooth 0.5, static,
static + smooth 0.5 — and ONNX Runtime's `quantize_dynamic(weight_type=QInt8)` of the fused model exported with
`vitfast.export.to_onnx`.  Per variant: top-1, Δ top-1 (points) and argmax agreement vs fp32, the relative logit
error ‖L_q − L‖ / ‖L‖ over the validation set, and the worst layer's own relative output error on the calibration
images (`model.vitfast_quantization["layers"]`).  Evaluation runs in batches of 64 in the loader's order for every
variant (the USDC model's batch-level gates decide per batch, so the batches must match).

The table goes to benchmarks/results/<date>-<machine>-quant-digits.json (`results_file` schema) unless --no-record.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

import torch

from vitfast.measure import argmax_flips

HERE = os.path.dirname(os.path.abspath(__file__))
CALIB_BATCHES = 4  # × 64 = 256 training images
EVAL_BATCH = 64
TARGET_POINTS = 0.3
TARGET_AGREEMENT = 0.995
VARIANTS = [
    ("dynamic", dict(activations="dynamic")),
    ("dynamic + smooth 0.5", dict(activations="dynamic", smooth=0.5)),
    ("static", dict(activations="static")),
    ("static + smooth 0.5", dict(activations="static", smooth=0.5)),
    ("dynamic + smooth auto", dict(activations="dynamic", smooth="auto")),
    ("static + smooth auto", dict(activations="static", smooth="auto")),
    # the dynamic variants above take attention="auto" (the default): at these models' shapes (17 tokens, head dim
    # 24-32) fp32 products on the x86 kernels (vitfast/quant/attention_choice.py); with int8 products asked for:
    ("dynamic, int8 attention", dict(activations="dynamic", attention="int8")),
    ("dynamic + smooth auto, int8 attention", dict(activations="dynamic", smooth="auto", attention="int8")),
    # and with bf16-operand products (fp32 sums), the accurate low-precision choice
    ("dynamic, bf16 attention", dict(activations="dynamic", attention="bf16")),
    # the patch embedding is int8 by default: with it in fp32 (as before it was)
    ("dynamic, fp32 patch embedding", dict(activations="dynamic", skip=["patch_embed.proj"])),
    # 7-bit weights (codes in [-64, 64]: the AVX2 kernel's narrow form, faster on CPUs with AVX2 and no VNNI)
    ("dynamic, 7-bit weights", dict(activations="dynamic", weight_bits=7)),
    ("dynamic + smooth auto, 7-bit weights", dict(activations="dynamic", smooth="auto", weight_bits=7)),
    # bf16 (vitfast.quantize(dtype="bf16"): the avx512_bf16 / neon_bf16 GEMMs where the CPU has them)
    ("bf16", dict(dtype="bf16")),
]
MODELS = ("channel-idle", "non-deep", "dwconv", "usdc")


def _quiet():
    return contextlib.redirect_stdout(io.StringIO())


# ---------------------------------------------------------------------------------------------- training
def train_channel_idle(work: str, steps: int, seed: int) -> str:
    from vitfast.demos.demo import run_demo

    out = os.path.join(work, "channel-idle")
    run_demo(steps=steps, threads=1, out_dir=out, seed=seed, progress=False, repeats=2, log=lambda *a: None)
    return os.path.join(out, "fused.safetensors")


def _trainer(model, steps: int, seed: int, lr: float):
    from vitfast.training.data import digits_loaders
    from vitfast.training.trainer import Trainer

    train_loader, val_loader = digits_loaders(img_size=32, batch_size=64, seed=seed)
    return Trainer(model, train_loader, val_loader, total_steps=steps, lr=lr, weight_decay=0.05,
                   warmup_fraction=0.1, grad_clip=1.0, eval_every=steps, seed=seed, progress=False)


def train_nondeep(work: str, steps: int, seed: int) -> str:
    import timm.models.vision_transformer as tvit

    import vitfast
    from vitfast.demos.demo import DEMO_MODEL
    from vitfast.methods.nondeep.schedule import JoinSchedule

    sys.path.insert(0, HERE)
    from nondeep_digits import RECIPES

    recipe = RECIPES["paper"]
    torch.manual_seed(seed)
    deep = tvit.VisionTransformer(**DEMO_MODEL)
    schedule = JoinSchedule("linear", warmup_fraction=recipe["join_fraction"],
                            start_step=int(round(recipe["join_start"] * steps)))
    model = vitfast.convert.from_timm(deep, branches=2, schedule=schedule, diversity_weight=0.05)
    _trainer(model, steps, seed, 2e-3).fit()
    path = os.path.join(work, "non-deep", "fused.safetensors")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    vitfast.save(vitfast.fuse(model.eval()), path)
    return path


def train_dwconv(work: str, steps: int, seed: int) -> str:
    import timm.models.vision_transformer as tvit

    import vitfast
    from vitfast.cli._dwconv_args import convert_dwconv
    from vitfast.demos.demo import DEMO_MODEL

    torch.manual_seed(seed)
    model = convert_dwconv(tvit.VisionTransformer(**DEMO_MODEL), {"dwconv_blocks": [2, 3]})
    _trainer(model, steps, seed, 3e-3).fit()
    path = os.path.join(work, "dwconv", "fused.safetensors")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    vitfast.save(vitfast.fuse(model.eval()), path)
    return path


def train_usdc(work: str, steps: int, seed: int) -> str:
    from vitfast.demos.usdc_study import run_usdc_study

    out = os.path.join(work, "usdc")
    run_usdc_study(levels=["batch"], pretrain_steps=steps, stage1_steps=steps // 2, stage2_steps=steps * 3 // 8,
                   seed=seed, threads=1, progress=False, out_dir=out, log=lambda *a: None)
    return os.path.join(out, "usdc_batch.safetensors")


TRAIN = {"channel-idle": train_channel_idle, "non-deep": train_nondeep, "dwconv": train_dwconv, "usdc": train_usdc}
CACHED = {"channel-idle": "channel-idle/fused.safetensors", "non-deep": "non-deep/fused.safetensors",
          "dwconv": "dwconv/fused.safetensors", "usdc": "usdc/usdc_batch.safetensors"}


# ---------------------------------------------------------------------------------------------- measuring
def data(seed: int):
    from vitfast.training.data import digits_loaders

    train_loader, val_loader = digits_loaders(img_size=32, batch_size=64, seed=seed, augment=False)
    calib = []
    for i, (images, _) in enumerate(train_loader):
        if i >= CALIB_BATCHES:
            break
        calib.append(images)
    val = [(x, y) for x, y in torch.utils.data.DataLoader(val_loader.dataset, batch_size=EVAL_BATCH, shuffle=False)]
    return torch.cat(calib), val


@torch.no_grad()
def logits_of(model, val) -> torch.Tensor:
    model.eval()
    dtype = next(model.parameters()).dtype  # a bf16 copy takes bf16 images
    with torch.no_grad():
        return torch.cat([model(x.to(dtype)).float() for x, _ in val])


def compare(logits: torch.Tensor, ref: torch.Tensor, labels: torch.Tensor) -> Dict[str, Any]:
    """Accuracy vs fp32, and the images whose argmax changed with their fp32 top-1 − top-2 margin and its rank
    (`vitfast.measure.argmax_flips`), next to the median per-image |Δlogits|."""
    acc = float((logits.argmax(-1) == labels).float().mean())
    acc_ref = float((ref.argmax(-1) == labels).float().mean())
    flips = argmax_flips(logits, ref)
    for f in flips["flipped"]:
        i = f["image"]
        f.update(fp32_correct=bool(ref[i].argmax() == labels[i]), int8_correct=bool(logits[i].argmax() == labels[i]))
    return {"top1": acc, "delta_points": 100.0 * (acc - acc_ref),
            "agreement": float((logits.argmax(-1) == ref.argmax(-1)).float().mean()),
            "logit_rel_error": float((logits.double() - ref.double()).norm() / ref.double().norm()),
            "median_abs_dlogits": float((logits - ref).norm(dim=-1).median()), **flips}


def ort_dynamic(fused, val, work_dir: str) -> Dict[str, Any]:
    """ONNX Runtime's one-call dynamic quantization (QInt8 weights, its defaults otherwise) of the exported model."""
    import numpy as np
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from vitfast.export import ort_session, to_onnx

    fp32_path = os.path.join(work_dir, "fused.onnx")
    int8_path = os.path.join(work_dir, "fused.int8.onnx")
    with _quiet():
        to_onnx(fused, fp32_path, input_shape=(3, 32, 32))
        quantize_dynamic(fp32_path, int8_path, weight_type=QuantType.QInt8)
    out = {}
    for name, path in (("fp32", fp32_path), ("int8", int8_path)):
        session = ort_session(path, 1, spinning=False)
        inp = session.get_inputs()[0].name
        out[name] = torch.cat([torch.from_numpy(session.run(None, {inp: x.numpy().astype(np.float32)})[0])
                               for x, _ in val])
    return out


def worst_layer(model) -> Optional[Dict[str, Any]]:
    layers = [layer for layer in (getattr(model, "vitfast_quantization", None) or {}).get("layers", [])
              if layer.get("relative_error") is not None]
    if not layers:
        return None
    worst = max(layers, key=lambda layer: layer["relative_error"])
    return {"path": worst["path"], "kind": worst["kind"], "relative_error": worst["relative_error"]}


def measure(name: str, path: str, calib: torch.Tensor, val, work: str, log=print) -> List[Dict[str, Any]]:
    import vitfast
    from vitfast.nn.int8 import Int8ChannelIdleFFN

    fused = vitfast.load(path)
    labels = torch.cat([y for _, y in val])
    ref = logits_of(fused, val)
    rows = [{"model": name, "variant": "fp32", **compare(ref, ref, labels), "worst_layer": None}]
    variants = list(VARIANTS)
    if any(Int8ChannelIdleFFN.folded_shortcut(m) for m in fused.modules() if hasattr(m, "linear_path")):
        # before/after of split_identity (the default): the shortcut folded into the linear path kept in int8
        variants += [(f"{v}, shortcut in int8 rows", {**kw, "split_identity": False}) for v, kw in VARIANTS
                     if v in ("dynamic", "static + smooth 0.5")]
    for variant, kwargs in variants:
        q = vitfast.quantize(fused, calib, **kwargs)
        rows.append({"model": name, "variant": variant, **compare(logits_of(q, val), ref, labels),
                     "worst_layer": worst_layer(q), "layers": q.vitfast_quantization.get("layers", []),
                     "describe": vitfast.quant.describe(q)})
    try:
        ort = ort_dynamic(fused, val, os.path.dirname(path))
        rows.append({"model": name, "variant": "ORT quantize_dynamic (QInt8)", **compare(ort["int8"], ref, labels),
                     "worst_layer": None,
                     "ort_fp32_max_abs_diff": float((ort["fp32"] - ref).abs().max())})
    except Exception as exc:  # noqa: BLE001 - a model the exporter cannot take is reported, not fatal
        rows.append({"model": name, "variant": "ORT quantize_dynamic (QInt8)", "error": f"{type(exc).__name__}: "
                     f"{str(exc).splitlines()[0][:200]}"})
    for r in rows:
        log(format_row(r))
    return rows


def format_row(r: Dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['model']:<13} {r['variant']:<36} {r['error']}"
    w = r.get("worst_layer")
    worst = f"{w['path']} {w['relative_error']:.2%}" if w else "–"
    flips = "; flips " + ", ".join(f"#{f['image']} (fp32 margin {f['fp32_margin']:.3f}, rank {f['margin_rank']})"
                                   for f in r["flipped"]) if r.get("flipped") else ""
    ok = (abs(r["delta_points"]) <= TARGET_POINTS + 1e-9 and r["agreement"] >= TARGET_AGREEMENT)
    return (f"{r['model']:<13} {r['variant']:<36} top1 {r['top1']:.4f}  Δ {r['delta_points']:+.2f} pt  agree "
            f"{r['agreement']:.2%}  logit err {r['logit_rel_error']:.2%}  worst {worst}"
            f"{'' if r['variant'] == 'fp32' else ('  ok' if ok else '  MISSED')}{flips}")


def table(rows: List[Dict[str, Any]], args) -> Dict[str, Any]:
    out = []
    for r in rows:
        w = r.get("worst_layer")
        row = {"model": r["model"], "variant": r["variant"]}
        if "error" in r:
            row.update(top1="–", delta="–", agreement="–", logit_err="–", worst="–", note=r["error"])
        else:
            row.update(top1=f"{r['top1']:.4f}", delta="–" if r["variant"] == "fp32" else f"{r['delta_points']:+.2f}",
                       agreement="–" if r["variant"] == "fp32" else f"{r['agreement']:.2%}",
                       logit_err="–" if r["variant"] == "fp32" else f"{r['logit_rel_error']:.2%}",
                       worst=f"{w['path']} ({w['relative_error']:.2%})" if w else "–",
                       note="; ".join(f"#{f['image']} flips (fp32 margin {f['fp32_margin']:.3f}, rank "
                                      f"{f['margin_rank']} of 360)" for f in r["flipped"]))
        if r["variant"] == "fp32" and "fp32_median_margin" in r:
            row["note"] = (f"fp32 margins: median {r['fp32_median_margin']:.2f}, 3 smallest "
                           f"{', '.join(f'{v:.3f}' for v in r['fp32_smallest_margins'])}")
        out.append(row)
    return {
        "title": "int8 accuracy on the digits: vitfast.quantize variants and ORT quantize_dynamic, vs fp32, per method",
        "script": "benchmarks/quant_digits.py",
        "command": "PYTHONPATH=$PWD python benchmarks/quant_digits.py " + " ".join(sys.argv[1:]),
        "conditions": (f"one thread; digits ViT 32×32, patch 8, width 96, 4 heads, seed {args.seed}, {args.steps} "
                       f"training steps (USDC: {args.steps} + {args.steps // 2} + {args.steps * 3 // 8}); 360 "
                       f"validation images (one image = 0.28 points), batches of {EVAL_BATCH}; calibration: "
                       f"{CALIB_BATCHES * 64} unaugmented training images; smooth 0.5: SmoothQuant α 0.5, smooth auto: α "
                       f"per layer from (none, 0.3, 0.5, 0.7, 0.85) by its own calibration error; 'shortcut in int8 "
                       f"rows': split_identity=False (the BatchNorm FFN's folded shortcut quantized with its linear "
                       f"path, the behaviour before split_identity); worst layer: "
                       f"the layer's own relative output error on the calibration images; ORT: "
                       f"onnxruntime.quantization.quantize_dynamic(weight_type=QInt8) of vitfast.export.to_onnx's "
                       f"graph; targets |Δ top-1| ≤ {TARGET_POINTS} pt and agreement ≥ {TARGET_AGREEMENT:.1%}"),
        "columns": [{"label": "model", "fmt": "{model}"}, {"label": "variant", "fmt": "{variant}"},
                    {"label": "top-1", "fmt": "{top1}"}, {"label": "Δ top-1 (pt)", "fmt": "{delta}"},
                    {"label": "argmax agreement", "fmt": "{agreement}"},
                    {"label": "rel. logit error", "fmt": "{logit_err}"},
                    {"label": "worst layer (rel. error)", "fmt": "{worst}"},
                    {"label": "argmax flips (fp32 top-1 − top-2 margin; rank 0 = smallest)", "fmt": "{note}"}],
        "rows": out,
    }


def study_box() -> Dict[str, str]:
    """The results file of the digits int8 accuracy studies (this one and quant_ffn_two_paths.py)."""
    sys.path.insert(0, HERE)
    import results_file

    box = results_file.machine()
    return {"id": f"{box['id'].rsplit('-', 1)[0]}-quant-digits",
            "description": f"{box['description']}; one thread; accuracy on scikit-learn's digits (seeded)"}


def record(tab: Dict[str, Any]) -> str:
    import results_file

    return results_file.record("quant_digits", tab, box=study_box())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="quant-digits", help="trained fused models are cached here")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.makedirs(args.work, exist_ok=True)
    calib, val = data(args.seed)
    rows: List[Dict[str, Any]] = []
    for name in args.models:
        path = os.path.join(args.work, CACHED[name])
        if not os.path.exists(path):
            t0 = time.perf_counter()
            built = TRAIN[name](args.work, args.steps, args.seed)
            assert os.path.abspath(built) == os.path.abspath(path), (built, path)
            print(f"[{name}] trained in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        rows += measure(name, path, calib, val, args.work)
    with open(os.path.join(args.work, "rows.json"), "w") as f:
        json.dump(rows, f, indent=1)
    if not args.no_record:
        print(record(table(rows, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
