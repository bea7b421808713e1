"""Exact algebra that turns a train-time channel-idle FFN into the three fused tensors of RePaViT eq. 6.

Everything here is computed in float64 and cast once to the target dtype, so the folded weights carry no more
rounding than one cast: the fused model then differs from the train-time one only by the order of float32
operations at run time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch
import torch.nn as nn

from .._checks import check_finite_parameter
from . import _timm

__all__ = ["batchnorm_scale_shift", "layernorm_affine", "FoldedFFN", "fold_ffn"]


def batchnorm_scale_shift(bn: nn.BatchNorm1d, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Eval-mode BatchNorm as an affine map, BN(x) = s ⊙ x + t, in float64 (RePaViT eq. 3).

    s = γ / √(σ² + ε),  t = β − μ·s.  Refuses missing or non-finite statistics, a negative variance, and an
    ε that makes σ² + ε non-positive: any of these would fold into NaN/Inf weights.
    """
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError(
            f"{name}: expected a BatchNorm with running statistics (track_running_stats=True), got none; "
            "eval-mode statistics are what gets folded"
        )
    mean = bn.running_mean.detach().double()
    var = bn.running_var.detach().double()
    check_finite_parameter(f"{name}.running_mean", mean)
    check_finite_parameter(f"{name}.running_var", var)
    denominator = var + bn.eps
    if bool((denominator <= 0).any()):
        raise ValueError(
            f"{name}.running_var: expected running_var + eps > 0 everywhere, got minimum "
            f"{float(denominator.min()):.3g}"
        )
    scale = torch.rsqrt(denominator)
    shift = -mean * scale
    if bn.weight is not None:
        check_finite_parameter(f"{name}.weight", bn.weight)
        scale = scale * bn.weight.detach().double()
        shift = shift * bn.weight.detach().double()
    if bn.bias is not None:
        check_finite_parameter(f"{name}.bias", bn.bias)
        shift = shift + bn.bias.detach().double()
    return scale, shift


def layernorm_affine(ln: nn.LayerNorm, name: str) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """The (γ, β) of a LayerNorm in float64, either possibly None; refuses non-finite values."""
    if len(ln.normalized_shape) != 1:
        raise ValueError(f"{name}: expected a LayerNorm over the last dimension only, got {tuple(ln.normalized_shape)}")
    gamma = getattr(ln, "weight", None)
    beta = getattr(ln, "bias", None)
    if gamma is not None:
        check_finite_parameter(f"{name}.weight", gamma)
        gamma = gamma.detach().double()
    if beta is not None:
        check_finite_parameter(f"{name}.bias", beta)
        beta = beta.detach().double()
    return gamma, beta


@dataclass
class FoldedFFN:
    """The fused FFN in float64: z = GELU(h[:, :A])·w_outᵀ + h[:, A:] + b_out (+ x if residual), h = y·w_inᵀ + b_in."""

    w_in: torch.Tensor  # [A + L, C]
    b_in: torch.Tensor  # [A + L]
    w_out: torch.Tensor  # [C, A]
    b_out: torch.Tensor  # [C]
    active_features: int
    linear_path: bool
    norm_eps: Optional[float]  # LayerNorm variant: the non-affine normalisation left in front; None: no norm
    residual: bool


