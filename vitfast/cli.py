"""The `vitfast` command line (also `python -m vitfast`): convert, train, fuse, verify, bench, export, demo, usdc.

Every subcommand explains itself with `vitfast <command> --help`.  Errors in what was asked for (a missing
file, θ outside [0, 1], an unknown timm model, ...) end with one line on stderr naming the argument, what was
expected and what was given, and exit status 2; a failed check (`verify`, `demo`) exits with 1.  Set
VITFAST_DEBUG=1 to see the Python traceback of an error instead.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import textwrap
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

if TYPE_CHECKING:  # annotations only: the CLI imports torch lazily, so `--help` stays fast
    import torch

from vitfast.methods.dwconv.recipe import DWCONV_SETTINGS  # names of the DW-conv options (no torch import)

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class CLIError(Exception):
    """An error in the user's request: printed as one line, exit status 2."""


# ---------------------------------------------------------------------------------------------- argument types
def _checked(text: str, convert: Callable[[str], Any], expected: str, ok: Callable[[Any], bool]) -> Any:
    """`convert(text)` if it parses and passes `ok` (NaN fails every range), else "expected ..., got TEXT"."""
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
    return value


def _theta(text: str) -> float:
    return _checked(text, float, "a number in [0, 1]", lambda v: 0.0 <= v <= 1.0)


def _positive_int(text: str) -> int:
    return _checked(text, int, "a positive integer", lambda v: v >= 1)


def _nonneg_float(text: str) -> float:
    # finite: `--lr inf` once passed and failed at step 1 with a NaN loss
    return _checked(text, float, "a finite number >= 0", lambda v: 0 <= v < float("inf"))


def _smoothing(text: str) -> float:
    # checked here, so the message names the option (the Trainer's said "label_smoothing: ...")
    return _checked(text, float, "a number in [0, 1)", lambda v: 0 <= v < 1)


def _positive_float(text: str) -> float:
    return _checked(text, float, "a finite number > 0", lambda v: 0 < v < float("inf"))


def _out_dir(path: str, flag: str = "--out", *, create: bool = True) -> str:
    """A directory for outputs, created if missing (a file there once raised FileExistsError's traceback).
    `create=False` only checks: a run that fails its later checks must not leave an empty directory behind."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise CLIError(f"{flag}: expected a directory (created if missing), got the file {path!r}")
    if create:
        os.makedirs(path, exist_ok=True)
    return path


def _existing_file(text: str) -> str:
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"expected an existing file, got {text!r} (no such file)")
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"expected a file, got {text!r} (a directory or special file)")
    return text


def _json_object(text: str) -> Dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"depth\": 4}}', got {text!r} ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"depth\": 4}}', got {text!r}")
    return value


def _batch_list(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers such as 1,64, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers such as 1,64, got {text!r}")
    return values


def _output_path(path: str, flag: str = "-o/--output") -> str:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise CLIError(f"{flag}: expected a path in an existing directory, got {path!r} ({directory} does not exist)")
    if os.path.isdir(path):
        raise CLIError(f"{flag}: expected a file path, got {path!r} (a directory)")
    return path


def _not_the_input(out: str, source: str, flag: str = "-o/--output", what: str = "SOURCE") -> None:
    """The output must not be the input file: it was replaced without a word (fuse: the train-time model by the
    fused one; export: the fused model by ONNX)."""
    if os.path.exists(out) and os.path.exists(source) and os.path.samefile(out, source):
        raise CLIError(f"{flag}: expected another path than {what} {source!r} (writing would replace it)")


# ---------------------------------------------------------------------------------------------- model helpers
def _same_size(value):
    """An image size as timm reads it (224 and [224, 224] are one size), other values as they are."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _timm_model(name: str, *, pretrained: Optional[str], img_size, num_classes, model_kwargs,
                flag: str = "MODEL", num_classes_from: str = "--num-classes") -> "torch.nn.Module":
    """A timm model by name, random init unless `pretrained` names a local weights file (never downloads).
    `num_classes_from`: where `num_classes` came from, for the message when --model-kwargs says otherwise."""
    import timm

    if flag != "MODEL" and (os.sep in name or name.endswith((".safetensors", ".pt", ".pth"))):
        raise CLIError(f"{flag}: expected an existing file or a timm model name, got {name!r} (no such file)")
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; list them with `python -c 'import timm; print(timm.list_models())'`"
        raise CLIError(f"{flag}: expected a timm model name, got {name!r}{hint}")
    kwargs = dict(model_kwargs or {})
    for flag_name, key, value in (("--img-size", "img_size", img_size), (num_classes_from, "num_classes", num_classes)):
        if value is None:
            continue
        if key in kwargs and _same_size(kwargs[key]) != _same_size(value):  # one of the two would be ignored
            once = "; give it once" if flag_name.startswith("--") and " " not in flag_name else ""
            raise CLIError(f"{flag_name}: {value!r} disagrees with {key}={kwargs[key]!r} in --model-kwargs{once}")
        kwargs[key] = value
    try:
        model = timm.create_model(name, pretrained=False, **kwargs)
    except (TypeError, ValueError, AssertionError) as exc:
        raise CLIError(f"--model-kwargs/--img-size/--num-classes: timm {name} rejected {kwargs} ({exc})") from exc
    if pretrained is None:
        return model
    state = _read_state_dict(pretrained, "--pretrained")
    try:  # weights made for exactly this shape: load them as they are
        model.load_state_dict(state, strict=True)
        return model
    except RuntimeError as exc:
        strict_error = str(exc).splitlines()[0]
    # Otherwise let timm adapt them (a different num_classes drops the classifier, a different img_size
    # resamples the position embedding).  Handing it the tensors, not a path or hub id, keeps it offline.
    overlay = {"state_dict": state, "source": "timm", "hf_hub_id": None, "url": None, "file": None}
    import torch

    # timm's adapted load is non-strict (it drops a mismatched classifier), so an unrelated file "loaded" and
    # left a random model.  Built twice from one seed, a weight matrix timm did not load still equals its
    # random init: any such tensor outside the classifier means the file does not fit.  (An unusual seed: a
    # checkpoint that *is* an initialisation, e.g. of seed 0, must not look unloaded.)
    with torch.random.fork_rng():
        torch.manual_seed(0x5EED_F17)
        fresh = timm.create_model(name, pretrained=False, **kwargs).state_dict()
        torch.manual_seed(0x5EED_F17)
        try:
            model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs)
        except (RuntimeError, KeyError, ValueError) as exc:
            raise CLIError(f"--pretrained: {pretrained!r} does not fit timm {name} with {kwargs} "
                           f"({str(exc).splitlines()[0]})") from exc
    classifier = model.pretrained_cfg.get("classifier") or ()
    classifier = (classifier,) if isinstance(classifier, str) else tuple(classifier)
    unloaded = [k for k, t in model.state_dict().items()
                if t.dim() >= 2 and not any(k == c or k.startswith(c + ".") for c in classifier)
                and torch.equal(t, fresh[k])]
    if unloaded:
        raise CLIError(f"--pretrained: {pretrained!r} does not fit timm {name} with {kwargs}: {len(unloaded)} weight "
                       f"tensors were not in it ({', '.join(unloaded[:4])}{', ...' if len(unloaded) > 4 else ''}); "
                       f"loading it as is: {strict_error}")
    print(f"note: --pretrained weights adapted by timm to {kwargs or 'the default shape'} "
          f"(they did not load as they are: {strict_error})")
    return model


def _read_state_dict(path: str, flag: str) -> Dict[str, "torch.Tensor"]:
    """Tensors from .safetensors, or from a torch file loaded with weights_only=True (no arbitrary pickle)."""
    import torch

    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        try:
            return load_file(path)
        except Exception as exc:
            raise CLIError(f"{flag}: {path!r} is not a readable .safetensors file ({exc})") from exc
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CLIError(
            f"{flag}: expected a .safetensors file or a torch state dict loadable with weights_only=True, "
            f"got {path!r} ({str(exc).splitlines()[0]})"
        ) from exc
    if not isinstance(state, dict):
        raise CLIError(f"{flag}: expected a state dict (a mapping of names to tensors) in {path!r}, got {type(state).__name__}")
    for wrapper in ("model", "state_dict", "model_ema"):
        if isinstance(state.get(wrapper), dict):
            state = state[wrapper]
            break
    return state


def _file_kind(path: str) -> str:
    """'trainable' | 'fused' | 'trainer' (a Trainer checkpoint) for a vitfast file; CLIError otherwise."""
    from vitfast.io.trainable import TRAINABLE_FORMAT, read_safetensors_metadata

    import zipfile

    from vitfast.io.fused import FORMAT as FUSED_FORMAT

    if zipfile.is_zipfile(path):  # torch.save's container: a Trainer checkpoint (read with weights_only)
        return "trainer"
    try:
        fmt = read_safetensors_metadata(path).get("format")
    except ValueError as exc:
        raise CLIError(
            f"{path}: expected a vitfast file (a .safetensors or a trainer checkpoint), got neither ({exc})"
        ) from exc
    if fmt == TRAINABLE_FORMAT:
        return "trainable"
    if fmt == FUSED_FORMAT:
        return "fused"
    raise CLIError(
        f"{path}: expected a vitfast file (train-time .safetensors from `vitfast convert`/`train`, a fused "
        f".safetensors from `vitfast fuse`, or a trainer checkpoint), got a .safetensors file with format {fmt!r}"
    )


def _load_source(path: str, flag: str):
    """Train-time model from a `convert`/`train` .safetensors or a trainer checkpoint -> (model, recipe)."""
    from vitfast.io.trainable import build_trainable, load_trainable
    from vitfast.io.trainer_checkpoint import load_trainer_checkpoint

    kind = _file_kind(path)
    if kind == "fused":
        raise CLIError(f"{flag}: expected a train-time model, got the already fused file {path!r}")
    if kind == "trainable":
        return load_trainable(path)
    state = load_trainer_checkpoint(path)
    extra = state.get("extra") or {}
    if "model_description" not in extra:
        raise CLIError(
            f"{flag}: the trainer checkpoint {path!r} does not say how to rebuild its model (it was not written by "
            "`vitfast train`); use the train-time .safetensors instead"
        )
    model = build_trainable(json.loads(extra["model_description"]))
    model.load_state_dict(state["model"])
    return model.eval(), json.loads(extra.get("recipe", "{}"))


def _describe(model) -> str:
    from vitfast.measure import count_parameters

    blocks = []
    for name, module in model.named_modules():
        if hasattr(module, "active_features") and hasattr(module, "hidden_features"):
            blocks.append(f"{module.active_features}/{module.hidden_features}")
    ffn = f", channel-idle FFNs (active/hidden per block: {' '.join(blocks)})" if blocks else ""
    nondeep = _nondeep_blocks(model)
    if nondeep:
        ffn += f", non-deep: {len(nondeep)} blocks x {nondeep[0].num_branches} branches ({nondeep[0].schedule})"
    from vitfast.methods.dwconv.recipe import describe_dwconv_model

    ffn += describe_dwconv_model(model)
    return f"{type(model).__name__}, {count_parameters(model):,} parameters{ffn}"


