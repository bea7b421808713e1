"""`vitfast.save` / `vitfast.load`: one `.safetensors` file per model, JSON config in its metadata, no pickle.

File format ("vitfast.fused", version 1)
-----------------------------------------
A standard safetensors file.  Tensors: the model's `state_dict()`, each stored once (entries that are the very
same tensor, e.g. tied weights, are stored under the first name and listed in `config["aliases"]`).
Header metadata (safetensors allows only str -> str):

    "format":  "vitfast.fused"
    "version": "1"
    "config":  JSON text of
        {"format": "vitfast.fused", "version": 1,
         "architecture": vitfast.arch.describe_timm(model),        # the timm skeleton to rebuild
         "modules": {"blocks.3.mlp": {"kind": "channel_idle_ffn", ...}, ...},
                     # every registered fused submodule (any depth): path -> its vitfast_config()
         "aliases": {"name": "name it shares its tensor with", ...},
         "blocks": [{"index": 0, "path": "blocks.0", "kind": "timm.Block" | "<fused kind>",
                     "modules": {"mlp": "channel_idle_ffn"}, ("stage": s for Swin)}, ...],
                     # informational summary, not needed to load
         "dtype": "float32" | "float16" | "bfloat16" | "float64" | "mixed" | "none",
                     # the floating-point dtype of every stored floating tensor, or "mixed"
         "vitfast_version": "0.1.0"}

"checksum" (optional, vitfast.io._checksum): JSON text of the CRC-32 of the config text and of every tensor.

Loading verifies the checksums, checks every config value against its range and the file's tensors before building
anything (vitfast.io._bounds), rebuilds the skeleton on the meta device (`vitfast.arch.build_timm`), replaces each
configured path, parents before children, with `fused_module_from_config(cfg)`, checks the file's tensors against
the rebuilt model (names, shapes, dtypes: every mismatch is listed), then builds it for real, copies the tensors in,
and returns the model in eval mode.

Decisions
---------
* A model without fused modules is accepted: a distilled student (method 5) or a baseline teacher is a plain
  timm model, and one file format for everything is simpler for users and for the CLI.
* `save` first rebuilds the model from the config it is about to write (on the meta device, so without
  allocating) and compares module types, forward-relevant attributes (eps, num_heads, window sizes, ...),
  tensor names and shapes.  A model the file cannot reproduce (unfused train-time modules, a pruned block
  that timm's constructor cannot express, an incomplete `vitfast_config`) is refused at save time, naming the
  offending paths, instead of producing a file that fails or silently differs at load time.  Dropout,
  DropPath and PatchDropout are treated as Identity: the file holds an inference model.
* NaN/Inf: refused by default at save and at load (ValueError listing the tensors): a fused model with a
  non-finite weight is almost always a training or folding bug, and a file is untrusted input.
  `allow_nonfinite=True` turns both checks off (e.g. for -inf masks stored as buffers).
* The write is atomic (vitfast.io.atomic.atomic_write): a temporary file in the target directory, fsync, then
  `os.replace`; on any error the temporary file is removed and an existing file at `path` is left untouched.
* No pickle: tensors come from safetensors, the config from JSON, and the architecture can name only a
  closed set of timm classes, norms and activations (see vitfast.arch).  `torch.load` is never called.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from ..arch import build_timm, describe_timm, set_source_architecture, source_architecture
from ..nn.registry import fused_module_from_config, is_fused_module
from ..quant import structure as quant_structure
from . import _checksum
from ._bounds import check_before_build, check_widths
from ._header import read_header as _read_header
from ._rebuild import float32_default, fused_configs, listing, rebuild, shape_problems, shape_text, structure_mismatches
from .atomic import atomic_write, check_target
from .trainable import TRAINABLE_FORMAT

__all__ = ["save", "load", "read_config", "FORMAT", "VERSION"]

FORMAT = "vitfast.fused"
VERSION = 1

# The real build allocates timm's whole skeleton before the fused modules replace parts of it, and config values
# no stored tensor checks (num_classes under a packed head, in_chans, mlp_ratio, Swin's unsaved masks) size it:
# a file whose skeleton needs more than this many times its own tensor bytes, plus the slack, is refused
# before anything is allocated.  Real fused models stay far below (θ = 1 FFNs with every attention on
# depthwise convolutions: ~4x).
_MAX_SKELETON_RATIO = 16
_SKELETON_SLACK_BYTES = 256 * 2**20

_ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
for _name, _attr in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")):
    if hasattr(torch, _attr):
        _ST_DTYPES[_name] = getattr(torch, _attr)
_DTYPE_NAMES = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


# --------------------------------------------------------------------------------------------- save


def _dtype_summary(tensors: Dict[str, torch.Tensor]) -> str:
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if not dtypes:
        return "none"
    if len(dtypes) == 1 and next(iter(dtypes)) in _DTYPE_NAMES:
        return _DTYPE_NAMES[next(iter(dtypes))]
    return "mixed"


def _nonfinite(tensors: Dict[str, torch.Tensor]) -> List[str]:
    bad = []
    for key, t in tensors.items():
        if not (t.is_floating_point() and t.numel()):
            continue
        # Fast path, one reduction: NaN and Inf propagate through a sum, so a finite sum proves every element
        # finite (several times cheaper than isfinite().all() on ViT-B).  A non-finite sum may also be an
        # overflow of large finite values, so only then count exactly.
        if bool(torch.isfinite(t.sum())):
            continue
        count = int((~torch.isfinite(t)).sum())
        if count:
            bad.append(f"{key} ({count} of {t.numel()})")
    return bad


def _dedup(state: Dict[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Tensors to write (each its own contiguous CPU storage) and {alias: stored name} for exact duplicates.

    safetensors refuses tensors that share memory.  The same tensor under two names (tied weights) is stored
    once; a tensor that merely overlaps another one's storage (a view) is copied, since its bytes are not
    another entry's bytes.
    """
    tensors: Dict[str, torch.Tensor] = {}
    aliases: Dict[str, str] = {}
    seen_views: Dict[tuple, str] = {}
    views_per_storage: Dict[tuple, set] = {}

    def ids(t: torch.Tensor) -> Tuple[tuple, tuple]:
        sid = (t.device.type, t.device.index, t.untyped_storage().data_ptr())
        return sid, sid + (t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)

    for key, t in state.items():
        if t.device.type == "meta":
            raise ValueError(f"model: tensor {key} is on the meta device (no data to save); materialise the model first")
        if t.numel():
            sid, view = ids(t)
            views_per_storage.setdefault(sid, set()).add(view)
    for key, t in state.items():
        t = t.detach()
        shared = False
        if t.numel():
            sid, view = ids(t)
            if view in seen_views:
                aliases[key] = seen_views[view]
                continue
            seen_views[view] = key
            # Another distinct view of the same memory, or a slice of a larger storage: copy it out, so that
            # safetensors sees one owner per storage and the file holds only this tensor's bytes.
            whole = t.untyped_storage().nbytes() == t.numel() * t.element_size()
            shared = len(views_per_storage[sid]) > 1 or not whole
        t = t.to("cpu")
        tensors[key] = t.clone(memory_format=torch.contiguous_format) if shared or not t.is_contiguous() else t
    return tensors, aliases


