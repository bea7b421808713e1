"""Argument checks of the USDC gate ops (`batch_gate`, `gate_select`), shared by the reference, the fake impl and
the Triton launchers; `csrc/ops/batch_gate.cpp` repeats them with the same wording.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._validate import FLOAT_DTYPES, _fmt_shape, as_integer, check_like_x, check_tensor

GATE_ACTS = ("none", "relu", "gelu")


def check_batch_gate_args(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: Optional[torch.Tensor],
    w2: Optional[torch.Tensor],
    b2: Optional[torch.Tensor],
    layer_norm: bool,
    act: str,
    eps: float,
) -> int:
    """Validate `batch_gate` arguments; return the hidden width H (2 for a one-layer gate network).

    x [B, N, C];  w1 [H, C], b1 [H];  w2 [2, H], b2 [2] (both None for a one-layer network, then H = 2 and
    neither a norm nor an activation: the first layer already gives the two gate logits).
    """
    check_tensor("x", x)
    check_tensor("w1", w1)
    if x.dim() != 3:
        raise ValueError(f"x: expected 3-D [B, N, C], got shape {_fmt_shape(x)}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x: expected dtype float32, float16 or bfloat16, got {x.dtype}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"x: expected at least one sample and one token, got shape {_fmt_shape(x)}")
    channels = x.shape[2]
    if not isinstance(w1, torch.Tensor) or w1.dim() != 2 or w1.shape[1] != channels:
        got = _fmt_shape(w1) if isinstance(w1, torch.Tensor) else type(w1).__name__
        raise ValueError(f"w1: expected shape [H, {channels}] (C = x.shape[-1]), got {got}")
    for name, t in (("b1", b1), ("w2", w2), ("b2", b2)):  # optional: a list here failed on `.dim()` unnamed
        if t is not None:
            check_tensor(name, t)
    hidden = w1.shape[0]
    if hidden == 0:  # an empty hidden layer: the C++ kernel took an empty w2 for "no second layer"
        raise ValueError(f"w1: expected at least one hidden unit, shape [H >= 1, {channels}], got {_fmt_shape(w1)}")
    if act not in GATE_ACTS:
        raise ValueError(f"act: expected one of {GATE_ACTS}, got {act!r}")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0:
        raise ValueError(f"eps: expected a number > 0, got {eps!r}")
    if w2 is None:
        if b2 is not None:
            raise ValueError(f"b2: expected None when w2 is None (one-layer gate network), got {_fmt_shape(b2)}")
        if hidden != 2:
            raise ValueError(f"w1: expected shape [2, {channels}] for a one-layer gate network (w2=None), "
                             f"got {_fmt_shape(w1)}")
        if layer_norm or act != "none":
            raise ValueError(f"layer_norm, act: expected False and 'none' for a one-layer gate network (w2=None), "
                             f"got {layer_norm!r} and {act!r}")
    elif w2.dim() != 2 or tuple(w2.shape) != (2, hidden):
        raise ValueError(f"w2: expected shape [2, {hidden}] (H = w1.shape[0]), got {_fmt_shape(w2)}")
    if b1 is not None and tuple(b1.shape) != (hidden,):
        raise ValueError(f"b1: expected shape [{hidden}], got {_fmt_shape(b1)}")
    if b2 is not None and tuple(b2.shape) != (2,):
        raise ValueError(f"b2: expected shape [2], got {_fmt_shape(b2)}")
    check_like_x(x, (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)))
    return hidden


def check_gate_select_args(gate: torch.Tensor, index: int, taken: torch.Tensor, skipped: torch.Tensor) -> None:
    """gate [G] (a `batch_gate` decision vector), 0 <= index < G; taken and skipped of one shape, dtype, device."""
    if not isinstance(gate, torch.Tensor) or gate.dim() != 1 or gate.shape[0] == 0:
        got = _fmt_shape(gate) if isinstance(gate, torch.Tensor) else type(gate).__name__
        raise ValueError(f"gate: expected a 1-D decision tensor [G], got {got}")
    position = as_integer(index)
    if position is None or not 0 <= position < gate.shape[0]:
        raise ValueError(f"index: expected an int in [0, {gate.shape[0]}), got {index!r}")
    if not isinstance(taken, torch.Tensor) or not isinstance(skipped, torch.Tensor):
        raise TypeError(f"taken, skipped: expected Tensors, got {type(taken).__name__} and {type(skipped).__name__}")
    if taken.shape != skipped.shape:
        raise ValueError(f"skipped: expected shape {_fmt_shape(taken)} (same as taken), got {_fmt_shape(skipped)}")
    if taken.dtype != skipped.dtype:
        raise ValueError(f"skipped: expected dtype {taken.dtype} (same as taken), got {skipped.dtype}")
    for name, t in (("gate", gate), ("skipped", skipped)):
        if t.device != taken.device:
            raise ValueError(f"{name}: expected device {taken.device} (same as taken), got {t.device}")


# ---------------------------------------------------------------------------------------------- gated sub-blocks
def _check_norm_eps(norm_eps) -> None:
    if norm_eps is None:
        return
    if not isinstance(norm_eps, (int, float)) or isinstance(norm_eps, bool) or not norm_eps > 0:
        raise ValueError(f"norm_eps: expected None (no LayerNorm) or a number > 0, got {norm_eps!r}")


def _check_block_input(gate: torch.Tensor, index: int, x: torch.Tensor) -> None:
    check_tensor("x", x)
    if x.dim() != 3:
        raise ValueError(f"x: expected 3-D [B, N, C], got shape {_fmt_shape(x)}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x: expected dtype float32, float16 or bfloat16, got {x.dtype}")
    check_gate_select_args(gate, index, x, x)


def check_gated_mhsa_args(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj) -> int:
    """`gated_mhsa` arguments: gate [G] and index as in `gate_select`; x [B, N, C]; w_qkv [3·H·D, C] (timm's
    [3, H, D] row layout), b_qkv [3·H·D]; w_proj [C, H·D], b_proj [C].  Returns the head dim D."""
    from ._validate import check_linear_args

    _check_block_input(gate, index, x)
    _check_norm_eps(norm_eps)
    width = check_linear_args(x, w_qkv, b_qkv, None)
    heads = as_integer(num_heads)
    if heads is None or heads < 1 or width % (3 * heads):
        raise ValueError(f"num_heads: expected an int >= 1 dividing w_qkv.shape[0] / 3 = {width / 3:g}, "
                         f"got {num_heads!r}")
    c, attn_dim = x.shape[-1], width // 3
    if not isinstance(w_proj, torch.Tensor) or tuple(w_proj.shape) != (c, attn_dim):
        got = _fmt_shape(w_proj) if isinstance(w_proj, torch.Tensor) else type(w_proj).__name__
        raise ValueError(f"w_proj: expected shape [{c}, {attn_dim}] (C, H·D), got {got}")
    if b_proj is not None and tuple(b_proj.shape) != (c,):
        raise ValueError(f"b_proj: expected shape [{c}], got {_fmt_shape(b_proj)}")
    for name, t in (("w_proj", w_proj), ("b_proj", b_proj)):
        if t is not None and (t.dtype != x.dtype or t.device != x.device):
            raise ValueError(f"{name}: expected dtype {x.dtype} on {x.device} (same as x), got {t.dtype} on "
                             f"{t.device}")
    return attn_dim // heads


def check_gated_ffn_args(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual) -> tuple:
    """`gated_ffn` arguments: gate/index as in `gate_select`; x [B, N, C]; the `channel_idle_ffn` weights with
    C_out = C (a skipped sub-block returns x, so the sub-block must keep the width); `residual` a bool.
    Returns (A, L): active (GELU) and linear hidden columns."""
    from ._validate import check_channel_idle_ffn_args

    _check_block_input(gate, index, x)
    _check_norm_eps(norm_eps)
    if not isinstance(residual, bool):
        raise ValueError(f"residual: expected a bool, got {residual!r}")
    active, linear, c_out = check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, x if residual else None)
    if c_out != x.shape[-1]:
        raise ValueError(f"w_out: expected {x.shape[-1]} output features (C = x.shape[-1]: a skipped sub-block "
                         f"returns x), got {c_out}")
    if active + linear == 0:
        raise ValueError(f"w_in: expected at least one row (active or linear), got shape {_fmt_shape(w_in)}")
    return active, linear
