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

`--length paper` runs each recipe for its paper's epochs on the digits (RePaViT, the non-deep ViT and USDC 300,
DW-conv 25, distillation 60: a few thousand steps, minutes on one core) and the defaults for the same number of
steps; `--jobs 2` runs two cells at once.

The table goes to benchmarks/results/<date>-<machine>-recipe-digits.json (`results_file` schema) unless --no-record.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import shlex
from typing import Any, Dict, List, Sequence, Tuple

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


def _teacher_dir(work: str, teacher_length: Sequence[str]) -> str:
    """distill: a 4-block ViT trained with the defaults, then a 2-block student; one teacher per length."""
    return os.path.join(work, "teacher-" + "-".join(a.lstrip("-") for a in teacher_length))


def _source(recipe: str, work: str, teacher_length: List[str], common: List[str]) -> List[str]:
    """SOURCE and method flags of `vitfast train` for this recipe's model (files made once, under `work`);
    `teacher_length`: the distillation teacher's --steps/--epochs."""
    if recipe in METHOD_FLAGS:
        return MODEL + METHOD_FLAGS[recipe]
    if recipe == "usdc":
        path = os.path.join(work, "usdc-gates.safetensors")
        if not os.path.exists(path):
            _cli(["convert", *MODEL, "--num-classes", "10", "--gates", "--flops-target", "0.7", "-o", path])
        return [path]
    teacher = _teacher_dir(work, teacher_length)
    if not os.path.exists(os.path.join(teacher, "model.safetensors")):
        _cli(["train", *MODEL, *teacher_length, *common, "--eval-every", str(10 ** 9), "--out", teacher])
    print(json.dumps({"teacher": teacher, "top1": _acc(teacher)}), flush=True)
    return ["--teacher", os.path.join(teacher, "model.safetensors"), "--student-depth", "2"]


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-").lower()


def _steps_done(out: str) -> int:
    return int(torch.load(os.path.join(out, "trainer.pt"), map_location="cpu", weights_only=True)["step"])


