"""Issue 30, part 5: each paper's recipe (`vitfast train --recipe NAME`) against vitfast's defaults on the digits and
on an image folder made from them, the same model, steps and batch; and an interrupted + resumed recipe run against
the uninterrupted one (bit-identical weights).

    cd <repo> && OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/recipe_digits.py --work runs/recipe-digits

Every run goes through `vitfast train` (the command line, in this process, one thread), so a recipe is applied as a
user gets it.  The model: a timm ViT (`vit_tiny_patch16_224` reshaped: 32x32 input, patch 8, width 64, 4 blocks,
2 heads) made into each method's train-time model — channel-idle FFNs θ = 0.75 (repavit), 2 branches (nondeep),
DW-conv heads in blocks 1 and 2 (dwconv), USDC gates with a 0.7 FLOPs target (usdc), a 2-block student built from a
4-block teacher that was trained first with the defaults (distill).

Scaling ImageNet recipes down to the digits (docs/training.md): the run's length is --steps (the recipe's epochs
are replaced; its warm-up keeps the paper's share of the run, and the non-deep join start its fraction), the batch
is --batch-size for both sides, and a recipe's lr follows that batch by the recipe's own rule (linear or sqrt, from
the paper's batch: 4096 for RePaViT, 1024 for the non-deep ViT, 256 for USDC; none where the paper gives no batch).
Everything else is the paper's (optimizer, weight decay, min lr, mixup/cutmix, label smoothing, random erasing,
drop-path, layer decay, method schedule).  On the digits RandAugment and colour jitter do not apply (rendered
tensors); on the image folder they do (timm's create_transform).

The table goes to benchmarks/results/<date>-<machine>-recipe-digits.json (`results_file` schema) unless --no-record.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any, Dict, List

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = ["vit_tiny_patch16_224", "--img-size", "32", "--model-kwargs",
         json.dumps({"patch_size": 8, "embed_dim": 64, "depth": 4, "num_heads": 2})]
METHOD_FLAGS = {
    "repavit": ["--channel-idle", "0.75"],
    "nondeep": ["--branches", "2"],
    "dwconv": ["--dwconv-blocks", "[1, 2]"],
}


def _cli(argv: List[str]) -> None:
    from vitfast.cli import main

    code = main(argv)
    if code != 0:
        raise RuntimeError(f"vitfast {' '.join(argv)}: exit status {code}")


@contextlib.contextmanager
def _stop_at(step: int):
    """`Trainer.fit()` stops after `step` steps (checkpoint written, as a stop by signal would): the interrupted run."""
    from vitfast.training.trainer import Trainer

    original = Trainer.fit

    def fit(self, until_step=None):
        return original(self, until_step=step if until_step is None else until_step)

    Trainer.fit = fit
    try:
        yield
    finally:
        Trainer.fit = original


def _acc(out: str) -> float:
    state = torch.load(os.path.join(out, "trainer.pt"), map_location="cpu", weights_only=True)
    return float(state["last_eval"]["acc"])


def _same_weights(a: str, b: str) -> bool:
    from safetensors.torch import load_file

    ta, tb = load_file(os.path.join(a, "model.safetensors")), load_file(os.path.join(b, "model.safetensors"))
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def _source(recipe: str, work: str, steps: int, common: List[str]) -> List[str]:
    """SOURCE and method flags of `vitfast train` for this recipe's model (files made once, under `work`)."""
    if recipe in METHOD_FLAGS:
        return MODEL + METHOD_FLAGS[recipe]
    if recipe == "usdc":
        path = os.path.join(work, "usdc-gates.safetensors")
        if not os.path.exists(path):
            _cli(["convert", *MODEL, "--num-classes", "10", "--gates", "--flops-target", "0.7", "-o", path])
        return [path]
    teacher = os.path.join(work, "teacher")  # distill: a 4-block ViT trained with the defaults, then a 2-block student
    if not os.path.exists(os.path.join(teacher, "model.safetensors")):
        _cli(["train", *MODEL, "--steps", str(steps), *common, "--out", teacher])
    return ["--teacher", os.path.join(teacher, "model.safetensors"), "--student-depth", "2"]


