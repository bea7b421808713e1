"""Tensor checks shared by the op argument checks (each op's own lives in its module, `check_<op>_args`).

The checks run in the reference, the fake (meta) impl and the Triton launchers; the C++ bindings
(`csrc/ops/*.cpp`, reached through the dispatcher without Python) repeat them with the same wording.  Every message
names the argument, what was expected and what was given.
"""
from __future__ import annotations

import math
import numbers
import operator
from typing import Optional

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def fmt_shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def describe(t) -> str:
    """A tensor's shape, or the type name of what was given instead (for "expected ..., got ..." messages)."""
    return fmt_shape(t) if isinstance(t, torch.Tensor) else type(t).__name__


def check_tensor(name: str, t) -> None:
    """A required Tensor argument (the C++ ops say the same: csrc/ops/op_utils.h check_required)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {'None' if t is None else type(t).__name__}")


def check_float_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: expected dtype float32, float16 or bfloat16, got {t.dtype}")


def check_float_x(x: torch.Tensor, last_dim: str) -> None:
    """x is a float32/float16/bfloat16 tensor with at least one dimension (`last_dim` names it in the message)."""
    check_tensor("x", x)
    if x.dim() < 1:
        raise ValueError(f"x: expected at least 1 dimension [..., {last_dim}], got a 0-d tensor")
    check_float_dtype("x", x)


def check_tokens(x: torch.Tensor) -> None:
    """x is a float32/float16/bfloat16 token tensor [B, N, C]."""
    check_tensor("x", x)
    if x.dim() != 3:
        raise ValueError(f"x: expected 3-D [B, N, C], got shape {fmt_shape(x)}")
    check_float_dtype("x", x)


def check_like_x(x: torch.Tensor, named: tuple) -> None:
    """Every given companion of x in `named` ((name, tensor or None) pairs) has x's dtype and device."""
    for name, t in named:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):  # a list or a float for an optional tensor: AttributeError before
            raise ValueError(f"{name}: expected a Tensor or None, got {type(t).__name__}")
        if t.dtype != x.dtype:
            raise ValueError(f"{name}: expected dtype {x.dtype} (same as x), got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (same as x), got {t.device}")


def check_shape(name: str, t: Optional[torch.Tensor], shape: tuple) -> None:
    """An optional tensor, when given, has exactly `shape`."""
    if t is not None and tuple(t.shape) != tuple(shape):
        expected = "[" + ", ".join(str(s) for s in shape) + "]"
        raise ValueError(f"{name}: expected shape {expected}, got {fmt_shape(t)}")


def as_integer(value) -> Optional[int]:
    """`value` as an int when it is an integer, Python's or numpy's (the C++ ops' int64 arguments take both, so the
    reference must too), else None: a bool, a float, a tensor (the dispatcher would read a one-element tensor with a
    host synchronisation, which the ops never make) or anything else."""
    if isinstance(value, (bool, torch.Tensor)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_num_heads(num_heads) -> int:
    heads = as_integer(num_heads)
    if heads is None or heads < 1:
        raise ValueError(f"num_heads: expected an int >= 1, got {num_heads!r}")
    return heads


def check_token_grid(name: str, t: torch.Tensor, grid_h, grid_w) -> tuple[int, int, int]:
    """The token grid of `name` [B, N, ·] (prefix tokens first, then grid_h × grid_w, row-major): both sides ints
    >= 1 and N >= their product; returns (grid_h, grid_w, prefix tokens).  The C++ ops say the same
    (csrc/ops/op_utils.h check_token_grid)."""
    grid = []
    for arg, value in (("grid_h", grid_h), ("grid_w", grid_w)):
        n = as_integer(value)
        if n is None or n < 1:
            raise ValueError(f"{arg}: expected an int >= 1, got {value!r}")
        grid.append(n)
    grid_h, grid_w = grid
    prefix = t.shape[1] - grid_h * grid_w
    if prefix < 0:
        raise ValueError(f"{name}: expected N >= grid_h·grid_w = {grid_h}·{grid_w} = {grid_h * grid_w} tokens (prefix "
                         f"tokens, then the grid), got shape {fmt_shape(t)}")
    return grid_h, grid_w, prefix


def as_real(value) -> float | None:
    """`value` as a float when it is a real number, Python's or numpy's (the C++ ops' float arguments take both, so
    the reference must too), else None: a bool, a tensor (as for `as_integer`), None, anything else, or an int beyond
    float range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def is_positive_number(value) -> bool:
    """A real number > 0 (`as_real`: a bool is no number here)."""
    real = as_real(value)
    return real is not None and real > 0


def is_finite_number(value) -> bool:
    """A finite real number (`as_real`)."""
    real = as_real(value)
    return real is not None and math.isfinite(real)


def is_finite_non_negative(value) -> bool:
    """A finite real number >= 0 (`as_real`): a LayerNorm eps."""
    return is_finite_number(value) and as_real(value) >= 0


def check_bool(name: str, value) -> None:
    """A bool argument is a bool.  The op schema's `bool` takes anything with a truth value (None as False, 2 or
    0.5 as True), which says nothing of what the caller meant; `vitfast.ops.<op>` refuses those as the reference
    does (vitfast/ops/_spec.py)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected a bool, got {value!r}")
