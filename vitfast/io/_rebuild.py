"""Rebuilding a fused model from its file config (private to `vitfast.io`): the timm skeleton with each configured
submodule replaced by its registered fused class, and the structural comparison `vitfast.save` runs between a model
and what its file would rebuild (the save refuses a model the file could not reproduce)."""
from __future__ import annotations

import contextlib
import json
import re
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from ..arch import build_timm, saved_class
from ..nn.registry import fused_module_from_config, is_fused_module


def fused_configs(model: nn.Module) -> Dict[str, dict]:
    configs = {}
    for name, module in model.named_modules():
        if not is_fused_module(module):
            continue
        where = name  # never the root: describe_timm() accepted the model, so the root is a timm class
        try:
            cfg = module.vitfast_config()
        except Exception as e:  # noqa: BLE001 - e.g. a fused block whose child was swapped for nn.Identity
            raise ValueError(
                f"model.{where}: this {type(module).__name__} cannot describe itself for the file "
                f"({type(e).__name__}: {e}); was one of its submodules replaced?"
            ) from e
        if not isinstance(cfg, dict) or cfg.get("kind") != type(module).vitfast_kind:
            raise ValueError(
                f"model.{where}.vitfast_config(): expected a dict with 'kind': {type(module).vitfast_kind!r}, "
                f"got {cfg!r:.200}"
            )
        try:
            json.dumps(cfg, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"model.{where}.vitfast_config(): expected JSON-serialisable values, got {e}") from None
        configs[name] = cfg
    return configs


def _set_submodule(root: nn.Module, path: str, module: nn.Module) -> None:
    # Paths come from the file: accept only plain dotted names, and replace a child module or add a new name,
    # never overwrite another attribute (a method, a tensor, a dunder).
    if not _PATH_RE.fullmatch(path) or any(part.startswith("__") for part in path.split(".")):
        raise ValueError(f"modules: expected a dotted submodule path such as 'blocks.0.mlp', got {path!r}")
    parent_path, _, leaf = path.rpartition(".")
    try:
        parent = root.get_submodule(parent_path) if parent_path else root
    except AttributeError:
        raise ValueError(
            f"modules[{path!r}]: the parent module {parent_path!r} does not exist in the rebuilt model"
        ) from None
    if leaf not in parent._modules and hasattr(parent, leaf):
        raise ValueError(f"modules[{path!r}]: expected a submodule name, got {leaf!r}, an existing non-module attribute")
    # A container's entries come from the architecture (depth), never from the file: a new index would be
    # appended after the existing ones, in the file's key order (blocks.1 before blocks.0 ran them swapped).
    if isinstance(parent, (nn.Sequential, nn.ModuleList)) and leaf not in parent._modules:
        raise ValueError(
            f"modules[{path!r}]: {parent_path or 'the model'} has {len(parent)} entries in the rebuilt model "
            f"(from the architecture), got an entry for {leaf!r}"
        )
    setattr(parent, leaf, module)


@contextlib.contextmanager
def float32_default():
    """Build in float32 whatever torch.set_default_dtype says (restored after): the stored dtypes are applied
    afterwards; a float64 default built float64 modules that the float32 file then 'did not match'.

    The default dtype is process-wide, so it is only touched when it is not float32 already: a load in one
    thread must not change what another thread's torch.zeros builds meanwhile."""
    previous = torch.get_default_dtype()
    if previous == torch.float32:
        yield
        return
    torch.set_default_dtype(torch.float32)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def rebuild(architecture: dict, modules: Dict[str, dict], device: Optional[str] = None) -> nn.Module:
    with float32_default():
        return rebuild_float32(architecture, modules, device)


def rebuild_float32(architecture: dict, modules: Dict[str, dict], device: Optional[str]) -> nn.Module:
    model = build_timm(architecture, device=device)
    # Parents before children: a fused block may itself contain fused modules that have their own entry.
    for path in sorted(modules, key=lambda p: p.count(".")):
        if device is not None:
            with torch.device(device):
                module = fused_module_from_config(modules[path])
        else:
            module = fused_module_from_config(modules[path])
        _set_submodule(model, path, module)
    from ..nn.vit import use_fused_vit_forward

    use_fused_vit_forward(model)  # the one-call CPU forward where the structure allows (vitfast.nn.vit)
    return model


