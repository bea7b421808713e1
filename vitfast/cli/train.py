"""`vitfast train`: train or finetune a model (a train-time file, a timm name, or a student built from a teacher),
resumably, on the digits or an image folder."""
from __future__ import annotations

import json
import os
import sys
import textwrap

import torch

import vitfast
from vitfast.cli._common import add_threads_arg
from vitfast.cli._common import EXIT_INTERRUPTED
from vitfast.cli._common import EXIT_OK
from vitfast.cli._common import CLIError
from vitfast.cli._common import Formatter
from vitfast.cli._common import existing_file
from vitfast.cli._common import nonneg_float
from vitfast.cli._common import output_dir
from vitfast.cli._common import positive_float
from vitfast.cli._common import positive_int
from vitfast.cli._common import set_threads
from vitfast.cli._common import smoothing
from vitfast.cli._distill_args import SCALE_DEFAULTS
from vitfast.cli._distill_args import SCALE_SETTINGS
from vitfast.cli._distill_args import add_scale_args
from vitfast.cli._distill_args import attention_distill_trainer
from vitfast.cli._distill_args import builds_student
from vitfast.cli._distill_args import data_shard
from vitfast.cli._distill_args import distill_student
from vitfast.cli._distill_args import scale_note
from vitfast.cli._distill_args import scale_trainer
from vitfast.cli._distill_args import seed_model_init
from vitfast.cli._distill_args import train_process_group
from vitfast.cli._distill_args import train_process_group_end
from vitfast.cli._dwconv_args import add_dwconv_args
from vitfast.cli._dwconv_args import dwconv_given
from vitfast.cli._dwconv_args import dwconv_source
from vitfast.cli._models import build_timm_model
from vitfast.cli._models import check_rgb_model
from vitfast.cli._models import describe
from vitfast.cli._models import file_kind
from vitfast.cli._models import model_input
from vitfast.cli._nondeep_args import NONDEEP_TRAIN_SETTINGS
from vitfast.cli._nondeep_args import add_nondeep_args
from vitfast.cli._nondeep_args import apply_join_settings
from vitfast.cli._nondeep_args import nondeep_source
from vitfast.cli._paper_recipe import PARAM_RULES
from vitfast.cli._paper_recipe import RECIPE_SETTINGS
from vitfast.cli._paper_recipe import add_paper_recipe_args
from vitfast.cli._paper_recipe import apply_recipe
from vitfast.cli._paper_recipe import check_recipe
from vitfast.cli._paper_recipe import method_keys_after_model
from vitfast.cli._paper_recipe import method_keys_before_model
from vitfast.cli._paper_recipe import print_settings
from vitfast.cli._paper_recipe import resolve_settings
from vitfast.cli._recipe_args import add_recipe_args
from vitfast.cli._recipe_args import ffn_flags_need_channel_idle
from vitfast.cli._usdc_args import ARCH_LR_SCALE
from vitfast.cli._usdc_args import add_usdc_train_args
from vitfast.cli._usdc_args import usdc_optimizer
from vitfast.cli._usdc_args import usdc_stage2
from vitfast.training.data import digits_loaders
from vitfast.training.data import image_folder_loaders
from vitfast.cli._dwconv_args import DWCONV_SETTINGS
from vitfast.training.trainer import Trainer
from vitfast.io.trainable import build_trainable
from vitfast.io.trainable import describe_trainable
from vitfast.io.trainable import load_trainable
from vitfast.io.trainer_checkpoint import load_trainer_checkpoint
from vitfast.io.trainable import save_trainable


