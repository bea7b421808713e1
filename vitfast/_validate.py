"""Argument checks shared by the reference, the fake (meta) impl and the Triton launcher.

The C++ binding (`csrc/ops/*.cpp`) repeats the same checks with the same wording, because it is reached
through the dispatcher without passing through Python.  Every message names the argument, what was expected
and what was given.
"""
from __future__ import annotations

import math
import numbers
import operator
from typing import Optional

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _fmt_shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"




def check_tensor(name: str, t) -> None:
    """A required Tensor argument (the C++ ops say the same: csrc/ops/op_utils.h check_required)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a Tensor, got {'None' if t is None else type(t).__name__}")


def check_float_x(x: torch.Tensor, last_dim: str) -> None:
    """x is a float32/float16/bfloat16 tensor with at least one dimension (`last_dim` names it in the message)."""
    check_tensor("x", x)
    if x.dim() < 1:
        raise ValueError(f"x: expected at least 1 dimension [..., {last_dim}], got a 0-d tensor")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x: expected dtype float32, float16 or bfloat16, got {x.dtype}")


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


def check_channel_idle_ffn_args(
    x: torch.Tensor,
    w_in: torch.Tensor,
    b_in: Optional[torch.Tensor],
    w_out: torch.Tensor,
    b_out: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
) -> tuple[int, int, int]:
    """Validate `channel_idle_ffn` arguments; return (active A, linear L, C_out).

    Layout (nn.Linear convention, weights are [out_features, in_features]):
      x [..., C_in];  w_in [A + L, C_in] with the A active rows first;  b_in [A + L];
      w_out [C_out, A];  b_out [C_out];  residual [..., C_out] like x;  L is 0 or C_out.
    """
    check_float_x(x, "C_in")
    check_tensor("w_in", w_in)
    check_tensor("w_out", w_out)
    if w_in.dim() != 2:
        raise ValueError(f"w_in: expected 2-D [A + L, C_in], got shape {_fmt_shape(w_in)}")
    if w_out.dim() != 2:
        raise ValueError(f"w_out: expected 2-D [C_out, A], got shape {_fmt_shape(w_out)}")
    c_in = x.shape[-1]
    if w_in.shape[1] != c_in:
        raise ValueError(
            f"w_in: expected shape [A + L, {c_in}] (C_in = x.shape[-1] = {c_in}), got {_fmt_shape(w_in)}"
        )
    c_out, active = w_out.shape
    if active > w_in.shape[0]:
        raise ValueError(
            f"w_out: expected at most w_in.shape[0] = {w_in.shape[0]} active columns, got shape {_fmt_shape(w_out)}"
        )
    linear = w_in.shape[0] - active
    if linear not in (0, c_out):
        raise ValueError(
            f"w_in: expected {active} (no linear path) or {active + c_out} (A + C_out) rows "
            f"for w_out of shape {_fmt_shape(w_out)}, got {w_in.shape[0]}"
        )
    if active == 0 and linear == 0 and b_out is None:
        # Degenerate but well-defined: the output is zero (plus residual).  Allowed.
        pass
    check_like_x(x, (("w_in", w_in), ("b_in", b_in), ("w_out", w_out), ("b_out", b_out), ("residual", residual)))
    if b_in is not None and tuple(b_in.shape) != (w_in.shape[0],):
        raise ValueError(f"b_in: expected shape [{w_in.shape[0]}], got {_fmt_shape(b_in)}")
    if b_out is not None and tuple(b_out.shape) != (c_out,):
        raise ValueError(f"b_out: expected shape [{c_out}], got {_fmt_shape(b_out)}")
    if residual is not None and tuple(residual.shape) != tuple(x.shape[:-1]) + (c_out,):
        expected = "[" + ", ".join(str(s) for s in tuple(x.shape[:-1]) + (c_out,)) + "]"
        raise ValueError(f"residual: expected shape {expected}, got {_fmt_shape(residual)}")
    return active, linear, c_out


def check_linear_args(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    residual: Optional[torch.Tensor],
) -> int:
    """Validate `linear` arguments; return N (out_features).

    x [..., K];  weight [N, K] (nn.Linear layout);  bias [N];  residual [..., N] like x.
    """
    check_float_x(x, "K")
    check_tensor("weight", weight)
    if weight.dim() != 2:
        raise ValueError(f"weight: expected 2-D [N, K], got shape {_fmt_shape(weight)}")
    k, n = x.shape[-1], weight.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f"weight: expected shape [N, {k}] (K = x.shape[-1] = {k}), got {_fmt_shape(weight)}")
    check_like_x(x, (("weight", weight), ("bias", bias), ("residual", residual)))
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias: expected shape [{n}], got {_fmt_shape(bias)}")
    if residual is not None and tuple(residual.shape) != tuple(x.shape[:-1]) + (n,):
        expected = "[" + ", ".join(str(s) for s in tuple(x.shape[:-1]) + (n,)) + "]"
        raise ValueError(f"residual: expected shape {expected}, got {_fmt_shape(residual)}")
    return n

def check_layer_norm_args(
    x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float
) -> int:
    """Validate `layer_norm` arguments; return C (the normalised last dimension).

    x [..., C];  weight [C], bias [C] (optional, the affine);  eps >= 0 and finite.
    """
    check_float_x(x, "C")
    c = x.shape[-1]
    check_like_x(x, (("weight", weight), ("bias", bias)))
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (c,):
            raise ValueError(f"{name}: expected shape [{c}], got {_fmt_shape(t)}")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps: expected a finite number >= 0, got {eps}")
    return c


def as_integer(value) -> Optional[int]:
    """`value` as an int when it is an integer, Python's or numpy's (the C++ ops' int64 arguments take both, so the
    reference must too), else None: a bool, a float or anything else."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_attention_args(qkv: torch.Tensor, num_heads: int, scale: Optional[float]) -> tuple[int, int]:
    """Validate `attention` arguments; return (H, D).

    qkv [B, N, 3·H·D]: timm's qkv Linear output (q | k | v along the last dimension, H heads of D in each).
    """
    check_tensor("qkv", qkv)
    if qkv.dim() != 3:
        raise ValueError(f"qkv: expected 3-D [B, N, 3·H·D], got shape {_fmt_shape(qkv)}")
    if qkv.dtype not in FLOAT_DTYPES:
        raise ValueError(f"qkv: expected dtype float32, float16 or bfloat16, got {qkv.dtype}")
    heads = as_integer(num_heads)
    if heads is None or heads < 1:
        raise ValueError(f"num_heads: expected an int >= 1, got {num_heads!r}")
    num_heads = heads
    width = qkv.shape[-1]
    if width <= 0 or width % (3 * num_heads):
        raise ValueError(
            f"qkv: expected last dimension a positive multiple of 3·num_heads = {3 * num_heads}, "
            f"got shape {_fmt_shape(qkv)}"
        )
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite number, got {scale}")
    return num_heads, width // (3 * num_heads)


