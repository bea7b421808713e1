"""The collapse of a non-deep block at λ = 1 into the fused XWXᵀ form (eq. 6-9), computed in float64.

`fold_nondeep_attention` gives the per-head W_h (factored or full), key bias, value and output factors that
`vitfast.nn.FusedXWXBlock` runs through `torch.ops.vitfast.xwx_attention`; `fold_nondeep_mlp` sums the branch FFNs into
one channel-idle FFN.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from ..._checks import check_finite_parameter
from ...nn._fold import batchnorm_scale_shift, fold_ffn
from ...nn.xwx import SCORE_FORMS, FoldedXWXAttention

if TYPE_CHECKING:
    from .modules import NonDeepMlp


def fold_nondeep_attention(attn: nn.Module, name: str = "attn", score_form: str = "auto") -> FoldedXWXAttention:
    """Collapse a `NonDeepAttention` at λ = 1 (see `vitfast.methods.nondeep` for the algebra), in float64.

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


def fold_nondeep_mlp(mlp: NonDeepMlp, name: str):
    """Σ_b FFN_b at λ = 1 as one channel-idle FFN (`_fold.FoldedFFN`): GELU rows summed (eq. 9), idle rows of all
    branches side by side (fold_ffn then collapses Σ_b W_{2,b,idle} W_{1,b,idle} into the linear path)."""
    a = mlp.active_features
    act_w1, act_b1, act_w2, idle_w1, idle_b1, idle_w2, b2 = [], [], [], [], [], [], []
    for b, br in enumerate(mlp.branches):
        where = f"{name}.branches.{b}"
        for tensor_name, t in (("fc1.weight", br.fc1.weight), ("fc1.bias", br.fc1.bias),
                               ("fc2.weight", br.fc2.weight), ("fc2.bias", br.fc2.bias)):
            if t is not None:
                check_finite_parameter(f"{where}.{tensor_name}", t)
        w1 = br.fc1.weight.detach().double()
        bias1 = br.fc1.bias.detach().double() if br.fc1.bias is not None else w1.new_zeros(w1.shape[0])
        w2 = br.fc2.weight.detach().double()
        bias2 = br.fc2.bias.detach().double() if br.fc2.bias is not None else w2.new_zeros(w2.shape[0])
        if isinstance(br.hidden_norm, nn.BatchNorm1d):  # per-branch hidden BN into that branch's fc2 (RePaViT eq. 3)
            scale, shift = batchnorm_scale_shift(br.hidden_norm, f"{where}.hidden_norm")
            bias2 = w2 @ shift + bias2
            w2 = w2 * scale[None, :]
        act_w1.append(w1[:a]), act_b1.append(bias1[:a]), act_w2.append(w2[:, :a])
        idle_w1.append(w1[a:]), idle_b1.append(bias1[a:]), idle_w2.append(w2[:, a:])
        b2.append(bias2)
    fc1_w = torch.cat([sum(act_w1)] + idle_w1, dim=0)
    fc1_b = torch.cat([sum(act_b1)] + idle_b1, dim=0)
    fc2_w = torch.cat([sum(act_w2)] + idle_w2, dim=1)
    return fold_ffn(
        fc1_weight=fc1_w,
        fc1_bias=fc1_b,
        fc2_weight=fc2_w,
        fc2_bias=sum(b2),
        active_features=a,
        pre_norm=mlp.pre_norm,
        name=name,
    )