# Every setting of a run, stored in its checkpoint: --resume refuses to change them (a different --arch-lr-scale was
# once silently ignored: the optimizer's restored state kept the old learning rates).
_TRAIN_SETTINGS = (("data", "val_data", "steps", "epochs", "lr", "weight_decay", "batch_size", "warmup", "label_smoothing",
                    "grad_clip", "seed", "img_size", "num_classes", "channel_idle", "norm", "heuristic", "model_kwargs",
                    "eval_every", "checkpoint_every")
                   + NONDEEP_TRAIN_SETTINGS + DWCONV_SETTINGS + ("arch_lr_scale",) + RECIPE_SETTINGS)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train", formatter_class=Formatter, help="train or finetune a model on digits or an image folder",
        description=textwrap.dedent("""\
            Train a train-time model (from `vitfast convert`) or a timm model by name (converted on the fly with
            --channel-idle) with AdamW, warm-up + cosine LR, gradient clipping and periodic evaluation, or with a
            paper's recipe (--recipe; --print shows the resolved settings and where each comes from).
            Writes OUT/trainer.pt (resumable; every --checkpoint-every steps and at the end) and
            OUT/model.safetensors (the trained train-time model, input for `vitfast fuse`).
            --resume continues a run exactly where it stopped, with the settings stored in the checkpoint."""),
        epilog=textwrap.dedent("""\
            examples:
              vitfast train tiny.safetensors --steps 800 --lr 3e-3 --out run/
              vitfast train vit_tiny_patch16_224 --img-size 32 --model-kwargs '{"depth": 4}' --channel-idle 0.75 --epochs 20 --out run/
              vitfast train --resume run/trainer.pt
              vitfast train --recipe repavit --print
              vitfast train tiny.safetensors --recipe repavit --steps 600 --out run/
              vitfast train vit.safetensors --data /data/imagenette/train --val-data /data/imagenette/val --out run/"""),
    )
    p.add_argument("source", nargs="?", metavar="SOURCE", help="train-time .safetensors, or a timm model name")
    p.add_argument("--data", default=None, help="'digits' (scikit-learn, no download) or an image-folder directory [default: digits]")
    p.add_argument("--val-data", default=None, help="validation image folder (default: hold out 10%% of --data)")
    p.add_argument("--steps", type=positive_int, default=None, help="optimizer steps (or --epochs) [default: 10 epochs]")
    p.add_argument("--epochs", type=positive_int, default=None, help="epochs over the training split")
    p.add_argument("--lr", type=positive_float, default=None, help="peak learning rate [default: 1e-3]")
    p.add_argument("--weight-decay", type=nonneg_float, default=None, help="AdamW weight decay (not on norms/biases/pos-embed) [default: 0.05]")
    p.add_argument("--batch-size", type=positive_int, default=None, help="training batch size [default: 64]")
    p.add_argument("--warmup", type=nonneg_float, default=None, help="warm-up: a fraction of the steps (< 1) or a step count [default: 0.05]")
    p.add_argument("--label-smoothing", type=smoothing, default=None, help="cross-entropy label smoothing [default: 0]")
    p.add_argument("--grad-clip", type=nonneg_float, default=None, help="max gradient norm, 0 = off [default: 1.0]")
    p.add_argument("--seed", type=int, default=None, help="seed for init order, data order and augmentation [default: 0]")
    p.add_argument("--eval-every", type=positive_int, default=None, help="evaluate every N steps [default: once per epoch]")
    p.add_argument("--checkpoint-every", type=positive_int, default=None, help="save OUT/trainer.pt every N steps [default: at the end]")
    p.add_argument("--resume", type=existing_file, default=None, metavar="CHECKPOINT", help="continue from OUT/trainer.pt")
    p.add_argument("--out", default=None, metavar="DIR", help="output directory [default with --resume: the checkpoint's]")
    add_threads_arg(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_recipe_args(p, convert=False)
    add_usdc_train_args(p)
    add_nondeep_args(p, train=True)
    add_dwconv_args(p)
    add_scale_args(p)
    add_paper_recipe_args(p)
    for action in p._actions:  # recipe defaults must be None here: --resume compares what was given
        if action.dest in ("norm", "heuristic"):
            action.default = None
    p.set_defaults(func=run)


def run(args) -> int:
    set_threads(args.threads)
    ctx = train_process_group(args)
    given = {k: getattr(args, k) for k in _TRAIN_SETTINGS + SCALE_SETTINGS if getattr(args, k) is not None}
    recipe = check_recipe(args.recipe)
    if args.print_settings:
        if args.resume is not None:
            raise CLIError("--print: shows a new run's settings; a resumed run's are in its checkpoint, drop --resume")
        settings = _defaults_and(given)
        print_settings(resolve_settings(settings, given, recipe), recipe, settings["data"])
        return EXIT_OK
    resume_state = None
    if args.resume is not None:
        resume_state = load_trainer_checkpoint(args.resume)
        extra = resume_state.get("extra") or {}
        if "train_settings" not in extra:
            raise CLIError(f"--resume: {args.resume!r} was not written by `vitfast train` (no settings stored)")
        stored = json.loads(extra["train_settings"])
        stored.setdefault("arch_lr_scale", ARCH_LR_SCALE)  # runs from before it was stored used the default
        # --grad-accum may change: it splits the same global batch into other micro-batches (the continuation is
        # then equal up to float rounding, not bit-exact, as the README says)
        clash = {k: (stored.get(k), v) for k, v in given.items() if stored.get(k) != v and k != "grad_accum"}
        if clash:
            raise CLIError(
                "--resume: continues the same run, so its settings cannot change; "
                + ", ".join(f"--{k.replace('_', '-')} was {a!r}, got {b!r}" for k, (a, b) in clash.items())
            )
        if args.source is not None:
            raise CLIError("SOURCE: not used with --resume (the checkpoint holds the model); drop it")
        settings = {**SCALE_DEFAULTS, **stored}  # checkpoints from before the scale settings existed
        if "grad_accum" in given:  # the one setting a resume may change (not bit-exact then): applied, and stored
            settings["grad_accum"] = given["grad_accum"]
        # The thread count changes the order of torch's CPU reductions: the continuation is bit-exact only at the
        # run's own count, so it is restored unless --threads says otherwise (a speed choice, not refused).
        if stored.get("threads") is not None:
            if args.threads is None:
                torch.set_num_threads(int(stored["threads"]))
            elif args.threads != stored["threads"]:
                print(f"--threads {args.threads}: the run used {stored['threads']}; the continuation will not be "
                      f"bit-exact", file=sys.stderr)
        model = build_trainable(json.loads(extra["model_description"]))
        recipe = json.loads(extra.get("recipe", "{}"))
        out_dir = args.out or os.path.dirname(os.path.abspath(args.resume))
    else:
        if args.source is None and not builds_student(args):
            raise CLIError("SOURCE: expected a train-time .safetensors (from `vitfast convert`) or a timm model name, got none")
        if args.out is None:
            raise CLIError("--out: expected a directory for the checkpoint and the trained model, got none")
        settings = _defaults_and(given)
        settings["explicit"] = sorted(given)  # which settings were flags, not recipe values (messages)
        apply_recipe(settings, resolve_settings(settings, given, recipe), given=given)
        settings["lr_schedule"] = "timm" if recipe is not None else "legacy"
        method_keys_before_model(settings, timm_name=not builds_student(args) and args.source is not None
                                 and not os.path.exists(args.source))
        settings["threads"] = torch.get_num_threads()  # restored by --resume (see there)
        settings["param_rules"] = PARAM_RULES  # which optimizer groups the run has (a resume rebuilds them)
        if settings["steps"] is None and settings["epochs"] is None:
            settings["epochs"] = 10
        if settings["steps"] is not None and settings["epochs"] is not None:
            raise CLIError(f"--steps/--epochs: expected one of them, got --steps {settings['steps']} and --epochs {settings['epochs']}")
        seed_model_init(settings["seed"])
        if builds_student(args) and settings.get("drop_path") is not None:
            _drop_path_unused(settings, "the student is built from --teacher's blocks")
        model, recipe = distill_student(args, settings) if builds_student(args) else _train_source(args, settings)
        out_dir = args.out
    output_dir(out_dir, create=False)  # created once every check below has passed

    img_size, num_classes = model_input(model)
    data = settings["data"]
    check_rgb_model(model, "--data")
    shard = data_shard(settings, ctx)
    if data == "digits":
        if settings.get("val_data") is not None:  # was silently unused
            raise CLIError("--val-data: only with --data DIR (the digits have their own validation split)")
        if img_size is None:
            raise CLIError("SOURCE: cannot tell the model's input size (no patch_embed.img_size)")
        try:
            train_loader, val_loader = digits_loaders(img_size=img_size, seed=settings["seed"],
                                                      reprob=settings.get("reprob") or 0.0,
                                                      repeats=settings.get("repeated_aug") or 1, **shard)
        except ValueError as exc:
            raise CLIError(_trainer_error_as_flags(str(exc))) from None
        data_classes = 10
    else:
        if not os.path.isdir(data):
            raise CLIError(f"--data: expected 'digits' or a directory of class sub-folders, got {data!r}")
        timm_tf = {k: settings.get(k) for k in ("auto_augment", "color_jitter", "reprob", "interpolation")}
        use_timm = settings.get("recipe") is not None or any(v is not None for v in timm_tf.values())
        train_loader, val_loader = image_folder_loaders(
            data, img_size=img_size, val_root=settings.get("val_data"), seed=settings["seed"], **shard,
            transform={**timm_tf, "interpolation": timm_tf["interpolation"] or "bilinear"} if use_timm else None,
            repeats=settings.get("repeated_aug") or 1,
        )
        data_classes = len(train_loader.dataset.classes)
    if num_classes != data_classes:
        raise CLIError(
            f"SOURCE: the model has {num_classes} classes, the data has {data_classes}; "
            f"convert with --num-classes {data_classes}"
        )
    if getattr(args, "usdc_prune", False):
        model = usdc_stage2(model, resume_state)
    if len(train_loader) < settings["grad_accum"]:  # the Trainer refuses it too, naming its own arguments
        raise CLIError(f"--batch-size/--grad-accum: one optimizer step needs {settings['grad_accum']} micro-batches of "
                       f"{train_loader.batch_size} images, the training split gives {len(train_loader)} per process; "
                       f"lower --batch-size or --grad-accum")
    # A resumed run keeps its length as its checkpoint counts it: with --epochs the count depends on --grad-accum
    # (and older vitfast counted micro-batches), so recomputing it refused the checkpoint ("total_steps=44, this
    # Trainer has 22") with no flag to get past it.
    steps, epochs = ((resume_state["total_steps"], None) if resume_state is not None
                     else (settings["steps"], settings["epochs"]))
    total = Trainer._resolve_total_steps(steps, epochs, train_loader, settings["grad_accum"])
    method_keys_after_model(model, settings, total, resumed=resume_state is not None)
    apply_join_settings(model, settings, total)
    description = json.dumps(describe_trainable(model))
    warmup = settings["warmup"]
    model.to(ctx.device)
    trainer_cls, scale_kwargs = scale_trainer(settings, ctx, num_classes, model)
    attn_trainer_cls, attn_kwargs = attention_distill_trainer(model, settings, ctx)
    if attn_kwargs:
        # Attention-map distillation (non-deep, --distill-teacher) and logit distillation (--teacher) are two
        # Trainer subclasses with their own compute_loss; combining them is not supported yet.
        if trainer_cls is not Trainer:
            raise CLIError("--distill-teacher: attention-map distillation cannot be combined with --teacher yet")
        trainer_cls = attn_trainer_cls
    try:
        trainer = trainer_cls(
            model, train_loader, val_loader, **scale_kwargs, **attn_kwargs,
            optimizer=_optimizer(model, settings),
            total_steps=steps, epochs=epochs, lr=settings["lr"], weight_decay=settings["weight_decay"],
            warmup_fraction=warmup if warmup < 1 else 0.0, warmup_steps=int(warmup) if warmup >= 1 else None,
            min_lr=settings.get("min_lr"), warmup_lr=settings.get("warmup_lr"), layer_decay=settings.get("layer_decay"),
            betas=tuple(settings["betas"]) if settings.get("betas") else None, mixup=settings.get("mixup"),
            cutmix=settings.get("cutmix"), num_classes=num_classes, lr_schedule=settings.get("lr_schedule", "legacy"),
            label_smoothing=settings["label_smoothing"], grad_clip=settings["grad_clip"] or None, seed=settings["seed"],
            eval_every=settings["eval_every"] or max(1, len(train_loader) // settings["grad_accum"]),
            checkpoint_path=os.path.join(out_dir, "trainer.pt"), checkpoint_every=settings["checkpoint_every"],
            checkpoint_extra={"model_description": description, "recipe": json.dumps(recipe),
                              "train_settings": json.dumps(settings)},
            progress=not args.no_progress,
        )
    except ValueError as exc:
        raise CLIError(_trainer_error_as_flags(str(exc))) from None
    output_dir(out_dir)  # only now: a refused setting left an empty --out behind
    say = print if ctx.rank == 0 else (lambda *a, **k: None)
    if resume_state is not None:
        trainer.load_state_dict(resume_state)
        say(f"resuming at step {trainer.step}/{trainer.total_steps} from {args.resume}")
    say(f"training {describe(model)} on {data} for {trainer.total_steps} steps ({torch.get_num_threads()} threads)"
        + scale_note(settings, ctx))
    summary = trainer.fit()
    model.eval()
    model_path = os.path.join(out_dir, "model.safetensors")
    if ctx.rank == 0:
        save_trainable(model.cpu(), model_path,
                       recipe={**recipe, "trained": {k: settings[k] for k in ("data", "steps", "epochs", "lr", "seed")}})
    train_process_group_end(ctx)
    # Stopped by a signal: checkpoint written, training not done.  Not status 0, so `vitfast train ... && vitfast
    # fuse ...` does not fuse a half-trained model (130, as an interrupt).
    status = EXIT_INTERRUPTED if summary.get("stopped") else EXIT_OK
    if ctx.rank != 0:
        return status
    if summary.get("stopped"):
        print(f"stopped at step {summary['step']}/{trainer.total_steps} (signal); "
              f"continue with `vitfast train --resume {trainer.checkpoint_path}`")
    if resume_state is not None and summary["steps_run"] == 0 and summary["finished"]:
        print(f"nothing to train: {args.resume} had already reached step {summary['step']}/{trainer.total_steps} "
              f"(a resumed run keeps its length; to train further start a new run from its model: "
              f"`vitfast train {model_path} --steps N --out NEW_DIR`)")
    last = summary["last_eval"]
    if last:
        print(f"step {summary['step']}: val acc {last['acc']:.4f}, val loss {last['loss']:.4f} ({summary['seconds']:.1f} s)")
    print(f"wrote {model_path} (train-time) and {trainer.checkpoint_path} (resumable); "
          f"next: `vitfast fuse {model_path} -o fused.safetensors`")
    return status


def _defaults_and(given):
    """A new run's settings: the defaults (small data, docs/training.md) with the explicit options on top."""
    settings = {"data": "digits", "steps": None, "epochs": None, "lr": 1e-3, "weight_decay": 0.05, "batch_size": 64,
                "warmup": 0.05, "label_smoothing": 0.0, "grad_clip": 1.0, "seed": 0, "eval_every": None,
                "checkpoint_every": None, "val_data": None}
    settings.update(SCALE_DEFAULTS)
    settings.update(given)
    return settings


def _optimizer(model, settings):
    """The optimizer name (timm's create_optimizer_v2), or for a USDC model its AdamW factory: the decision
    parameters (logits and gate networks) in their own no-decay group at lr × --arch-lr-scale (1 under the usdc
    recipe: the paper's single lr)."""
    from vitfast.methods.usdc.compression import usdc_blocks

    name = settings.get("optimizer") or "adamw"
    if usdc_blocks(model):
        if name != "adamw":
            raise CLIError(f"--optimizer: a USDC model trains with AdamW (its decision parameters in their own "
                           f"group), got {name!r}")
        return usdc_optimizer(model, settings, settings.get("arch_lr_scale", ARCH_LR_SCALE))
    return name


def _train_source(args, settings):
    source = args.source
    if os.path.exists(source):
        if not os.path.isfile(source):
            raise CLIError(f"SOURCE: expected a file or a timm model name, got the directory {source!r}")
        for k in ("channel_idle", "norm", "heuristic", "img_size", "num_classes", "model_kwargs"):
            if settings.get(k) is not None:
                raise CLIError(f"--{k.replace('_', '-')}: only applies when SOURCE is a timm model name; "
                               f"{source!r} is a file (set it when converting)")
        for k in ("branches", "join_values", "global_pool"):
            if settings.get(k) is not None:
                raise CLIError(f"--{k.replace('_', '-')}: only applies when SOURCE is a timm model name; {source!r} is "
                               f"a file (non-deep models are made by `vitfast train MODEL_NAME --branches n`; `vitfast "
                               f"convert` has no --branches)")
        for k in DWCONV_SETTINGS:
            if settings.get(k) is not None:
                raise CLIError(f"--{k.replace('_', '-')}: only applies when SOURCE is a timm model name; {source!r} is "
                               f"a file (convert it with --dwconv-blocks/--dwconv-heads)")
        if settings.get("drop_path") is not None:
            _drop_path_unused(settings, f"SOURCE {source!r} is a file (set it when converting)")
        kind = file_kind(source)
        if kind != "trainable":
            raise CLIError(f"SOURCE: expected a train-time .safetensors (from `vitfast convert`), got a {kind} file {source!r}"
                           + (" (continue a run with --resume)" if kind == "trainer" else ""))
        model, recipe = load_trainable(source)
        return model, recipe
    num_classes = settings.get("num_classes") or (10 if settings["data"] == "digits" else None)
    if num_classes is None and os.path.isdir(settings["data"]):
        num_classes = sum(1 for e in os.scandir(settings["data"]) if e.is_dir())
    model_kwargs = dict(settings.get("model_kwargs") or {})
    if settings.get("drop_path") is not None:
        if "drop_path_rate" in model_kwargs and model_kwargs["drop_path_rate"] != settings["drop_path"]:
            raise CLIError(f"--drop-path/--model-kwargs: two drop-path rates, {settings['drop_path']} and "
                           f"drop_path_rate={model_kwargs['drop_path_rate']}; give one")
        model_kwargs["drop_path_rate"] = settings["drop_path"]
    timm_model = build_timm_model(source, pretrained=None, img_size=settings.get("img_size"), num_classes=num_classes,
                                  model_kwargs=model_kwargs or None, flag="SOURCE",
                                  num_classes_from="--num-classes" if settings.get("num_classes") else "--data (its classes)")
    recipe = {"source": "timm", "model": source, "img_size": settings.get("img_size"), "num_classes": num_classes,
              "model_kwargs": model_kwargs}
    if settings.get("branches") is not None:
        if dwconv_given(settings):
            raise CLIError("--dwconv-blocks/--dwconv-heads: not supported together with --branches, got both")
        return nondeep_source(timm_model, settings, recipe)
    if dwconv_given(settings):
        return dwconv_source(timm_model, settings, recipe)
    if settings.get("channel_idle") is None:
        ffn_flags_need_channel_idle(settings, "without it the timm model trains as it is")
        return timm_model, recipe
    norm, heuristic = settings.get("norm") or "batch", settings.get("heuristic") or "static"
    model = vitfast.convert.from_timm(timm_model, channel_idle=settings["channel_idle"], norm=norm, heuristic=heuristic)
    recipe.update(channel_idle=settings["channel_idle"], norm=norm, heuristic=heuristic)
    return model, recipe


def _drop_path_unused(settings, why: str) -> None:
    """--drop-path shapes the model when it is built: refused when given explicitly, said aloud when a recipe's."""
    if settings.get("recipe") is None or "drop_path" in settings.get("explicit", ()):
        raise CLIError(f"--drop-path: only applies when SOURCE is a timm model name; {why}")
    print(f"note: the recipe's drop-path {settings['drop_path']:g} is not applied: {why}")


_TRAINER_FLAGS = {  # Trainer argument -> the `vitfast train` flag that sets it
    "warmup_steps": "--warmup", "warmup_fraction": "--warmup", "total_steps": "--steps", "epochs": "--epochs",
    "lr": "--lr", "weight_decay": "--weight-decay", "grad_clip": "--grad-clip", "label_smoothing": "--label-smoothing",
    "grad_accum": "--grad-accum", "amp": "--amp", "device": "--device", "eval_every": "--eval-every",
    "checkpoint_every": "--checkpoint-every", "seed": "--seed", "train_loader": "--batch-size/--grad-accum",
    "batch_size": "--batch-size",
}


def _trainer_error_as_flags(message: str) -> str:
    """A Trainer ValueError ("warmup_steps: expected ...") with the command-line flag named instead."""
    name, sep, rest = message.partition(":")
    return f"{_TRAINER_FLAGS[name]}{sep}{rest}" if sep and name in _TRAINER_FLAGS else message