def _block_summary(model: nn.Module, modules: Dict[str, dict]) -> List[dict]:
    containers: List[Tuple[str, nn.Module, Optional[int]]] = []
    if hasattr(model, "layers") and isinstance(model.layers, nn.Sequential):  # Swin: stages of blocks
        containers = [(f"layers.{s}.blocks", stage.blocks, s) for s, stage in enumerate(model.layers)]
    elif hasattr(model, "blocks"):
        containers = [("blocks", model.blocks, None)]
    summary, index = [], 0
    for prefix, blocks, stage in containers:
        for j, block in enumerate(blocks):
            path = f"{prefix}.{j}"
            kind = type(block).vitfast_kind if is_fused_module(block) else f"timm.{type(block).__name__}"
            inner = {p[len(path) + 1:]: cfg["kind"] for p, cfg in modules.items() if p.startswith(path + ".")}
            entry = {"index": index, "path": path, "kind": kind, "modules": inner}
            if stage is not None:
                entry["stage"] = stage
            summary.append(entry)
            index += 1
    return summary


def save(model: nn.Module, path: str | os.PathLike, *, allow_nonfinite: bool = False) -> None:
    """Write `model` (a timm ViT/DeiT/Swin skeleton, fused or not) to one `.safetensors` file at `path`."""
    from .._version import __version__

    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    check_target(path)  # before the rebuild check: a bad path fails fast
    from ..cuda_graphs import CudaGraphModule

    if isinstance(model, CudaGraphModule):  # vitfast.cuda_graph(model): the file holds the model, not the replays
        model = model.module

    architecture = describe_timm(model)
    modules = fused_configs(model)
    quantization = quant_structure.quant_config(model)
    _check_rebuildable(model, architecture, modules, quantization)
    _check_fused_dtypes(model, modules)

    state = model.state_dict()
    tensors, aliases = _dedup(state)
    if not allow_nonfinite:
        bad = _nonfinite(tensors)
        if bad:
            raise ValueError(
                f"model: expected finite weights, got NaN/Inf in {len(bad)} tensors: {listing(bad)} "
                f"(pass allow_nonfinite=True to save anyway)"
            )
    config = {
        "format": FORMAT,
        "version": VERSION,
        "architecture": architecture,
        "modules": modules,
        "aliases": aliases,
        "blocks": _block_summary(model, modules),
        "dtype": _dtype_summary(tensors),
        "vitfast_version": __version__,
    }
    if quantization is not None:  # optional key: the int8 layers put back over the fp32 structure at load
        config[quant_structure.KEY] = quantization
    if config["dtype"] == "mixed":
        buffer_dtypes = _unsaved_buffer_dtypes(model, state)
        if buffer_dtypes:  # optional key: files without it load as before
            config["buffer_dtypes"] = buffer_dtypes
    source = source_architecture(model)
    if source is not None:  # optional: the timm model the file was made from (vitfast.arch.SOURCE_ATTR)
        config["source_architecture"] = source
    metadata = {"format": FORMAT, "version": str(VERSION), "config": json.dumps(config, allow_nan=False, sort_keys=True)}
    metadata[_checksum.KEY] = _checksum.record(tensors, metadata["config"])
    from safetensors.torch import save_file

    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def _check_fused_dtypes(model: nn.Module, modules: Dict[str, dict]) -> None:
    # A plain timm skeleton runs in float64, vitfast's own fused modules do not: every vitfast op (kernels and
    # reference) takes float32, float16 or bfloat16, so such a file would load into a model that cannot run.
    # (Fused modules registered by others may compute in float64: their business.)
    for path in modules:
        if not type(model.get_submodule(path)).__module__.startswith("vitfast."):
            continue
        for name, t in (*model.get_submodule(path).named_parameters(), *model.get_submodule(path).named_buffers()):
            if t.dtype == torch.float64:
                raise ValueError(
                    f"model.{path}.{name}: expected float32, float16 or bfloat16 in a fused module (what the "
                    f"vitfast ops take), got torch.float64; call model.float() (or .half()/.bfloat16()) first"
                )


