"""Non-deep ViT on the digits: does progressive joining of n branches beat a plain model of the fused depth?

    vitfast demo --nondeep                      # or: python -m vitfast demo --nondeep --branches 2 --steps 800

Trains, from the same seed, with the same optimiser, steps and data order:
  * "single": a plain timm ViT of depth L/n (the depth the non-deep model fuses to);
  * "non-deep": a ViT of depth L converted to L/n blocks of n parallel branches (`convert.from_timm(branches=n)`),
    trained in the paper's three phases (sections 3.4, 4, appendix A.2/B): the branches first train apart
    (λ = 0, the paper's pre-training of the branched model: the first `join_start` = 1/2 of the steps), then
    the λ warm-up (linear by default: λ = t over `join_fraction` = 1/6 of the remaining steps, the paper's
    10k of 10k + 50k) and the post-joining adjustment phase at λ = 1; diversity regulariser α = 0.05;
then fuses the non-deep model (exact, λ = 1) and reports the three validation accuracies (single, non-deep
train-time, non-deep fused).  The issue's target: non-deep ≥ single at the same fused depth and steps.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional

import torch

from ..measure import count_parameters, format_table
from .demo import DEMO_MODEL, QUICK_MODEL

__all__ = ["run_nondeep_comparison"]


def run_nondeep_comparison(
    *,
    branches: int = 2,
    steps: Optional[int] = None,
    schedule: str = "linear",
    join_fraction: float = 1.0 / 6.0,
    join_start: float = 0.5,
    join_values: bool = False,
    diversity_weight: float = 0.05,
    lr: float = 3e-3,
    threads: Optional[int] = None,
    out_dir: str = "vitfast-nondeep",
    quick: bool = False,
    seed: int = 0,
    progress: bool = True,
    log=print,
) -> Dict[str, Any]:
    """Train both models and return {"single": acc, "nondeep": acc, "nondeep_fused": acc, ...} (module doc)."""
    import timm.models.vision_transformer as tvit

    import vitfast

    from ..io.trainable import save_trainable
    from ..methods.nondeep.schedule import JoinSchedule
    from ..training.data import digits_loaders
    from ..training.trainer import Trainer

    if isinstance(branches, bool) or not isinstance(branches, int) or branches < 2:
        raise ValueError(f"branches: expected an int >= 2, got {branches!r}")
    if isinstance(join_start, bool) or not isinstance(join_start, (int, float)) or not 0.0 <= join_start < 1.0:
        raise ValueError(f"join_start: expected a fraction of the steps in [0, 1), got {join_start!r}")
    if not lr > 0:
        raise ValueError(f"lr: expected > 0, got {lr!r}")
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads: expected >= 1, got {threads}")
        torch.set_num_threads(threads)
    cfg = dict(QUICK_MODEL if quick else DEMO_MODEL)
    cfg["depth"] = 2 * branches if quick else max(cfg["depth"], 2 * branches)  # L: at least 2 fused layers
    fused_depth = cfg["depth"] // branches
    steps = steps if steps is not None else (60 if quick else 800)
    if steps < 1:
        raise ValueError(f"steps: expected >= 1, got {steps}")
    start = int(round(join_start * steps))
    os.makedirs(out_dir, exist_ok=True)
    train_loader, val_loader = digits_loaders(img_size=cfg["img_size"], batch_size=64, seed=seed)
    log(f"vitfast non-deep comparison on digits: ViT(patch {cfg['patch_size']}, width {cfg['embed_dim']}, heads "
        f"{cfg['num_heads']}), {steps} steps each, AdamW lr {lr:g} for both, {torch.get_num_threads()} CPU thread(s):\n"
        f"  single   = plain ViT of depth {fused_depth}\n"
        f"  non-deep = depth {cfg['depth']} as {fused_depth} blocks x {branches} branches: λ = 0 for {start} steps, "
        f"then {schedule} joining over {join_fraction:.3g} of the rest, then λ = 1; diversity α = {diversity_weight}")

    def train(model, desc):
        trainer = Trainer(
            model, train_loader, val_loader, total_steps=steps, lr=lr, weight_decay=0.05, warmup_fraction=0.1,
            grad_clip=1.0, eval_every=max(1, steps // 4), seed=seed, progress=progress, desc=desc,
        )
        summary = trainer.fit()
        model.eval()
        return trainer, summary

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    single = tvit.VisionTransformer(**{**cfg, "depth": fused_depth})
    single_trainer, single_summary = train(single, "single")
    acc_single = single_trainer.evaluate()["acc"]

    torch.manual_seed(seed)
    deep = tvit.VisionTransformer(**cfg)
    nondeep = vitfast.convert.from_timm(
        deep, branches=branches, schedule=JoinSchedule(schedule, warmup_fraction=join_fraction, start_step=start),
        join_values=join_values, diversity_weight=diversity_weight,
    )
    nd_trainer, nd_summary = train(nondeep, "non-deep")
    acc_nondeep = nd_trainer.evaluate()["acc"]
    lam = [float(b.lam) for b in nondeep.blocks]
    fused = vitfast.fuse(nondeep)
    acc_fused = nd_trainer.evaluate(model=fused)["acc"]
    save_trainable(nondeep, os.path.join(out_dir, "nondeep.safetensors"))
    vitfast.save(fused, os.path.join(out_dir, "nondeep_fused.safetensors"))
    report = {
        "branches": branches, "steps": steps, "schedule": schedule, "join_fraction": join_fraction,
        "join_start": join_start,
        "join_values": join_values, "diversity_weight": diversity_weight, "lr": lr, "seed": seed, "fused_depth": fused_depth,
        "single": acc_single, "nondeep": acc_nondeep, "nondeep_fused": acc_fused, "lambda_end": lam,
        "params": {"single": count_parameters(single), "nondeep_train": count_parameters(nondeep),
                   "nondeep_fused": count_parameters(fused)},
        "seconds": time.perf_counter() - t0,
    }
    log(format_table(
        ["model", "layers", "params", "val acc"],
        [["single", str(fused_depth), f"{report['params']['single']:,}", f"{acc_single:.4f}"],
         ["non-deep (train-time)", f"{fused_depth} x {branches} branches", f"{report['params']['nondeep_train']:,}",
          f"{acc_nondeep:.4f}"],
         ["non-deep (fused)", str(fused_depth), f"{report['params']['nondeep_fused']:,}", f"{acc_fused:.4f}"]],
    ))
    verdict = "reaches" if acc_fused >= acc_single else "does NOT reach"
    log(f"non-deep fused {verdict} the single-branch accuracy ({acc_fused:.4f} vs {acc_single:.4f}); "
        f"λ at the end {lam}; {report['seconds']:.0f} s")
    return report
