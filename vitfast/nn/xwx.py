"""Fused non-deep ViT block: what `NonDeepBlock.to_fused()` returns (non-deep-vit-progressive-reparam eq. 6-9).

    FusedXWXBlock(x) = mlp(x + xwx_attention(LN(x), w_q, w_k, key_bias, w_v, w_o, b_o))      LN non-affine

`mlp` is a `FusedChannelIdleFFN` (LayerNorm variant with explicit residual, or the BatchNorm variant with norms
and shortcut folded).  The attention's tensors are exactly the arguments of `vitfast.reference.xwx_attention`
(see its docstring); the block calls `vitfast.ops.xwx_attention` with them (C++ kernel on CPU, Triton on CUDA).

Score form (stored in the config as "score_form"): "factored" — w_q, w_k [H, C, R] with W_h = w_q[h] w_k[h]ᵀ;
"full" — w_q = W_h [H, C, C], no w_k.  The value width D is d_h (values joined in training) or n·d_h (branch
value/output factors side by side, the exact collapse of unjoined values).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn

from .. import ops
from ._base import ConfigReader, apply_norm
from ._fold import FoldedFFN
from .ffn import FusedChannelIdleFFN
from .registry import register_fused

__all__ = ["FoldedXWXAttention", "FusedXWXAttention", "FusedXWXBlock", "ProjectedXWXAttention", "SCORE_FORMS"]

SCORE_FORMS = ("factored", "full")


@dataclass
class FoldedXWXAttention:
    """float64 arguments of `reference.xwx_attention` (w_k None for the full form, key_bias/b_o None if zero-free)."""

    w_q: torch.Tensor
    w_k: Optional[torch.Tensor]
    key_bias: Optional[torch.Tensor]
    w_v: torch.Tensor
    w_o: torch.Tensor
    b_o: Optional[torch.Tensor]


class FusedXWXAttention(nn.Module):
    """Collapsed non-deep attention: forward(y, residual=None) = ops.xwx_attention(y, ...) (module doc).

    Not registered on its own: it is part of `FusedXWXBlock`, whose config carries its shape.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        score_form: str,
        score_rank: int,
        value_dim: int,
        *,
        key_bias: bool = True,
        out_bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if score_form not in SCORE_FORMS:
            raise ValueError(f"score_form: expected one of {SCORE_FORMS}, got {score_form!r}")
        if score_form == "full" and score_rank != dim:
            raise ValueError(f"score_rank: expected {dim} (= dim) for score_form='full', got {score_rank}")
        for arg, value in (("dim", dim), ("num_heads", num_heads), ("score_rank", score_rank), ("value_dim", value_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg}: expected a positive int, got {value!r}")
        dd = {"device": device, "dtype": dtype}
        self.dim = dim
        self.num_heads = num_heads
        self.score_form = score_form
        self.score_rank = score_rank
        self.value_dim = value_dim
        self.w_q = nn.Parameter(torch.zeros(num_heads, dim, score_rank, **dd))
        if score_form == "factored":
            self.w_k = nn.Parameter(torch.zeros(num_heads, dim, score_rank, **dd))
        else:
            self.register_parameter("w_k", None)
        if key_bias:
            self.key_bias = nn.Parameter(torch.zeros(num_heads, dim, **dd))
        else:
            self.register_parameter("key_bias", None)
        self.w_v = nn.Parameter(torch.zeros(num_heads, dim, value_dim, **dd))
        self.w_o = nn.Parameter(torch.zeros(num_heads, value_dim, dim, **dd))
        if out_bias:
            self.b_o = nn.Parameter(torch.zeros(dim, **dd))
        else:
            self.register_parameter("b_o", None)

    def forward(self, y: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        # The op: C++ on CPU, Triton on CUDA, the reference under VITFAST_BACKEND=reference.
        return ops.xwx_attention(y, self.w_q, self.w_k, self.key_bias, self.w_v, self.w_o, self.b_o, residual)

    @property
    def has_key_bias(self) -> bool:
        return self.key_bias is not None

    @property
    def has_out_bias(self) -> bool:
        return self.b_o is not None

    def vitfast_prepack(self) -> bool:
        """Pack the weights for the CPU kernel now (see `vitfast.ops.prepack`): one call on a one-token input, the
        same weight tensors the real forward passes, so the same cache entries; False when not on CPU."""
        if self.w_q.device.type != "cpu":
            return False
        self(self.w_q.new_zeros(1, 1, self.dim))
        return True

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, score_form={self.score_form!r}, "
                f"score_rank={self.score_rank}, value_dim={self.value_dim}")


def _xwx_projection(attn: FusedXWXAttention) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(weight [H·P, C], bias [H·P] or None) of the one projection `xwx_heads` reads, in float64: per head the rows
    of [x w_q[h] | 1], then [x w_k[h] | x key_bias[h]] (factored) or [x key_bias[h]] (full, if any), then
    x w_v[h] — the columns the C++ kernel's own projection packs (kernels/xwx_attention.cpp xwx_pack).  The ones
    column is a zero row with bias 1 (it carries the key bias through the score product); no key bias, no bias."""
    w_q, w_v = attn.w_q.detach().double(), attn.w_v.detach().double()
    heads, dim, rank = w_q.shape
    kb = attn.key_bias.detach().double() if attn.key_bias is not None else None
    rows, bias = [], []
    for h in range(heads):
        rows.append(w_q[h].t())
        bias.append(w_q.new_zeros(rank))
        if kb is not None:
            rows.append(w_q.new_zeros(1, dim))
            bias.append(w_q.new_ones(1))
        if attn.w_k is not None:
            rows.append(attn.w_k.detach().double()[h].t())
            bias.append(w_q.new_zeros(rank))
        if kb is not None:
            rows.append(kb[h].unsqueeze(0))
            bias.append(w_q.new_zeros(1))
        rows.append(w_v[h].t())
        bias.append(w_q.new_zeros(w_v.shape[2]))
    return torch.cat(rows), (torch.cat(bias) if kb is not None else None)


class ProjectedXWXAttention(nn.Module):
    """`FusedXWXAttention` as its three steps: `proj_in` (C → H·P, the projection `xwx_heads` reads), the heads
    (`ops.xwx_heads`: scores, softmax, values), `proj_out` (H·D → C_out with b_o, + the residual).

    The form `vitfast.quantize` gives a non-deep block's attention so that its two GEMMs — ~80% of the attention's
    multiply-adds at DeiT-S size (projection 175 M, output 58 M, scores and values 60 M per image) — run on the
    int8 core: `proj_in` / `proj_out` become `Int8Linear`s (either may stay an nn.Linear under `skip=`).  Equal to
    the fused op in exact arithmetic (the same columns, xwx_attention's phases 2-3); not a fused kind of its own: the
    block's file config stays the FusedXWXBlock's, and the quantization record names `attn.proj_in` /
    `attn.proj_out`, from which `vitfast.load` rebuilds this form (vitfast/quant/structure.py).

    `int8_attention` / `bf16_attention` (set on an instance by `vitfast.quantize(attention=...)`, recorded like
    `FusedAttention`'s): the heads' score and value products on int8 (`ops.xwx_heads_int8`) or on bf16 operands
    (`ops.xwx_heads_bf16`) instead of fp32.
    """

    # read from the instance's __dict__ when set; the class defaults let a plan read them as attributes
    int8_attention = False
    bf16_attention = False

    def __init__(self, dim: int, num_heads: int, score_form: str, score_rank: int, value_dim: int, *,
                 key_bias: bool = True, out_bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        FusedXWXAttention(dim, num_heads, score_form, score_rank, value_dim, device="meta")  # validates the arguments
        self.dim, self.num_heads, self.score_form = dim, num_heads, score_form
        self.score_rank, self.value_dim = score_rank, value_dim
        self._key_bias, self._out_bias = bool(key_bias), bool(out_bias)
        kb = int(self._key_bias)
        per_head = (score_rank + kb) + (score_rank + kb if score_form == "factored" else kb) + value_dim
        dd = {"device": device, "dtype": dtype}
        self.proj_in = nn.Linear(dim, num_heads * per_head, bias=self._key_bias, **dd)
        self.proj_out = nn.Linear(num_heads * value_dim, dim, bias=out_bias, **dd)

    @classmethod
    def like(cls, attn: FusedXWXAttention) -> "ProjectedXWXAttention":
        """An uninitialised one of `attn`'s shape, dtype and device (its tensors come from a file)."""
        return cls(attn.dim, attn.num_heads, attn.score_form, attn.score_rank, attn.value_dim,
                   key_bias=attn.has_key_bias, out_bias=attn.has_out_bias, device=attn.w_q.device,
                   dtype=attn.w_q.dtype)

    @classmethod
    def from_fused(cls, attn: FusedXWXAttention) -> "ProjectedXWXAttention":
        """The same attention in this form (weights computed in float64, cast once to the attention's dtype)."""
        out = cls.like(attn)
        weight, bias = _xwx_projection(attn)
        heads, value_dim, c_out = attn.w_o.shape
        with torch.no_grad():
            out.proj_in.weight.copy_(weight)
            if bias is not None:
                out.proj_in.bias.copy_(bias)
            out.proj_out.weight.copy_(attn.w_o.detach().reshape(heads * value_dim, c_out).t())
            if attn.b_o is not None:
                out.proj_out.bias.copy_(attn.b_o.detach())
        return out.eval()

    @property
    def has_key_bias(self) -> bool:
        return self._key_bias

    @property
    def has_out_bias(self) -> bool:
        return self._out_bias

    def forward(self, y: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        # An int8 model's layers (vitfast.nn.int8.Int8Linear) run themselves; fp32 ones on the linear op, as in
        # FusedAttention.forward.
        first, last = self.proj_in, self.proj_out
        proj = ops.linear(y, first.weight, first.bias) if isinstance(first, nn.Linear) else first(y)
        flags = self.__dict__
        heads_op = (ops.xwx_heads_int8 if flags.get("int8_attention") else
                    ops.xwx_heads_bf16 if flags.get("bf16_attention") else ops.xwx_heads)
        heads = heads_op(proj, y if self.score_form == "full" else None, self.num_heads, self.value_dim)
        if isinstance(last, nn.Linear):
            return ops.linear(heads, last.weight, last.bias, residual)
        return last(heads, residual)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, score_form={self.score_form!r}, "
                f"score_rank={self.score_rank}, value_dim={self.value_dim}")


@register_fused("xwx_block")
class FusedXWXBlock(nn.Module):
    """Fused non-deep block, drop-in for a timm ViT `Block`: x ↦ mlp(x + attn(norm1(x))) on [B, N, C].

    Children: `norm1` (LayerNorm without affine), `attn` (`FusedXWXAttention`), `mlp` (`FusedChannelIdleFFN`, owns
    its norm and shortcut).  Build with `NonDeepBlock.to_fused()` / `vitfast.fuse(model)`; the kind
    "xwx_block" and its config keys are stored in checkpoint files: never rename them.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        score_form: str,
        score_rank: int,
        value_dim: int,
        mlp: FusedChannelIdleFFN,
        *,
        key_bias: bool = True,
        out_bias: bool = True,
        norm_eps: float = 1e-6,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if not isinstance(mlp, FusedChannelIdleFFN) or mlp.features != dim:
            got = f"{type(mlp).__name__} over {getattr(mlp, 'features', '?')} features"
            raise ValueError(f"mlp: expected a FusedChannelIdleFFN over {dim} features, got {got}")
        self.dim = dim
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps, elementwise_affine=False)
        self.attn = FusedXWXAttention(dim, num_heads, score_form, score_rank, value_dim, key_bias=key_bias,
                                 out_bias=out_bias, device=device, dtype=dtype)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("attn_mask/is_causal: expected none (the xwx block attends over all tokens), got a mask")
        x = self.attn(apply_norm(self.norm1, x), residual=x)  # the LayerNorm kernel on CPU
        return self.mlp(x)  # the FFN sub-block adds its own shortcut

    @classmethod
    def from_folded(
        cls, attention: FoldedXWXAttention, ffn: FoldedFFN, *, norm_eps: float, device=None, dtype=None
    ) -> "FusedXWXBlock":
        """Build from float64 folded tensors, cast once to `dtype`."""
        heads, dim, rank = attention.w_q.shape
        block = cls(
            dim,
            heads,
            "factored" if attention.w_k is not None else "full",
            rank,
            attention.w_v.shape[2],
            FusedChannelIdleFFN.from_folded(ffn, device=device, dtype=dtype),
            key_bias=attention.key_bias is not None,
            out_bias=attention.b_o is not None,
            norm_eps=norm_eps,
            device=device,
            dtype=dtype,
        )
        with torch.no_grad():
            for key in ("w_q", "w_k", "key_bias", "w_v", "w_o", "b_o"):
                value = getattr(attention, key)
                if value is not None:
                    getattr(block.attn, key).copy_(value)
        return block.eval()

    def vitfast_config(self) -> Dict[str, Any]:
        attn = self.attn
        return {
            "kind": self.vitfast_kind,
            "dim": self.dim,
            "num_heads": attn.num_heads,
            "score_form": attn.score_form,
            "score_rank": attn.score_rank,
            "value_dim": attn.value_dim,
            "key_bias": attn.has_key_bias,
            "out_bias": attn.has_out_bias,
            "norm_eps": float(self.norm1.eps),
            "mlp": self.mlp.vitfast_config(),
        }

    @classmethod
    def from_vitfast_config(cls, cfg: Dict[str, Any], *, device=None, dtype=None) -> "FusedXWXBlock":
        read = ConfigReader(cfg, "xwx_block", (
            "dim", "num_heads", "score_form", "score_rank", "value_dim", "key_bias", "out_bias", "norm_eps", "mlp",
        ))
        return cls(
            read.int("dim"),
            read.int("num_heads"),
            read.choice("score_form", SCORE_FORMS),
            read.int("score_rank"),
            read.int("value_dim"),
            FusedChannelIdleFFN.from_vitfast_config(read.dict("mlp"), device=device, dtype=dtype),
            key_bias=read.bool("key_bias"),
            out_bias=read.bool("out_bias"),
            norm_eps=read.eps("norm_eps"),
            device=device,
            dtype=dtype,
        )

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