def _check_rebuildable(model: nn.Module, architecture: dict, modules: Dict[str, dict],
                       quantization: Optional[dict] = None) -> None:
    try:
        rebuilt = rebuild(architecture, modules, device="meta")
        device = "meta"
    except Exception:  # noqa: BLE001 - some fused constructors may compute on values; retry allocating
        try:
            rebuilt = rebuild(architecture, modules)
            device = None
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"model: its saved config would not rebuild it ({type(e).__name__}: {e})") from e
    if quantization is not None:
        try:
            quant_structure.apply(rebuilt, quantization, device=device)
        except ValueError as e:
            raise ValueError(f"model: its int8 layers would not be put back ({e})") from e
    problems = structure_mismatches(model, rebuilt)
    if problems:
        raise ValueError(
            f"model: the checkpoint config cannot reproduce this model ({len(problems)} differences): "
            f"{listing(problems)}"
        )


# --------------------------------------------------------------------------------------------- load


def _parse_config(path: str, metadata: Dict[str, str]) -> dict:
    fmt = metadata.get("format")
    if fmt == TRAINABLE_FORMAT:
        raise ValueError(
            f"{path}: a train-time model (vitfast.io.save_trainable / `vitfast train`), not a fused one; load it with "
            f"vitfast.io.load_trainable, or fuse it first (vitfast.fuse, `vitfast fuse {path} -o FUSED`)"
        )
    if fmt != FORMAT:
        raise ValueError(
            f"{path}: not a vitfast checkpoint (metadata 'format' expected {FORMAT!r}, got {fmt!r}); "
            f"write one with vitfast.save(model, path)"
        )
    version = metadata.get("version")
    try:
        version_num = int(version)
    except (TypeError, ValueError):
        raise ValueError(f"{path}: metadata 'version' expected an integer string, got {version!r}") from None
    if version_num > VERSION:
        raise ValueError(
            f"{path}: checkpoint format version {version_num} is newer than this vitfast supports "
            f"(version {VERSION}); upgrade vitfast to load it"
        )
    if version_num < 1:
        raise ValueError(f"{path}: metadata 'version' expected 1..{VERSION}, got {version_num}")
    raw_config = metadata.get("config")
    if raw_config is None:
        raise ValueError(f"{path}: metadata 'config' is missing (a vitfast file stores its JSON config there)")
    if not isinstance(raw_config, str):  # safetensors metadata values are strings; the config is JSON text
        raise ValueError(f"{path}: metadata 'config' expected a JSON string, got {type(raw_config).__name__}")
    try:
        config = json.loads(raw_config)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, an int of > 4300 digits; a nesting bomb
        raise ValueError(f"{path}: metadata 'config' is not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: metadata 'config' expected a JSON object, got {type(config).__name__}")
    if config.get("format") != FORMAT or type(config.get("version")) is not int or config["version"] != version_num:
        raise ValueError(
            f"{path}: config format/version ({config.get('format')!r}, {config.get('version')!r}) disagree with "
            f"the metadata ({fmt!r}, {version_num})"
        )
    for key, kind in (("architecture", dict), ("modules", dict)):
        if not isinstance(config.get(key), kind):
            raise ValueError(f"{path}: config[{key!r}] expected a JSON object, got {type(config.get(key)).__name__}")
    dtype = config.get("dtype", "mixed")
    if dtype not in ("none", "mixed", *_DTYPE_NAMES.values()):
        raise ValueError(f"{path}: config['dtype'] expected one of {['none', 'mixed', *_DTYPE_NAMES.values()]}, "
                         f"got {dtype!r:.100}")
    if quant_structure.KEY in config:
        try:
            quant_structure.check_record(config[quant_structure.KEY])
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    buffer_dtypes = config.get("buffer_dtypes", {})
    if not isinstance(buffer_dtypes, dict) or not all(
            isinstance(k, str) and v in _DTYPE_NAMES.values() for k, v in buffer_dtypes.items()):
        raise ValueError(f"{path}: config['buffer_dtypes'] expected an object of buffer name -> one of "
                         f"{list(_DTYPE_NAMES.values())}, got {json.dumps(buffer_dtypes)[:100]}")
    aliases = config.setdefault("aliases", {})
    if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
        raise ValueError(f"{path}: config['aliases'] expected an object of name -> name")
    if not all(isinstance(p, str) and isinstance(c, dict) for p, c in config["modules"].items()):
        raise ValueError(f"{path}: config['modules'] expected an object of path -> fused module config")
    return config