def _droplike_types() -> Tuple[type, ...]:
    from timm.layers import DropPath, PatchDropout

    return (nn.Dropout, nn.Identity, DropPath, PatchDropout)


def _simple(value: Any) -> bool:
    import enum

    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, enum.Enum)):
        return True
    if isinstance(value, (tuple, list)):
        return all(_simple(v) for v in value)
    return False


def structure_mismatches(model: nn.Module, rebuilt: nn.Module) -> List[str]:
    """What differs between `model` and the model its config rebuilds (empty list: identical)."""
    droplike = _droplike_types()
    out: List[str] = []
    mods = dict(model.named_modules())
    new = dict(rebuilt.named_modules())
    for name, module in mods.items():
        where = name or "<root>"
        other = new.get(name)
        if other is None:
            out.append(f"{where}: {type(module).__qualname__} is not part of the rebuilt skeleton")
            continue
        if saved_class(module) is not saved_class(other):
            if isinstance(module, droplike) and isinstance(other, droplike):
                continue  # identical in eval mode
            hint = ""
            if type(module).__module__.startswith("vitfast"):
                hint = " (unregistered vitfast module: fuse the model first, vitfast.fuse(model))"
            out.append(
                f"{where}: expected {type(other).__module__}.{type(other).__qualname__} (what the saved config "
                f"rebuilds), got {type(module).__module__}.{type(module).__qualname__}{hint}"
            )
            continue
        if isinstance(module, droplike):
            continue
        for attr, value in vars(module).items():
            if attr.startswith("_") or attr in _IGNORED_ATTRS or not _simple(value):
                continue
            rebuilt_value = vars(other).get(attr, "<missing>")
            if attr == "target_shift_size" and isinstance(value, (tuple, list)) and isinstance(rebuilt_value, (tuple, list)):
                # timm leaves it stale after set_input_size and reads only whether it is non-zero (the next resize
                # shifts by window // 2 then): a resized Swin was refused for a value that changes nothing
                value, rebuilt_value = any(value), any(rebuilt_value)
            if rebuilt_value != value:
                out.append(f"{where}.{attr}: the rebuilt model has {rebuilt_value!r}, the model has {value!r}")
    for name in new:
        if name not in mods and not isinstance(new[name], droplike):
            out.append(f"{name}: the rebuilt skeleton has a {type(new[name]).__qualname__} the model lacks")
    sd, new_sd = model.state_dict(), rebuilt.state_dict()
    for key, t in sd.items():
        if key not in new_sd:
            out.append(f"tensor {key}: not in the rebuilt model")
        elif tuple(new_sd[key].shape) != tuple(t.shape):
            out.append(
                f"tensor {key}: the rebuilt model has shape {shape_text(new_sd[key].shape)}, the model has "
                f"{shape_text(t.shape)}"
            )
    out.extend(f"tensor {key}: missing from the model" for key in new_sd if key not in sd)
    return out


_PATH_RE = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")


# Attributes that do not change what a loaded model computes in eval mode (training switches, init modes,
# and the SDPA switch timm sets from the environment), so differences in them are not a save error.
_IGNORED_ATTRS = frozenset({
    "training", "grad_checkpointing", "distilled_training", "weight_init_mode", "fix_init", "fused_attn",
    "inplace",
})


def shape_text(shape) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


MAX_LISTED = 20  # problems listed in one error message; the count says how many there are in total


def listing(items: List[str]) -> str:
    """The first MAX_LISTED items joined for a one-line message, and how many more there are."""
    more = f"; ... and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return "; ".join(items[:MAX_LISTED]) + more


def shape_problems(header: Dict[str, dict], expected: Dict[str, torch.Tensor], *, missing: bool) -> List[str]:
    """What differs between a file's tensor entries (safetensors header) and the tensors a (meta-device) model
    expects: unexpected names, other shapes, and with `missing=True` names the file lacks."""
    problems = [f"unexpected tensor {k}" for k in sorted(set(header) - set(expected))]
    if missing:
        problems += [f"missing tensor {k} (expected shape {shape_text(expected[k].shape)})"
                     for k in sorted(set(expected) - set(header))]
    problems += [f"tensor {k}: expected shape {shape_text(expected[k].shape)}, got {shape_text(header[k]['shape'])}"
                 for k in sorted(set(header) & set(expected)) if list(header[k]["shape"]) != list(expected[k].shape)]
    return problems
