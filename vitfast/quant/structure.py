"""Which layers of a model are int8, as JSON (the "quantization" entry of a vitfast.fused file), and putting them back.

    {"dtype": "int8", "activations": "dynamic" | "static",
     "modules": {"blocks.0.attn.qkv": {"kind": "int8_linear", ...}, "blocks.0.mlp": {"kind": "int8_channel_idle_ffn",
                 ...}, "patch_embed.proj": {"kind": "int8_patch_projection", ...}, ...},
                                                # path -> Int8Linear / Int8ChannelIdleFFN / Int8PatchProjection
                                                #         .quant_config()
     "fp32": ["blocks.11.mlp", ...],            # quantizable layers kept in fp32 (skip=), informational
     "attention_auto": {"kernel": "amx_int8", "tokens": 197}}  # optional: the int8 kernel and token count
                                                # attention="auto" chose the products for, informational

`vitfast.load` rebuilds the fp32 structure from the file's fused configs, then `apply` swaps these paths for empty
int8 modules (on the meta device first, so the file's tensors are compared with the result before anything real is
allocated), then loads the tensors.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

import torch.nn as nn

from ..nn.patch_embed import is_patch_projection
from ..nn.int8 import (_QUANT_KINDS, Int8ChannelIdleFFN, Int8Linear, Int8PatchProjection, int8_module_from_config,
                       is_int8_module)

KEY = "quantization"
_FLAGS = ("int8_attention", "bf16_attention")  # the attentions' product flags (FusedAttention, ProjectedXWXAttention)
_KINDS = (*_QUANT_KINDS, *_FLAGS)  # the int8 modules, and the flags
_MAX_INT = 2**31 - 1


def quant_config(model: nn.Module) -> Optional[Dict[str, Any]]:
    """The model's quantization record, or None for a model without int8 modules."""
    modules = {name: m.quant_config() for name, m in model.named_modules() if is_int8_module(m)}
    for flag in _FLAGS:
        modules.update({name: {"kind": flag} for name, m in model.named_modules() if m.__dict__.get(flag)})
    if not modules:
        return None
    static = any(cfg.get("act_scale", 0.0) > 0 or cfg.get("act_scale_in", 0.0) > 0 for cfg in modules.values())
    record = getattr(model, "vitfast_quantization", None) or {}
    out = {"dtype": "int8", "activations": "static" if static else "dynamic", "modules": modules,
           "fp32": list(record.get("fp32", []))}
    if isinstance(record.get("attention_auto"), dict):  # what attention="auto" chose for (describe says it)
        out["attention_auto"] = dict(record["attention_auto"])
    return out