def read_config(path: str | os.PathLike, *, verify: bool = True) -> dict:
    """The validated config of a vitfast checkpoint, without building the model or reading tensor data.

    `verify=True` checks the config text against the file's checksum record (see `load`)."""
    path = _check_path(path)
    header, metadata = _read_header(path)
    config = _parse_config(path, metadata)
    if verify:
        _checksum.verify_config(path, _checksum.parse(path, metadata, set(header)), metadata["config"])
    return config


def _check_path(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"path: no such file {path!r}")
    if not os.path.isfile(path):
        raise ValueError(f"path: expected a file, got a directory or special file {path!r}")
    return path


def _check_tensors(path: str, header: dict, config: dict, expected: Dict[str, torch.Tensor]) -> None:
    aliases = config["aliases"]
    problems = []
    stored = set(header)
    for alias, target in aliases.items():
        if alias not in expected:
            problems.append(f"{alias}: listed as an alias, but the model has no such tensor")
        elif alias in stored:
            problems.append(f"{alias}: listed as an alias but also stored")
        elif target not in stored:
            problems.append(f"{alias}: alias of {target!r}, which is not stored")
    uniform = config.get("dtype") if config.get("dtype") in ("float64", "float32", "float16", "bfloat16") else None
    for key in sorted(set(expected) - stored - set(aliases)):
        problems.append(f"missing tensor {key} (expected shape {shape_text(expected[key].shape)})")
    for key in sorted(stored - set(expected)):
        problems.append(f"unexpected tensor {key}")
    for key in sorted(stored & set(expected)):
        info, want = header[key], expected[key]
        if tuple(info["shape"]) != tuple(want.shape):
            problems.append(f"tensor {key}: expected shape {shape_text(want.shape)}, got {shape_text(info['shape'])}")
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None or (dtype.is_floating_point and dtype not in _DTYPE_NAMES):  # float8: no kernel reads it
            problems.append(f"tensor {key}: unsupported dtype {info['dtype']!r}")
        elif want.is_floating_point() != dtype.is_floating_point or (not dtype.is_floating_point and dtype != want.dtype):
            problems.append(f"tensor {key}: expected dtype {want.dtype}, got {dtype}")
        elif uniform is not None and dtype.is_floating_point and dtype != want.dtype:
            problems.append(f"tensor {key}: expected dtype {want.dtype} (config dtype {uniform}), got {dtype}")
    for alias, target in aliases.items():
        if alias in expected and target in header and tuple(header[target]["shape"]) != tuple(expected[alias].shape):
            problems.append(f"tensor {alias} (alias of {target}): expected shape {shape_text(expected[alias].shape)}, "
                            f"got {shape_text(header[target]['shape'])}")
    if problems:
        raise ValueError(f"{path}: tensors do not match the config ({len(problems)} problems): {listing(problems)}")


