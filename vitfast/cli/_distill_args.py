"""Distillation (swin-distillation-compression: a teacher, students built from it, the loss weighting) and scale
(torchrun processes, gradient accumulation, mixed precision) options of `train`, and the Trainer they select.

vitfast.methods.distill.student and vitfast.methods.nondeep.attn_distill import timm: they are imported when a run uses them (see
vitfast/cli/_models.py)."""
from __future__ import annotations

import os
from typing import Dict

import vitfast
from vitfast.cli._common import CLIError
from vitfast.cli._common import comma_list
from vitfast.cli._common import existing_file
from vitfast.cli._common import parse_device
from vitfast.cli._common import positive_float
from vitfast.cli._common import positive_int
from vitfast.cli._common import unit_float
from vitfast.cli._models import file_kind
from vitfast.cli._models import load_source
from vitfast.cli._nondeep_args import nondeep_source
from vitfast.cli._recipe_args import ffn_flags_need_channel_idle
from vitfast.training.distributed import DistContext
from vitfast.training.distributed import cleanup
from vitfast.training.distributed import init_from_env
from vitfast.training.trainer import Trainer
from vitfast.io.trainable import load_trainable
from vitfast.training.rng import seed_everything


# Settings of `vitfast train` for distillation (swin-distillation-compression) and for training at scale.  They are
# stored in the checkpoint with the others, so --resume continues the same recipe.
SCALE_SETTINGS = ("teacher", "distill", "tau", "alpha", "alpha_schedule", "harmonic", "student_depth",
                  "student_depths", "student_cut", "student_init", "grad_accum", "amp")
SCALE_DEFAULTS = {"grad_accum": 1, "amp": None}


_alpha_pair = comma_list(float, "two numbers in [0, 1] such as 0,0.5",
                         lambda v: len(v) == 2 and all(0.0 <= x <= 1.0 for x in v), skip_empty=False)
_weight_pair = comma_list(float, "two numbers > 0 (w_d,w_s) such as 13,1", lambda v: len(v) == 2 and all(x > 0 for x in v),
                          skip_empty=False)
_depth_list = comma_list(int, "comma-separated positive stage depths such as 2,2,2,2", lambda v: all(x >= 1 for x in v),
                         skip_empty=False)


def add_scale_args(p) -> None:
    g = p.add_argument_group("distillation (swin-distillation-compression; needs --teacher)")
    g.add_argument("--teacher", type=existing_file, default=None, metavar="PATH",
                   help="the fine-tuned teacher: a train-time .safetensors (`vitfast train` output) or trainer checkpoint")
    g.add_argument("--distill", choices=("mse", "kl", "none"), default=None,
                   help="distillation loss L_d: MSE on logits (the paper's), KL with --tau, or none (CE only; e.g. "
                        "the copied student without distillation) [default with --teacher: mse]")
    g.add_argument("--tau", type=positive_float, default=None, help="KL temperature (--distill kl) [default: 4]")
    g.add_argument("--alpha", type=unit_float, default=None,
                   help="eq. 1: L = (1-α)·L_d + α·L_s with fixed α [default: 0.25 unless --alpha-schedule/--harmonic]")
    g.add_argument("--alpha-schedule", type=_alpha_pair, default=None, metavar="A0,A1",
                   help="eq. 1 with α linear from A0 to A1 over the run (Table VI's best: 0,0.5)")
    g.add_argument("--harmonic", type=_weight_pair, nargs="?", const=[13.0, 1.0], default=None, metavar="WD,WS",
                   help="eq. 4: weighted harmonic mean of L_d and L_s (bare flag: w_d=13, w_s=1, the paper's best)")
    g.add_argument("--student-depth", type=positive_int, default=None, metavar="N",
                   help="build the student from the ViT teacher with N blocks (Algorithm 1; SOURCE is then omitted)")
    g.add_argument("--student-depths", type=_depth_list, default=None, metavar="D1,D2,..",
                   help="build the student from the Swin teacher with these stage depths, e.g. 2,2,2,2 (Swin-N)")
    g.add_argument("--student-cut", type=int, default=None, metavar="P1",
                   help="blocks copied before the cut (ViT: p1; Swin: in the shallower stage) [default: vitfast.methods.distill.student]")
    g.add_argument("--student-init", choices=("copy", "random"), default=None,
                   help="copy the teacher's blocks before the cut (Algorithm 1), or random init (from scratch) [default: copy]")
    g = p.add_argument_group("scale (single process or torchrun --nproc_per_node N)")
    g.add_argument("--grad-accum", type=positive_int, default=None,
                   help="micro-batches per optimizer step; --batch-size is the global batch, split over processes and "
                        "micro-batches [default: 1]")
    g.add_argument("--amp", choices=("bf16", "fp16"), default=None,
                   help="mixed precision: bf16 autocast (CPU or GPU), fp16 autocast + loss scaling (GPU only)")
    g.add_argument("--device", default=None,
                   help="cpu or cuda (under torchrun: each process takes GPU LOCAL_RANK; NCCL on GPU, gloo on CPU) [default: cpu]")