def check_vit_block_args(
    x: torch.Tensor,
    norm1_eps: float,
    w_qkv: torch.Tensor,
    b_qkv: Optional[torch.Tensor],
    num_heads: int,
    w_proj: torch.Tensor,
    b_proj: Optional[torch.Tensor],
    ffn_norm_eps: Optional[float],
    w_in: torch.Tensor,
    b_in: Optional[torch.Tensor],
    w_out: torch.Tensor,
    b_out: Optional[torch.Tensor],
    ffn_residual: bool,
    *,
    any_float: bool = False,
) -> tuple[int, int]:
    """Validate `vit_block` arguments (the fused ViT block as one op); return (H, D).

    x [B, N, C] float32 (float16 / bfloat16 too with `any_float`: the CUDA eager block, ops.vit_block_cuda_eager);
    w_qkv [3·H·D, C], b_qkv [3·H·D];  w_proj [C, H·D], b_proj [C];  the FFN's tensors as for `channel_idle_ffn`
    with C_in = C_out = C.  norm1_eps (and ffn_norm_eps unless None): finite, >= 0.
    """
    check_tensor("x", x)
    if x.dim() != 3:
        raise ValueError(f"x: expected 3-D [B, N, C], got shape {_fmt_shape(x)}")
    if any_float:
        if x.dtype not in FLOAT_DTYPES:
            raise ValueError(f"x: expected dtype float32, float16 or bfloat16, got {x.dtype}")
    elif x.dtype != torch.float32:
        raise ValueError(f"x: expected dtype torch.float32 (the block op runs in fp32), got {x.dtype}")
    c = x.shape[-1]
    for name, eps in (("norm1_eps", norm1_eps), ("ffn_norm_eps", ffn_norm_eps)):
        if eps is None and name == "ffn_norm_eps":
            continue
        # numbers.Real, not (int, float): the C++ schema's float takes a numpy float32 too (it is not a float subclass);
        # a numpy bool is no numbers.Real, a Python bool is one (hence its own test)
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"{name}: expected a finite number >= 0, got {eps!r}")
    heads = as_integer(num_heads)
    if heads is None or heads < 1:
        raise ValueError(f"num_heads: expected an int >= 1, got {num_heads!r}")
    check_tensor("w_qkv", w_qkv)
    check_tensor("w_proj", w_proj)
    if w_qkv.dim() != 2 or w_qkv.shape[1] != c:
        raise ValueError(f"w_qkv: expected shape [3·H·D, {c}] (C = x.shape[-1] = {c}), got {_fmt_shape(w_qkv)}")
    width = w_qkv.shape[0]
    if width <= 0 or width % 3 or width // 3 % heads:
        raise ValueError(
            f"w_qkv: expected a first dimension a positive multiple of 3·num_heads = {3 * heads}, "
            f"got shape {_fmt_shape(w_qkv)}"
        )
    attn_dim = width // 3
    if tuple(w_proj.shape) != (c, attn_dim):
        raise ValueError(f"w_proj: expected shape [{c}, {attn_dim}] ([C, H·D]), got {_fmt_shape(w_proj)}")
    check_like_x(x, (("w_qkv", w_qkv), ("b_qkv", b_qkv), ("w_proj", w_proj), ("b_proj", b_proj)))
    if b_qkv is not None and tuple(b_qkv.shape) != (width,):
        raise ValueError(f"b_qkv: expected shape [{width}], got {_fmt_shape(b_qkv)}")
    if b_proj is not None and tuple(b_proj.shape) != (c,):
        raise ValueError(f"b_proj: expected shape [{c}], got {_fmt_shape(b_proj)}")
    if not isinstance(ffn_residual, (bool, int)):  # (the op schema's bool takes an int as its truth value)
        raise ValueError(f"ffn_residual: expected a bool, got {ffn_residual!r}")
    _, _, c_out = check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, None)
    if c_out != c:
        raise ValueError(f"w_out: expected shape [{c}, A] (C = x.shape[-1] = {c}: the block keeps its width), "
                         f"got {_fmt_shape(w_out)}")
    return heads, attn_dim // heads