def _check_fused_modules_on_meta(path: str, header: dict, config: dict) -> None:
    """When the timm skeleton cannot build on the meta device, the fused modules still must (their constructors are
    vitfast's), and their tensors are compared with the file's before the real build allocates them: a fused
    Swin block declaring dim 16000 in a file storing 16 was once built for real (minutes) before being refused."""
    modules = config["modules"]
    problems: List[str] = []
    for where in sorted(modules, key=lambda p: p.count(".")):
        try:
            with float32_default(), torch.device("meta"):
                module = fused_module_from_config(modules[where])
        except Exception as e:  # noqa: BLE001 - a config that does not build: the file's fault, named
            raise ValueError(f"{path}: cannot rebuild the model from its config: modules[{where!r}]: {e}") from e
        if quant_structure.KEY in config:  # the int8 layers inside it
            try:
                quant_structure.apply(module, config[quant_structure.KEY], device="meta", prefix=where)
            except ValueError as e:
                raise ValueError(f"{path}: cannot rebuild the model from its config: {e}") from e
        nested = [p for p in modules if p.startswith(where + ".")]  # replaced by their own entries, checked there
        expected = {f"{where}.{name}": t for name, t in module.state_dict().items()}
        expected = {k: t for k, t in expected.items()
                    if k not in config["aliases"] and not any(k.startswith(n + ".") for n in nested)}
        own = {k: v for k, v in header.items() if k in expected}  # the rest of the file is the skeleton's
        problems += shape_problems(own, expected, missing=True)
    if problems:
        raise ValueError(f"{path}: tensors do not match the config ({len(problems)} problems): {listing(problems)}")