def run(recipes: List[str], steps: int, batch: int, work: str, folder: bool) -> List[Dict[str, Any]]:
    from vitfast.training.data import write_digits_image_folder

    os.makedirs(work, exist_ok=True)
    data = {"digits": []}
    if folder:
        train_dir, val_dir = os.path.join(work, "digits-folder", "train"), os.path.join(work, "digits-folder", "val")
        if not os.path.isdir(val_dir):
            write_digits_image_folder(os.path.join(work, "digits-folder"), size=32)
        data["folder"] = ["--data", train_dir, "--val-data", val_dir]
    common = ["--batch-size", str(batch), "--seed", "0", "--no-progress"]
    rows = []
    for recipe in recipes:
        source = _source(recipe, work, steps, common)
        for kind, data_flags in data.items():
            base = [*source, *data_flags, "--steps", str(steps), *common]
            out = {name: os.path.join(work, recipe, kind, name) for name in ("default", "recipe", "resumed")}
            start = time.perf_counter()
            _cli(["train", *base, "--out", out["default"]])
            _cli(["train", *base, "--recipe", recipe, "--out", out["recipe"]])
            exact = None
            if kind == "digits":  # interrupted half-way, resumed from its checkpoint: the same weights as one run
                with _stop_at(steps // 2):
                    _cli(["train", *base, "--recipe", recipe, "--out", out["resumed"]])
                _cli(["train", "--resume", os.path.join(out["resumed"], "trainer.pt"), "--no-progress"])
                exact = _same_weights(out["recipe"], out["resumed"])
            settings = json.loads(torch.load(os.path.join(out["recipe"], "trainer.pt"), map_location="cpu",
                                             weights_only=True)["extra"]["train_settings"])
            row = {"recipe": recipe, "data": kind, "steps": steps, "batch": batch,
                   "default_acc": _acc(out["default"]), "recipe_acc": _acc(out["recipe"]),
                   "resume_exact": exact, "recipe_lr": settings["lr"], "optimizer": settings.get("optimizer"),
                   "seconds": round(time.perf_counter() - start, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def record(rows: List[Dict[str, Any]], conditions: str) -> str:
    sys.path.insert(0, HERE)
    import results_file

    box = results_file.machine()
    box = {"id": f"{box['id'].rsplit('-', 1)[0]}-recipe-digits", "description": box["description"]}
    table = {
        "title": "Paper recipes vs vitfast's defaults on the digits (same model, steps and batch)",
        "script": "benchmarks/recipe_digits.py", "command": results_file.command_line(), "conditions": conditions,
        "columns": [{"label": "recipe", "fmt": "{recipe}"}, {"label": "data", "fmt": "{data}"},
                    {"label": "default top-1", "fmt": "{default_acc}"},
                    {"label": "recipe top-1", "fmt": "{recipe_acc}"},
                    {"label": "resume bit-exact", "fmt": "{resume_exact}"},
                    {"label": "recipe lr", "fmt": "{recipe_lr}"}, {"label": "optimizer", "fmt": "{optimizer}"}],
        "rows": [{**r, "default_acc": f"{r['default_acc']:.4f}", "recipe_acc": f"{r['recipe_acc']:.4f}",
                  "resume_exact": {None: "–", True: "yes", False: "NO"}[r["resume_exact"]],
                  "recipe_lr": f"{r['recipe_lr']:.3g}"} for r in rows],
    }
    return results_file.record("recipe_digits", table, box=box)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", nargs="+", default=["repavit", "nondeep", "dwconv", "usdc", "distill"])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--work", default="recipe-digits", help="runs are written here")
    p.add_argument("--no-folder", action="store_true", help="digits only (no image-folder runs)")
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    rows = run(args.recipes, args.steps, args.batch_size, args.work, not args.no_folder)
    print(f"\n{'recipe':<9} {'data':<7} {'default':>8} {'recipe':>8}  resume  lr")
    for r in rows:
        exact = {None: "-", True: "exact", False: "DIFFERS"}[r["resume_exact"]]
        print(f"{r['recipe']:<9} {r['data']:<7} {r['default_acc']:>8.4f} {r['recipe_acc']:>8.4f}  {exact:<7} "
              f"{r['recipe_lr']:.3g} ({r['optimizer']})")
    print(f"total {time.perf_counter() - start:.0f} s")
    if not args.no_record:
        conditions = (f"{args.steps} steps, batch {args.batch_size}, seed 0, one thread; validation: 360 digits "
                      f"(20%, stratified); model: ViT 32x32, patch 8, width 64, 4 blocks, 2 heads, per method as in "
                      f"the script's docstring; recipe lr scaled to the batch by each recipe's rule")
        print(record(rows, conditions))
    return 0 if all(r["resume_exact"] in (None, True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