def _cell(recipe: str, kind: str, base: List[str], length: List[str], work: str, resume: bool,
          variant: str = "", flags: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """One (recipe, data) cell: the recipe's run, the defaults' run of the same steps and, if asked, the recipe run
    interrupted half-way and resumed from its checkpoint (it must give the same weights as the one run).  A
    `variant` cell runs only the recipe with `flags` added (one setting changed: which setting costs accuracy)."""
    torch.set_num_threads(1)
    tag = f"recipe-{_slug(variant)}" if variant else "recipe"
    out = {name: os.path.join(work, recipe, kind, name) for name in ("default", "resumed")}
    out["recipe"] = os.path.join(work, recipe, kind, tag)
    start = time.perf_counter()
    _cli(["train", *base, *length, "--recipe", recipe, *flags, "--out", out["recipe"]])
    steps = _steps_done(out["recipe"])  # --length paper: the recipe's epochs decide, the defaults follow
    settings = json.loads(torch.load(os.path.join(out["recipe"], "trainer.pt"), map_location="cpu",
                                     weights_only=True)["extra"]["train_settings"])
    if variant:
        row = {"recipe": recipe, "variant": variant, "data": kind, "steps": steps, "default_acc": None,
               "recipe_acc": _acc(out["recipe"]), "resume_exact": None, "recipe_lr": settings["lr"],
               "optimizer": settings.get("optimizer"), "seconds": round(time.perf_counter() - start, 1)}
        print(json.dumps(row), flush=True)
        return row
    _cli(["train", *base, "--steps", str(steps), "--out", out["default"]])
    exact = None
    if resume:
        with _stop_at(steps // 2):
            _cli(["train", *base, *length, "--recipe", recipe, "--out", out["resumed"]])
        _cli(["train", "--resume", os.path.join(out["resumed"], "trainer.pt"), "--no-progress"])
        exact = _same_weights(out["recipe"], out["resumed"])
    row = {"recipe": recipe, "variant": "paper", "data": kind, "steps": steps, "batch": None,
           "default_acc": _acc(out["default"]), "recipe_acc": _acc(out["recipe"]),
           "resume_exact": exact, "recipe_lr": settings["lr"], "optimizer": settings.get("optimizer"),
           "seconds": round(time.perf_counter() - start, 1)}
    print(json.dumps(row), flush=True)
    return row


def run(recipes: List[str], steps: int, batch: int, work: str, folder: bool, length: str = "steps",
        jobs: int = 1, variants: Sequence[Tuple[str, str, Tuple[str, ...]]] = (),
        teacher_length: Sequence[str] = (), variants_only: bool = False) -> List[Dict[str, Any]]:
    """Every (recipe, data) cell; `length` "steps": `steps` for both sides, "paper": each recipe its paper's epochs
    on this data (the defaults the same number of steps).  `variants` (recipe, label, flags): that recipe run again
    on the digits with the flags added.  `jobs` cells run at once, each in its own process (one thread each).
    `teacher_length`: the distillation teacher's `vitfast train` length flags (default `--steps steps`);
    `variants_only`: only the variant cells (the recipe's own cells measured before)."""
    from vitfast.training.data import write_digits_image_folder

    os.makedirs(work, exist_ok=True)
    data = {"digits": []}
    if folder:
        train_dir, val_dir = os.path.join(work, "digits-folder", "train"), os.path.join(work, "digits-folder", "val")
        if not os.path.isdir(val_dir):
            write_digits_image_folder(os.path.join(work, "digits-folder"), size=32)
        data["folder"] = ["--data", train_dir, "--val-data", val_dir]
    common = ["--batch-size", str(batch), "--seed", "0", "--no-progress"]
    # evaluation once at the end: per-epoch evaluation of a 300-epoch run would cost more than its training
    run_length = ["--steps", str(steps)] if length == "steps" else []
    cells, extra = [], []
    for recipe in recipes:
        source = _source(recipe, work, list(teacher_length) or ["--steps", str(steps)], common)  # made once, here
        for kind, data_flags in data.items():
            base = [*source, *data_flags, *common, "--eval-every", str(10 ** 9)]
            if not variants_only:
                cells.append((recipe, kind, base, run_length, work, kind == "digits"))
            if kind == "digits":
                extra.extend((recipe, kind, base, run_length, work, False, label, flags)
                             for of, label, flags in variants if of == recipe)
    cells += extra  # the one-run variant cells last: the longer cells start first and the two cores stay busy
    if jobs <= 1:
        rows = [_cell(*c) for c in cells]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            rows = [f.result() for f in [pool.submit(_cell, *c) for c in cells]]
    return [{**r, "batch": batch} for r in rows]


def _fmt_acc(acc: Any) -> str:
    return "–" if acc is None else f"{acc:.4f}"


def record(rows: List[Dict[str, Any]], conditions: str, name: str = "recipe_digits", paper_length: bool = False) -> str:
    sys.path.insert(0, HERE)
    import results_file

    box = results_file.machine()
    box = {"id": f"{box['id'].rsplit('-', 1)[0]}-recipe-digits", "description": box["description"]}
    table = {
        "title": ("Paper recipes at their papers' epochs vs vitfast's defaults for the same steps, on the digits"
                  if paper_length else "Paper recipes vs vitfast's defaults on the digits (same model, steps and batch)"),
        "script": "benchmarks/recipe_digits.py", "command": results_file.command_line(), "conditions": conditions,
        "columns": [{"label": "recipe", "fmt": "{recipe}"}, {"label": "data", "fmt": "{data}"},
                    {"label": "steps", "fmt": "{steps}"},
                    {"label": "default top-1", "fmt": "{default_acc}"},
                    {"label": "recipe top-1", "fmt": "{recipe_acc}"}, {"label": "recipe as run", "fmt": "{variant}"},
                    {"label": "resume bit-exact", "fmt": "{resume_exact}"},
                    {"label": "recipe lr", "fmt": "{recipe_lr}"}, {"label": "optimizer", "fmt": "{optimizer}"}],
        "rows": [{**r, "default_acc": _fmt_acc(r["default_acc"]), "recipe_acc": _fmt_acc(r["recipe_acc"]),
                  "resume_exact": {None: "–", True: "yes", False: "NO"}[r["resume_exact"]],
                  "recipe_lr": f"{r['recipe_lr']:.3g}"} for r in rows],
    }
    return results_file.record(name, table, box=box)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipes", nargs="+", default=["repavit", "nondeep", "dwconv", "usdc", "distill"])
    p.add_argument("--steps", type=int, default=300, help="steps of every run (--length steps)")
    p.add_argument("--teacher-epochs", type=int, default=None,
                   help="epochs of the distillation teacher (trained with the defaults) [default: --steps steps; "
                        "with --length paper 300 epochs, the from-scratch papers' length: the paper distils from a "
                        "fine-tuned teacher, and a teacher of a few hundred steps is not one]")
    p.add_argument("--length", choices=("steps", "paper"), default="steps",
                   help="steps: --steps for both sides; paper: each recipe runs its paper's epochs on this data and "
                        "the defaults run the same number of steps")
    p.add_argument("--jobs", type=int, default=1, help="cells run at once (one process and one thread each)")
    p.add_argument("--table", default="recipe_digits", help="the results table written")
    p.add_argument("--variant", action="append", default=[], metavar="RECIPE:LABEL=FLAGS",
                   help="also run RECIPE on the digits with these `vitfast train` flags added, e.g. 'repavit:lr not "
                        "scaled=--lr 4e-3' (repeatable; the recipe side only: which setting costs accuracy)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--work", default="recipe-digits", help="runs are written here")
    p.add_argument("--no-folder", action="store_true", help="digits only (no image-folder runs)")
    p.add_argument("--variants-only", action="store_true",
                   help="run only the --variant cells (the recipes' own cells and the defaults are not run)")
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    variants = []
    for text in args.variant:
        head, sep, flags = text.partition("=")
        recipe, colon, label = head.partition(":")
        if not sep or not colon or recipe not in args.recipes or not label.strip() or not flags.strip():
            p.error(f"--variant: expected RECIPE:LABEL=FLAGS with RECIPE one of {', '.join(args.recipes)}, such as "
                    f"'repavit:no mixup=--mixup 0 --cutmix 0', got {text!r}")
        variants.append((recipe, label.strip(), tuple(shlex.split(flags))))
    if args.variants_only and not variants:
        p.error("--variants-only: expected at least one --variant, got none")
    teacher_epochs = args.teacher_epochs or (300 if args.length == "paper" else None)
    teacher_length = ["--epochs", str(teacher_epochs)] if teacher_epochs else ["--steps", str(args.steps)]
    rows = run(args.recipes, args.steps, args.batch_size, args.work, not args.no_folder, args.length,
               args.jobs, variants, teacher_length, args.variants_only)
    print(f"\n{'recipe':<9} {'data':<7} {'steps':>6} {'default':>8} {'recipe':>8}  resume  lr")
    for r in rows:
        exact = {None: "-", True: "exact", False: "DIFFERS"}[r["resume_exact"]]
        print(f"{r['recipe']:<9} {r['data']:<7} {r['steps']:>6} {_fmt_acc(r['default_acc']):>8} "
              f"{_fmt_acc(r['recipe_acc']):>8}  {exact:<7} {r['recipe_lr']:.3g} ({r['optimizer']})  {r['variant']}")
    print(f"total {time.perf_counter() - start:.0f} s")
    if not args.no_record:
        length = ("each recipe its paper's epochs (the steps column), the defaults the same steps"
                  if args.length == "paper" else f"{args.steps} steps")
        if "distill" in args.recipes:
            length += (f"; distillation teacher: defaults, {' '.join(teacher_length).replace('--', '')}, top-1 "
                       f"{_acc(_teacher_dir(args.work, teacher_length)):.4f}")
        conditions = (f"{length}, batch {args.batch_size}, seed 0, one thread; validation: 360 digits "
                      f"(20%, stratified); model: ViT 32x32, patch 8, width 64, 4 blocks, 2 heads, per method as in "
                      f"the script's docstring; recipe lr scaled to the batch by each recipe's rule")
        print(record(rows, conditions, args.table, args.length == "paper"))
    return 0 if all(r["resume_exact"] in (None, True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