def _skeleton_builds_on_meta(config: dict) -> bool:
    try:
        with float32_default():
            build_timm(config["architecture"], device="meta")
        return True
    except Exception:  # noqa: BLE001 - only whether it builds matters here
        return False


def _try_rebuild(path: str, config: dict, device: Optional[str] = None) -> Optional[nn.Module]:
    try:
        model = rebuild(config["architecture"], config["modules"], device=device)
    except Exception as e:  # noqa: BLE001
        if device == "meta" and not _skeleton_builds_on_meta(config):
            # A timm constructor that computes on values (timm <= 1.0.20's `linspace(..).item()` for drop-path
            # rates) cannot build on the meta device: the real build checks the skeleton instead (a ValueError
            # here once refused every file under such a timm).  The caller checks the fused modules on meta.
            return None
        if isinstance(e, ValueError):
            raise ValueError(f"{path}: cannot rebuild the model from its config: {e}") from e
        raise ValueError(f"{path}: cannot rebuild the model from its config ({type(e).__name__}: {e})") from e
    if quant_structure.KEY in config:
        try:
            quant_structure.apply(model, config[quant_structure.KEY], device=device)
        except ValueError as e:
            raise ValueError(f"{path}: cannot rebuild the model from its config: {e}") from e
    return model


def _tensor_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def _check_skeleton_size(path: str, header: dict, config: dict, probe: Optional[nn.Module]) -> None:
    """Refuse before the real build when the skeleton, or the final model with its unsaved (non-persistent)
    buffers such as Swin's attention masks, needs far more memory than the file's tensors."""
    try:
        with float32_default():
            need = _tensor_bytes(build_timm(config["architecture"], device="meta"))
    except Exception:  # noqa: BLE001 - the real build reports a config that does not build
        need = 0
    if probe is not None:
        need = max(need, _tensor_bytes(probe))
    stored = sum(info["data_offsets"][1] - info["data_offsets"][0] for info in header.values())
    if need > _MAX_SKELETON_RATIO * stored + _SKELETON_SLACK_BYTES:
        raise ValueError(
            f"{path}: the architecture in the config needs {need / 2**20:.1f} MiB of tensors to build, more than "
            f"{_MAX_SKELETON_RATIO}x the {stored / 2**20:.1f} MiB the file stores: a config value no stored tensor "
            f"checks (num_classes, in_chans, mlp_ratio, img_size, ...) is wrong; architecture kwargs: "
            f"{json.dumps(config['architecture'].get('kwargs'), sort_keys=True)[:300]}"
        )


def _unsaved_buffer_dtypes(model: nn.Module, state: Dict[str, torch.Tensor]) -> Dict[str, str]:
    """dtype of every floating buffer the state dict leaves out (non-persistent: Swin's attention masks), for a
    "mixed" file, whose one dtype cannot say it: a bf16 Swin with fp32 norms came back with fp32 masks, which its
    bf16 attention then refused."""
    return {name: _DTYPE_NAMES[b.dtype] for name, b in model.named_buffers()
            if name not in state and b.is_floating_point() and b.dtype in _DTYPE_NAMES}


def _with_dtype(model: nn.Module, config: dict) -> nn.Module:
    uniform = config.get("dtype")
    if uniform in ("float64", "float16", "bfloat16"):
        # Like the saved model's own .to(dtype): also converts non-persistent floating buffers (Swin masks).
        model.to(getattr(torch, uniform))
    elif uniform == "mixed":
        buffers = dict(model.named_buffers())
        for name, dtype in config.get("buffer_dtypes", {}).items():
            if name in buffers and buffers[name] is not None:
                owner, _, leaf = name.rpartition(".")
                module = model.get_submodule(owner) if owner else model
                module._buffers[leaf] = buffers[name].to(getattr(torch, dtype))
    return model