def train_process_group(args):
    """Join torchrun's process group when there is one (WORLD_SIZE > 1); else the single-process context."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return DistContext(0, 0, 1, None, parse_device(args.device or "cpu"))
    if args.device is not None:
        parse_device(args.device)  # the clean error when CUDA is asked for and absent
    return init_from_env("cuda" if args.device and args.device.startswith("cuda") else "cpu")


def train_process_group_end(ctx) -> None:
    if ctx.world_size > 1:
        cleanup()


def seed_model_init(seed: int) -> None:
    """--seed fixes the initial weights too, so every process (and a single-process rerun) builds the same model."""
    seed_everything(seed)


def builds_student(args) -> bool:
    return args.student_depth is not None or args.student_depths is not None


def distill_student(args, settings):
    """Algorithm 1, lines 2-3: the student built from --teacher (then converted like a timm name, if asked)."""
    from vitfast.methods.distill.student import make_student

    if settings.get("teacher") is None:
        raise CLIError("--student-depth/--student-depths: build the student from a teacher; give --teacher PATH")
    if args.source is not None:
        raise CLIError("SOURCE: not used with --student-depth/--student-depths (the student is built from --teacher); drop it")
    for k in ("img_size", "num_classes", "model_kwargs"):
        if settings.get(k) is not None:
            raise CLIError(f"--{k.replace('_', '-')}: the student takes the teacher's shape; drop it")
    teacher, _ = load_source(settings["teacher"], "--teacher")
    try:
        student = make_student(teacher, depth=settings.get("student_depth"), depths=settings.get("student_depths"),
                               cut=settings.get("student_cut"), init=settings.get("student_init") or "copy",
                               seed=settings["seed"])
    except ValueError as exc:
        raise CLIError(f"--student-depth(s)/--student-cut: {exc}") from exc
    cut = student.distill_cut
    recipe = {"source": "student", "teacher": os.path.basename(settings["teacher"]),
              "cut": {k: cut[k] for k in ("p1", "p2", "init", "copied")}}
    if settings.get("branches") is not None:
        # Combined recipe: distil into a non-deep student (its blocks grouped into branches, with channel-idle FFNs
        # when --channel-idle is given), converted exactly like a timm SOURCE.
        return nondeep_source(student, settings, recipe)
    if settings.get("channel_idle") is None:
        ffn_flags_need_channel_idle(settings, "without it the student keeps the teacher's FFNs")
        return student, recipe
    norm, heuristic = settings.get("norm") or "batch", settings.get("heuristic") or "static"
    student = vitfast.convert.from_timm(student, channel_idle=settings["channel_idle"], norm=norm, heuristic=heuristic)
    recipe.update(channel_idle=settings["channel_idle"], norm=norm, heuristic=heuristic)
    return student, recipe


def data_shard(settings, ctx) -> Dict[str, int]:
    """Per-process loader arguments: --batch-size is the global batch of one optimizer step."""
    batch, accum, world = settings["batch_size"], settings["grad_accum"], ctx.world_size
    if batch % (accum * world):
        raise CLIError(f"--batch-size: expected a multiple of --grad-accum ({accum}) x processes ({world}), got {batch}")
    return {"batch_size": batch // (accum * world), "num_replicas": world, "rank": ctx.rank}


def _check_teacher_input(teacher, student, flag: str) -> None:
    """Before --out is created (the trainers check it too, later)."""
    from vitfast.methods.distill import check_teacher_input  # imports timm: not at `vitfast --help` time

    try:
        check_teacher_input(teacher, student, flag)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def scale_trainer(settings, ctx, num_classes, model):
    """(Trainer class, its extra keyword arguments) for the distillation and scale settings."""
    from vitfast.methods.distill import DistillTrainer

    kwargs = {"grad_accum": settings["grad_accum"], "amp": settings["amp"], "device": ctx.device,
              "handle_signals": True}
    for flag in ("student_cut", "student_init"):
        if settings.get(flag) is not None and settings.get("student_depth") is None and settings.get("student_depths") is None:
            raise CLIError(f"--{flag.replace('_', '-')}: only used with --student-depth/--student-depths")
    loss_flags = [f for f in ("distill", "tau", "alpha", "alpha_schedule", "harmonic") if settings.get(f) is not None]
    teacher_path = settings.get("teacher")
    if teacher_path is None or settings.get("distill") == "none":
        # --distill none alone is allowed (and stored in older runs' settings): it is "no distillation"
        extra = [f for f in loss_flags if not (f == "distill" and settings.get("distill") == "none")]
        if teacher_path is None and extra:
            raise CLIError(f"--{extra[0].replace('_', '-')}: a distillation setting needs --teacher")
        if teacher_path is not None and len(loss_flags) > 1:  # --distill none and a loss setting
            raise CLIError(f"--{loss_flags[1].replace('_', '-')}: has no effect with --distill none")
        return Trainer, kwargs
    teacher, _ = load_source(teacher_path, "--teacher")
    if getattr(teacher, "num_classes", num_classes) != num_classes:
        raise CLIError(f"--teacher: has {teacher.num_classes} classes, the student {num_classes}")
    _check_teacher_input(teacher, model, "--teacher")
    try:
        kwargs.update(teacher=teacher.to(ctx.device), distill=settings.get("distill") or "mse",
                      tau=settings.get("tau") or 4.0, alpha=settings.get("alpha"),
                      alpha_schedule=settings.get("alpha_schedule"), harmonic=settings.get("harmonic"))
        if kwargs["distill"] != "kl" and settings.get("tau") is not None:
            raise ValueError("--tau: only used with --distill kl")
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    return DistillTrainer, kwargs


def scale_note(settings, ctx) -> str:
    notes = []
    if ctx.world_size > 1:
        notes.append(f"{ctx.world_size} processes ({ctx.backend})")
    if settings["grad_accum"] > 1:
        notes.append(f"{settings['grad_accum']} micro-batches per step")
    if settings["amp"]:
        notes.append(settings["amp"])
    if settings.get("teacher") and settings.get("distill") != "none":
        loss = (f"harmonic mean w_d={settings['harmonic'][0]:g}, w_s={settings['harmonic'][1]:g}" if settings.get("harmonic")
                else f"alpha {settings['alpha_schedule'][0]:g}->{settings['alpha_schedule'][1]:g}" if settings.get("alpha_schedule")
                else f"alpha={settings['alpha'] if settings.get('alpha') is not None else 0.25:g}")
        notes.append(f"distilling from {os.path.basename(settings['teacher'])} ({settings.get('distill') or 'mse'}, {loss})")
    return ("; " + ", ".join(notes)) if notes else ""


def attention_distill_trainer(model, settings, ctx):
    """(Trainer class, its extra kwargs): attention-map distillation from --distill-teacher when given."""
    if settings.get("distill_teacher") is None:
        if settings.get("distill_weight") is not None:
            raise CLIError("--distill-weight: only applies with --distill-teacher, got no teacher")
        return Trainer, {}
    from vitfast.methods.nondeep.attn_distill import AttentionDistillTrainer
    from vitfast.methods.nondeep.attn_distill import AttentionDistillation

    path = settings["distill_teacher"]
    if file_kind(path) != "trainable":
        raise CLIError(f"--distill-teacher: expected a train-time .safetensors (from `vitfast train`), got {path!r}")
    teacher, _ = load_trainable(path)
    _check_teacher_input(teacher, model, "--distill-teacher")
    try:
        distill = AttentionDistillation(model, teacher.to(ctx.device))
    except ValueError as exc:
        raise CLIError(f"--distill-teacher: {exc}") from None
    weight = 1.0 if settings.get("distill_weight") is None else settings["distill_weight"]
    return AttentionDistillTrainer, {"distill": distill, "distill_weight": weight}