def check_xwx_attention_args(x, w_q, w_k, key_bias, w_v, w_o, b_o, residual) -> tuple[int, int, int, int]:
    """Validate `xwx_attention` arguments; return (H, R, D, C_out).

    x [B, N, C];  w_q [H, C, R] and w_k [H, C, R] (factored scores W_h = w_q[h] w_k[h]ᵀ), or w_q [H, C, C] with
    w_k None (full W_h);  key_bias [H, C];  w_v [H, C, D];  w_o [H, D, C_out];  b_o [C_out];  residual
    [B, N, C_out].  Every tensor has x's dtype and device.
    """

    def shape(t):
        return _fmt_shape(t) if isinstance(t, torch.Tensor) else type(t).__name__

    for name, t in (("x", x), ("w_q", w_q), ("w_v", w_v), ("w_o", w_o)):
        check_tensor(name, t)

    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"x: expected a [B, N, C] tensor, got {shape(x)}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x: expected dtype float32, float16 or bfloat16, got {x.dtype}")
    channels = x.shape[-1]
    if not isinstance(w_q, torch.Tensor) or w_q.dim() != 3 or w_q.shape[1] != channels:
        raise ValueError(
            f"w_q: expected [H, {channels}, R] (or [H, {channels}, {channels}] with w_k=None), got {shape(w_q)}"
        )
    heads, rank = w_q.shape[0], w_q.shape[2]
    if heads < 1 or rank < 1:
        raise ValueError(f"w_q: expected at least one head and rank >= 1, got {shape(w_q)}")
    if w_k is None:
        if rank != channels:
            raise ValueError(
                f"w_q: expected the full score matrices [H, {channels}, {channels}] when w_k is None, got {shape(w_q)}"
            )
    elif not isinstance(w_k, torch.Tensor) or tuple(w_k.shape) != tuple(w_q.shape):
        raise ValueError(f"w_k: expected the same shape as w_q {shape(w_q)}, got {shape(w_k)}")
    if key_bias is not None and (not isinstance(key_bias, torch.Tensor) or tuple(key_bias.shape) != (heads, channels)):
        raise ValueError(f"key_bias: expected [{heads}, {channels}] or None, got {shape(key_bias)}")
    if not isinstance(w_v, torch.Tensor) or w_v.dim() != 3 or tuple(w_v.shape[:2]) != (heads, channels):
        raise ValueError(f"w_v: expected [{heads}, {channels}, D], got {shape(w_v)}")
    value_dim = w_v.shape[2]
    if not isinstance(w_o, torch.Tensor) or w_o.dim() != 3 or tuple(w_o.shape[:2]) != (heads, value_dim):
        raise ValueError(f"w_o: expected [{heads}, {value_dim}, C_out], got {shape(w_o)}")
    out_channels = w_o.shape[2]
    if b_o is not None and (not isinstance(b_o, torch.Tensor) or tuple(b_o.shape) != (out_channels,)):
        raise ValueError(f"b_o: expected [{out_channels}] or None, got {shape(b_o)}")
    if residual is not None and (
        not isinstance(residual, torch.Tensor) or tuple(residual.shape) != (*x.shape[:2], out_channels)
    ):
        expected = "[" + ", ".join(str(s) for s in (*x.shape[:2], out_channels)) + "]"
        raise ValueError(f"residual: expected {expected} or None, got {shape(residual)}")
    for name, t in (("w_q", w_q), ("w_k", w_k), ("key_bias", key_bias), ("w_v", w_v), ("w_o", w_o), ("b_o", b_o),
                    ("residual", residual)):
        if t is not None and (t.dtype != x.dtype or t.device != x.device):
            raise ValueError(f"{name}: expected dtype {x.dtype} on {x.device} (like x), got {t.dtype} on {t.device}")
    return heads, rank, value_dim, out_channels
