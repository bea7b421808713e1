"""Checks that bound a load by its file, run on the parsed header before anything is built (private to `vitfast.io`).

Why before building: timm builds a skeleton in Python, module by module, so the cost of even a meta-device build
grows with the counts the config declares (a 90 KB file declaring depth=10^5 ran for minutes at 5.5 GB), and some
constructors compute on the values they get (a drop-path `linspace` of length `depth`).  Every count that sizes the
model (depth, Swin's stage depths) is therefore compared with the tensors the file actually holds, every width a
stored tensor determines (embed_dim, in_chans, patch_size, num_classes, reg_tokens) with that tensor's shape, and
every other value against its type and range.  After these checks the meta-device build costs time proportional
to the file's own tensor count, and `vitfast.io.fused` then compares every implied tensor shape with the file
before allocating.  Each refusal is one ValueError naming the file and the field.
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, Iterable, List, Optional

# Any int in a config beyond this is corruption, not a model (widths, counts and sizes are far below it); the
# generic walk refuses it with the field named, before a constructor turns it into an allocation.
MAX_INT = 2**31 - 1
# Ranges for values no stored tensor determines.
MAX_IMG_SIZE = 2**15
MAX_MLP_RATIO = 64.0
MAX_EPS = 1.0  # LayerNorm eps: real models use 1e-6..1e-5; anything above 1 is a corrupt value
MAX_GLOBAL_POOL_LEN = 16

_BLOCK = re.compile(r"blocks\.(\d+)\.")
_STAGE_BLOCK = re.compile(r"layers\.(\d+)\.blocks\.(\d+)\.")
_STAGE = re.compile(r"layers\.(\d+)\.")

_VIT_BOOLS = ("qkv_bias", "qk_norm", "scale_attn_norm", "scale_mlp_norm", "proj_bias", "class_token",
              "no_embed_class", "pre_norm", "final_norm", "pool_include_prefix", "dynamic_img_size",
              "dynamic_img_pad")
_SWIN_BOOLS = ("always_partition", "strict_img_size", "qkv_bias")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


class _Checker:
    """Collects nothing: the first problem raises, naming the file and the dotted field."""

    def __init__(self, path: str, widths: bool) -> None:
        self.path = path
        self.widths = widths  # also compare widths with the stored tensors' shapes

    def fail(self, field: str, expected: str, got: Any) -> None:
        text = repr(got)
        if len(text) > 120:
            text = text[:117] + "..."
        raise ValueError(f"{self.path}: config {field}: expected {expected}, got {text}")

    def int(self, field: str, v: Any, lo: int, hi: int = MAX_INT) -> int:
        if not _is_int(v) or not lo <= v <= hi:
            self.fail(field, f"an int in [{lo}, {hi}]", v)
        return v

    def number(self, field: str, v: Any, lo: float, hi: float, lo_open: bool = False) -> float:
        if not _is_number(v) or v > hi or v < lo or (lo_open and v == lo):
            self.fail(field, f"a finite number in {'(' if lo_open else '['}{lo}, {hi}]", v)
        return float(v)

    def bool(self, field: str, v: Any) -> bool:
        if not isinstance(v, bool):
            self.fail(field, "true or false", v)
        return v

    def pair(self, field: str, v: Any, lo: int, hi: int = MAX_INT) -> List[int]:
        if _is_int(v):
            v = [v, v]
        if not (isinstance(v, list) and len(v) == 2 and all(_is_int(x) and lo <= x <= hi for x in v)):
            self.fail(field, f"an int or [h, w] with values in [{lo}, {hi}]", v)
        return v

    def list_of(self, field: str, v: Any, n: int) -> list:
        if not isinstance(v, list) or len(v) != n:
            self.fail(field, f"a list of {n} entries (one per stage)", v)
        return v


def _field(where: str, key: Any) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{where}.{key}" if where else key
    return f"{where}[{key!r}]"


def _walk_numbers(check: _Checker, value: Any, field: str) -> None:
    """Every number anywhere in the config: ints within MAX_INT, floats finite."""
    stack = [(value, field)]
    while stack:
        v, where = stack.pop()
        if isinstance(v, dict):
            stack.extend((item, _field(where, k)) for k, item in v.items())
        elif isinstance(v, list):
            stack.extend((item, f"{where}[{i}]") for i, item in enumerate(v))
        elif _is_int(v) and abs(v) > MAX_INT:
            check.fail(where, f"an int of magnitude <= {MAX_INT}", v)
        elif isinstance(v, float) and not math.isfinite(v):
            check.fail(where, "a finite number", v)


def _indices(names: Iterable[str], pattern: re.Pattern) -> Dict[tuple, None]:
    found: Dict[tuple, None] = {}
    for name in names:
        m = pattern.match(name)
        if m:
            found[tuple(int(g) for g in m.groups())] = None
    return found


def _shape(header: Dict[str, dict], name: str) -> Optional[List[int]]:
    info = header.get(name)
    return list(info["shape"]) if info is not None else None


def _check_patch_embed(check: _Checker, kwargs: dict, header: Dict[str, dict], embed_dim: int) -> None:
    patch = check.pair("architecture.kwargs.patch_size", kwargs.get("patch_size", 16), 1, MAX_IMG_SIZE)
    in_chans = check.int("architecture.kwargs.in_chans", kwargs.get("in_chans", 3), 1, 4096)
    img = kwargs.get("img_size", 224)
    if img is not None:
        img = check.pair("architecture.kwargs.img_size", img, 1, MAX_IMG_SIZE)
        if img[0] < patch[0] or img[1] < patch[1]:
            check.fail("architecture.kwargs.img_size", f"at least the patch size {patch}", img)
    weight = _shape(header, "patch_embed.proj.weight")
    if weight is None or not check.widths:
        return
    implied = [embed_dim, in_chans, *patch]
    if weight != implied and not (len(weight) == 2 and weight == [embed_dim, in_chans * patch[0] * patch[1]]):
        check.fail("architecture.kwargs (embed_dim, in_chans, patch_size)",
                   f"the stored patch_embed.proj.weight shape {weight}", implied)


def _check_head(check: _Checker, kwargs: dict, header: Dict[str, dict], names: set) -> None:
    num_classes = check.int("architecture.kwargs.num_classes", kwargs.get("num_classes", 1000), 0, 10**7)
    head = _shape(header, "head.weight")
    if check.widths and head is not None and head[0] != num_classes:
        check.fail("architecture.kwargs.num_classes", f"{head[0]} (rows of the stored head.weight)", num_classes)
    if check.widths and num_classes and not any(n.startswith("head.") for n in names):
        check.fail("architecture.kwargs.num_classes", "0 (the file stores no head tensor)", num_classes)
    pool = kwargs.get("global_pool", "token")
    if not isinstance(pool, str) or len(pool) > MAX_GLOBAL_POOL_LEN:
        check.fail("architecture.kwargs.global_pool", "a pooling name such as 'token' or 'avg'", pool)


def _check_vit(check: _Checker, kwargs: dict, header: Dict[str, dict], names: set) -> None:
    blocks = sorted(i for (i,) in _indices(names, _BLOCK))
    depth = check.int("architecture.kwargs.depth", kwargs.get("depth", 12), 0, MAX_INT)
    # Every ViT block holds tensors (its attention or fused replacement at least): more blocks than the file holds
    # tensors for are refused here, before timm builds them (fewer: the tensor comparison lists what differs).
    if depth > len(blocks):
        check.fail("architecture.kwargs.depth", f"{len(blocks)} (the blocks the file stores tensors for)", depth)
    embed_dim = check.int("architecture.kwargs.embed_dim", kwargs.get("embed_dim", 768), 1, 2**20)
    heads = check.int("architecture.kwargs.num_heads", kwargs.get("num_heads", 12), 1, embed_dim)
    if embed_dim % heads:
        check.fail("architecture.kwargs.num_heads", f"a divisor of embed_dim {embed_dim}", heads)
    check.number("architecture.kwargs.mlp_ratio", kwargs.get("mlp_ratio", 4.0), 0.0, MAX_MLP_RATIO, lo_open=True)
    for key in _VIT_BOOLS:
        if key in kwargs:
            check.bool(f"architecture.kwargs.{key}", kwargs[key])
    if kwargs.get("fc_norm") is not None:
        check.bool("architecture.kwargs.fc_norm", kwargs["fc_norm"])
    if kwargs.get("init_values") is not None:
        check.number("architecture.kwargs.init_values", kwargs["init_values"], -1e6, 1e6)
    reg = check.int("architecture.kwargs.reg_tokens", kwargs.get("reg_tokens", 0), 0, 1024)
    stored_reg = _shape(header, "reg_token")
    if check.widths and ((stored_reg is not None and stored_reg[1:2] != [reg])
                         or (stored_reg is None and reg and "reg_token" not in names)):
        check.fail("architecture.kwargs.reg_tokens", f"{stored_reg[1] if stored_reg else 0} (the stored reg_token)", reg)
    if kwargs.get("pos_embed", "learn") not in ("learn", "none"):
        check.fail("architecture.kwargs.pos_embed", "'learn' or 'none'", kwargs.get("pos_embed"))
    _check_patch_embed(check, kwargs, header, embed_dim)
    _check_head(check, kwargs, header, names)


def _check_swin(check: _Checker, kwargs: dict, header: Dict[str, dict], names: set) -> None:
    stages = sorted(s for (s,) in _indices(names, _STAGE))
    depths = kwargs.get("depths", [2, 2, 6, 2])
    if not isinstance(depths, list) or not all(_is_int(d) and d >= 0 for d in depths) or len(depths) > 16:
        check.fail("architecture.kwargs.depths", "a list of at most 16 ints >= 0", depths)
    if len(depths) > len(stages):
        check.fail("architecture.kwargs.depths", f"{len(stages)} stages (the stages the file stores tensors for)",
                   depths)
    blocks = _indices(names, _STAGE_BLOCK)
    for s, d in enumerate(depths):
        stored = sorted(j for (t, j) in blocks if t == s)
        if d > len(stored):
            check.fail(f"architecture.kwargs.depths[{s}]", f"{len(stored)} (the blocks of stage {s} in the file)", d)
    n = len(depths)
    embed_dim = check.int("architecture.kwargs.embed_dim", kwargs.get("embed_dim", 96), 1, 2**20)
    heads = kwargs.get("num_heads", [3, 6, 12, 24])
    heads = [heads] * n if _is_int(heads) else check.list_of("architecture.kwargs.num_heads", heads, n)
    head_dims = kwargs.get("head_dim")
    head_dims = [head_dims] * n if head_dims is None or _is_int(head_dims) else check.list_of(
        "architecture.kwargs.head_dim", head_dims, n)
    for s in range(n):
        dim = embed_dim * 2**s
        h = check.int(f"architecture.kwargs.num_heads[{s}]", heads[s], 1, dim)
        if head_dims[s] is None:
            if dim % h:
                check.fail(f"architecture.kwargs.num_heads[{s}]", f"a divisor of the stage width {dim}", h)
        else:
            check.int(f"architecture.kwargs.head_dim[{s}]", head_dims[s], 1, 2**16)
    windows = kwargs.get("window_size", 7)
    if isinstance(windows, list) and windows and isinstance(windows[0], list):
        windows = check.list_of("architecture.kwargs.window_size", windows, n)
    else:
        windows = [windows] * n
    for s in range(n):
        check.pair(f"architecture.kwargs.window_size[{s}]", windows[s], 1, MAX_IMG_SIZE)
    ratios = kwargs.get("mlp_ratio", 4.0)
    ratios = check.list_of("architecture.kwargs.mlp_ratio", ratios, n) if isinstance(ratios, list) else [ratios] * n
    for s in range(n):
        check.number(f"architecture.kwargs.mlp_ratio[{s}]", ratios[s], 0.0, MAX_MLP_RATIO, lo_open=True)
    for key in _SWIN_BOOLS:
        if key in kwargs:
            check.bool(f"architecture.kwargs.{key}", kwargs[key])
    _check_patch_embed(check, kwargs, header, embed_dim)
    _check_head(check, kwargs, header, names)


def _check_norm(check: _Checker, spec: Any, field: str) -> None:
    if isinstance(spec, dict) and "eps" in spec:
        check.number(f"{field}.eps", spec["eps"], 0.0, MAX_EPS)


def _check_modules(check: _Checker, architecture: dict, modules: Dict[str, dict]) -> None:
    """Values of fused-module configs that no stored tensor determines (their typed readers check types and
    lower bounds; the shapes they imply are compared with the file after the meta-device build)."""
    kwargs = architecture.get("kwargs", {})
    grid = None
    img, patch = kwargs.get("img_size"), kwargs.get("patch_size")
    if img is not None and patch is not None and not kwargs.get("dynamic_img_size", False):
        img, patch = ([v, v] if _is_int(v) else v for v in (img, patch))
        grid = [img[0] // patch[0], img[1] // patch[1]]
    for path, cfg in modules.items():
        stack = [(cfg, f"modules[{path!r}]")]
        while stack:
            c, where = stack.pop()
            for key, value in c.items():
                if key.endswith("eps") and value is not None:
                    check.number(f"{where}[{key!r}]", value, 0.0, MAX_EPS)
                elif isinstance(value, dict):
                    stack.append((value, f"{where}[{key!r}]"))
            if c.get("kind") == "dwconv_block" and grid is not None and c.get("grid_size") != grid:
                check.fail(f"{where}['grid_size']", f"{grid} (img_size / patch_size of the architecture)",
                           c.get("grid_size"))


def _check(check: _Checker, config: dict, header: Dict[str, dict]) -> None:
    _walk_numbers(check, config, "")
    architecture = config["architecture"]
    kwargs = architecture.get("kwargs")
    if not isinstance(kwargs, dict):
        check.fail("architecture.kwargs", "an object", kwargs)
    names = set(header) | set(config.get("aliases", {}))
    if architecture.get("class") == "SwinTransformer":
        _check_swin(check, kwargs, header, names)
    else:
        _check_vit(check, kwargs, header, names)
    for key in ("norm_layer", "embed_norm_layer"):
        _check_norm(check, architecture.get(key), f"architecture.{key}")
    _check_modules(check, architecture, config["modules"])


def check_before_build(path: str, config: dict, header: Dict[str, dict]) -> None:
    """Refuse, naming the file and the field, a config with a value out of type or range, or declaring more blocks
    than the file stores tensors for: after this, a meta-device build costs time proportional to the file."""
    _check(_Checker(path, widths=False), config, header)


def check_widths(path: str, config: dict, header: Dict[str, dict]) -> None:
    """Also compare embed_dim, in_chans, patch_size, num_classes and reg_tokens with the stored tensors' shapes.

    Run after the meta-device tensor comparison (which lists every mismatch at once, and says when a *tensor* is
    the odd one out) and before the real build, which allocates what these values size even where the meta build
    could not run."""
    _check(_Checker(path, widths=True), config, header)
