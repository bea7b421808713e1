"""Issue 4, target (c): on the digits, does a 2-branch non-deep ViT (progressive joining) reach the accuracy of a
plain ViT of the depth it fuses to, trained for the same steps?  Several seeds, the same LR grid for both.

    cd <repo> && PYTHONPATH=$PWD python benchmarks/nondeep_digits.py                  # the README table
    PYTHONPATH=$PWD python benchmarks/nondeep_digits.py --seeds 0 1 2 --lrs 1e-3 --steps 400 --recipes paper start0

Per (seed, lr) it trains, with one thread, the same data order, augmentation, optimiser (AdamW, weight decay
0.05, LR warm-up 10% then cosine), gradient clipping and step count:
  * single:  a plain timm ViT of depth L/n (`vitfast.demos.demo.DEMO_MODEL`: patch 8, width 96, 4 heads);
  * non-deep (one row per recipe): a depth-L ViT from the same seed converted with
    `vitfast.convert.from_timm(branches=n)` into L/n blocks of n branches, joined with the linear λ schedule,
    diversity α = 0.05, then fused (`vitfast.fuse`, exact) and evaluated fused.
Recipes (`RECIPES`; fractions of the run): "start0" — joining from step 0 over 1/6 of the steps, then λ = 1 (the
previous default); "paper" — the branches first train apart (λ = 0, the paper's pre-training of the branched
model), then the 1 : 5 warm-up : adjustment split of the paper's 10k + 50k steps (appendix A.2, B.1).
The "-lr" recipes are an experiment, not part of vitfast: AdamW steps the branch parameters with
lr / (1 + (n − 1)λ) and weight decay × (1 + (n − 1)λ) (`_joined_adamw`), so that once joined (λ = 1) the fused
weight Σ_b W_b, whose n terms all get the same gradient, moves and decays like one weight of the single model.

Results are appended to OUT/results.jsonl as they come (a rerun skips the runs already there) and the table is
printed at the end: per seed, and mean ± std over seeds, for every (model, lr); then, for each model, its best
LR by mean accuracy (the same selection for every model, so neither side is tuned harder).  The validation split
(20% of the 1797 digits, 360 images, stratified) depends on the seed: 1 image = 0.0028 accuracy.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Any, Dict, List

import torch

RECIPES: Dict[str, Dict[str, Any]] = {
    # previous default: λ 0 -> 1 over the first 1/6 of the steps, then λ = 1 (adjustment) for the rest
    "start0": dict(join_start=0.0, join_fraction=1.0 / 6.0, branch_lr="none"),
    "start0-lr": dict(join_start=0.0, join_fraction=1.0 / 6.0, branch_lr="joined"),
    # paper: the branched model trains apart first (λ = 0), then warm-up : adjustment = 10k : 50k
    "paper": dict(join_start=0.5, join_fraction=1.0 / 6.0, branch_lr="none"),
    "paper-lr": dict(join_start=0.5, join_fraction=1.0 / 6.0, branch_lr="joined"),
}


def _key(run: Dict[str, Any]) -> str:
    return json.dumps({k: run[k] for k in ("model", "seed", "lr", "steps", "branches")}, sort_keys=True)


def _joined_adamw(model, lr):
    """The "-lr" recipes (module doc): AdamW whose branch groups step with lr / (1 + (n-1)λ), wd × (1 + (n-1)λ)."""
    from vitfast.methods.nondeep.modules import NonDeepBlock

    blocks = [m for m in model.modules() if isinstance(m, NonDeepBlock)]
    branch_ids = {id(p) for b in blocks for p in b.parameters()}

    class JoinedAdamW(torch.optim.AdamW):
        def step(self, closure=None):
            n = blocks[0].num_branches
            s = 1.0 + (n - 1) * float(blocks[0].lam)
            saved = [(g["lr"], g["weight_decay"]) for g in self.param_groups]
            for g in self.param_groups:
                if g.get("branch"):
                    g["lr"], g["weight_decay"] = g["lr"] / s, g["weight_decay"] * s
            try:
                return super().step(closure)
            finally:
                for g, (a, b) in zip(self.param_groups, saved):
                    g["lr"], g["weight_decay"] = a, b

    def factory(groups):
        out = []
        for g in groups:
            br = [p for p in g["params"] if id(p) in branch_ids]
            rest = [p for p in g["params"] if id(p) not in branch_ids]
            if br:
                out.append({**g, "params": br, "branch": True})
            if rest:
                out.append({**g, "params": rest})
        return JoinedAdamW(out, lr=lr)

    return factory


def train_one(model_name: str, *, seed: int, lr: float, steps: int, branches: int, progress: bool) -> Dict[str, Any]:
    """Train one model on the digits and return its validation accuracy (fused accuracy too for non-deep)."""
    import timm.models.vision_transformer as tvit

    import vitfast
    from vitfast.training.data import digits_loaders
    from vitfast.demos.demo import DEMO_MODEL
    from vitfast.methods.nondeep.schedule import JoinSchedule
    from vitfast.training.trainer import Trainer

    cfg = dict(DEMO_MODEL)
    cfg["depth"] = max(cfg["depth"], 2 * branches)
    fused_depth = cfg["depth"] // branches
    train_loader, val_loader = digits_loaders(img_size=cfg["img_size"], batch_size=64, seed=seed)
    torch.manual_seed(seed)
    if model_name == "single":
        model = tvit.VisionTransformer(**{**cfg, "depth": fused_depth})
        recipe = None
    else:
        recipe = RECIPES[model_name]
        deep = tvit.VisionTransformer(**cfg)
        start = int(round(recipe["join_start"] * steps))
        schedule = JoinSchedule("linear", warmup_fraction=recipe["join_fraction"], start_step=start)
        model = vitfast.convert.from_timm(deep, branches=branches, schedule=schedule, diversity_weight=0.05)
    optimizer = "adamw"
    if recipe is not None and recipe["branch_lr"] == "joined":
        optimizer = _joined_adamw(model, lr)
    trainer = Trainer(model, train_loader, val_loader, total_steps=steps, lr=lr, weight_decay=0.05,
                      warmup_fraction=0.1, grad_clip=1.0, eval_every=steps, seed=seed, progress=progress,
                      desc=f"{model_name} s{seed} lr{lr:g}", optimizer=optimizer)
    trainer.fit()
    model.eval()
    out = {"acc": trainer.evaluate()["acc"]}
    if recipe is not None:
        out["lambda_end"] = [float(b.lam) for b in model.blocks]
        out["acc_fused"] = trainer.evaluate(model=vitfast.fuse(model))["acc"]
    return out


def _fmt(values: List[float]) -> str:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.4f} ± {std:.4f}"


def print_table(runs: List[Dict[str, Any]], models: List[str], seeds: List[int], lrs: List[float], log=print) -> None:
    by = {(r["model"], r["seed"], r["lr"]): r for r in runs}
    log(f"\nval accuracy (digits, {runs[0]['steps']} steps, {runs[0]['branches']} branches; non-deep = fused model)")
    header = ["model", "lr"] + [f"seed {s}" for s in seeds] + ["mean ± std"]
    rows, means = [], {}
    for model in models:
        for lr in lrs:
            accs = [by[(model, s, lr)]["acc_fused" if model != "single" else "acc"] for s in seeds
                    if (model, s, lr) in by]
            if len(accs) != len(seeds):
                continue
            means[(model, lr)] = statistics.fmean(accs)
            rows.append([model, f"{lr:g}"] + [f"{a:.4f}" for a in accs] + [_fmt(accs)])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for row in [header] + rows:
        log("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))
    log("\nbest LR per model (by mean over seeds; the same grid for every model):")
    for model in models:
        cands = [(m, lr) for (m, lr) in means if m == model]
        if cands:
            best = max(cands, key=lambda k: means[k])
            accs = [by[(model, s, best[1])]["acc_fused" if model != "single" else "acc"] for s in seeds]
            log(f"  {model:<10} lr {best[1]:g}: {_fmt(accs)}  per seed {' '.join(f'{a:.4f}' for a in accs)}")
    if "single" in models:
        for model in models:
            if model == "single":
                continue
            for lr in lrs:
                if (model, lr) in means and ("single", lr) in means:
                    diffs = [by[(model, s, lr)]["acc_fused"] - by[("single", s, lr)]["acc"] for s in seeds]
                    wins = sum(d >= 0 for d in diffs)
                    log(f"  {model} - single at lr {lr:g}: mean {statistics.fmean(diffs):+.4f}, "
                        f"non-deep >= single in {wins}/{len(diffs)} seeds")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 2e-3, 4e-3])
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--branches", type=int, default=2)
    p.add_argument("--recipes", nargs="+", default=["paper"], choices=sorted(RECIPES))
    p.add_argument("--out", default="nondeep-digits")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from tqdm import tqdm

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.jsonl")
    done: Dict[str, Dict[str, Any]] = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                done[_key(r)] = r
    models = ["single"] + list(args.recipes)
    todo = [dict(model=m, seed=s, lr=lr, steps=args.steps, branches=args.branches)
            for s in args.seeds for lr in args.lrs for m in models]
    runs = []
    bar = tqdm(todo, desc="runs", disable=args.no_progress, file=sys.stderr)
    for run in bar:
        key = _key(run)
        if key in done:
            runs.append(done[key])
            continue
        bar.set_postfix_str(f"{run['model']} seed {run['seed']} lr {run['lr']:g}")
        t0 = time.process_time()
        result = train_one(run["model"], seed=run["seed"], lr=run["lr"], steps=run["steps"],
                           branches=run["branches"], progress=False)
        run = {**run, **result, "cpu_s": time.process_time() - t0}
        if run["model"] in RECIPES:
            run["recipe"] = RECIPES[run["model"]]
            if not math.isclose(run["acc"], run["acc_fused"], abs_tol=1.5 / 360):
                print(f"warning: fused accuracy {run['acc_fused']} != train-time {run['acc']}", file=sys.stderr)
        with open(path, "a") as f:
            f.write(json.dumps(run) + "\n")
        runs.append(run)
    print_table(runs, models, args.seeds, args.lrs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
