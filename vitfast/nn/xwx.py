"""Fused non-deep ViT block: what `NonDeepBlock.to_fused()` returns (non-deep-vit-progressive-reparam eq. 6-9).

    XWXBlock(x) = mlp(x + xwx_attention(LN(x), w_q, w_k, key_bias, w_v, w_o, b_o))      LN non-affine

`mlp` is a `FusedChannelIdleFFN` (LayerNorm variant with explicit residual, or the BatchNorm variant with norms
and shortcut folded).  The attention's tensors are exactly the arguments of `vitfast.reference.xwx_attention`
(see its docstring); the block calls `vitfast.ops.xwx_attention` with them (C++ kernel on CPU, Triton on CUDA).

Score form (stored in the config as "score_form"): "factored" — w_q, w_k [H, C, R] with W_h = w_q[h] w_k[h]ᵀ;
"full" — w_q = W_h [H, C, C], no w_k.  The value width D is d_h (values joined in training) or n·d_h (branch
value/output factors side by side, the exact collapse of unjoined values).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch
import torch.nn as nn

from .. import ops
from .._checks import check_finite_parameter
from ._fold import FoldedFFN
from .fused import FusedChannelIdleFFN, _ConfigReader, _layer_norm
from .registry import register_fused

__all__ = ["FoldedXWXAttention", "fold_nondeep_attention", "XWXAttention", "XWXBlock", "SCORE_FORMS"]

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


def fold_nondeep_attention(attn: nn.Module, name: str = "attn", score_form: str = "auto") -> FoldedXWXAttention:
    """Collapse a `NonDeepAttention` at λ = 1 (see `vitfast.nn.nondeep` for the algebra), in float64.

    With A_{b,h} = W^Q_{b,h}ᵀ, B_{b,h} = W^K_{b,h}ᵀ ([C, d]) and s = 1 / (√n √d_k) (the rescale at λ = 1):
      W_h = s Σ_b A_{b,h} B_{b,h}ᵀ = [s A_{1,h} … s A_{n,h}] [B_{1,h} … B_{n,h}]ᵀ     (eq. 6: summed W_h)
      key_bias_h = s Σ_b B_{b,h} b_{q,b,h}                          (the q-bias; the k-bias cancels in softmax)
      values not joined: w_v[h] = [V_{1,h} … V_{n,h}], w_o[h] = [O_{1,h}; …; O_{n,h}]   (= Σ_b V_{b,h} O_{b,h})
      values joined:     w_v[h] = Σ_b V_{b,h} / √n,  w_o[h] = Σ_b O_{b,h}                 (eq. 6-7)
      b_o = Σ_b b_{proj,b} + Σ_h b_{v,h} w_o[h]   (b_v the value bias feeding w_o; softmax rows sum to 1)
    """
    if score_form not in ("auto",) + SCORE_FORMS:
        raise ValueError(f"score_form: expected 'auto' or one of {SCORE_FORMS}, got {score_form!r}")
    n, heads, d = attn.num_branches, attn.num_heads, attn.head_dim
    dim = attn.branches[0].qkv.in_features
    a_list, b_list, bq_list, v_list, bv_list, o_list = [], [], [], [], [], []
    b_out = None
    for b, br in enumerate(attn.branches):
        where = f"{name}.branches.{b}"
        for tensor_name, t in (("qkv.weight", br.qkv.weight), ("qkv.bias", br.qkv.bias),
                               ("proj.weight", br.proj.weight), ("proj.bias", br.proj.bias)):
            if t is not None:
                check_finite_parameter(f"{where}.{tensor_name}", t)
        w = br.qkv.weight.detach().double().reshape(3, heads, d, dim)
        a_list.append(w[0].transpose(1, 2))  # [H, C, d]
        b_list.append(w[1].transpose(1, 2))
        v_list.append(w[2].transpose(1, 2))
        if br.qkv.bias is not None:
            bias = br.qkv.bias.detach().double().reshape(3, heads, d)
            bq_list.append(bias[0])
            bv_list.append(bias[2])
        o_list.append(br.proj.weight.detach().double().t().reshape(heads, d, -1))  # [H, d, C]
        if br.proj.bias is not None:
            pb = br.proj.bias.detach().double()
            b_out = pb if b_out is None else b_out + pb
    s = 1.0 / (math.sqrt(n) * math.sqrt(d))
    rank = n * d
    if score_form == "auto":
        score_form = "factored" if 2 * rank <= dim else "full"
    if score_form == "factored":
        w_q = s * torch.cat(a_list, dim=2)  # [H, C, n·d]
        w_k = torch.cat(b_list, dim=2)
    else:
        w_q = s * sum(torch.einsum("hcd,hed->hce", a, bk) for a, bk in zip(a_list, b_list))  # [H, C, C]
        w_k = None
    key_bias = None
    if bq_list:
        key_bias = s * sum(torch.einsum("hcd,hd->hc", bk, bq) for bk, bq in zip(b_list, bq_list))
    if attn.join_values:
        w_v = sum(v_list) / math.sqrt(n)
        w_o = sum(o_list)
        b_v = sum(bv_list) / math.sqrt(n) if bv_list else None
    else:
        w_v = torch.cat(v_list, dim=2)  # [H, C, n·d]
        w_o = torch.cat(o_list, dim=1)  # [H, n·d, C]
        b_v = torch.cat(bv_list, dim=1) if bv_list else None
    if b_v is not None:
        pushed = torch.einsum("hd,hdc->c", b_v, w_o)
        b_out = pushed if b_out is None else b_out + pushed
    return FoldedXWXAttention(w_q=w_q, w_k=w_k, key_bias=key_bias, w_v=w_v, w_o=w_o, b_o=b_out)


class XWXAttention(nn.Module):
    """Collapsed non-deep attention: forward(y, residual=None) = ops.xwx_attention(y, ...) (module doc).

    Not registered on its own: it is part of `XWXBlock`, whose config carries its shape.
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


@register_fused("xwx_block")
class XWXBlock(nn.Module):
    """Fused non-deep block, drop-in for a timm ViT `Block`: x ↦ mlp(x + attn(norm1(x))) on [B, N, C].

    Children: `norm1` (LayerNorm without affine), `attn` (`XWXAttention`), `mlp` (`FusedChannelIdleFFN`, owns
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
        self.attn = XWXAttention(dim, num_heads, score_form, score_rank, value_dim, key_bias=key_bias,
                                 out_bias=out_bias, device=device, dtype=dtype)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("attn_mask/is_causal: expected none (the xwx block attends over all tokens), got a mask")
        x = self.attn(_layer_norm(self.norm1, x), residual=x)  # the LayerNorm kernel on CPU
        return self.mlp(x)  # the FFN sub-block adds its own shortcut

    @classmethod
    def from_folded(
        cls, attention: FoldedXWXAttention, ffn: FoldedFFN, *, norm_eps: float, device=None, dtype=None
    ) -> "XWXBlock":
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
            "key_bias": attn.key_bias is not None,
            "out_bias": attn.b_o is not None,
            "norm_eps": float(self.norm1.eps),
            "mlp": self.mlp.vitfast_config(),
        }

    @classmethod
    def from_vitfast_config(cls, cfg: Dict[str, Any], *, device=None, dtype=None) -> "XWXBlock":
        read = _ConfigReader(cfg, "xwx_block", (
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
