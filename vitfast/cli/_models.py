"""Model helpers several subcommands use: timm models by name (offline), vitfast files by kind, the train-time
model behind a file, and what a model takes as input.

Modules that import timm (vitfast.io.fused, vitfast.nn.*) are imported inside the functions that need them, here
and in the other command modules: `vitfast --help` then costs torch's import alone, not timm's as well."""
from __future__ import annotations

import difflib
import json
import os
import sys
import zipfile
from typing import Dict, Optional

import torch
from safetensors.torch import load_file

from vitfast.cli._common import EXIT_SYSTEM_ERROR
from vitfast.cli._common import CLIError
from vitfast.cli._common import existing_file
from vitfast.measure import count_parameters
from vitfast.cli._dwconv_args import describe_dwconv_model
from vitfast.io.trainable import TRAINABLE_FORMAT
from vitfast.io.trainable import build_trainable
from vitfast.io.trainable import load_trainable
from vitfast.io.trainer_checkpoint import load_trainer_checkpoint
from vitfast.io.trainable import read_safetensors_metadata


def _same_size(value):
    """An image size as timm reads it (224 and [224, 224] are one size), other values as they are."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    return tuple(value) if isinstance(value, (list, tuple)) else value


# model names timm resolves itself: a Hugging Face Hub repository, a local directory with a config
_TIMM_PREFIXES = ("hf-hub:", "local-dir:")


def add_weights_args(p, subject: str = "MODEL") -> None:
    """--pretrained (timm's switch: timm's own weights) and --checkpoint PATH (local weights, nothing downloaded)."""
    p.add_argument("--pretrained", nargs="?", const=True, default=False, metavar="PATH",
                   help=f"timm's pretrained weights for {subject} (timm downloads them: needs network or the Hugging "
                        f"Face cache); `--pretrained PATH` is the older spelling of --checkpoint PATH")
    p.add_argument("--checkpoint", type=existing_file, default=None, metavar="PATH",
                   help=f"local weights for {subject} (.safetensors, or a torch state dict loaded with weights_only); "
                        f"nothing is downloaded")


def weights_args(args, model_attr: str) -> None:
    """Settle --pretrained/--checkpoint on `args`: args.pretrained a bool, args.checkpoint a path or None."""
    value = args.pretrained
    if isinstance(value, str):
        if getattr(args, model_attr, None) is None and not os.path.exists(value):
            # `--pretrained deit_tiny_patch16_224`: the switch came before the model name and took it as its value
            setattr(args, model_attr, value)
            value = True
        else:
            if not os.path.isfile(value):
                raise CLIError(f"--pretrained: a switch (timm's weights); local weights are --checkpoint PATH, got "
                               f"{value!r} (no such file)")
            if args.checkpoint is not None:
                raise CLIError("--pretrained PATH, --checkpoint PATH: the same option spelt twice, got both")
            print("note: `--pretrained PATH` is now `--checkpoint PATH` (`--pretrained` alone asks timm for its "
                  "weights)", file=sys.stderr)
            args.checkpoint, value = value, False
    if value and args.checkpoint is not None:
        raise CLIError("--pretrained, --checkpoint: timm's weights or local ones, got both")
    args.pretrained = bool(value)


def build_timm_model(name: str, *, pretrained: Optional[bool] = False, checkpoint: Optional[str] = None, img_size,
                     num_classes, model_kwargs, flag: str = "MODEL",
                     num_classes_from: str = "--num-classes") -> torch.nn.Module:
    """A timm model by name: random init, timm's weights with `pretrained` (timm downloads them), or the local
    weights file `checkpoint` (never downloads).  `num_classes_from`: where `num_classes` came from, for the
    message when --model-kwargs says otherwise."""
    import timm

    prefixed = name.startswith(_TIMM_PREFIXES)
    if flag != "MODEL" and not prefixed and (os.sep in name or name.endswith((".safetensors", ".pt", ".pth"))):
        raise CLIError(f"{flag}: expected an existing file or a timm model name, got {name!r} (no such file)")
    if not prefixed and not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `vitfast convert --list-models` lists them"
        raise CLIError(f"{flag}: expected a timm model name, got {name!r}{hint}")
    kwargs = dict(model_kwargs or {})
    for flag_name, key, value in (("--img-size", "img_size", img_size), (num_classes_from, "num_classes", num_classes)):
        if value is None:
            continue
        if key in kwargs and _same_size(kwargs[key]) != _same_size(value):  # one of the two would be ignored
            once = "; give it once" if flag_name.startswith("--") and " " not in flag_name else ""
            raise CLIError(f"{flag_name}: {value!r} disagrees with {key}={kwargs[key]!r} in --model-kwargs{once}")
        kwargs[key] = value
    from vitfast.convert import create_timm_model

    try:
        model = create_timm_model(name, pretrained=bool(pretrained), **kwargs)
    except ConnectionError as exc:  # no network: the system's fault, status 1, said in the CLI's terms
        reason = str(exc).partition(": ")[2].partition("; give")[0]
        error = CLIError(f"{'--pretrained' if pretrained else flag}: {reason}; local weights: --checkpoint PATH")
        error.status = EXIT_SYSTEM_ERROR
        raise error from exc
    except (TypeError, ValueError, AssertionError) as exc:
        raise CLIError(f"--model-kwargs/--img-size/--num-classes: timm {name} rejected {kwargs} ({exc})") from exc
    if checkpoint is None:
        return model
    state = read_state_dict(checkpoint, "--checkpoint")
    try:  # weights made for exactly this shape: load them as they are
        model.load_state_dict(state, strict=True)
        return model
    except RuntimeError as exc:
        strict_error = str(exc).splitlines()[0]
    # Otherwise let timm adapt them (a different num_classes drops the classifier, a different img_size
    # resamples the position embedding).  Handing it the tensors, not a path or hub id, keeps it offline.
    overlay = {"state_dict": state, "source": "timm", "hf_hub_id": None, "url": None, "file": None}

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
            raise CLIError(f"--checkpoint: {checkpoint!r} does not fit timm {name} with {kwargs} "
                           f"({str(exc).splitlines()[0]})") from exc
    classifier = model.pretrained_cfg.get("classifier") or ()
    classifier = (classifier,) if isinstance(classifier, str) else tuple(classifier)
    unloaded = [k for k, t in model.state_dict().items()
                if t.dim() >= 2 and not any(k == c or k.startswith(c + ".") for c in classifier)
                and torch.equal(t, fresh[k])]
    if unloaded:
        raise CLIError(f"--checkpoint: {checkpoint!r} does not fit timm {name} with {kwargs}: {len(unloaded)} weight "
                       f"tensors were not in it ({', '.join(unloaded[:4])}{', ...' if len(unloaded) > 4 else ''}); "
                       f"loading it as is: {strict_error}")
    print(f"note: --checkpoint weights adapted by timm to {kwargs or 'the default shape'} "
          f"(they did not load as they are: {strict_error})")
    return model


def read_state_dict(path: str, flag: str) -> Dict[str, torch.Tensor]:
    """Tensors from .safetensors, or from a torch file loaded with weights_only=True (no arbitrary pickle)."""
    if path.endswith(".safetensors"):
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


def file_kind(path: str) -> str:
    """'trainable' | 'fused' | 'trainer' (a Trainer checkpoint) for a vitfast file; CLIError otherwise."""
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


def load_source(path: str, flag: str):
    """Train-time model from a `convert`/`train` .safetensors or a trainer checkpoint -> (model, recipe)."""
    kind = file_kind(path)
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


def describe(model) -> str:
    blocks = []
    for name, module in model.named_modules():
        if hasattr(module, "active_features") and hasattr(module, "hidden_features"):
            blocks.append(f"{module.active_features}/{module.hidden_features}")
    ffn = f", channel-idle FFNs (active/hidden per block: {' '.join(blocks)})" if blocks else ""
    nondeep = nondeep_blocks(model)
    if nondeep:
        ffn += f", non-deep: {len(nondeep)} blocks x {nondeep[0].num_branches} branches ({nondeep[0].schedule})"
    ffn += describe_dwconv_model(model)
    return f"{type(model).__name__}, {count_parameters(model):,} parameters{ffn}"


def nondeep_blocks(model):
    from vitfast.methods.nondeep.modules import NonDeepBlock

    return [m for m in model.modules() if isinstance(m, NonDeepBlock)]


def model_input(model):
    """((height, width) or None, num_classes) a timm model expects (non-square models keep both sides: the
    height alone made square inputs a 32×48 model refused)."""
    size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if size is not None:
        size = (int(size[0]), int(size[1])) if isinstance(size, (tuple, list)) else (int(size), int(size))
    return size, getattr(model, "num_classes", None)


def size_text(size) -> str:
    return "unknown" if size is None else (f"{size[0]} px" if size[0] == size[1] else f"{size[0]}×{size[1]} px")


def check_rgb_model(model, flag: str) -> None:
    """Both data sources (digits, image folders) give RGB images: a model of other input channels failed in its
    first forward with a conv traceback."""
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    in_chans = getattr(proj, "in_channels", 3)
    if in_chans != 3:
        raise CLIError(f"{flag}: the data are RGB images (3 channels), the model takes {in_chans} input channels")
