"""`vitfast.reference.layer_norm` and its argument check `check_layer_norm_args`: LayerNorm over the last dimension
(affine optional): the fused blocks' pre-norms."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._check import check_float_x, check_like_x, check_shape, is_finite_non_negative


def check_layer_norm_args(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                          eps: float) -> int:
    """Validate `layer_norm` arguments; return C (the normalised last dimension).

    x [..., C];  weight [C], bias [C] (optional, the affine);  eps >= 0 and finite.
    """
    check_float_x(x, "C")
    c = x.shape[-1]
    check_like_x(x, (("weight", weight), ("bias", bias)))
    check_shape("weight", weight, (c,))
    check_shape("bias", bias, (c,))
    if not is_finite_non_negative(eps):
        raise ValueError(f"eps: expected a finite number >= 0, got {eps!r}")
    return c


def layer_norm_unchecked(x, weight=None, bias=None, eps=1e-5):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def layer_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, eps: float = 1e-5
) -> torch.Tensor:
    """LayerNorm over the last dimension (the fused blocks' pre-norms, usually without an affine: it is folded
    into the next linear layer):  y = (x − mean) / √(var + eps) · weight + bias  (= F.layer_norm)."""
    check_layer_norm_args(x, weight, bias, eps)
    return layer_norm_unchecked(x, weight, bias, eps)
