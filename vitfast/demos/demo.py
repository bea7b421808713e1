"""`vitfast demo`: the whole path on real data, in about two minutes on a laptop CPU.

    digits (scikit-learn, 8x8, no download) → small timm ViT → convert (channel-idle θ=0.75, BatchNorm FFNs)
    → train (vitfast.training.Trainer) → fuse → vitfast.save → vitfast.load → compare train-time vs fused

The comparison table is measured, never assumed: accuracy of both models on the same validation images,
max |Δlogits| between them, parameter counts, FLOPs per image (PyTorch's FlopCounterMode: matmuls,
convolutions and attention, 2 FLOPs per multiply-add), and latency (median over interleaved rounds, so a
busy machine slows both models alike; in each round a model runs LATENCY_BURST calls back to back and the round
counts the median of all but the first, so neither model is timed on caches the other just used) with the
throughput it implies.

Also here, shared with `vitfast bench`: `count_parameters`, `flops_per_image`, `measure_latency`.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional

import torch
import torch.nn as nn

from ..measure import argmax_flips, count_parameters, flips_text, flops_per_image, format_table, measure_latency

__all__ = ["run_demo", "count_parameters", "flops_per_image", "measure_latency", "format_table", "DEMO_MODEL"]

# A ViT small enough to train to >90% on the digits in ~800 steps on a CPU: 32x32 input, 8x8 patches
# (16 tokens + cls: each token covers 2x2 of the original 8x8 pixels), width 96, 4 blocks.
DEMO_MODEL = dict(img_size=32, patch_size=8, embed_dim=96, depth=4, num_heads=4, mlp_ratio=4.0, num_classes=10)
QUICK_MODEL = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=4.0, num_classes=10)
# Calls per model per latency round (measure_latency's burst): the fused model fits in the caches, and timed right
# after the train-time model (burst 1) its batch-1 call took 0.28 ms against 0.15 ms back to back.
LATENCY_BURST = 4


# ---------------------------------------------------------------------------------------------- the demo
@torch.no_grad()
def _predict(model: nn.Module, loader) -> tuple:
    model.eval()
    logits, labels = [], []
    for images, targets in loader:
        logits.append(model(images))
        labels.append(targets)
    return torch.cat(logits), torch.cat(labels)


def run_demo(
    *,
    steps: Optional[int] = None,
    threads: Optional[int] = None,
    out_dir: str = "vitfast-demo",
    quick: bool = False,
    seed: int = 0,
    channel_idle: float = 0.75,
    progress: bool = True,
    repeats: Optional[int] = None,
    log=print,
) -> Dict[str, Any]:
    """Run the demo; returns the measured report (and prints the table through `log`).

    `quick` is a tiny model and a few steps (the test suite's end-to-end check, seconds not minutes).
    """
    import timm.models.vision_transformer as tvit

    import vitfast

    from ..io.trainable import save_trainable
    from ..training.data import digits_loaders
    from ..training.trainer import Trainer

    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads: expected >= 1, got {threads}")
        torch.set_num_threads(threads)
    cfg = dict(QUICK_MODEL if quick else DEMO_MODEL)
    steps = steps if steps is not None else (300 if quick else 800)
    if steps < 1:
        raise ValueError(f"steps: expected >= 1, got {steps}")
    repeats = repeats if repeats is not None else (5 if quick else 30)
    os.makedirs(out_dir, exist_ok=True)
    t_start = time.perf_counter()

    train_loader, val_loader = digits_loaders(img_size=cfg["img_size"], batch_size=64, seed=seed)
    torch.manual_seed(seed)
    timm_model = tvit.VisionTransformer(**cfg)
    model = vitfast.convert.from_timm(timm_model, channel_idle=channel_idle, norm="batch")
    log(
        f"vitfast demo: digits ({len(train_loader.dataset)} train / {len(val_loader.dataset)} val images, "
        f"{cfg['img_size']}x{cfg['img_size']}), timm VisionTransformer(patch {cfg['patch_size']}, width "
        f"{cfg['embed_dim']}, depth {cfg['depth']}, heads {cfg['num_heads']}) with channel-idle FFNs "
        f"(θ={channel_idle}, BatchNorm), {steps} steps on {torch.get_num_threads()} CPU thread(s)"
    )
    trainer = Trainer(
        model, train_loader, val_loader, total_steps=steps, lr=3e-3, weight_decay=0.05, warmup_fraction=0.1,
        grad_clip=1.0, eval_every=max(1, steps // 4), seed=seed, progress=progress, desc="demo",
    )
    summary = trainer.fit()
    train_seconds = summary["seconds"]

    model.eval()
    train_path = os.path.join(out_dir, "train.safetensors")
    save_trainable(model, train_path, recipe={"demo": True, "model": cfg, "channel_idle": channel_idle, "norm": "batch"})
    fused_path = os.path.join(out_dir, "fused.safetensors")
    vitfast.save(vitfast.fuse(model), fused_path)
    fused = vitfast.load(fused_path)  # what a user ships: the file, not the in-memory object

    logits_t, labels = _predict(model, val_loader)
    logits_f, _ = _predict(fused, val_loader)
    correct_t = int((logits_t.argmax(-1) == labels).sum())
    correct_f = int((logits_f.argmax(-1) == labels).sum())
    n_val = int(labels.numel())
    max_diff = float((logits_t - logits_f).abs().max())
    agree = float((logits_t.argmax(-1) == logits_f.argmax(-1)).float().mean())

    shape = (3, cfg["img_size"], cfg["img_size"])
    models = {"train": model, "fused": fused}
    params = {k: count_parameters(m) for k, m in models.items()}
    flops = {k: flops_per_image(m, shape) for k, m in models.items()}
    latency = {}
    for batch in (1, 64):
        x = torch.randn(batch, *shape)
        latency[batch] = measure_latency(models, x, repeats=repeats, warmup=2 if quick else 5, burst=LATENCY_BURST)

    def ratio(a, b):
        return f"{a / b:.2f}x" if b else "-"

    rows = [
        ["val accuracy", f"{correct_t / n_val:.4f} ({correct_t}/{n_val})", f"{correct_f / n_val:.4f} ({correct_f}/{n_val})",
         "equal" if correct_t == correct_f else "DIFFERENT"],
        ["max |Δlogits| (val set)", "-", f"{max_diff:.2e}", f"argmax agree {agree:.2%}"],
        ["parameters", f"{params['train']:,}", f"{params['fused']:,}", ratio(params["fused"], params["train"])],
        ["MFLOPs / image", f"{flops['train'] / 1e6:.2f}", f"{flops['fused'] / 1e6:.2f}", ratio(flops["fused"], flops["train"])],
    ]
    for batch, lat in latency.items():
        t, f = lat["train"], lat["fused"]
        rows.append([
            f"latency batch {batch} (ms, median [p10-p90])",
            f"{t['median_ms']:.2f} [{t['p10_ms']:.2f}-{t['p90_ms']:.2f}]",
            f"{f['median_ms']:.2f} [{f['p10_ms']:.2f}-{f['p90_ms']:.2f}]",
            f"{t['median_ms'] / f['median_ms']:.2f}x faster",
        ])
        rows.append([f"throughput batch {batch} (img/s)", f"{t['images_per_s']:.0f}", f"{f['images_per_s']:.0f}",
                     ratio(f["images_per_s"], t["images_per_s"])])
    table = format_table(["", "train-time (eval)", "fused (vitfast.load)", "fused vs train"], rows)
    int8 = _int8_comparison(fused, fused_path, out_dir, cfg, val_loader, logits_f, labels, seed, repeats, quick)
    total_seconds = time.perf_counter() - t_start
    log("")
    log(table)
    log("")
    log(int8["title"])
    log(int8["table"])
    log(int8["verdict"])
    log("")
    log(
        f"training {train_seconds:.1f} s, whole demo {total_seconds:.1f} s; latency: {repeats} interleaved rounds of "
        f"{LATENCY_BURST} calls per model (median of calls 2-{LATENCY_BURST}) on {torch.get_num_threads()} "
        f"thread(s), backend {vitfast.get_backend()} (CPU path {vitfast.ops.cpu_isa()})"
    )
    log(f"files: {train_path} (train-time), {fused_path} (fused); check them with "
        f"`vitfast verify {fused_path} --source {train_path}`")
    return {
        "accuracy_train": correct_t / n_val,
        "accuracy_fused": correct_f / n_val,
        "correct_train": correct_t,
        "correct_fused": correct_f,
        "n_val": n_val,
        "max_abs_diff": max_diff,
        "argmax_agreement": agree,
        "params": params,
        "flops": flops,
        "latency": latency,
        "train_seconds": train_seconds,
        "total_seconds": total_seconds,
        "eval_history": trainer.eval_history,
        "table": table,
        "train_path": train_path,
        "fused_path": fused_path,
        "accuracy_equal": correct_t == correct_f,
        "int8": {k: v for k, v in int8.items() if k not in ("title", "table", "verdict")},
        "int8_table": int8["table"],
    }


def _int8_comparison(fused, fused_path, out_dir, cfg, val_loader, logits_f, labels, seed, repeats, quick):
    """The fused model quantized (vitfast.quantize: dynamic per-token int8, SmoothQuant α chosen per layer on 256
    unaugmented training images), saved and loaded back, against the fused fp32 model: accuracy, agreement, file
    size, latency."""
    import vitfast

    from ..cli.verify import MAX_TOP1_DROP_POINTS, MIN_ARGMAX_AGREEMENT, meets_accuracy_targets
    from ..training.data import digits_loaders

    calib_loader, _ = digits_loaders(img_size=cfg["img_size"], batch_size=64, seed=seed, augment=False)
    calibration = [images for _, (images, _) in zip(range(4), calib_loader)]
    int8_path = os.path.join(out_dir, "int8.safetensors")
    vitfast.save(vitfast.quantize(fused, calibration, smooth="auto"), int8_path)
    int8 = vitfast.load(int8_path)
    logits_q, _ = _predict(int8, val_loader)
    n_val = int(labels.numel())
    correct_f = int((logits_f.argmax(-1) == labels).sum())
    correct_q = int((logits_q.argmax(-1) == labels).sum())
    agree = float((logits_q.argmax(-1) == logits_f.argmax(-1)).float().mean())
    sizes = {"fused": os.path.getsize(fused_path), "int8": os.path.getsize(int8_path)}
    shape = (3, cfg["img_size"], cfg["img_size"])
    rows = [
        ["val accuracy", f"{correct_f / n_val:.4f} ({correct_f}/{n_val})", f"{correct_q / n_val:.4f} ({correct_q}/{n_val})",
         f"{(correct_q - correct_f) / n_val * 100:+.2f} pt"],
        ["argmax agreement with fp32", "-", f"{agree:.2%}", ""],
        ["file size (MB)", f"{sizes['fused'] / 1e6:.2f}", f"{sizes['int8'] / 1e6:.2f}", f"{sizes['int8'] / sizes['fused']:.2f}x"],
    ]
    latency = {}
    for batch in (1, 64):
        lat = measure_latency({"fused": fused, "int8": int8}, torch.randn(batch, *shape), repeats=repeats,
                              warmup=2 if quick else 5, burst=LATENCY_BURST)
        latency[batch] = lat
        f, q = lat["fused"], lat["int8"]
        rows.append([f"latency batch {batch} (ms, median [p10-p90])",
                     f"{f['median_ms']:.2f} [{f['p10_ms']:.2f}-{f['p90_ms']:.2f}]",
                     f"{q['median_ms']:.2f} [{q['p10_ms']:.2f}-{q['p90_ms']:.2f}]",
                     f"{f['median_ms'] / q['median_ms']:.2f}x {'faster' if q['median_ms'] < f['median_ms'] else 'SLOWER'}"])
    drop = (correct_f - correct_q) / n_val * 100
    met = meets_accuracy_targets(drop, agree)
    flips = argmax_flips(logits_q, logits_f)
    verdict = (f"int8 accuracy targets (at most {MAX_TOP1_DROP_POINTS} pt below fp32, at least "
               f"{MIN_ARGMAX_AGREEMENT:.1%} agreement): " + ("met" if met else
               f"MISSED on this model ({(correct_q - correct_f) / n_val * 100:+.2f} pt, {agree:.2%}; "
               f"docs/quantization.md, Accuracy)")
               + f"\n{flips_text(flips, n_val)}")
    return {
        "verdict": verdict, "targets_met": met,
        "title": (f"int8 ({int8_path}: vitfast.quantize, dynamic per-token activations, SmoothQuant α per layer; "
                  f"{vitfast.ops.int8_kernel()} kernels)"),
        "table": format_table(["", "fused fp32", "int8", "int8 vs fp32"], rows),
        "accuracy": correct_q / n_val, "correct": correct_q, "argmax_agreement": agree, "file_bytes": sizes["int8"],
        "argmax_flips": flips,
        "latency": latency, "path": int8_path,
    }
