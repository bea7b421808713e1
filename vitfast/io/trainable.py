"""The train-time file: a train-time model (`vitfast.convert.from_timm`'s output, mid-finetune) in one .safetensors
file whose metadata describes how to rebuild it: the timm skeleton, each block's channel-idle FFN, and each method's
entry ("nondeep", "usdc" from `vitfast.methods.usdc.describe_usdc`, "dwconv" from
`vitfast.methods.dwconv.describe_dwconv`).  Loading rebuilds the skeleton, then loads the tensors strictly.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import torch.nn as nn

from .atomic import atomic_write

# ---------------------------------------------------------------------------------------------- train-time model files
TRAINABLE_FORMAT = "vitfast.trainable"


TRAINABLE_VERSION = 1


def _block_paths(model: nn.Module) -> List[str]:
    """Paths of the transformer blocks in depth order (ViT: blocks.i; Swin: layers.s.blocks.i)."""
    from timm.models.swin_transformer import SwinTransformer

    if isinstance(model, SwinTransformer):
        return [f"layers.{s}.blocks.{i}" for s, stage in enumerate(model.layers) for i in range(len(stage.blocks))]
    return [f"blocks.{i}" for i in range(len(getattr(model, "blocks", [])))]


def describe_trainable(model: nn.Module) -> Dict[str, Any]:
    """JSON description from which `build_trainable` rebuilds an identically shaped train-time model (see
    `_describe_trainable`), plus "source_architecture": the timm model it was converted from, when known."""
    from ..arch import source_architecture

    desc = _describe_trainable(model)
    source = source_architecture(model)
    if source is not None:
        desc["source_architecture"] = source
    return desc


def _describe_trainable(model: nn.Module) -> Dict[str, Any]:
    """JSON description from which `build_trainable` rebuilds an identically shaped train-time model.

    = the timm skeleton (`vitfast.arch.describe_timm`), the channel-idle FFN of every block (exact active
    channel count and norm type), every module's `eps` (official RePaViT weights mix LayerNorm eps values
    that one skeleton-wide norm setting cannot express) and every module's class name (checked on rebuild);
    plus "usdc" (`vitfast.methods.usdc.describe_usdc`) and "dwconv" (drop-in DW-conv heads:
    `vitfast.methods.dwconv.recipe.describe_dwconv`) entries for models that have them.
    Raises ValueError for train-time modules this format does not know yet, naming them.
    """
    from ..arch import describe_timm
    from ..methods.repavit.modules import (
        ChannelIdleBlock,
        ChannelIdleMlp,
        ChannelIdleSwinBlock,
    )

    if _is_nondeep(model):
        return _describe_nondeep(model)
    known = (ChannelIdleBlock, ChannelIdleSwinBlock, ChannelIdleMlp)
    from ..methods.usdc.compression import USDCResourceLoss, describe_usdc
    from ..methods.usdc.modules import USDCBlock

    known = known + (USDCBlock, USDCResourceLoss)  # USDC (gates + static compression): the "usdc" entry below
    from ..methods.dwconv.modules import DWConvBlock
    from ..methods.dwconv.recipe import describe_dwconv

    known = known + (DWConvBlock,)  # drop-in DW-conv heads: the "dwconv" entry below
    unknown = [
        f"{name} ({type(m).__name__})"
        for name, m in model.named_modules()
        if callable(getattr(m, "to_fused", None)) and not isinstance(m, known)
    ]
    if unknown:
        raise ValueError(
            f"model: expected only channel-idle train-time modules (the methods this file format knows), got "
            f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}"
        )
    blocks = _block_paths(model)
    ffn = []
    modules = dict(model.named_modules())
    for path in blocks:
        mlp = getattr(modules[path], "mlp", None)
        if isinstance(mlp, ChannelIdleMlp):
            ffn.append(
                {"path": f"{path}.mlp", "active": int(mlp.active_features), "hidden": int(mlp.hidden_features),
                 "norm": mlp.norm_type}
            )
    if ffn and len(ffn) != len(blocks):
        raise ValueError(
            f"model: expected every block or none to have a channel-idle FFN, got {len(ffn)} of {len(blocks)}"
        )
    if len({f["norm"] for f in ffn}) > 1:
        raise ValueError(f"model: expected one FFN norm type for all blocks, got {sorted({f['norm'] for f in ffn})}")
    eps = {name: float(m.eps) for name, m in model.named_modules() if isinstance(getattr(m, "eps", None), float)}
    types = {name: type(m).__name__ for name, m in model.named_modules()}
    dropout = _describe_dropout(model)
    architecture = describe_timm(model)
    usdc = describe_usdc(model, architecture)
    extra = {"usdc": usdc} if usdc is not None else {}
    dwconv = describe_dwconv(model, architecture)
    if dwconv is not None:
        extra["dwconv"] = dwconv
    return {
        "format": TRAINABLE_FORMAT,
        "version": TRAINABLE_VERSION,
        "architecture": architecture,
        "channel_idle": ffn,
        "eps": eps,
        "module_types": types,
        "dropout": dropout,
        **extra,
    }


# Regularisation the skeleton description does not hold (describe_timm records what an eval model computes):
# without it a rebuilt model trained without dropout (a --resume was no longer the run it resumed) and one
# with drop-path could not be saved at all ("DropPath described, Identity rebuilt").
def _describe_dropout(model: nn.Module) -> Dict[str, Dict[str, Any]]:
    from timm.layers import DropPath, PatchDropout

    out: Dict[str, Dict[str, Any]] = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Dropout) and m.p > 0:
            out[name] = {"kind": "Dropout", "p": float(m.p)}
        elif isinstance(m, DropPath) and m.drop_prob > 0:
            out[name] = {"kind": "DropPath", "p": float(m.drop_prob), "scale_by_keep": bool(m.scale_by_keep)}
        elif isinstance(m, PatchDropout) and m.prob > 0:
            out[name] = {"kind": "PatchDropout", "p": float(m.prob), "num_prefix_tokens": int(m.num_prefix_tokens)}
        if isinstance(getattr(m, "attn_drop", None), float) and m.attn_drop > 0:  # e.g. DWConvAttention's SDPA rate
            out[f"{name}#attn_drop"] = {"kind": "rate", "p": float(m.attn_drop)}
    return out


def _without_drop_path(architecture: Dict[str, Any]) -> Dict[str, Any]:
    """The skeleton without timm's default drop-path: the description's dropout entries put back every DropPath the
    model had, and only those.  (timm's Swin defaults to drop_path_rate 0.1: a Swin trained without drop-path was
    rebuilt with DropPath modules it never had, and save_trainable refused it.)"""
    kwargs = architecture.get("kwargs")
    if not isinstance(kwargs, dict) or "drop_path_rate" in kwargs:
        return architecture
    return {**architecture, "kwargs": {**kwargs, "drop_path_rate": 0.0}}


def _restore_dropout(model: nn.Module, entries: Dict[str, Dict[str, Any]]) -> None:
    from timm.layers import DropPath, PatchDropout

    for path, e in entries.items():
        module_path, _, attr = path.partition("#")
        p, kind = float(e["p"]), e.get("kind")
        # Drop-path/patch-dropout modules replace what the rebuild put there (Identity, or nothing: a USDC block
        # without drop-path has no child); a Dropout or a rate attribute is set on the module that has it.
        if kind in ("DropPath", "PatchDropout") and not attr:
            module_path, _, attr = module_path.rpartition(".")
        try:
            target = model.get_submodule(module_path) if module_path else model
        except AttributeError:
            raise ValueError(f"description['dropout'][{path!r}]: no such module in the rebuilt model") from None
        if kind == "rate":
            setattr(target, attr, p)
        elif kind == "Dropout":
            target.p = p
        elif kind == "DropPath":
            setattr(target, attr, DropPath(p, scale_by_keep=bool(e.get("scale_by_keep", True))))
        elif kind == "PatchDropout":
            setattr(target, attr, PatchDropout(p, num_prefix_tokens=int(e.get("num_prefix_tokens", 1))))
        else:
            raise ValueError(f"description['dropout'][{path!r}]: unknown kind {kind!r}")


def _restore_described(model: nn.Module, desc: Dict[str, Any]) -> nn.Module:
    """The last step of every rebuild from a description: the recorded LayerNorm eps values, then a check that the
    module tree (names and types) is the one that was described."""
    _restore_dropout(model, desc.get("dropout") or {})
    modules = dict(model.named_modules())
    for name, value in (desc.get("eps") or {}).items():
        if name in modules and hasattr(modules[name], "eps"):
            modules[name].eps = float(value)
    types = desc.get("module_types") or {}
    got = {name: type(m).__name__ for name, m in modules.items()}
    diff = sorted(set(types.items()) ^ set(got.items()))
    if diff:
        raise ValueError(
            "description: the rebuilt model differs from the described one at "
            + ", ".join(f"{n} ({types.get(n, 'absent')} described, {got.get(n, 'absent')} rebuilt)" for n, _ in diff[:5])
        )
    return model


def build_trainable(desc: Dict[str, Any], device: Union[str, torch.device, None] = None) -> nn.Module:
    """Rebuild the (uninitialised) train-time model described by `describe_trainable`."""
    from ..arch import set_source_architecture

    model = _build_trainable(desc, device)
    # from_timm on the rebuilt skeleton recorded the skeleton itself: the description's record (or none) replaces it
    set_source_architecture(model, desc.get("source_architecture"))
    return model


def _build_trainable(desc: Dict[str, Any], device: Union[str, torch.device, None] = None) -> nn.Module:
    from ..arch import build_timm
    from ..convert import from_timm

    if not isinstance(desc, dict) or desc.get("format") != TRAINABLE_FORMAT:
        raise ValueError(f"description: expected format {TRAINABLE_FORMAT!r}, got {desc.get('format') if isinstance(desc, dict) else desc!r}")
    if desc.get("version") != TRAINABLE_VERSION:
        raise ValueError(f"description: expected version {TRAINABLE_VERSION}, got {desc.get('version')!r}")
    if desc.get("nondeep"):
        return _build_nondeep(desc, device)
    model = build_timm(_without_drop_path(desc["architecture"]), device=device)
    ffn = desc.get("channel_idle") or []
    if ffn:
        ratios = [1.0 - f["active"] / f["hidden"] for f in ffn]
        model = from_timm(model, channel_idle=ratios, norm=ffn[0]["norm"])
        modules = dict(model.named_modules())
        for f in ffn:
            # set the count itself: θ -> ceil(hidden·(1-θ)) need not give back the same integer in floats
            modules[f["path"]].active_features = int(f["active"])
    if desc.get("usdc"):
        from ..methods.usdc.compression import build_usdc

        model = build_usdc(model, desc["usdc"])
    if desc.get("dwconv"):
        from ..methods.dwconv.recipe import build_dwconv

        model = build_dwconv(model, desc["dwconv"])
    return _restore_described(model, desc)


# ---------------------------------------------------------------------------------------------- non-deep models
def _is_nondeep(model: nn.Module) -> bool:
    from ..methods.nondeep.modules import NonDeepBlock

    return any(isinstance(m, NonDeepBlock) for m in model.modules())


def save_trainable(model: nn.Module, path: Union[str, os.PathLike], *, recipe: Optional[Dict[str, Any]] = None) -> str:
    """Write a train-time model (e.g. `convert.from_timm`'s output, mid-finetune) to one .safetensors file.

    The fused-inference format is `vitfast.save`; this one keeps the trainable shape (BatchNorms, idle
    channels unfolded) so it can be trained further or fused later.  JSON description in the metadata, no
    pickle.  `recipe` (plain JSON values) is stored alongside for people reading the file.
    """
    import json

    path = os.fspath(path)
    desc = describe_trainable(model)
    build_trainable(desc, device="meta")  # refuse now what could not be rebuilt at load time
    metadata = {
        "format": TRAINABLE_FORMAT,
        "version": str(TRAINABLE_VERSION),
        "config": json.dumps(desc, sort_keys=True),
        "recipe": json.dumps(recipe or {}, sort_keys=True),
    }
    from safetensors.torch import save_model

    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"path: directory {directory!r} does not exist")
    atomic_write(path, lambda tmp: save_model(model, tmp, metadata=metadata))
    return path


def read_safetensors_metadata(path: Union[str, os.PathLike]) -> Dict[str, str]:
    """The str -> str metadata of a .safetensors file; ValueError (naming the file) when it is not one."""
    from safetensors import safe_open

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"path: expected an existing .safetensors file, got {path!r} (not found)")
    try:
        with safe_open(path, framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as exc:  # safetensors raises its own error type for truncated/corrupt headers
        from ._sniff import foreign_file

        what = foreign_file(path)  # a torch file: say what it is and what opens it, not "unreadable"
        if what is not None:
            raise ValueError(what) from exc
        raise ValueError(f"path: {path!r} is not a readable .safetensors file ({exc})") from exc


def _check_bounded_by_file(path: str, desc: Any) -> None:
    """What `vitfast.load` does for fused files (vitfast.io._bounds), before the real build: the architecture's
    counts and ranges against the file, then a meta-device build whose tensor shapes must match the stored ones.
    A 100 KB file declaring depth=10^5 would otherwise build for minutes at gigabytes before load_model refused it.
    (Tensors safetensors' save_model deduplicated are absent from the file: only stored names are compared.)"""
    from ._bounds import check_before_build
    from ._header import read_header
    from ._rebuild import listing, shape_problems

    header, _ = read_header(path)
    if not isinstance(desc, dict):
        raise ValueError(f"path: {path!r} has a 'config' metadata entry that is not a JSON object")
    architecture = desc.get("architecture")
    if not desc.get("nondeep") and isinstance(architecture, dict):
        check_before_build(path, {"architecture": architecture, "modules": {}, "aliases": {}}, header)
    try:
        probe = build_trainable(desc, device="meta")  # save_trainable refuses what does not build on meta
    except Exception as exc:  # noqa: BLE001 - a description that does not build is the file's fault, named
        raise ValueError(f"path: {path!r} describes a model that cannot be rebuilt ({type(exc).__name__}: "
                         f"{exc})") from exc
    problems = shape_problems(header, probe.state_dict(), missing=False)
    if problems:
        raise ValueError(f"path: the tensors in {path!r} do not match the model it describes ({len(problems)} "
                         f"problems): {listing(problems)}")


def load_trainable(path: Union[str, os.PathLike]) -> Tuple[nn.Module, Dict[str, Any]]:
    """Read a `save_trainable` file -> (model in eval mode, recipe)."""
    import json

    from safetensors.torch import load_model

    path = os.fspath(path)
    meta = read_safetensors_metadata(path)
    fmt = meta.get("format")
    if fmt != TRAINABLE_FORMAT:
        hint = " (it is a fused model: load it with vitfast.load)" if fmt == "vitfast.fused" else ""
        raise ValueError(f"path: expected a {TRAINABLE_FORMAT!r} file in {path!r}, got format {fmt!r}{hint}")
    try:
        desc = json.loads(meta["config"])
        recipe = json.loads(meta.get("recipe") or "{}")
    except (KeyError, ValueError, RecursionError) as exc:  # JSONDecodeError, > 4300-digit ints; nesting bombs
        raise ValueError(f"path: {path!r} has a missing or corrupt 'config' metadata entry ({exc})") from exc
    _check_bounded_by_file(path, desc)
    model = build_trainable(desc)
    try:
        load_model(model, path, strict=True)
    except Exception as exc:
        raise ValueError(f"path: the tensors in {path!r} do not match the model it describes ({exc})") from exc
    return model.eval(), recipe


def _describe_nondeep(model: nn.Module) -> Dict[str, Any]:
    """The description of a non-deep ViT (`convert.from_timm(..., branches=n)`): the timm skeleton it was converted
    from (depth L = blocks × n) plus what `from_timm` needs to rebuild the same blocks — branches, join schedule,
    value joining, α, and each block's FFN (exact active channel count, norm)."""
    from ..arch import describe_timm
    from ..methods.nondeep.modules import NonDeepBlock

    blocks = list(getattr(model, "blocks", []))
    if not blocks or not all(isinstance(b, NonDeepBlock) for b in blocks):
        kinds = sorted({type(b).__name__ for b in blocks})
        raise ValueError(f"model: expected every block to be a NonDeepBlock (a non-deep ViT), got {kinds}")
    first = blocks[0]
    n = first.num_branches
    if any(b.num_branches != n for b in blocks):
        raise ValueError(f"model: expected one branch count for all blocks, got {[b.num_branches for b in blocks]}")
    schedule = first.schedule
    arch = describe_timm(model)
    br_attn, br_mlp = first.attn.branches[0], first.mlp.branches[0]
    arch["kwargs"].update(
        depth=len(blocks) * n,
        num_heads=int(first.attn.num_heads),
        mlp_ratio=first.mlp.hidden_features / first.dim,
        qkv_bias=br_attn.qkv.bias is not None,
        proj_bias=br_attn.proj.bias is not None,
    )
    eps = {name: float(m.eps) for name, m in model.named_modules() if isinstance(getattr(m, "eps", None), float)}
    return {
        "format": TRAINABLE_FORMAT,
        "version": TRAINABLE_VERSION,
        "architecture": arch,
        "nondeep": {
            "branches": n,
            "schedule": schedule.to_dict(),
            "join_values": bool(first.attn.join_values),
            "diversity_weight": float(sum(b.extra_loss_weight for b in blocks)),
            "ffn": [{"active": int(b.mlp.active_features), "hidden": int(b.mlp.hidden_features), "norm": b.mlp.norm_type,
                     "fc1_bias": br_mlp.fc1.bias is not None}
                    for b in blocks],
        },
        "channel_idle": [],
        "eps": eps,
        "module_types": {name: type(m).__name__ for name, m in model.named_modules()},
        "dropout": _describe_dropout(model),
    }


def _build_nondeep(desc: Dict[str, Any], device) -> nn.Module:
    from ..arch import build_timm
    from ..convert import from_timm
    from ..methods.nondeep.schedule import JoinSchedule

    nd = desc["nondeep"]
    sched = nd["schedule"]
    ffn = nd["ffn"]
    # Conversion reads weight values (LayerNorm absorption checks them): a "meta" rebuild (save_trainable's check)
    # runs on the CPU instead.
    timm_model = build_timm(_without_drop_path(desc["architecture"]), device=None if str(device) == "meta" else device)
    model = from_timm(
        timm_model, branches=int(nd["branches"]), channel_idle=[1.0 - f["active"] / f["hidden"] for f in ffn],
        norm=ffn[0]["norm"], join_values=bool(nd["join_values"]), diversity_weight=float(nd["diversity_weight"]),
        schedule=JoinSchedule.from_dict(sched),
    )
    for block, f in zip(model.blocks, ffn):
        block.mlp.active_features = int(f["active"])  # the count itself (θ -> ceil(...) may round differently)
    return _restore_described(model, desc)