def _check_ints(path: str, value: Any) -> None:
    """Every int in a (file-borne) config is at most 2³¹ − 1, before anything is sized from it."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_ints(f"{path}[{k!r}]", v)
    elif isinstance(value, int) and not isinstance(value, bool) and value > _MAX_INT:
        raise ValueError(f"{path}: expected an int <= {_MAX_INT}, got {value}")


def check_record(record: Any) -> None:
    if not isinstance(record, dict) or record.get("dtype") != "int8" or not isinstance(record.get("modules"), dict):
        raise ValueError(f"config[{KEY!r}]: expected an object with 'dtype': 'int8' and 'modules', got {record!r:.200}")


def apply(model: nn.Module, record: Any, device=None, prefix: str = "") -> nn.Module:
    """Swap the int8 modules `record` names into `model` (in place; returns it).  Every error is a ValueError that
    names the config entry.  `prefix`: `model` is the submodule at that path (only the entries below it apply)."""
    check_record(record)
    # a non-deep attention whose GEMMs are int8 was saved in its projected form (nn/xwx.py ProjectedXWXAttention)
    owners = {p.rpartition(".")[0] for p in record["modules"] if isinstance(p, str)}
    # (and one whose heads' products are int8 or bf16: the flag names the attention itself)
    owners |= {p for p, cfg in record["modules"].items()
               if isinstance(p, str) and isinstance(cfg, dict) and cfg.get("kind") in _FLAGS}
    if prefix:
        owners = {p[len(prefix) + 1:] for p in owners if p.startswith(prefix + ".")}
    project_xwx_attentions(model, owners, weights=False)
    for full_path, cfg in record["modules"].items():
        if prefix and not full_path.startswith(prefix + "."):
            continue
        path = full_path[len(prefix) + 1:] if prefix else full_path
        where = f"config[{KEY!r}]['modules'][{full_path!r}]"
        _check_ints(where, cfg)
        try:
            target = model.get_submodule(path)
        except AttributeError:
            raise ValueError(f"{where}: no module {path!r} in the rebuilt model") from None
        kind = cfg.get("kind") if isinstance(cfg, dict) else None
        if kind not in _KINDS:
            raise ValueError(f"{where}['kind']: expected one of {', '.join(map(repr, _KINDS))}, got {cfg!r:.200}")
        if kind in _FLAGS:  # a flag on the fused attention: its products' op
            from ..nn.block import FusedAttention
            from ..nn.xwx import ProjectedXWXAttention

            if type(target) not in (FusedAttention, ProjectedXWXAttention) or set(cfg) != {"kind"}:
                raise ValueError(f"{where}: expected a fused attention at {path!r} and no other keys, found "
                                 f"{type(target).__name__}, keys {sorted(cfg)}")
            setattr(target, kind, True)
            continue
        try:
            module = int8_module_from_config(cfg, device=device)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if isinstance(module, Int8Linear):
            if type(target) is not nn.Linear or (target.in_features, target.out_features) != (
                    module.in_features, module.out_features):
                raise ValueError(f"{where}: expected to replace an nn.Linear({module.in_features}, "
                                 f"{module.out_features}), found {type(target).__name__} at {path!r}")
        elif isinstance(module, Int8ChannelIdleFFN):
            if not hasattr(target, "vitfast_config") or target.vitfast_config() != module.vitfast_config():
                raise ValueError(f"{where}['ffn']: expected the config of the FFN at {path!r}, got another")
        elif isinstance(module, Int8PatchProjection):
            geometry = (module.in_channels, module.out_channels, module.kernel_size, module.bias is not None)
            if not is_patch_projection(target) or (target.in_channels, target.out_channels, tuple(target.kernel_size),
                                                   target.bias is not None) != geometry:
                raise ValueError(f"{where}: expected to replace a patch Conv2d({module.in_channels}, "
                                 f"{module.out_channels}, kernel_size=stride={module.kernel_size}, "
                                 f"bias={geometry[3]}), found {target!r:.200} at {path!r}")
        set_submodule(model, path, module)
    if not prefix:
        model.vitfast_quantization = {"dtype": "int8", "activations": record.get("activations"),
                                      "fp32": [p for p in record.get("fp32", []) if isinstance(p, str)]}
        auto = record.get("attention_auto")
        if isinstance(auto, dict) and isinstance(auto.get("kernel"), str):
            model.vitfast_quantization["attention_auto"] = {
                "kernel": auto["kernel"], "tokens": auto.get("tokens") if isinstance(auto.get("tokens"), int) else None}
    _replan_blocks(model)
    return model


def project_xwx_attentions(model: nn.Module, paths: Optional[Iterable[str]] = None,
                           weights: bool = True) -> Dict[str, nn.Module]:
    """Put the `ProjectedXWXAttention` form (vitfast/nn/xwx.py: projection GEMM → xwx_heads → output GEMM, whose two
    GEMMs can be int8) in place of every `FusedXWXAttention` of `model`, or of those at `paths`; returns the
    replaced modules by path.  weights=False: empty ones of the same shape, dtype and device (a file's tensors follow).
    """
    from ..nn.xwx import FusedXWXAttention, ProjectedXWXAttention

    wanted = None if paths is None else set(paths)
    found = [(name, m) for name, m in model.named_modules() if type(m) is FusedXWXAttention
             and (wanted is None or name in wanted)]
    for name, m in found:
        set_submodule(model, name, ProjectedXWXAttention.from_fused(m) if weights else ProjectedXWXAttention.like(m))
    return dict(found)


def restore_fp32_xwx(model: nn.Module, originals: Dict[str, nn.Module]) -> None:
    """Put back the fused op where both GEMMs of a projected attention stayed fp32 (nothing of it is int8)."""
    for path, original in originals.items():
        m = model.get_submodule(path)
        if type(getattr(m, "proj_in", None)) is nn.Linear and type(getattr(m, "proj_out", None)) is nn.Linear:
            set_submodule(model, path, original)


def set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    owner, _, leaf = path.rpartition(".")
    parent = model.get_submodule(owner) if owner else model
    setattr(parent, leaf, module)


def _replan_blocks(model: nn.Module) -> None:
    """Blocks decide once whether they run as one whole-block op (vitfast.nn.block.plan_whole_block): decide again."""
    from ..nn.block import FusedBlock, plan_whole_block
    from ..nn.gated import FusedGatedBlock

    for m in model.modules():
        if isinstance(m, (FusedBlock, FusedGatedBlock)):
            plan_whole_block(m)
