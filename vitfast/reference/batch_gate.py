"""`vitfast.reference.batch_gate` / `gate_select` and their argument checks: USDC batch-level gate: pool the tokens,
average over the batch, run the folded gate network, threshold → one [MHSA, FFN] decision per batch; `gate_select`
applies it on the device."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._check import (
    as_integer,
    check_bool,
    check_like_x,
    check_tensor,
    check_tokens,
    describe,
    fmt_shape,
    is_positive_number,
)


def check_batch_gate_args(x, w1, b1, w2, b2, layer_norm, act, eps) -> int:
    """Validate `batch_gate` arguments; return the hidden width H (2 for a one-layer gate network).

    x [B, N, C];  w1 [H, C], b1 [H];  w2 [2, H], b2 [2] (both None for a one-layer network, then H = 2 and
    neither a norm nor an activation: the first layer already gives the two gate logits).
    """
    check_tensor("x", x)
    check_tensor("w1", w1)
    check_tokens(x)
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"x: expected at least one sample and one token, got shape {fmt_shape(x)}")
    channels = x.shape[2]
    if w1.dim() != 2 or w1.shape[1] != channels:
        raise ValueError(f"w1: expected shape [H, {channels}] (C = x.shape[-1]), got {describe(w1)}")
    for name, t in (("b1", b1), ("w2", w2), ("b2", b2)):  # optional: a list here failed on `.dim()` unnamed
        if t is not None:
            check_tensor(name, t)
    hidden = w1.shape[0]
    if hidden == 0:  # an empty hidden layer: the C++ kernel took an empty w2 for "no second layer"
        raise ValueError(f"w1: expected at least one hidden unit, shape [H >= 1, {channels}], got {fmt_shape(w1)}")
    check_bool("layer_norm", layer_norm)
    if act not in GATE_ACTS:
        raise ValueError(f"act: expected one of {GATE_ACTS}, got {act!r}")
    if not is_positive_number(eps):
        raise ValueError(f"eps: expected a number > 0, got {eps!r}")
    if w2 is None:
        if b2 is not None:
            raise ValueError(f"b2: expected None when w2 is None (one-layer gate network), got {fmt_shape(b2)}")
        if hidden != 2:
            raise ValueError(f"w1: expected shape [2, {channels}] for a one-layer gate network (w2=None), "
                             f"got {fmt_shape(w1)}")
        if layer_norm or act != "none":
            raise ValueError(f"layer_norm, act: expected False and 'none' for a one-layer gate network (w2=None), "
                             f"got {layer_norm!r} and {act!r}")
    elif w2.dim() != 2 or tuple(w2.shape) != (2, hidden):
        raise ValueError(f"w2: expected shape [2, {hidden}] (H = w1.shape[0]), got {fmt_shape(w2)}")
    if b1 is not None and tuple(b1.shape) != (hidden,):
        raise ValueError(f"b1: expected shape [{hidden}], got {fmt_shape(b1)}")
    if b2 is not None and tuple(b2.shape) != (2,):
        raise ValueError(f"b2: expected shape [2], got {fmt_shape(b2)}")
    check_like_x(x, (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)))
    return hidden


def check_gate_select_args(gate, index, taken, skipped) -> None:
    """gate [G] (a `batch_gate` decision vector), 0 <= index < G; taken and skipped of one shape, dtype, device."""
    if not isinstance(gate, torch.Tensor) or gate.dim() != 1 or gate.shape[0] == 0:
        raise ValueError(f"gate: expected a 1-D decision tensor [G], got {describe(gate)}")
    position = as_integer(index)
    if position is None or not 0 <= position < gate.shape[0]:
        raise ValueError(f"index: expected an int in [0, {gate.shape[0]}), got {index!r}")
    if not isinstance(taken, torch.Tensor) or not isinstance(skipped, torch.Tensor):
        raise TypeError(f"taken, skipped: expected Tensors, got {type(taken).__name__} and {type(skipped).__name__}")
    if taken.shape != skipped.shape:
        raise ValueError(f"skipped: expected shape {fmt_shape(taken)} (same as taken), got {fmt_shape(skipped)}")
    if taken.dtype != skipped.dtype:
        raise ValueError(f"skipped: expected dtype {taken.dtype} (same as taken), got {skipped.dtype}")
    for name, t in (("gate", gate), ("skipped", skipped)):
        if t.device != taken.device:
            raise ValueError(f"{name}: expected device {taken.device} (same as taken), got {t.device}")


# ---------------------------------------------------------------------------------------------- USDC gates
def batch_gate_logits(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: Optional[torch.Tensor],
    w2: Optional[torch.Tensor] = None,
    b2: Optional[torch.Tensor] = None,
    layer_norm: bool = False,
    act: str = "none",
    eps: float = 1e-5,
) -> torch.Tensor:
    """The two gate logits d = (execute − skip) of a batch, in float32 ([2]); `batch_gate` thresholds them."""
    check_batch_gate_args(x, w1, b1, w2, b2, layer_norm, act, eps)
    # Token mean-pool then batch mean (USDC batch-level gate): every sample has N tokens, so this is the mean of
    # all B·N token vectors.  float32 whatever the input dtype: the result is thresholded, keep it stable.
    feature = x.float().mean(dim=(0, 1))
    h = F.linear(feature, w1.float(), None if b1 is None else b1.float())
    if layer_norm:
        h = F.layer_norm(h, (h.shape[-1],), eps=float(eps))
    if act == "relu":
        h = F.relu(h)
    elif act == "gelu":
        h = F.gelu(h)
    if w2 is not None:
        h = F.linear(h, w2.float(), None if b2 is None else b2.float())
    return h


def batch_gate(x, w1, b1, w2=None, b2=None, layer_norm=False, act="none", eps=1e-5) -> torch.Tensor:
    """USDC batch-level gate decision (USDC eq. 5 at inference): one decision per batch for [MHSA, FFN].

        f = mean over the B·N tokens of x [B, N, C]        (token mean-pool, then batch mean)
        h = f · w1ᵀ + b1                                    [H]
        h = act(LayerNorm(h))                               (non-affine LN if layer_norm; act ∈ none/relu/gelu)
        d = h · w2ᵀ + b2                                    [2]  (skipped when w2 is None: then H = 2, d = h)
        out = (d > 0) as x.dtype                            1 = execute the sub-block, 0 = skip it

    The gate network is given in its folded form (`vitfast.nn.gated.FusedBatchGate`): an eval BatchNorm folded into
    the layer before it, a LayerNorm's affine into the layer after it, the two softmax logits (execute, skip) of each
    gate subtracted into one row, so that argmax of a hard Gumbel-softmax without noise is `d > 0`.
    """
    return (batch_gate_logits(x, w1, b1, w2, b2, layer_norm, act, eps) > 0).to(x.dtype)


def gate_select(gate: torch.Tensor, index: int, taken: torch.Tensor, skipped: torch.Tensor) -> torch.Tensor:
    """`taken` where gate[index] != 0 else `skipped` — read on the device, never synchronised to the host."""
    check_gate_select_args(gate, index, taken, skipped)
    return torch.where(gate[index] != 0, taken, skipped)


GATE_ACTS = ("none", "relu", "gelu")