def fold_ffn(
    *,
    fc1_weight: torch.Tensor,
    fc1_bias: Optional[torch.Tensor],
    fc2_weight: torch.Tensor,
    fc2_bias: Optional[torch.Tensor],
    active_features: int,
    pre_norm: Optional[nn.Module],
    hidden_norm: Optional[nn.Module] = None,
    layer_scale: Optional[torch.Tensor] = None,
    name: str = "mlp",
) -> FoldedFFN:
    """Fold `x + ls ⊙ fc2(hidden_norm(act_A(fc1(pre_norm(x)))))` into the fused form (RePaViT eq. 3-6).

    act_A applies GELU to the first `active_features` hidden channels and leaves the rest ("idle") linear.
    pre_norm: BatchNorm1d (folded into fc1 and, with the shortcut, into W̃ — no residual left), LayerNorm (its
    affine is folded into fc1; the non-affine normalisation and an explicit residual remain, because the
    shortcut carries the un-normalised x), or None (identity, shortcut folded like the BatchNorm case).
    hidden_norm: BatchNorm1d over the hidden width (folded into fc2, eq. 3) or None.
    layer_scale: LayerScale γ over the output channels (folded into fc2's rows), or None.

    Idle path (eq. 4-5): W̃ = W̃_out[:, idle]·W̃_in[idle, :] (+ I when the shortcut folds); its bias goes to b_out.
    With no idle channel (θ = 0) there is no linear path; the shortcut, if any, stays an explicit residual —
    cheaper than a C×C identity GEMM and exact.
    """
    hidden, features = fc1_weight.shape
    if tuple(fc2_weight.shape) != (features, hidden):
        raise ValueError(
            f"{name}.fc2.weight: expected shape [{features}, {hidden}] (the shortcut needs out = in features), "
            f"got {list(fc2_weight.shape)}"
        )
    if not 0 <= active_features <= hidden:
        raise ValueError(f"{name}: expected 0 <= active_features <= {hidden}, got {active_features}")
    for tensor_name, t in (("fc1.weight", fc1_weight), ("fc1.bias", fc1_bias), ("fc2.weight", fc2_weight),
                           ("fc2.bias", fc2_bias), ("layer_scale", layer_scale)):
        if t is not None:
            check_finite_parameter(f"{name}.{tensor_name}", t)

    w1 = fc1_weight.detach().double()
    b1 = fc1_bias.detach().double() if fc1_bias is not None else w1.new_zeros(hidden)
    w2 = fc2_weight.detach().double()
    b2 = fc2_bias.detach().double() if fc2_bias is not None else w2.new_zeros(features)

    # Pre-norm → fc1 (eq. 3, first line).  fc1(s ⊙ x + t) = (W1 diag s) x + (W1 t + b1).
    norm_eps: Optional[float] = None
    if isinstance(pre_norm, nn.BatchNorm1d):
        scale, shift = batchnorm_scale_shift(pre_norm, f"{name}.pre_norm")
        b1 = w1 @ shift + b1
        w1 = w1 * scale[None, :]
        shortcut_folds = True
    elif isinstance(pre_norm, nn.LayerNorm):
        gamma, beta = layernorm_affine(pre_norm, f"{name}.pre_norm")
        if beta is not None:
            b1 = w1 @ beta + b1
        if gamma is not None:
            w1 = w1 * gamma[None, :]
        norm_eps = float(pre_norm.eps)
        shortcut_folds = False
    elif pre_norm is None:
        shortcut_folds = True
    else:
        raise TypeError(f"{name}.pre_norm: expected BatchNorm1d, LayerNorm or None, got {type(pre_norm).__name__}")

    # Hidden BatchNorm → fc2 (eq. 3, second line).  fc2(s ⊙ h + t) = (W2 diag s) h + (W2 t + b2).
    if isinstance(hidden_norm, nn.BatchNorm1d):
        scale, shift = batchnorm_scale_shift(hidden_norm, f"{name}.hidden_norm")
        b2 = w2 @ shift + b2
        w2 = w2 * scale[None, :]
    elif hidden_norm is not None:
        raise TypeError(f"{name}.hidden_norm: expected BatchNorm1d or None, got {type(hidden_norm).__name__}")

    # LayerScale multiplies the branch output: fold into fc2's rows and bias.
    if layer_scale is not None:
        gamma_ls = layer_scale.detach().double().reshape(-1)
        w2 = w2 * gamma_ls[:, None]
        b2 = b2 * gamma_ls

    a = active_features
    idle = hidden - a
    if idle > 0:
        # Eq. 4-5: the idle channels are linear end to end; collapse them to one C×C map (plus the shortcut).
        w_linear = w2[:, a:] @ w1[a:, :]
        b_out = b2 + w2[:, a:] @ b1[a:]
        if shortcut_folds:
            w_linear = w_linear + torch.eye(features, dtype=w_linear.dtype, device=w_linear.device)
        w_in = torch.cat([w1[:a], w_linear], dim=0)
        b_in = torch.cat([b1[:a], b1.new_zeros(features)], dim=0)
        linear_path = True
        residual = not shortcut_folds
    else:
        w_in, b_in, b_out = w1, b1, b2
        linear_path = False
        residual = True
    return FoldedFFN(
        w_in=w_in,
        b_in=b_in,
        w_out=w2[:, :a].contiguous(),
        b_out=b_out,
        active_features=a,
        linear_path=linear_path,
        norm_eps=norm_eps,
        residual=residual,
    )