def load(
    path: str | os.PathLike, device: str | torch.device | None = None, *, allow_nonfinite: bool = False,
    prepack: bool = True, verify: bool = True, map_location: str | torch.device | None = None,
) -> nn.Module:
    """Rebuild the model saved by `vitfast.save` at `path`, on `device` (default "cpu"), in eval mode.

    `map_location` is another name for `device`, torch.load's (a device only: no mapping function or dict).

    `prepack=True` packs the weights for the CPU kernels before returning (`vitfast.ops.prepack`), so the first
    inference does no packing.  `verify=True` checks the config text and every tensor's bytes against the CRC-32
    record `save` wrote (vitfast.io._checksum; a file without one loads with a warning); `verify=False` skips it.
    Every config value is checked against the file's tensors before anything is built (vitfast.io._bounds), so
    the work and memory of a load stay proportional to the file.
    """
    flag = "device"
    if map_location is not None:
        if device is not None and str(device) != str(map_location):
            raise ValueError(f"map_location: another name for device, got both: device={str(device)!r}, "
                             f"map_location={str(map_location)!r}")
        device, flag = map_location, "map_location"
    if device is None:
        device = "cpu"
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{flag}: expected a torch device such as 'cpu' or 'cuda:0', got {device!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():  # before building anything
        raise ValueError(f"{flag}: {str(device)!r} requested, but torch.cuda.is_available() is False here")
    if not isinstance(verify, bool):
        raise TypeError(f"verify: expected True or False, got {verify!r}")
    path = _check_path(path)
    header, metadata = _read_header(path)
    config = _parse_config(path, metadata)
    record = _checksum.parse(path, metadata, set(header)) if verify else None
    _checksum.verify_config(path, record, metadata["config"])  # a corrupt config is named as such, first
    check_before_build(path, config, header)

    # Check the tensors against a meta-device build first: a file whose config describes a much larger (or
    # different) model than its tensors is reported before anything is allocated.
    probe = _try_rebuild(path, config, device="meta")
    if probe is not None:
        _check_tensors(path, header, config, _with_dtype(probe, config).state_dict())
    else:
        _check_fused_modules_on_meta(path, header, config)
    check_widths(path, config, header)
    _check_skeleton_size(path, header, config, probe)
    model = _with_dtype(_try_rebuild(path, config), config)
    set_source_architecture(model, config.get("source_architecture"))  # kept if the model is saved again
    from ..nn.dwconv import FusedDWConvBlock, follow_patch_grid

    if any(isinstance(m, FusedDWConvBlock) for m in model.modules()):
        follow_patch_grid(model)  # under dynamic_img_size, the grid of each input (see vitfast.nn.dwconv)
    expected = model.state_dict(keep_vars=True)
    if probe is None:
        _check_tensors(path, header, config, expected)

    from safetensors import safe_open

    tensors: Dict[str, torch.Tensor] = {}
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type; name the file
        raise ValueError(f"{path}: corrupt safetensors file ({type(e).__name__}: {e})") from None
    _checksum.verify_tensors(path, record, tensors)
    if not allow_nonfinite:
        bad = _nonfinite(tensors)
        if bad:
            raise ValueError(
                f"{path}: expected finite weights, got NaN/Inf in {len(bad)} tensors: {listing(bad)} "
                f"(pass allow_nonfinite=True to load anyway)"
            )
    for alias, target in config["aliases"].items():
        tensors[alias] = tensors[target]
    with torch.no_grad():
        for key, t in tensors.items():
            target = expected[key]
            if target.dtype != t.dtype:  # "mixed" files: keep each tensor's stored dtype
                target.data = target.data.to(t.dtype)
    model.load_state_dict(tensors, strict=True)
    model.eval()
    model = model.to(device)
    if prepack:
        from ..ops import prepack as prepack_weights

        prepack_weights(model)
    return model