def _device(name: str) -> "torch.device":
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise CLIError(f"--device: expected a torch device such as cpu or cuda, got {name!r}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CLIError(f"--device: {name!r} asked for, but torch sees no CUDA device here")
    if device.type not in ("cpu", "cuda"):  # meta holds no data; others have no vitfast kernels
        raise CLIError(f"--device: expected cpu or cuda, got {name!r}")
    return device


def _set_threads(threads: Optional[int]) -> None:
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------- convert
def cmd_convert(args) -> int:
    import vitfast
    from vitfast.io.trainable import save_trainable

    out = _output_path(args.output)
    _check_gate_options(args)
    if args.repavit is not None:
        if getattr(args, "gates", False):
            raise CLIError("--gates: only for timm ViT/DeiT names (MODEL), not --repavit")
        if _dwconv_given(args):
            raise CLIError("--dwconv-blocks/--dwconv-heads: only for timm ViT/DeiT names (MODEL), not --repavit")
        if args.model is not None or args.pretrained is not None or args.model_kwargs:
            raise CLIError("--repavit: builds the model from the RePaViT state dict alone; drop MODEL/--pretrained/--model-kwargs")
        if args.norm != "batch" or args.heuristic != "static":
            raise CLIError("--repavit: official RePaViT models use norm=batch and one θ (heuristic=static)")
        state = _read_state_dict(args.repavit, "--repavit")
        theta = 0.75 if args.channel_idle is None else args.channel_idle
        model = vitfast.convert.from_repavit(
            state, num_heads=args.num_heads, num_classes=args.num_classes, img_size=args.img_size, idle_ratio=theta
        )
        recipe = {"source": "repavit", "file": os.path.basename(args.repavit), "channel_idle": theta}
    else:
        if args.model is None:
            raise CLIError("MODEL: expected a timm model name (e.g. deit_tiny_patch16_224) or --repavit PATH, got neither")
        if args.num_heads is not None:
            raise CLIError("--num-heads: only used with --repavit (timm names fix their head count)")
        timm_model = _timm_model(
            args.model, pretrained=args.pretrained, img_size=args.img_size, num_classes=args.num_classes,
            model_kwargs=args.model_kwargs,
        )
        theta = vitfast.convert.default_idle_ratio(timm_model) if args.channel_idle is None else args.channel_idle
        if _dwconv_given(args):
            model, theta = _convert_dwconv(args, timm_model), args.channel_idle
        elif getattr(args, "gates", False):
            model = _convert_usdc(args, timm_model)
        else:
            model = vitfast.convert.from_timm(timm_model, channel_idle=theta, norm=args.norm, heuristic=args.heuristic)
        recipe = {
            "source": "timm", "model": args.model, "pretrained": os.path.basename(args.pretrained) if args.pretrained else None,
            "img_size": args.img_size, "num_classes": args.num_classes, "model_kwargs": args.model_kwargs or {},
            "channel_idle": theta, "norm": args.norm, "heuristic": args.heuristic,
        }
        if getattr(args, "gates", False):
            recipe.update(channel_idle=args.channel_idle, gates=True, flops_target=args.flops_target,
                          gate_level=args.gate_level, gate_kind=args.gate_kind)
        if _dwconv_given(args):
            from vitfast.methods.dwconv.recipe import dwconv_recipe

            recipe.update(dwconv_recipe(vars(args)))
    save_trainable(model, out, recipe=recipe)
    print(f"converted: {_describe(model)}")
    print(f"wrote {out} (train-time; next: `vitfast train {out} ...` or `vitfast fuse {out} -o fused.safetensors`)")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- train
_NONDEEP_TRAIN_SETTINGS = ("branches", "join_values", "join_schedule", "join_start", "join_steps", "adjust_steps",
                           "diversity_weight", "distill_teacher", "distill_weight")


_TRAIN_SETTINGS = ("data", "val_data", "steps", "epochs", "lr", "weight_decay", "batch_size", "warmup", "label_smoothing",
                   "grad_clip", "seed", "img_size", "num_classes", "channel_idle", "norm", "heuristic", "model_kwargs",
                   "eval_every", "checkpoint_every") + _NONDEEP_TRAIN_SETTINGS
_TRAIN_SETTINGS = _TRAIN_SETTINGS + DWCONV_SETTINGS  # drop-in DW-conv heads
# USDC: stored with the run like the rest (a different value on --resume was silently ignored: the optimizer's
# restored state kept the old learning rates)
_TRAIN_SETTINGS = _TRAIN_SETTINGS + ("arch_lr_scale",)
_ARCH_LR_SCALE = 10.0  # the gates' and keep/prune logits' learning rate relative to --lr when not given


def _model_input(model):
    """((height, width) or None, num_classes) a timm model expects (non-square models keep both sides: the
    height alone made square inputs a 32×48 model refused)."""
    size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if size is not None:
        size = (int(size[0]), int(size[1])) if isinstance(size, (tuple, list)) else (int(size), int(size))
    return size, getattr(model, "num_classes", None)


def _size_text(size) -> str:
    return "unknown" if size is None else (f"{size[0]} px" if size[0] == size[1] else f"{size[0]}×{size[1]} px")


def _check_rgb_model(model, flag: str) -> None:
    """Both data sources (digits, image folders) give RGB images: a model of other input channels failed in its
    first forward with a conv traceback."""
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    in_chans = getattr(proj, "in_channels", 3)
    if in_chans != 3:
        raise CLIError(f"{flag}: the data are RGB images (3 channels), the model takes {in_chans} input channels")


def cmd_train(args) -> int:
    import torch

    from vitfast.training.data import digits_loaders, image_folder_loaders
    from vitfast.training.trainer import Trainer
    from vitfast.io.trainable import build_trainable, describe_trainable, save_trainable
    from vitfast.io.trainer_checkpoint import load_trainer_checkpoint

    _set_threads(args.threads)
    ctx = _train_process_group(args)
    given = {k: getattr(args, k) for k in _TRAIN_SETTINGS + _SCALE_SETTINGS if getattr(args, k) is not None}
    resume_state = None
    if args.resume is not None:
        resume_state = load_trainer_checkpoint(args.resume)
        extra = resume_state.get("extra") or {}
        if "train_settings" not in extra:
            raise CLIError(f"--resume: {args.resume!r} was not written by `vitfast train` (no settings stored)")
        stored = json.loads(extra["train_settings"])
        stored.setdefault("arch_lr_scale", _ARCH_LR_SCALE)  # runs from before it was stored used the default
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
        settings = {**_SCALE_DEFAULTS, **stored}  # checkpoints from before the scale settings existed
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
        if args.source is None and not _builds_student(args):
            raise CLIError("SOURCE: expected a train-time .safetensors (from `vitfast convert`) or a timm model name, got none")
        if args.out is None:
            raise CLIError("--out: expected a directory for the checkpoint and the trained model, got none")
        settings = {"data": "digits", "steps": None, "epochs": None, "lr": 1e-3, "weight_decay": 0.05, "batch_size": 64,
                    "warmup": 0.05, "label_smoothing": 0.0, "grad_clip": 1.0, "seed": 0, "eval_every": None,
                    "checkpoint_every": None, "val_data": None}
        settings.update(_SCALE_DEFAULTS)
        settings.update(given)
        settings["threads"] = torch.get_num_threads()  # restored by --resume (see there)
        if settings["steps"] is None and settings["epochs"] is None:
            settings["epochs"] = 10
        if settings["steps"] is not None and settings["epochs"] is not None:
            raise CLIError(f"--steps/--epochs: expected one of them, got --steps {settings['steps']} and --epochs {settings['epochs']}")
        _seed_model_init(settings["seed"])
        model, recipe = _distill_student(args, settings) if _builds_student(args) else _train_source(args, settings)
        out_dir = args.out
    _out_dir(out_dir, create=False)  # created once every check below has passed

    img_size, num_classes = _model_input(model)
    data = settings["data"]
    _check_rgb_model(model, "--data")
    shard = _data_shard(settings, ctx)
    if data == "digits":
        if settings.get("val_data") is not None:  # was silently unused
            raise CLIError("--val-data: only with --data DIR (the digits have their own validation split)")
        if img_size is None:
            raise CLIError("SOURCE: cannot tell the model's input size (no patch_embed.img_size)")
        try:
            train_loader, val_loader = digits_loaders(img_size=img_size, seed=settings["seed"], **shard)
        except ValueError as exc:
            raise CLIError(_trainer_error_as_flags(str(exc))) from None
        data_classes = 10
    else:
        if not os.path.isdir(data):
            raise CLIError(f"--data: expected 'digits' or a directory of class sub-folders, got {data!r}")
        train_loader, val_loader = image_folder_loaders(
            data, img_size=img_size, val_root=settings.get("val_data"), seed=settings["seed"], **shard
        )
        data_classes = len(train_loader.dataset.classes)
    if num_classes != data_classes:
        raise CLIError(
            f"SOURCE: the model has {num_classes} classes, the data has {data_classes}; "
            f"convert with --num-classes {data_classes}"
        )
    if getattr(args, "usdc_prune", False):
        model = _usdc_stage2(model, resume_state)
    if len(train_loader) < settings["grad_accum"]:  # the Trainer refuses it too, naming its own arguments
        raise CLIError(f"--batch-size/--grad-accum: one optimizer step needs {settings['grad_accum']} micro-batches of "
                       f"{train_loader.batch_size} images, the training split gives {len(train_loader)} per process; "
                       f"lower --batch-size or --grad-accum")
    # A resumed run keeps its length as its checkpoint counts it: with --epochs the count depends on --grad-accum
    # (and older vitfast counted micro-batches), so recomputing it refused the checkpoint ("total_steps=44, this
    # Trainer has 22") with no flag to get past it.
    steps, epochs = ((resume_state["total_steps"], None) if resume_state is not None
                     else (settings["steps"], settings["epochs"]))
    _apply_join_settings(model, settings, Trainer._resolve_total_steps(steps, epochs, train_loader,
                                                                       settings["grad_accum"]))
    description = json.dumps(describe_trainable(model))
    warmup = settings["warmup"]
    model.to(ctx.device)
    trainer_cls, scale_kwargs = _scale_trainer(settings, ctx, num_classes, model)
    attn_trainer_cls, attn_kwargs = _distill_trainer(model, settings, ctx)
    if attn_kwargs:
        # Attention-map distillation (non-deep, --distill-teacher) and logit distillation (--teacher) are two
        # Trainer subclasses with their own compute_loss; combining them is not supported yet.
        if trainer_cls is not Trainer:
            raise CLIError("--distill-teacher: attention-map distillation cannot be combined with --teacher yet")
        trainer_cls = attn_trainer_cls
    try:
        trainer = trainer_cls(
            model, train_loader, val_loader, **scale_kwargs, **attn_kwargs,
            optimizer=_usdc_optimizer(model, settings, settings.get("arch_lr_scale", _ARCH_LR_SCALE)),
            total_steps=steps, epochs=epochs, lr=settings["lr"], weight_decay=settings["weight_decay"],
            warmup_fraction=warmup if warmup < 1 else 0.0, warmup_steps=int(warmup) if warmup >= 1 else None,
            label_smoothing=settings["label_smoothing"], grad_clip=settings["grad_clip"] or None, seed=settings["seed"],
            eval_every=settings["eval_every"] or max(1, len(train_loader) // settings["grad_accum"]),
            checkpoint_path=os.path.join(out_dir, "trainer.pt"), checkpoint_every=settings["checkpoint_every"],
            checkpoint_extra={"model_description": description, "recipe": json.dumps(recipe),
                              "train_settings": json.dumps(settings)},
            progress=not args.no_progress,
        )
    except ValueError as exc:
        raise CLIError(_trainer_error_as_flags(str(exc))) from None
    _out_dir(out_dir)  # only now: a refused setting left an empty --out behind
    say = print if ctx.rank == 0 else (lambda *a, **k: None)
    if resume_state is not None:
        trainer.load_state_dict(resume_state)
        say(f"resuming at step {trainer.step}/{trainer.total_steps} from {args.resume}")
    say(f"training {_describe(model)} on {data} for {trainer.total_steps} steps ({torch.get_num_threads()} threads)"
        + _scale_note(settings, ctx))
    summary = trainer.fit()
    model.eval()
    model_path = os.path.join(out_dir, "model.safetensors")
    if ctx.rank == 0:
        save_trainable(model.cpu(), model_path,
                       recipe={**recipe, "trained": {k: settings[k] for k in ("data", "steps", "epochs", "lr", "seed")}})
    _train_process_group_end(ctx)
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


def _train_source(args, settings):
    import vitfast
    from vitfast.io.trainable import load_trainable

    source = args.source
    if os.path.exists(source):
        if not os.path.isfile(source):
            raise CLIError(f"SOURCE: expected a file or a timm model name, got the directory {source!r}")
        for k in ("channel_idle", "norm", "heuristic", "img_size", "num_classes", "model_kwargs"):
            if settings.get(k) is not None:
                raise CLIError(f"--{k.replace('_', '-')}: only applies when SOURCE is a timm model name; "
                               f"{source!r} is a file (set it when converting)")
        for k in ("branches", "join_values"):
            if settings.get(k) is not None:
                raise CLIError(f"--{k.replace('_', '-')}: only applies when SOURCE is a timm model name; {source!r} is "
                               f"a file (non-deep models are made by `vitfast train MODEL_NAME --branches n`; `vitfast "
                               f"convert` has no --branches)")
        for k in DWCONV_SETTINGS:
            if settings.get(k) is not None:
                raise CLIError(f"--{k.replace('_', '-')}: only applies when SOURCE is a timm model name; {source!r} is "
                               f"a file (convert it with --dwconv-blocks/--dwconv-heads)")
        kind = _file_kind(source)
        if kind != "trainable":
            raise CLIError(f"SOURCE: expected a train-time .safetensors (from `vitfast convert`), got a {kind} file {source!r}"
                           + (" (continue a run with --resume)" if kind == "trainer" else ""))
        model, recipe = load_trainable(source)
        return model, recipe
    num_classes = settings.get("num_classes") or (10 if settings["data"] == "digits" else None)
    if num_classes is None and os.path.isdir(settings["data"]):
        num_classes = sum(1 for e in os.scandir(settings["data"]) if e.is_dir())
    timm_model = _timm_model(source, pretrained=None, img_size=settings.get("img_size"), num_classes=num_classes,
                             model_kwargs=settings.get("model_kwargs"), flag="SOURCE",
                             num_classes_from="--num-classes" if settings.get("num_classes") else "--data (its classes)")
    recipe = {"source": "timm", "model": source, "img_size": settings.get("img_size"), "num_classes": num_classes,
              "model_kwargs": settings.get("model_kwargs") or {}}
    if settings.get("branches") is not None:
        if _dwconv_given(settings):
            raise CLIError("--dwconv-blocks/--dwconv-heads: not supported together with --branches, got both")
        return _nondeep_source(timm_model, settings, recipe)
    if _dwconv_given(settings):
        return _dwconv_source(timm_model, settings, recipe)
    if settings.get("channel_idle") is None:
        _ffn_flags_need_channel_idle(settings, "without it the timm model trains as it is")
        return timm_model, recipe
    norm, heuristic = settings.get("norm") or "batch", settings.get("heuristic") or "static"
    model = vitfast.convert.from_timm(timm_model, channel_idle=settings["channel_idle"], norm=norm, heuristic=heuristic)
    recipe.update(channel_idle=settings["channel_idle"], norm=norm, heuristic=heuristic)
    return model, recipe


def _nondeep_source(timm_model, settings, recipe):
    """A timm ViT/DeiT made non-deep (--branches n): θ = --channel-idle or 0, FFN norm --norm with --channel-idle,
    else layer (a plain non-deep model: the same FFN as the timm one)."""
    import vitfast

    _ffn_flags_need_channel_idle(settings, "a plain non-deep model keeps timm's FFNs")
    theta = settings.get("channel_idle") or 0.0
    norm = (settings.get("norm") or "batch") if settings.get("channel_idle") is not None else "layer"
    try:
        model = vitfast.convert.from_timm(
            timm_model, branches=settings["branches"], channel_idle=theta, norm=norm,
            heuristic=settings.get("heuristic") or "static", join_values=bool(settings.get("join_values")),
        )
    except ValueError as exc:
        raise CLIError(f"--branches: {exc}") from None
    recipe.update(branches=settings["branches"], channel_idle=theta, norm=norm,
                  join_values=bool(settings.get("join_values")))
    return model, recipe


def _check_teacher_input(teacher, student, flag: str) -> None:
    """Before --out is created (the trainers check it too, later)."""
    from vitfast.methods.distill.trainer import check_teacher_input

    try:
        check_teacher_input(teacher, student, flag)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def _distill_trainer(model, settings, ctx):
    """(Trainer class, its extra kwargs): attention-map distillation from --distill-teacher when given."""
    from vitfast.training.trainer import Trainer
    from vitfast.io.trainable import load_trainable

    if settings.get("distill_teacher") is None:
        if settings.get("distill_weight") is not None:
            raise CLIError("--distill-weight: only applies with --distill-teacher, got no teacher")
        return Trainer, {}
    from vitfast.methods.nondeep.attn_distill import AttentionDistillation, AttentionDistillTrainer

    path = settings["distill_teacher"]
    if _file_kind(path) != "trainable":
        raise CLIError(f"--distill-teacher: expected a train-time .safetensors (from `vitfast train`), got {path!r}")
    teacher, _ = load_trainable(path)
    _check_teacher_input(teacher, model, "--distill-teacher")
    try:
        distill = AttentionDistillation(model, teacher.to(ctx.device))
    except ValueError as exc:
        raise CLIError(f"--distill-teacher: {exc}") from None
    weight = 1.0 if settings.get("distill_weight") is None else settings["distill_weight"]
    return AttentionDistillTrainer, {"distill": distill, "distill_weight": weight}


# ---------------------------------------------------------------------------------------------- train: distillation and scale
# Settings of `vitfast train` for distillation (swin-distillation-compression) and for training at scale.  They are
# stored in the checkpoint with the others, so --resume continues the same recipe.
_SCALE_SETTINGS = ("teacher", "distill", "tau", "alpha", "alpha_schedule", "harmonic", "student_depth",
                   "student_depths", "student_cut", "student_init", "grad_accum", "amp")
_SCALE_DEFAULTS = {"grad_accum": 1, "amp": None}


def _number_list(text: str, cast, valid, expected: str) -> list:
    """Comma-separated numbers for argparse: `cast` each, all passing `valid(values)`, else `expected` in the error."""
    try:
        values = [cast(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or not valid(values):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return values


def _alpha_pair(text: str) -> List[float]:
    return _number_list(text, float, lambda v: len(v) == 2 and all(0.0 <= x <= 1.0 for x in v),
                        "two numbers in [0, 1] such as 0,0.5")


def _weight_pair(text: str) -> List[float]:
    return _number_list(text, float, lambda v: len(v) == 2 and all(x > 0 for x in v),
                        "two numbers > 0 (w_d,w_s) such as 13,1")


def _depth_list(text: str) -> List[int]:
    return _number_list(text, int, lambda v: all(x >= 1 for x in v),
                        "comma-separated positive stage depths such as 2,2,2,2")


def _add_scale_args(p) -> None:
    g = p.add_argument_group("distillation (swin-distillation-compression; needs --teacher)")
    g.add_argument("--teacher", type=_existing_file, default=None, metavar="PATH",
                   help="the fine-tuned teacher: a train-time .safetensors (`vitfast train` output) or trainer checkpoint")
    g.add_argument("--distill", choices=("mse", "kl", "none"), default=None,
                   help="distillation loss L_d: MSE on logits (the paper's), KL with --tau, or none (CE only; e.g. "
                        "the copied student without distillation) [default with --teacher: mse]")
    g.add_argument("--tau", type=_positive_float, default=None, help="KL temperature (--distill kl) [default: 4]")
    g.add_argument("--alpha", type=_theta, default=None,
                   help="eq. 1: L = (1-α)·L_d + α·L_s with fixed α [default: 0.25 unless --alpha-schedule/--harmonic]")
    g.add_argument("--alpha-schedule", type=_alpha_pair, default=None, metavar="A0,A1",
                   help="eq. 1 with α linear from A0 to A1 over the run (Table VI's best: 0,0.5)")
    g.add_argument("--harmonic", type=_weight_pair, nargs="?", const=[13.0, 1.0], default=None, metavar="WD,WS",
                   help="eq. 4: weighted harmonic mean of L_d and L_s (bare flag: w_d=13, w_s=1, the paper's best)")
    g.add_argument("--student-depth", type=_positive_int, default=None, metavar="N",
                   help="build the student from the ViT teacher with N blocks (Algorithm 1; SOURCE is then omitted)")
    g.add_argument("--student-depths", type=_depth_list, default=None, metavar="D1,D2,..",
                   help="build the student from the Swin teacher with these stage depths, e.g. 2,2,2,2 (Swin-N)")
    g.add_argument("--student-cut", type=int, default=None, metavar="P1",
                   help="blocks copied before the cut (ViT: p1; Swin: in the shallower stage) [default: vitfast.methods.distill.student]")
    g.add_argument("--student-init", choices=("copy", "random"), default=None,
                   help="copy the teacher's blocks before the cut (Algorithm 1), or random init (from scratch) [default: copy]")
    g = p.add_argument_group("scale (single process or torchrun --nproc_per_node N)")
    g.add_argument("--grad-accum", type=_positive_int, default=None,
                   help="micro-batches per optimizer step; --batch-size is the global batch, split over processes and "
                        "micro-batches [default: 1]")
    g.add_argument("--amp", choices=("bf16", "fp16"), default=None,
                   help="mixed precision: bf16 autocast (CPU or GPU), fp16 autocast + loss scaling (GPU only)")
    g.add_argument("--device", default=None,
                   help="cpu or cuda (under torchrun: each process takes GPU LOCAL_RANK; NCCL on GPU, gloo on CPU) [default: cpu]")


def _train_process_group(args):
    """Join torchrun's process group when there is one (WORLD_SIZE > 1); else the single-process context."""
    from vitfast.training.distributed import DistContext, init_from_env

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return DistContext(0, 0, 1, None, _device(args.device or "cpu"))
    if args.device is not None:
        _device(args.device)  # the clean error when CUDA is asked for and absent
    return init_from_env("cuda" if args.device and args.device.startswith("cuda") else "cpu")


def _train_process_group_end(ctx) -> None:
    from vitfast.training.distributed import cleanup

    if ctx.world_size > 1:
        cleanup()


def _seed_model_init(seed: int) -> None:
    """--seed fixes the initial weights too, so every process (and a single-process rerun) builds the same model."""
    from vitfast.training.rng import seed_everything

    seed_everything(seed)


def _builds_student(args) -> bool:
    return args.student_depth is not None or args.student_depths is not None


def _distill_student(args, settings):
    """Algorithm 1, lines 2-3: the student built from --teacher (then converted like a timm name, if asked)."""
    import vitfast
    from vitfast.methods.distill.student import make_student

    if settings.get("teacher") is None:
        raise CLIError("--student-depth/--student-depths: build the student from a teacher; give --teacher PATH")
    if args.source is not None:
        raise CLIError("SOURCE: not used with --student-depth/--student-depths (the student is built from --teacher); drop it")
    for k in ("img_size", "num_classes", "model_kwargs"):
        if settings.get(k) is not None:
            raise CLIError(f"--{k.replace('_', '-')}: the student takes the teacher's shape; drop it")
    teacher, _ = _load_source(settings["teacher"], "--teacher")
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
        return _nondeep_source(student, settings, recipe)
    if settings.get("channel_idle") is None:
        _ffn_flags_need_channel_idle(settings, "without it the student keeps the teacher's FFNs")
        return student, recipe
    norm, heuristic = settings.get("norm") or "batch", settings.get("heuristic") or "static"
    student = vitfast.convert.from_timm(student, channel_idle=settings["channel_idle"], norm=norm, heuristic=heuristic)
    recipe.update(channel_idle=settings["channel_idle"], norm=norm, heuristic=heuristic)
    return student, recipe


def _data_shard(settings, ctx) -> Dict[str, int]:
    """Per-process loader arguments: --batch-size is the global batch of one optimizer step."""
    batch, accum, world = settings["batch_size"], settings["grad_accum"], ctx.world_size
    if batch % (accum * world):
        raise CLIError(f"--batch-size: expected a multiple of --grad-accum ({accum}) x processes ({world}), got {batch}")
    return {"batch_size": batch // (accum * world), "num_replicas": world, "rank": ctx.rank}


def _scale_trainer(settings, ctx, num_classes, model):
    """(Trainer class, its extra keyword arguments) for the distillation and scale settings."""
    from vitfast.methods.distill.trainer import DistillTrainer
    from vitfast.training.trainer import Trainer

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
    teacher, _ = _load_source(teacher_path, "--teacher")
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


def _scale_note(settings, ctx) -> str:
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


# ---------------------------------------------------------------------------------------------- distill-demo
def cmd_distill_demo(args) -> int:
    from vitfast.demos.distill_demo import format_distill_table, run_distill_demo, target_ordering_holds

    _set_threads(args.threads)
    json_out = _output_path(args.json, "--json") if args.json else None  # checked before minutes of training
    report = run_distill_demo(quick=args.quick, teacher_steps=args.teacher_steps, student_steps=args.student_steps,
                              seed=args.seed, progress=not args.no_progress, log=lambda *a: None)
    print(format_distill_table(report))
    holds = target_ordering_holds(report)
    acc = [r["acc"] for r in report["students"]]
    print(f"Table IX ordering (scratch < scratch+KD < copied): {'holds' if holds else 'does NOT hold'}; "
          f"copied+KD vs copied (row 4, reported only): {acc[3]:.4f} vs {acc[2]:.4f}")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {json_out}")
    return EXIT_CHECK_FAILED if (args.check and not holds) else EXIT_OK


# ---------------------------------------------------------------------------------------------- fuse
def cmd_fuse(args) -> int:
    import torch

    import vitfast
    from vitfast.measure import count_parameters

    out = _output_path(args.output)
    _not_the_input(out, args.source)
    model, _ = _load_source(args.source, "SOURCE")
    fused = vitfast.fuse(model)
    vitfast.save(fused, out)
    print(f"fused {count_parameters(model):,} -> {count_parameters(fused):,} parameters; wrote {out} "
          f"({os.path.getsize(out) / 1e6:.2f} MB)")
    img_size, _ = _model_input(model)
    if not args.no_check and img_size is None:
        print("quick check skipped: the model does not say its input size (no patch_embed.img_size)")
    elif not args.no_check:
        in_chans = getattr(getattr(model, "patch_embed", None), "proj", None)
        in_chans = in_chans.in_channels if in_chans is not None else 3
        x = torch.randn(2, in_chans, *img_size, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            diff = float((model.eval()(x) - vitfast.load(out)(x)).abs().max())
        print(f"quick check (2 random images, the file reloaded): max |Δlogits| = {diff:.2e}; "
              f"full check: `vitfast verify {out} --source {args.source}`")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- verify
def cmd_verify(args) -> int:
    import torch

    import vitfast
    from vitfast.training.data import digits_loaders

    _set_threads(args.threads)
    device = _device(args.device)
    if _file_kind(args.fused) != "fused":
        raise CLIError(f"FUSED: expected a fused .safetensors (from `vitfast fuse`), got {args.fused!r}")
    fused = vitfast.load(args.fused).to(device)
    source, _ = _load_source(args.source, "--source")
    source = source.to(device)
    img_size, _ = _model_input(source)
    proj = getattr(getattr(source, "patch_embed", None), "proj", None)
    in_chans = proj.in_channels if proj is not None else 3
    fused_size, _ = _model_input(fused)
    if fused_size != img_size:  # once timm's AssertionError from the first forward
        raise CLIError(f"FUSED/--source: expected models of one input size, got {_size_text(fused_size)} (fused) "
                       f"and {_size_text(img_size)} (source)")
    if args.inputs == "digits":
        _check_rgb_model(source, "--inputs digits")
        _, loader = digits_loaders(img_size=img_size, batch_size=args.batch_size, eval_batch_size=args.batch_size)
        batches = [x for x, _ in loader]
    else:
        g = torch.Generator().manual_seed(args.seed)
        batches = [torch.randn(args.batch_size, in_chans, *img_size, generator=g) for _ in range(args.batches)]
    max_abs, max_ref, agree, n, err2, ref2 = 0.0, 0.0, 0, 0, 0.0, 0.0
    with torch.no_grad():
        for x in batches:
            x = x.to(device)
            ref, out = source(x), fused(x)
            if ref.shape != out.shape:
                print(f"MISMATCH: output shapes differ: source {tuple(ref.shape)}, fused {tuple(out.shape)}")
                return EXIT_CHECK_FAILED
            max_abs = max(max_abs, float((ref - out).abs().max()))
            max_ref = max(max_ref, float(ref.abs().max()))
            err2 += float(((ref - out) ** 2).sum())
            ref2 += float((ref ** 2).sum())
            agree += int((ref.argmax(-1) == out.argmax(-1)).sum())
            n += int(ref.shape[0])
    bound = args.atol + args.rtol * max_ref
    nmse = err2 / ref2 if ref2 > 0 else err2
    finite = all(map(lambda v: v == v and abs(v) != float("inf"), (max_abs, max_ref)))
    ok = finite and max_abs <= bound
    print(f"inputs: {n} {args.inputs} images of {in_chans}x{img_size[0]}x{img_size[1]} on {device}")
    print(f"max |Δlogits| = {max_abs:.3e} (tolerance {bound:.3e} = atol {args.atol:g} + rtol {args.rtol:g} x max|logit| {max_ref:.3g})")
    print(f"normalised MSE = {nmse:.3e}; argmax agreement = {agree}/{n} ({agree / n:.2%})")
    print("OK: the fused model matches its source" if ok else "MISMATCH: the fused model does not match its source")
    return EXIT_OK if ok else EXIT_CHECK_FAILED


# ---------------------------------------------------------------------------------------------- bench
def _si(value: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g}"


def _thread_list(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers such as 1,2, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers such as 1,2, got {text!r}")
    return values


def _providers(text: str) -> List[str]:
    from vitfast.bench import parse_providers

    try:
        return parse_providers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None


def cmd_bench(args) -> int:
    import torch

    import vitfast
    from vitfast.bench import DEFAULT_PROVIDERS
    from vitfast.io.fused import read_config

    device = _device(args.device)
    if args.dtype != "float32" and device.type != "cuda":
        raise CLIError(f"--dtype: {args.dtype} needs --device cuda (CPU runs float32), got --device {args.device}")
    json_path = _output_path(args.json, "--json") if args.json else None
    png_path = _chart_path(args.png) if args.png else None
    threads = args.threads or [torch.get_num_threads()]
    if args.providers is not None:
        providers = args.providers
        if device.type != "cpu" and any(p.startswith("ort-") for p in providers):
            raise CLIError(f"--providers: ONNX Runtime providers run on the CPU only, got {','.join(providers)} "
                           f"with --device {args.device}")
        if device.type != "cuda" and any(p.endswith("-graph") for p in providers):
            raise CLIError(f"--providers: the CUDA-graph providers need --device cuda, got {','.join(providers)} "
                           f"with --device {args.device}")
    else:
        providers = [p for p in DEFAULT_PROVIDERS if device.type == "cpu" or not p.startswith("ort-")]
        if device.type == "cuda":  # launch overhead is most of batch 1 on a GPU: show both models without it
            providers += ["timm-graph", "vitfast-graph"]
    torch.manual_seed(0)
    if os.path.exists(args.target):
        if not os.path.isfile(args.target):
            raise CLIError(f"TARGET: expected a fused .safetensors file or a timm model name, got the directory {args.target!r}")
        if _file_kind(args.target) != "fused":
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
            baseline = _skeleton_baseline(source if isinstance(source, dict) else config["architecture"])
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
        baseline = _timm_model(args.target, pretrained=None, img_size=args.img_size, num_classes=args.num_classes,
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

    _output_path(path, "--png")
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if not ext:
        path, ext = path + ".png", "png"
    formats = Figure().canvas.get_supported_filetypes()
    if ext not in formats:
        raise CLIError(f"--png: expected a chart file name ending in one of {', '.join('.' + f for f in sorted(formats))}, "
                       f"got {path!r}")
    return _output_path(path, "--png")


def _skeleton_baseline(architecture: dict) -> "torch.nn.Module":
    """The timm model a fused file was made from, with timm's random init, in eval mode.

    build_timm skips timm's init (a load overwrites every tensor); timed as it came, its uninitialised memory
    (NaN cls_token, 1e31 pos_embed) made every "timm" row time a NaN model and the ONNX check fail."""
    from vitfast.arch import build_timm

    baseline = build_timm(architecture)
    baseline.init_weights()
    return baseline.eval()


def _bench_and_report(args, baseline, fused, device, threads, providers, json_path, png_path, *, title, recipe,
                      note) -> int:
    """Time `baseline` against `fused` (vitfast.bench.run_bench), print the table, write --json/--png."""
    from vitfast.bench import DTYPES, format_report, plot_report, run_bench
    from vitfast.export import model_input_shape

    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    report = run_bench(
        baseline, fused, input_shape=model_input_shape(baseline), threads=threads, batch_sizes=args.batch_sizes,
        providers=providers, repeats=args.repeats, warmup=args.warmup, device=device, dtype=DTYPES[args.dtype],
        ort_spinning=args.ort_spinning, meta={"title": title, "target": args.target, "recipe": recipe, "note": note}, log=log,
    )
    print(format_report(report))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {json_path}")
    if png_path:
        plot_report(report, png_path)
        print(f"wrote {png_path}")
    return EXIT_CHECK_FAILED if report["errors"] else EXIT_OK


def _bench_nondeep(args, baseline, device, threads, providers, json_path, png_path) -> int:
    """`vitfast bench MODEL --branches n`: timm MODEL (L layers) against its fused L/n-layer non-deep model."""
    import vitfast

    theta = args.channel_idle or 0.0
    norm = args.norm if args.channel_idle is not None else "layer"
    try:
        trainable = vitfast.convert.from_timm(baseline, branches=args.branches, channel_idle=theta, norm=norm,
                                              heuristic=args.heuristic, join_values=bool(args.join_values)).eval()
    except ValueError as exc:
        raise CLIError(f"--branches: {exc}") from None
    for block in _nondeep_blocks(trainable):
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


# ---------------------------------------------------------------------------------------------- export
def _export_batch(text: str):
    if text == "dynamic":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'dynamic' or a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 'dynamic' or a positive integer, got {value}")
    return value


def cmd_export(args) -> int:
    import torch

    import vitfast
    from vitfast.export import ExportError, ExportMismatchError, to_onnx

    out = _output_path(args.output)
    _not_the_input(out, args.fused, what="FUSED")
    if _file_kind(args.fused) != "fused":
        raise CLIError(f"FUSED: expected a fused .safetensors (from `vitfast fuse`), got a train-time file {args.fused!r} "
                       "(fuse it first)")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model = vitfast.load(args.fused)
    # The ONNX graph is float32 (what to_onnx exports and checks); a bf16/fp16 file is widened here, since the
    # command line has no way to follow to_onnx's "call .float() first".
    low = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters() if p.dtype != torch.float32})
    if low:
        print(f"FUSED holds {', '.join(low)} weights: exported as float32 (the ONNX graph's dtype)")
        model = model.float()
    try:
        report = to_onnx(model, out, batch=args.batch, opset=args.opset, exporter=args.exporter,
                         check=not args.no_check, atol=args.atol, rtol=args.rtol)
    except ExportMismatchError as exc:
        print(f"vitfast export: MISMATCH: {exc}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    except ExportError as exc:
        print(f"vitfast export: error: {exc}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    batch = "dynamic batch axis" if report.dynamic_batch else f"batch {report.batch}"
    print(f"wrote {out} ({report.bytes / 1e6:.2f} MB): {report.exporter} exporter, opset {report.opset}, {batch}, "
          f"input {report.input_shape}, {report.nodes} nodes, standard ONNX ops only: {', '.join(report.op_types)}")
    if report.notes:
        print("notes: " + "; ".join(report.notes))
    if args.no_check:
        print("not checked in ONNX Runtime (--no-check)")
    else:
        print(f"check: ONNX Runtime vs vitfast at batch {' and '.join(map(str, report.checked_batches))}: "
              f"max |Δ| = {report.max_abs_diff:.3e} (tolerance {report.tolerance:.3e} = atol {args.atol:g} + "
              f"rtol {args.rtol:g} x max|output| {report.max_abs_output:.3g}): OK")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- demo
def cmd_demo(args) -> int:
    from vitfast.demos.demo import run_demo

    if args.nondeep:
        return _demo_nondeep(args)
    if args.branches is not None or args.join_schedule is not None or args.lr is not None:
        raise CLIError("--branches/--join-schedule/--lr: only used with --nondeep")
    report = run_demo(steps=args.steps, threads=args.threads, out_dir=args.out, quick=args.quick, seed=args.seed,
                      progress=not args.no_progress, repeats=args.repeats)
    if not report["accuracy_equal"]:
        print(f"FAILED: fused accuracy {report['accuracy_fused']:.4f} differs from train-time {report['accuracy_train']:.4f}")
        return EXIT_CHECK_FAILED
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- select-heads
def cmd_select_heads(args) -> int:
    """Σ_h of every attention head over N_s samples (one Welford pass), printed and saved as JSON."""
    import torch

    from vitfast.training.data import digits_loaders, image_folder_loaders
    from vitfast.methods.dwconv.head_selection import attention_std_scores

    out = _output_path(args.output)
    _set_threads(args.threads)
    if os.path.isfile(args.source):
        model, _ = _load_source(args.source, "SOURCE")
    else:
        model = _timm_model(args.source, pretrained=args.pretrained, img_size=args.img_size,
                            num_classes=args.num_classes, model_kwargs=args.model_kwargs, flag="SOURCE")
    img_size, _ = _model_input(model)
    data = args.data or "digits"
    _check_rgb_model(model, "--data")
    # N_s samples from the training split (appendix A.3.3), without augmentation: the score measures the map's
    # spread over the data, not over random crops.
    if data == "digits":
        loader, _ = digits_loaders(img_size=img_size or 32, batch_size=args.batch_size, augment=False,
                                   drop_last=False, seed=args.seed)
    elif os.path.isdir(data):
        loader, _ = image_folder_loaders(data, img_size=img_size or 224, batch_size=args.batch_size, augment=False,
                                         seed=args.seed)
    else:
        raise CLIError(f"--data: expected 'digits' or a directory of class sub-folders, got {data!r}")
    torch.manual_seed(args.seed)
    ranking = attention_std_scores(model, loader, num_samples=args.num_samples, progress=not args.no_progress)
    ranking.save(out)
    print(ranking.format_table(top=args.top))
    print(f"wrote {out} (use it with vitfast.convert.from_timm(model, dwconv_blocks=k, ranking={out!r}))")
    return EXIT_OK


def _add_select_heads_parser(sub) -> None:
    p = sub.add_parser(
        "select-heads", formatter_class=_Formatter,
        help="rank attention heads by Σ_h (drop-in depthwise convolution): which to replace first",
        description=textwrap.dedent("""\
            Score every attention head with Σ_h, the sum over the attention map's entries of their standard
            deviation across N_s input samples (dropin-depthwise-conv-attention eq. 15; one pass, Welford), and
            each block with Σ_b, the mean over its heads (eq. 16).  Lowest first: the most convolution-like
            heads/blocks, the ones to replace.  Prints the ranking and writes it as JSON for
            vitfast.convert.from_timm(..., dwconv_blocks=k / dwconv_heads=p, ranking=PATH)."""),
        epilog=textwrap.dedent("""\
            examples:
              vitfast select-heads deit_tiny_patch16_224 --img-size 32 --pretrained deit_tiny.pth -o ranking.json
              vitfast select-heads run/model.safetensors --data /data/imagenet/train --num-samples 1000 -o ranking.json"""),
    )
    p.add_argument("source", metavar="SOURCE", help="timm model name, or a train-time .safetensors / trainer checkpoint")
    p.add_argument("-o", "--output", required=True, help="output ranking .json path")
    p.add_argument("--pretrained", type=_existing_file, default=None, metavar="PATH", help="local weights for a timm SOURCE")
    p.add_argument("--img-size", type=_positive_int, default=None, help="input resolution for a timm SOURCE")
    p.add_argument("--num-classes", type=_positive_int, default=None, help="classifier outputs for a timm SOURCE")
    p.add_argument("--model-kwargs", type=_json_object, default=None, metavar="JSON", help="more timm constructor arguments")
    p.add_argument("--data", default=None, help="'digits' or an image-folder directory (training split) [default: digits]")
    p.add_argument("--num-samples", type=_positive_int, default=1000, help="N_s, images scored (the paper's 1000)")
    p.add_argument("--batch-size", type=_positive_int, default=32, help="images per forward")
    p.add_argument("--top", type=_positive_int, default=10, help="heads listed in the printed ranking")
    p.add_argument("--seed", type=int, default=0, help="data split seed")
    p.add_argument("--threads", type=_positive_int, default=None, help="CPU threads (torch.set_num_threads)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_select_heads)


def _demo_nondeep(args) -> int:
    """`vitfast demo --nondeep`: the non-deep vs single-branch comparison on the digits (vitfast/nondeep_demo.py)."""
    from vitfast.demos.nondeep_demo import run_nondeep_comparison

    out = args.out if args.out != "vitfast-demo" else "vitfast-nondeep"
    try:
        report = run_nondeep_comparison(
            branches=args.branches or 2, steps=args.steps, schedule=args.join_schedule or "linear", threads=args.threads,
            lr=args.lr if args.lr is not None else 3e-3,
            out_dir=out, quick=args.quick, seed=args.seed, progress=not args.no_progress,
        )
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if abs(report["nondeep_fused"] - report["nondeep"]) > 1e-9:
        print(f"FAILED: fused accuracy {report['nondeep_fused']:.4f} differs from train-time {report['nondeep']:.4f}")
        return EXIT_CHECK_FAILED
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- parser
class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):
        # "(default: None)" says nothing: those options state their real default in their help text
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, the command named, exit 2 (argparse's default minus the usage dump)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n(see `{self.prog} --help`)\n")


def _add_recipe_args(p, *, convert: bool) -> None:
    g = p.add_argument_group("model recipe (timm model names)")
    g.add_argument("--img-size", type=_positive_int, default=None, help="input resolution (default: the timm model's)")
    g.add_argument("--num-classes", type=_positive_int, default=None, help="classifier outputs (default: the timm model's; `train` uses the data's)")
    g.add_argument("--model-kwargs", type=_json_object, default=None, metavar="JSON",
                   help="more timm constructor arguments, e.g. '{\"depth\": 4, \"embed_dim\": 96}'")
    g.add_argument("--channel-idle", type=_theta, default=None, metavar="θ",
                   help="channel idle ratio θ in [0, 1]: the fraction of FFN hidden channels without GELU "
                        "(RePaViT; when converting the paper's default 1 - 1/mlp_ratio, 0.75 for ratio 4"
                        + (")" if convert else "; omit to train the plain timm model)"))
    g.add_argument("--norm", choices=("batch", "layer"), default="batch",
                   help="FFN normalisation: batch (foldable, the paper's) or layer (keeps an explicit shortcut)")
    g.add_argument("--heuristic", choices=("static", "linear"), default="static",
                   help="per-layer θ: static (same everywhere) or linear (ramps with depth around θ)")


def _join_steps(text: str):
    value = _checked(text, float, "a step count >= 1 or a fraction in [0, 1) of the steps after --join-start",
                     lambda v: v >= 0 and (v < 1 or float(v).is_integer()))
    return int(value) if value >= 1 else value  # a count stays an int (stored settings, messages)


def _add_nondeep_args(p, *, train: bool) -> None:
    """Non-deep ViT options (non-deep-vit-progressive-reparam): branches, progressive joining, diversity, distillation."""
    g = p.add_argument_group("non-deep ViT (parallel branches, progressive joining; timm ViT/DeiT names)")
    g.add_argument("--branches", type=_positive_int, default=None, metavar="n",
                   help="n >= 2: L timm blocks -> L/n blocks of n parallel branches (fused: L/n layers); with it "
                        "--channel-idle defaults to 0 and the FFN norm to layer (--norm applies with --channel-idle)")
    g.add_argument("--join-values", action="store_true", default=None,
                   help="join the value path too (the fused attention then has value width d_h, eq. 6-7 exact)")
    if not train:
        return
    g.add_argument("--join-schedule", choices=("linear", "cosine", "exp", "sqrt"), default=None,
                   help="λ(t) during the joining steps (eq. 10-13) [default: linear]")
    g.add_argument("--join-start", type=int, default=None, metavar="STEPS",
                   help="steps before joining starts (λ = 0: the branches train apart) [default: 0]")
    g.add_argument("--join-steps", type=_join_steps, default=None, metavar="N",
                   help="joining steps (λ: 0 -> 1), a count or a fraction (< 1) of the steps after --join-start; "
                        "after them the adjustment phase runs at λ = 1 [default: 1/6, the paper's 10k of 60k]")
    g.add_argument("--adjust-steps", type=int, default=None, metavar="STEPS",
                   help="instead of --join-steps: the length of the final adjustment phase (λ = 1); joining then "
                        "takes the steps between --join-start and it")
    g.add_argument("--diversity-weight", type=_nonneg_float, default=None, metavar="α",
                   help="weight of the branch-diversity regulariser (squared cosine, section 4) [default: 0.05]")
    g.add_argument("--distill-teacher", type=_existing_file, default=None, metavar="PATH",
                   help="attention-map distillation from this teacher (a train-time .safetensors of a timm ViT with "
                        "the same heads and tokens, e.g. a trained deeper model from `vitfast train`)")
    g.add_argument("--distill-weight", type=_nonneg_float, default=None,
                   help="weight of the attention-map MSE [default: 1.0]")


def _nondeep_blocks(model):
    from vitfast.methods.nondeep.modules import NonDeepBlock

    return [m for m in model.modules() if isinstance(m, NonDeepBlock)]


def _apply_join_settings(model, settings, total_steps: int) -> None:
    """--join-* and --diversity-weight onto a non-deep model's blocks (refused for a model without branches)."""
    from vitfast.methods.nondeep.modules import JoinSchedule

    given = [k for k in ("join_schedule", "join_start", "join_steps", "adjust_steps", "diversity_weight",
                         "distill_teacher") if settings.get(k) is not None]
    blocks = _nondeep_blocks(model)
    if not blocks:
        if given:
            raise CLIError(f"--{given[0].replace('_', '-')}: only applies to a non-deep model (--branches n, or a "
                           f"file converted with --branches), got a model without branches")
        return
    start = settings.get("join_start") or 0
    if start < 0 or start > total_steps:
        raise CLIError(f"--join-start: expected a step in [0, {total_steps}], got {start}")
    if settings.get("join_steps") is not None and settings.get("adjust_steps") is not None:
        raise CLIError("--join-steps/--adjust-steps: expected one of them (the other follows from the step count), got both")
    if any(settings.get(k) is not None for k in ("join_schedule", "join_start", "join_steps", "adjust_steps")):
        kind = settings.get("join_schedule") or "linear"
        if settings.get("adjust_steps") is not None:
            warmup = total_steps - start - settings["adjust_steps"]
            if warmup < 0:
                raise CLIError(f"--adjust-steps: expected at most {total_steps - start} (steps after --join-start), "
                               f"got {settings['adjust_steps']}")
            schedule = JoinSchedule(kind, warmup, start_step=start)
        elif settings.get("join_steps") is not None and settings["join_steps"] >= 1:
            schedule = JoinSchedule(kind, int(settings["join_steps"]), start_step=start)
        elif settings.get("join_steps") is not None:
            schedule = JoinSchedule(kind, None, warmup_fraction=settings["join_steps"], start_step=start)
        else:
            schedule = JoinSchedule(kind, start_step=start)
        end = start + schedule.warmup_length(total_steps)
        if end > total_steps:  # λ < 1 at the end: the run "finished", then `vitfast fuse` refused the model
            raise CLIError(f"--join-start/--join-steps/--adjust-steps: joining would end at step {end}, after the run's "
                           f"last step {total_steps}; the model fuses only once λ = 1")
        for block in blocks:
            block.schedule = schedule
    if settings.get("diversity_weight") is not None:
        for block in blocks:
            block.extra_loss_weight = settings["diversity_weight"] / len(blocks)
            for sub in (block.attn, block.mlp):
                sub.compute_diversity = block.extra_loss_weight > 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="vitfast",
        formatter_class=_Formatter,
        description=textwrap.dedent("""\
            Train Vision Transformers in reparameterizable shapes, fuse them exactly, run them on fused kernels.

            The path:  timm model --convert--> train-time model --train--> --fuse--> fused .safetensors
            (each step is a subcommand; `vitfast demo` runs all of them on the scikit-learn digits)."""),
        epilog=textwrap.dedent("""\
            examples:
              vitfast demo                                          # the whole path in ~2 minutes
              vitfast convert deit_tiny_patch16_224 --img-size 32 --num-classes 10 --channel-idle 0.75 -o tiny.safetensors
              vitfast train tiny.safetensors --steps 500 --out run/
              vitfast fuse run/model.safetensors -o fused.safetensors
              vitfast verify fused.safetensors --source run/model.safetensors --inputs digits
              vitfast bench fused.safetensors --batch-sizes 1,64"""),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    # convert
    p = sub.add_parser(
        "convert", formatter_class=_Formatter, help="timm model or RePaViT weights -> train-time vitfast model",
        description=textwrap.dedent("""\
            Build a timm ViT/DeiT/Swin and turn its FFNs into RePaViT channel-idle FFNs (a train-time model that
            `vitfast fuse` later collapses exactly), or rebuild one from an official RePaViT state dict.
            Weights are random unless --pretrained names a local file: nothing is downloaded.
            Writes a train-time .safetensors (JSON description inside, no pickle)."""),
        epilog=textwrap.dedent("""\
            examples:
              vitfast convert vit_tiny_patch16_224 --img-size 32 --num-classes 10 -o vit.safetensors
              vitfast convert deit_small_patch16_224 --pretrained deit_small.pth --channel-idle 0.5 --norm layer -o ds.safetensors
              vitfast convert --repavit repavit_deit_base.pth -o repa_base.safetensors"""),
    )
    p.add_argument("model", nargs="?", metavar="MODEL", help="timm model name, e.g. deit_tiny_patch16_224")
    p.add_argument("-o", "--output", required=True, help="output .safetensors path (train-time model)")
    p.add_argument("--pretrained", type=_existing_file, default=None, metavar="PATH",
                   help="local weights for MODEL (.safetensors, or a torch state dict loaded with weights_only)")
    p.add_argument("--repavit", type=_existing_file, default=None, metavar="PATH",
                   help="official RePaViT ViT/DeiT state dict to convert instead of MODEL")
    p.add_argument("--num-heads", type=_positive_int, default=None, help="--repavit only: heads (default: from the width)")
    _add_recipe_args(p, convert=True)
    _add_gate_args(p)
    _add_dwconv_args(p)
    p.set_defaults(func=cmd_convert)

    # train
    p = sub.add_parser(
        "train", formatter_class=_Formatter, help="train or finetune a model on digits or an image folder",
        description=textwrap.dedent("""\
            Train a train-time model (from `vitfast convert`) or a timm model by name (converted on the fly with
            --channel-idle) with AdamW, warm-up + cosine LR, gradient clipping and periodic evaluation.
            Writes OUT/trainer.pt (resumable; every --checkpoint-every steps and at the end) and
            OUT/model.safetensors (the trained train-time model, input for `vitfast fuse`).
            --resume continues a run exactly where it stopped, with the settings stored in the checkpoint."""),
        epilog=textwrap.dedent("""\
            examples:
              vitfast train tiny.safetensors --steps 800 --lr 3e-3 --out run/
              vitfast train vit_tiny_patch16_224 --img-size 32 --model-kwargs '{"depth": 4}' --channel-idle 0.75 --epochs 20 --out run/
              vitfast train --resume run/trainer.pt
              vitfast train vit.safetensors --data /data/imagenette/train --val-data /data/imagenette/val --out run/"""),
    )
    p.add_argument("source", nargs="?", metavar="SOURCE", help="train-time .safetensors, or a timm model name")
    p.add_argument("--data", default=None, help="'digits' (scikit-learn, no download) or an image-folder directory [default: digits]")
    p.add_argument("--val-data", default=None, help="validation image folder (default: hold out 10%% of --data)")
    p.add_argument("--steps", type=_positive_int, default=None, help="optimizer steps (or --epochs) [default: 10 epochs]")
    p.add_argument("--epochs", type=_positive_int, default=None, help="epochs over the training split")
    p.add_argument("--lr", type=_positive_float, default=None, help="peak learning rate [default: 1e-3]")
    p.add_argument("--weight-decay", type=_nonneg_float, default=None, help="AdamW weight decay (not on norms/biases/pos-embed) [default: 0.05]")
    p.add_argument("--batch-size", type=_positive_int, default=None, help="training batch size [default: 64]")
    p.add_argument("--warmup", type=_nonneg_float, default=None, help="warm-up: a fraction of the steps (< 1) or a step count [default: 0.05]")
    p.add_argument("--label-smoothing", type=_smoothing, default=None, help="cross-entropy label smoothing [default: 0]")
    p.add_argument("--grad-clip", type=_nonneg_float, default=None, help="max gradient norm, 0 = off [default: 1.0]")
    p.add_argument("--seed", type=int, default=None, help="seed for init order, data order and augmentation [default: 0]")
    p.add_argument("--eval-every", type=_positive_int, default=None, help="evaluate every N steps [default: once per epoch]")
    p.add_argument("--checkpoint-every", type=_positive_int, default=None, help="save OUT/trainer.pt every N steps [default: at the end]")
    p.add_argument("--resume", type=_existing_file, default=None, metavar="CHECKPOINT", help="continue from OUT/trainer.pt")
    p.add_argument("--out", default=None, metavar="DIR", help="output directory [default with --resume: the checkpoint's]")
    p.add_argument("--threads", type=_positive_int, default=None, help="CPU threads (torch.set_num_threads)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_recipe_args(p, convert=False)
    _add_usdc_train_args(p)
    _add_nondeep_args(p, train=True)
    _add_dwconv_args(p)


    _add_scale_args(p)
    for action in p._actions:  # recipe defaults must be None here: --resume compares what was given
        if action.dest in ("norm", "heuristic"):
            action.default = None
    p.set_defaults(func=cmd_train)

    # fuse
    p = sub.add_parser(
        "fuse", formatter_class=_Formatter, help="train-time model -> exact fused .safetensors",
        description=textwrap.dedent("""\
            Collapse a train-time model exactly (RePaViT eq. 3-6: BatchNorms and the idle channels' linear path
            folded into the weights, the shortcut folded too) and write it with vitfast.save; load it anywhere
            with vitfast.load(path).  Prints a quick 2-image check; `vitfast verify` is the thorough one."""),
        epilog="examples:\n  vitfast fuse run/model.safetensors -o fused.safetensors\n  vitfast fuse run/trainer.pt -o fused.safetensors",
    )
    p.add_argument("source", type=_existing_file, metavar="SOURCE",
                   help="train-time .safetensors (convert/train output) or a trainer checkpoint (OUT/trainer.pt)")
    p.add_argument("-o", "--output", required=True, help="output fused .safetensors path")
    p.add_argument("--no-check", action="store_true", help="skip the quick 2-image comparison")
    p.set_defaults(func=cmd_fuse)

    # verify
    p = sub.add_parser(
        "verify", formatter_class=_Formatter, help="check a fused file against its train-time source",
        description=textwrap.dedent("""\
            Run the fused model (vitfast.load) and its train-time source (eval mode) on the same inputs and
            compare logits: max |Δ|, normalised MSE, argmax agreement.  Passes when
            max |Δ| <= atol + rtol * max |logit|; exit status 1 otherwise."""),
        epilog="examples:\n  vitfast verify fused.safetensors --source run/model.safetensors\n"
               "  vitfast verify fused.safetensors --source run/trainer.pt --inputs digits --atol 1e-5",
    )
    p.add_argument("fused", type=_existing_file, metavar="FUSED", help="fused .safetensors (from `vitfast fuse`)")
    p.add_argument("--source", type=_existing_file, required=True, help="train-time .safetensors or trainer checkpoint it came from")
    p.add_argument("--inputs", choices=("random", "digits"), default="random", help="random normal images, or the digits validation split")
    p.add_argument("--batch-size", type=_positive_int, default=16, help="images per batch")
    p.add_argument("--batches", type=_positive_int, default=2, help="number of random batches (--inputs random)")
    p.add_argument("--atol", type=_nonneg_float, default=1e-4, help="absolute tolerance on logits")
    p.add_argument("--rtol", type=_nonneg_float, default=1e-4, help="tolerance relative to the largest |logit|")
    p.add_argument("--seed", type=int, default=0, help="seed for the random inputs")
    p.add_argument("--threads", type=_positive_int, default=None, help="CPU threads")
    p.add_argument("--device", default="cpu", help="run both models on this device (cpu, cuda, cuda:1, ...)")
    p.set_defaults(func=cmd_verify)

    # bench
    p = sub.add_parser(
        "bench", formatter_class=_Formatter, help="latency: timm eager, torch.compile, ONNX Runtime and vitfast",
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
            Prints one table: median latency and the p10-p90 spread over interleaved calls (the order rotates
            every round), images/s, GFLOP per forward (FlopCounterMode), % of the FLOP floor (FLOPs / the fp32
            sgemm rate, torch.mm 2048^3, measured in the same run at the same thread count) and the speed-up
            over timm eager.  ORT sessions: intra-op threads = --threads, one inter-op thread, all graph
            optimisations.  Progress goes to stderr.  Exit status 1 if a provider failed (the others are
            still reported)."""),
        epilog="examples:\n"
               "  vitfast bench deit_base_patch16_224 --channel-idle 0.75 --threads 1,2 --batch-sizes 1,8 --json r.json --png r.png\n"
               "  vitfast bench fused.safetensors --threads 1 --batch-sizes 1,64 --providers timm,vitfast,reference\n"
               "  vitfast bench deit_small_patch16_224 --channel-idle 0.75 --batch-sizes 1 --repeats 10",
    )
    p.add_argument("target", metavar="TARGET", help="a timm model name (with the recipe options), or a fused .safetensors")
    p.add_argument("--providers", type=_providers, default=None, metavar="P1,P2",
                   help="runtimes to time [default: timm,compile,ort-timm,ort-fused,vitfast; without ort-* off the CPU; "
                        "on CUDA also timm-graph,vitfast-graph (CUDA-graph replays)]")
    p.add_argument("--threads", type=_thread_list, default=None, metavar="T1,T2", help="CPU thread counts [default: torch's]")
    p.add_argument("--batch-sizes", type=_batch_list, default="1,8", metavar="B1,B2", help="batch sizes")
    p.add_argument("--repeats", type=_positive_int, default=10, help="timed calls per provider at each (threads, batch)")
    p.add_argument("--warmup", type=_positive_int, default=2, help="untimed calls first (at least 1: compiles, ORT's first run)")
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
    _add_recipe_args(p, convert=True)
    _add_nondeep_args(p, train=False)
    p.set_defaults(func=cmd_bench)

    # export
    p = sub.add_parser(
        "export", formatter_class=_Formatter, help="fused .safetensors -> ONNX (standard ops), checked in ONNX Runtime",
        description=textwrap.dedent("""\
            Export a fused model to ONNX with standard ONNX operators only: it is traced on vitfast's reference
            path (plain PyTorch ops), so no vitfast custom op reaches the graph (checked: a custom-domain node is
            an error).  The file is then run in ONNX Runtime against vitfast's own output (its kernels) at two
            batch sizes; if max |Δ| > atol + rtol x max|output| nothing is written and the exit status is 1.
            Exporter: "auto" uses torch's TorchScript exporter where torch has it (torch 2.4 and later) and the
            torch.export-based one (dynamo=True) otherwise, when the TorchScript export fails, and for USDC gated
            models (their gates decide per batch, which a trace cannot keep)."""),
        epilog="examples:\n  vitfast export fused.safetensors -o model.onnx\n"
               "  vitfast export fused.safetensors -o model_b8.onnx --batch 8 --opset 18 --exporter dynamo",
    )
    p.add_argument("fused", type=_existing_file, metavar="FUSED", help="fused .safetensors (from `vitfast fuse`)")
    p.add_argument("-o", "--output", required=True, help="output .onnx path")
    p.add_argument("--batch", type=_export_batch, default="dynamic", help="'dynamic' (a symbolic batch axis) or a fixed batch size")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset [default: 17 TorchScript exporter, 18 dynamo]")
    p.add_argument("--exporter", choices=("auto", "torchscript", "dynamo"), default="auto", help="torch ONNX exporter")
    p.add_argument("--atol", type=_nonneg_float, default=1e-4, help="absolute tolerance of the ONNX Runtime check")
    p.add_argument("--rtol", type=_nonneg_float, default=1e-4, help="tolerance relative to the largest |output|")
    p.add_argument("--no-check", action="store_true", help="skip the ONNX Runtime comparison (onnx.checker still runs)")
    p.add_argument("--threads", type=_positive_int, default=None, help="CPU threads")
    p.set_defaults(func=cmd_export)

    # demo
    p = sub.add_parser(
        "demo", formatter_class=_Formatter, help="the whole path on the digits, with a comparison table",
        description=textwrap.dedent("""\
            Train a small timm ViT with channel-idle FFNs (θ=0.75, BatchNorm) on scikit-learn's digits,
            fuse it, save it, load it back with vitfast.load, and print train-time vs fused: validation
            accuracy (must be equal, else exit status 1), max |Δlogits|, parameters, FLOPs per image,
            latency at batch 1 and 64 and throughput.  About 2 minutes on 2 CPU cores; --quick takes seconds."""),
        epilog="examples:\n  vitfast demo\n  vitfast demo --threads 1 --steps 400 --out /tmp/demo\n  vitfast demo --quick",
    )
    p.add_argument("--steps", type=_positive_int, default=None, help="training steps [default: 800, --quick: 300]")
    p.add_argument("--threads", type=_positive_int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--out", default="vitfast-demo", metavar="DIR", help="where the .safetensors files go")
    p.add_argument("--quick", action="store_true", help="tiny model and few steps (an end-to-end smoke test)")
    p.add_argument("--repeats", type=_positive_int, default=None, help="latency repeats [default: 30, --quick: 5]")
    p.add_argument("--seed", type=int, default=0, help="seed for data split, init and training")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--nondeep", action="store_true",
                   help="instead: train a plain ViT of depth L/n and a non-deep ViT (L/n blocks x n branches, "
                        "progressive joining) for the same steps, fuse the latter, compare accuracies "
                        "[default steps: 800, --quick: 60; out dir: vitfast-nondeep]")
    p.add_argument("--branches", type=_positive_int, default=None, help="--nondeep: branches n [default: 2]")
    p.add_argument("--join-schedule", choices=("linear", "cosine", "exp", "sqrt"), default=None,
                   help="--nondeep: λ schedule [default: linear]")
    p.add_argument("--lr", type=_positive_float, default=None, help="--nondeep: AdamW peak learning rate, both models [default: 3e-3]")
    p.set_defaults(func=cmd_demo)
    _add_select_heads_parser(sub)

    _add_usdc_parser(sub)



    # distill-demo
    p = sub.add_parser(
        "distill-demo", formatter_class=_Formatter, help="Table IX on the digits: scratch vs distilled vs copied students",
        description=textwrap.dedent("""\
            The distillation framework of swin-distillation-compression on scikit-learn's digits: train a ViT teacher
            (depth 6), then four half-depth students for the same steps, data order and optimiser: random init,
            random init + harmonic-mean distillation (eq. 4, MSE on logits, w_d=13, w_s=1), the teacher's blocks
            copied before the cut (Algorithm 1), and copied + distillation.  Prints validation accuracies and whether
            the paper's ordering holds.  Fixed seeds: the same numbers for the same torch version and --threads.
            About 8 minutes on one busy CPU core; --quick is a smoke test (too short to show anything)."""),
        epilog="examples:\n  vitfast distill-demo\n  vitfast distill-demo --json table9.json --check",
    )
    p.add_argument("--teacher-steps", type=_positive_int, default=None, help="teacher training steps [default: 600]")
    p.add_argument("--student-steps", type=_positive_int, default=None, help="steps per student [default: 600]")
    p.add_argument("--seed", type=int, default=0, help="seed for data split, init and training")
    p.add_argument("--threads", type=_positive_int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="tiny models and few steps (a smoke test)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the numbers as JSON")
    p.add_argument("--check", action="store_true", help="exit status 1 if scratch < scratch+KD < copied does not hold")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_distill_demo)
    return parser


# ---------------------------------------------------------------------------------------------- usdc
def _level_list(text: str) -> List[str]:
    levels = [v.strip() for v in text.split(",") if v.strip()]
    if not levels or any(v not in ("group", "batch", "sample") for v in levels):
        raise argparse.ArgumentTypeError(f"expected comma-separated levels among group,batch,sample, got {text!r}")
    return levels


def _ratio(text: str) -> float:
    return _checked(text, float, "a ratio in (0, 1]", lambda v: 0.0 < v <= 1.0)


def cmd_usdc(args) -> int:
    from vitfast.demos.usdc_study import run_usdc_study

    steps = (args.pretrain_steps, args.stage1_steps, args.stage2_steps)
    if args.quick:
        steps = tuple(s if s is not None else q for s, q in zip(steps, (60, 40, 30)))
        cfg = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=4.0, num_classes=10)
    else:
        steps = tuple(s if s is not None else d for s, d in zip(steps, (800, 400, 300)))
        cfg = None
    _out_dir(args.out)
    report = run_usdc_study(
        levels=args.levels, pretrain_steps=steps[0], stage1_steps=steps[1], stage2_steps=steps[2],
        flops_target=args.flops_target, eval_batch_sizes=args.batch_sizes, seed=args.seed, threads=args.threads,
        progress=not args.no_progress, out_dir=args.out, model_cfg=cfg,
    )
    path = os.path.join(args.out, "usdc_report.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"wrote {path} and the fused models usdc_<level>.safetensors in {args.out}")
    return EXIT_OK


def _ffn_flags_need_channel_idle(settings, alone: str) -> None:
    """--norm / --heuristic shape RePaViT FFNs: without --channel-idle these methods keep timm's FFNs (θ = 0)."""
    if settings.get("channel_idle") is not None:
        return
    for flag, key, default in (("--norm", "norm", "batch"), ("--heuristic", "heuristic", "static")):
        if settings.get(key) not in (None, default):
            raise CLIError(f"{flag}: only used with --channel-idle (RePaViT FFNs); {alone}")


def _convert_usdc(args, timm_model):
    import vitfast

    _ffn_flags_need_channel_idle(vars(args), "with --gates alone the FFNs stay timm's")
    return vitfast.convert.from_timm(
        timm_model, channel_idle=args.channel_idle, norm=args.norm if args.channel_idle is not None else None,
        heuristic=args.heuristic, gates=True, flops_target=args.flops_target, gate_level=args.gate_level,
        gate_search=args.gate_kind is None, gate_kind=args.gate_kind or "G0",
    )


def _usdc_stage2(model, resume_state):
    import vitfast
    from vitfast.methods.usdc.compression import usdc_blocks

    if resume_state is not None:
        raise CLIError("--usdc-prune: not used with --resume (the checkpoint's model is already pruned or not)")
    if not usdc_blocks(model):
        raise CLIError("--usdc-prune: SOURCE has no USDC blocks (convert with --gates first)")
    pruned = vitfast.methods.usdc.prune(model.eval()).train()
    print("USDC stage 2: pruned heads/channels/sub-blocks removed, best gate network kept per layer")
    return pruned


def _usdc_optimizer(model, settings, arch_lr_scale):
    from vitfast.methods.usdc.compression import arch_optimizer, usdc_blocks

    if not usdc_blocks(model):
        return "adamw"
    return arch_optimizer(model, settings["lr"], settings["lr"] * arch_lr_scale)


def _add_gate_args(p) -> None:
    g = p.add_argument_group("USDC gates and static compression (usdc-static-dynamic-compression)")
    g.add_argument("--gates", action="store_true",
                   help="per-layer decision networks that skip MHSA/FFN sub-blocks (searched over G0..G6)")
    g.add_argument("--flops-target", type=_ratio, default=None,
                   help="f_t in (0, 1]: adds static keep/prune logits and the resource loss 100 (F - f_t)^2")
    g.add_argument("--gate-level", choices=("group", "sample", "batch"), default="group",
                   help="gate level in training (group: USDC's augmentation)")
    g.add_argument("--gate-kind", choices=("G0", "G1", "G2", "G3", "G4", "G5", "G6"), default=None,
                   help="one fixed gate network instead of the search")


def _check_gate_options(args) -> None:
    """The gate options mean nothing without --gates (they were silently dropped: a plain θ model came out)."""
    if getattr(args, "gates", False):
        return
    given = [flag for flag, value, default in (("--flops-target", getattr(args, "flops_target", None), None),
                                               ("--gate-kind", getattr(args, "gate_kind", None), None),
                                               ("--gate-level", getattr(args, "gate_level", "group"), "group"))
             if value != default]
    if given:
        raise CLIError(f"{'/'.join(given)}: only with --gates (USDC gated blocks), got no --gates")


def _add_usdc_train_args(p) -> None:
    g = p.add_argument_group("USDC (models converted with --gates)")
    g.add_argument("--usdc-prune", action="store_true",
                   help="stage 2: physically remove what stage 1 pruned and keep the best gate net, then train")
    g.add_argument("--arch-lr-scale", type=_positive_float, default=None,
                   help="learning rate of the gates and keep/prune logits, relative to --lr [default: 10]")


def _add_usdc_parser(sub) -> None:
    p = sub.add_parser(
        "usdc", formatter_class=_Formatter, help="USDC gates + static compression on the digits: batch-size study",
        description=textwrap.dedent("""\
            The USDC recipe end to end on scikit-learn's digits (usdc-static-dynamic-compression): pretrain a
            small ViT, convert it with dynamic gates (searched over G0..G6) and static keep/prune logits, train
            stage 1 with the FLOPs resource loss (target --flops-target, gamma = 100), prune, fine-tune stage 2,
            fuse, then measure the fused model's accuracy and realised FLOPs at inference batch sizes
            (--batch-sizes) for each training gate level (--levels).  Seeded: the same command gives the same
            numbers.  Writes usdc_report.json and usdc_<level>.safetensors (load with vitfast.load)."""),
        epilog="examples:\n  vitfast usdc --out runs/usdc --threads 1\n  vitfast usdc --quick --out /tmp/usdc",
    )
    p.add_argument("--levels", type=_level_list, default=["group", "batch"], help="training gate levels to compare")
    p.add_argument("--batch-sizes", type=_batch_list, default=[1, 8, 64], help="inference batch sizes")
    p.add_argument("--flops-target", type=_ratio, default=0.6, help="f_t of the resource loss (FLOPs ratio)")
    p.add_argument("--pretrain-steps", type=_positive_int, default=None, help="baseline steps [800; --quick: 60]")
    p.add_argument("--stage1-steps", type=_positive_int, default=None, help="search + static steps [400; --quick: 40]")
    p.add_argument("--stage2-steps", type=_positive_int, default=None, help="fine-tune steps [300; --quick: 30]")
    p.add_argument("--threads", type=_positive_int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0, help="seed for data split, init and training")
    p.add_argument("--out", default="vitfast-usdc", metavar="DIR", help="where the report and fused models go")
    p.add_argument("--quick", action="store_true", help="tiny model and few steps (a smoke test)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_usdc)


# ---------------------------------------------------------------------------------------------- drop-in DW-conv heads
def _dwconv_blocks_arg(text: str):
    from vitfast.methods.dwconv.recipe import parse_dwconv_blocks

    try:
        return parse_dwconv_blocks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dwconv_heads_arg(text: str):
    from vitfast.methods.dwconv.recipe import parse_dwconv_heads

    try:
        return parse_dwconv_heads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _odd_kernel(text: str) -> int:
    return _checked(text, int, "an odd kernel size >= 1", lambda v: v >= 1 and v % 2 == 1)


def _add_dwconv_args(p) -> None:
    g = p.add_argument_group("drop-in depthwise-convolution heads (dropin-depthwise-conv-attention; timm ViT/DeiT names)")
    g.add_argument("--dwconv-blocks", type=_dwconv_blocks_arg, default=None, metavar="K|JSON",
                   help="replace every head of K blocks (the K lowest-Σ_b blocks of --ranking) or of the blocks of a "
                        "JSON list such as '[2, 5]'")
    g.add_argument("--dwconv-heads", type=_dwconv_heads_arg, default=None, metavar="P|JSON",
                   help="replace single heads: P (the P lowest-Σ_h heads of --ranking), '{\"0\": [1, 3]}' "
                        "(block: heads) or '[[0, 1], [4, 2]]' ([block, head] pairs); with --dwconv-blocks both apply")
    g.add_argument("--ranking", type=_existing_file, default=None, metavar="PATH",
                   help="the Σ_h ranking .json from `vitfast select-heads` (needed for the counts K / P)")
    g.add_argument("--dwconv-kernel", type=_odd_kernel, default=None, metavar="k",
                   help="depthwise kernel size k (odd) [default: 3]")
    g.add_argument("--ensemble", action="store_true", default=None,
                   help="head ensembling (eq. 12-13): a block's replaced heads become one head of width d_h "
                        "with softmax(γ) weights")
    g.add_argument("--remove-cls", action="store_true", default=None,
                   help="remove the cls token and pool the mean of the tokens, as the paper does (appendix A.3.2)")


def _dwconv_given(args_or_settings) -> bool:
    from vitfast.methods.dwconv.recipe import check_dwconv_options, dwconv_request

    settings = args_or_settings if isinstance(args_or_settings, dict) else vars(args_or_settings)
    try:
        check_dwconv_options(settings)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    return dwconv_request(settings)


def _convert_dwconv(args, timm_model):
    """A timm ViT/DeiT with DW-conv heads; the FFNs: --channel-idle θ (with --norm), else timm's exactly (θ = 0,
    LayerNorm) so only the replaced heads change the function."""
    from vitfast.methods.dwconv.recipe import convert_dwconv

    settings = vars(args)
    if getattr(args, "gates", False):
        given = [flag for flag, key in (("--dwconv-blocks", "dwconv_blocks"), ("--dwconv-heads", "dwconv_heads"),
                                        ("--remove-cls", "remove_cls")) if settings.get(key) not in (None, False)]
        raise CLIError(f"--gates: not supported together with {'/'.join(given)} yet, got "
                       f"{'both' if len(given) == 1 else 'them together'}")
    _ffn_flags_need_channel_idle(settings, "DW-conv alone keeps timm's FFNs")
    try:
        return convert_dwconv(timm_model, settings)
    except ValueError as exc:
        raise CLIError(f"--dwconv-blocks/--dwconv-heads: {exc}") from None


def _dwconv_source(timm_model, settings, recipe):
    from vitfast.methods.dwconv.recipe import convert_dwconv, dwconv_recipe

    _ffn_flags_need_channel_idle(settings, "DW-conv alone keeps timm's FFNs")
    try:
        model = convert_dwconv(timm_model, settings)
    except ValueError as exc:
        raise CLIError(f"--dwconv-blocks/--dwconv-heads: {exc}") from None
    recipe.update(channel_idle=settings.get("channel_idle"), **dwconv_recipe(settings))
    if settings.get("channel_idle") is not None:
        recipe.update(norm=settings.get("norm") or "batch", heuristic=settings.get("heuristic") or "static")
    return model, recipe


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


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point (`vitfast`, `python -m vitfast`); returns the exit status (0 ok, 1 check failed, 2 bad request)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or a bad argument (already reported): a status, not an exception
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    debug = os.environ.get("VITFAST_DEBUG", "") not in ("", "0")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"vitfast {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except FloatingPointError as exc:  # a diverging run (the Trainer refuses a non-finite loss): no traceback
        if debug:
            raise
        print(f"vitfast {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    except BrokenPipeError:  # `vitfast ... | head`: the reader left; not an error worth a traceback
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_OK
    except (CLIError, ValueError, TypeError, FileNotFoundError, FileExistsError, NotADirectoryError, PermissionError,
            IsADirectoryError) as exc:
        # Errors in what was asked for (vitfast's own checks raise these with the argument named).
        if debug:
            raise
        print(f"vitfast {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