def fold_attention(norm1: nn.Module, attn: nn.Module, ls1: nn.Module, name: str) -> Dict[str, Any]:
    """norm1's affine into qkv, ls1 into proj (both exact: LN(x)=γ⊙n+β feeds only qkv; ls1 scales proj's rows).

    Returns the fused attention's constructor arguments and float64 tensors.
    """
    dim = attn.qkv.in_features
    norm_eps = _timm.check_layernorm(norm1, f"{name}.norm1", dim)
    gamma, beta = layernorm_affine(norm1, f"{name}.norm1")
    w_qkv = attn.qkv.weight.detach().double()
    b_qkv = attn.qkv.bias.detach().double() if attn.qkv.bias is not None else None
    if beta is not None:
        b_qkv = w_qkv @ beta + (b_qkv if b_qkv is not None else 0.0)
    if gamma is not None:
        w_qkv = w_qkv * gamma[None, :]
    w_proj = attn.proj.weight.detach().double()
    b_proj = attn.proj.bias.detach().double() if attn.proj.bias is not None else None
    ls = _timm.layer_scale_gamma(ls1, f"{name}.ls1")
    if ls is not None:
        ls = ls.detach().double().reshape(-1)
        w_proj = w_proj * ls[:, None]
        if b_proj is not None:
            b_proj = b_proj * ls
    qk_norm = not isinstance(attn.q_norm, nn.Identity)
    scale_norm = not isinstance(getattr(attn, "norm", nn.Identity()), nn.Identity)
    return dict(
        dim=dim,
        num_heads=attn.num_heads,
        head_dim=attn.head_dim,
        qkv_bias=b_qkv is not None,
        qk_norm=qk_norm,
        qk_norm_eps=float(attn.q_norm.eps) if qk_norm else 1e-6,
        scale_attn_norm=scale_norm,
        scale_attn_norm_eps=float(attn.norm.eps) if scale_norm else 1e-6,
        proj_bias=b_proj is not None,
        norm_eps=norm_eps,
        tensors={
            "attn.qkv.weight": w_qkv,
            "attn.qkv.bias": b_qkv,
            "attn.proj.weight": w_proj,
            "attn.proj.bias": b_proj,
            **({"attn.q_norm." + k: v for k, v in affine_norm_state(attn.q_norm, w_qkv).items()} if qk_norm else {}),
            **({"attn.k_norm." + k: v for k, v in affine_norm_state(attn.k_norm, w_qkv).items()} if qk_norm else {}),
            **({"attn.norm." + k: v for k, v in affine_norm_state(attn.norm, w_qkv).items()} if scale_norm else {}),
        },
    )


def affine_norm_state(norm: nn.Module, like: torch.Tensor) -> Dict[str, torch.Tensor]:
    """A LayerNorm's state as an affine one's: a missing weight is 1, a missing bias 0 (the same output, bit for
    bit), so fused modules, whose norms always have both, take LayerNorm(bias=False) or (elementwise_affine=False)
    sources (the strict state-dict load failed on them: "Missing key(s) ... q_norm.bias")."""
    state = dict(norm.state_dict())
    shape = tuple(norm.normalized_shape)
    if "weight" not in state:
        state["weight"] = torch.ones(shape, dtype=like.dtype, device=like.device)
    if "bias" not in state:
        state["bias"] = torch.zeros(shape, dtype=like.dtype, device=like.device)
    return state
