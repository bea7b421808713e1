"""Drop-in depthwise-convolution heads, train-time: `DWConvAttention` (some heads attention, the replaced ones
V_h = X W_V,h followed by a k×k depthwise convolution over the token grid, eq. 11; optional head ensembling with
softmax(γ) weights, eq. 12-13) and `DWConvBlock`.  `fold_dwconv_attention` is the exact fold into
`vitfast.nn.FusedDWConvBlock`.

Kernel forms (`kernel_form`):
  "depthwise" (eq. 11, the paper's method): one k×k filter per value channel, K ∈ R^(D×k×k).
  "full" (eq. 9-10): one k×k kernel K^h per head, shared by the head's d_h channels; the full convolution
      Conv(X, W^Vh) with W^Vh_(r,s) = K^h_(r,s) W^V_h.  Since
      Σ_(r,s) (K^h_(r,s) W^V_h)ᵀ X_(i+r,j+s) = Σ_(r,s) K^h_(r,s) V^h_(i+r,j+s), it is computed (and fused,
      exactly) as the depthwise convolution of V^h with K^h repeated over the d_h channels: O(d_i d_h + k² d_h)
      per token instead of the literal O(k² d_i d_h), the same function.  With a value bias b_V the values are
      V = X W^V + b_V, zero-padded like the depthwise form's (eq. 9 has no bias).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models.vision_transformer import Attention as TimmAttention, Block as TimmBlock

from ... import reference
from ..._copy import deepcopy_model
from ...nn import _timm
from ...nn._fold import layernorm_affine
from ...nn.dwconv import FusedDWConvBlock, check_grid, check_kernel_size, check_prefix_tokens, check_token_count
from ..repavit.modules import ChannelIdleBlock, ChannelIdleMlp


KERNEL_FORMS = ("depthwise", "full")


def _check_heads(conv_heads, num_heads: int) -> Tuple[int, ...]:
    heads = tuple(conv_heads)
    if not heads or len(set(heads)) != len(heads) or any(
        isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < num_heads for h in heads
    ):
        raise ValueError(
            f"conv_heads: expected distinct head indices in [0, {num_heads}), at least one, got {list(heads)}"
        )
    return tuple(sorted(heads))


def _columns(heads: Sequence[int], head_dim: int) -> List[int]:
    return [h * head_dim + i for h in heads for i in range(head_dim)]


class DWConvAttention(nn.Module):
    """Attention with the heads `conv_heads` replaced by depthwise convolutions (eq. 11), train-time.

    Same call as timm's Attention (`attn(x) -> [B, N, C]`, no mask).  Children: `qkv` (q, k, v rows of the
    attention heads that remain, timm's [3, heads, head_dim] layout; None when every head is replaced),
    `value` (the replaced heads' value rows), `conv_kernel` [D, k, k] (D = replaced heads · d_h; d_h when
    `ensemble`), `gamma` [replaced heads] (ensemble only; zeros = equal weights), `proj` (timm's whole output
    projection, columns in the original head order).

    `kernel_form="full"` (eq. 9-10, module doc): `conv_kernel` is [replaced heads, k, k] ([1, k, k] when
    `ensemble`), one kernel per head shared by its d_h channels; `depthwise_kernel()` is the [D, k, k] form both
    compute with.

    Kernel initialisation: Gaussian N(0, kernel_init_std²), default std = 1/k (the paper's appendix A.2.1
    initialises the kernels from a Gaussian; 1/k keeps the output variance of the k² taps equal to V's).
    Weight decay (appendix A.2.1 "exclude kernel parameters from L2-regularization"): `conv_kernel` is excluded;
    γ is decayed as the paper's other parameters are (`decay_gamma=True`: the module lists it in `_weight_decay`,
    the names to decay although 1-D — module attributes survive `copy.deepcopy`, parameter attributes do not), or
    excluded with `decay_gamma=False` (vitfast's earlier rule).
    """

    _no_weight_decay = ("conv_kernel",)
    _weight_decay = ()
    vitfast_counts_prefix_tokens = True  # vitfast.convert.remove_prefix_tokens updates `prefix_tokens`
    vitfast_token_grid = True  # vitfast.nn.set_grid_size / follow_patch_grid update its grid

    def __init__(
        self,
        dim: int,
        num_heads: int,
        conv_heads: Sequence[int],
        grid_size: Tuple[int, int],
        *,
        head_dim: Optional[int] = None,
        kernel_size: int = 3,
        ensemble: bool = False,
        kernel_form: str = "depthwise",
        decay_gamma: bool = True,
        qkv_bias: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        kernel_init_std: Optional[float] = None,
        prefix_tokens: Optional[int] = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"num_heads: expected a divisor of dim = {dim}, got {num_heads}")
            head_dim = dim // num_heads
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.conv_heads = _check_heads(conv_heads, num_heads)
        self.attn_heads = tuple(h for h in range(num_heads) if h not in self.conv_heads)
        self.grid_size = check_grid(grid_size)
        self.prefix_tokens = check_prefix_tokens(prefix_tokens)
        self.kernel_size = check_kernel_size(kernel_size)
        self.ensemble = bool(ensemble)
        if kernel_form not in KERNEL_FORMS:
            raise ValueError(f"kernel_form: expected one of {KERNEL_FORMS}, got {kernel_form!r}")
        if not isinstance(decay_gamma, bool):
            raise ValueError(f"decay_gamma: expected True or False, got {decay_gamma!r}")
        self.kernel_form = kernel_form
        n_conv, n_attn = len(self.conv_heads), len(self.attn_heads)
        self.qkv = nn.Linear(dim, 3 * n_attn * head_dim, bias=qkv_bias, **dd) if n_attn else None
        self.value = nn.Linear(dim, n_conv * head_dim, bias=qkv_bias, **dd)
        width = head_dim if self.ensemble else n_conv * head_dim
        if kernel_form == "full":  # one kernel per (ensembled) head, shared by its d_h channels (eq. 10)
            width //= head_dim
        if kernel_init_std is not None and (isinstance(kernel_init_std, bool) or not isinstance(kernel_init_std, (int, float))
                                            or not math.isfinite(kernel_init_std) or kernel_init_std < 0):
            raise ValueError(f"kernel_init_std: expected None (1/k) or a finite number >= 0, got {kernel_init_std!r}")
        std = 1.0 / kernel_size if kernel_init_std is None else float(kernel_init_std)
        self.conv_kernel = nn.Parameter(torch.randn(width, kernel_size, kernel_size, **dd) * std)
        self.gamma = nn.Parameter(torch.zeros(n_conv, **dd)) if self.ensemble else None
        self.decay_gamma = decay_gamma
        self.attn_drop = float(attn_drop)
        self.proj = nn.Linear(num_heads * head_dim, dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    @property
    def decay_gamma(self) -> bool:
        return self._decay_gamma

    @decay_gamma.setter
    def decay_gamma(self, value: bool) -> None:
        """γ's weight decay: the module's `_no_weight_decay` and `_weight_decay` names follow it."""
        if not isinstance(value, bool):
            raise ValueError(f"decay_gamma: expected True or False, got {value!r}")
        self._decay_gamma = value
        self._no_weight_decay = ("conv_kernel",) if value else ("conv_kernel", "gamma")
        self._weight_decay = ("gamma",) if value and self.gamma is not None else ()

    def depthwise_kernel(self) -> torch.Tensor:
        """The [D, k, k] depthwise kernel: `conv_kernel` itself, or (kernel_form "full") each head's k×k kernel
        repeated over its d_h channels (eq. 10: K^h shared across the head's channels)."""
        if self.kernel_form == "depthwise":
            return self.conv_kernel
        return self.conv_kernel.repeat_interleave(self.head_dim, dim=0)

    # -------------------------------------------------------------------------------------- construction
    @classmethod
    def from_timm(
        cls,
        attn: nn.Module,
        conv_heads: Sequence[int],
        grid_size: Tuple[int, int],
        *,
        kernel_size: int = 3,
        ensemble: bool = False,
        kernel_form: str = "depthwise",
        decay_gamma: bool = True,
        kernel_init_std: Optional[float] = None,
        prefix_tokens: Optional[int] = None,
        name: str = "attn",
    ) -> "DWConvAttention":
        """Replace heads of a trained timm `Attention`: q/k of the replaced heads are dropped (appendix A.2.1),
        their values and output columns kept, the other heads copied unchanged."""
        if type(attn) is not TimmAttention:
            raise ValueError(f"{name}: expected timm Attention, got {type(attn).__name__}")
        for sub in ("q_norm", "k_norm", "norm"):
            if not isinstance(getattr(attn, sub, nn.Identity()), nn.Identity):
                raise ValueError(f"{name}.{sub}: expected nn.Identity (qk-norm / scale-norm are not supported), "
                                 f"got {type(getattr(attn, sub)).__name__}")
        weight = attn.qkv.weight
        new = cls(
            attn.qkv.in_features, attn.num_heads, conv_heads, grid_size, head_dim=attn.head_dim,
            kernel_size=kernel_size, ensemble=ensemble, kernel_form=kernel_form, decay_gamma=decay_gamma,
            qkv_bias=attn.qkv.bias is not None,
            proj_bias=attn.proj.bias is not None, attn_drop=float(getattr(attn.attn_drop, "p", 0.0)),
            proj_drop=float(getattr(attn.proj_drop, "p", 0.0)), kernel_init_std=kernel_init_std,
            prefix_tokens=prefix_tokens, device=weight.device, dtype=weight.dtype,
        )
        hd, width = attn.head_dim, attn.num_heads * attn.head_dim
        with torch.no_grad():
            if new.qkv is not None:
                rows = [s * width + c for s in range(3) for c in _columns(new.attn_heads, hd)]
                new.qkv.weight.copy_(weight[rows])
                if attn.qkv.bias is not None:
                    new.qkv.bias.copy_(attn.qkv.bias[rows])
            value_rows = [2 * width + c for c in _columns(new.conv_heads, hd)]
            new.value.weight.copy_(weight[value_rows])
            if attn.qkv.bias is not None:
                new.value.bias.copy_(attn.qkv.bias[value_rows])
            new.proj.load_state_dict(attn.proj.state_dict())
        new.train(attn.training)
        return new

    # -------------------------------------------------------------------------------------- weights
    def conv_weights(self) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """(w_v [D, C], b_v [D] or None, w_o [C, D]) of the replaced heads; ensembled (eq. 12) when `ensemble`."""
        cols = torch.as_tensor(_columns(self.conv_heads, self.head_dim), device=self.proj.weight.device)
        w_o = self.proj.weight.index_select(1, cols)
        w_v, b_v = self.value.weight, self.value.bias
        if not self.ensemble:
            return w_v, b_v, w_o
        n, hd = len(self.conv_heads), self.head_dim
        s = torch.softmax(self.gamma, dim=0)
        w_v = torch.einsum("h,hdc->dc", s, w_v.reshape(n, hd, -1))
        b_v = torch.einsum("h,hd->d", s, b_v.reshape(n, hd)) if b_v is not None else None
        w_o = torch.einsum("h,ohd->od", s, w_o.reshape(w_o.shape[0], n, hd))
        return w_v, b_v, w_o

    def set_grid_size(self, grid_size: Tuple[int, int]) -> None:
        self.grid_size = check_grid(grid_size)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("attn_mask/is_causal: expected none (convolution heads have no mask), got a mask")
        batch, tokens, _ = x.shape
        check_token_count(tokens, self.prefix_tokens, self.grid_size)
        rest = None
        if self.qkv is not None:
            n = len(self.attn_heads)
            q, k, v = self.qkv(x).reshape(batch, tokens, 3, n, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            a = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
            cols = torch.as_tensor(_columns(self.attn_heads, self.head_dim), device=x.device)
            rest = F.linear(a.transpose(1, 2).reshape(batch, tokens, n * self.head_dim),
                            self.proj.weight.index_select(1, cols))
        w_v, b_v, w_o = self.conv_weights()
        out = reference.dwconv_attention(x, w_v, b_v, self.depthwise_kernel(), w_o, self.proj.bias, *self.grid_size,
                                         rest)
        return self.proj_drop(out)

    def extra_repr(self) -> str:
        return (f"conv_heads={list(self.conv_heads)}, attn_heads={list(self.attn_heads)}, head_dim={self.head_dim}, "
                f"kernel_size={self.kernel_size}, grid_size={self.grid_size}, prefix_tokens={self.prefix_tokens}, "
                f"ensemble={self.ensemble}, kernel_form={self.kernel_form!r}")


class DWConvBlock(ChannelIdleBlock):
    """Train-time ViT block whose attention is a `DWConvAttention`: x ↦ mlp(x + drop_path1(ls1(attn(norm1(x))))).

    Children as `ChannelIdleBlock` (norm1, attn, ls1, drop_path1, mlp = `ChannelIdleMlp`, which owns the FFN's
    norm, LayerScale and shortcut), so a block converted with `channel_idle=θ` keeps its channel-idle FFN and
    θ = 0 with norm "layer" is timm's FFN exactly.  Build with `DWConvBlock.from_block(block, conv_heads, ...)`.
    """

    def __init__(self, *args, **kwargs) -> None:
        raise TypeError("DWConvBlock: build it from a trained block with DWConvBlock.from_block(block, conv_heads, "
                        "grid_size, ...), or use vitfast.convert.from_timm(model, dwconv_blocks=...)")

    @classmethod
    def from_block(
        cls,
        block: nn.Module,
        conv_heads: Sequence[int],
        grid_size: Tuple[int, int],
        *,
        kernel_size: int = 3,
        ensemble: bool = False,
        kernel_form: str = "depthwise",
        decay_gamma: bool = True,
        kernel_init_std: Optional[float] = None,
        prefix_tokens: Optional[int] = None,
        name: str = "block",
    ) -> "DWConvBlock":
        """From a timm ViT `Block` (its FFN becomes the exact θ = 0 LayerNorm `ChannelIdleMlp`) or a
        `ChannelIdleBlock` (FFN kept).  The argument is not modified."""
        if type(block) is TimmBlock:
            _timm.vit_block_spec(block, name)
            mlp = ChannelIdleMlp.from_timm(block.norm2, block.mlp, block.ls2, block.drop_path2, idle_ratio=0.0,
                                           ffn_norm="layer", name=f"{name}.mlp")
        elif isinstance(block, ChannelIdleBlock) and not isinstance(block, DWConvBlock):
            mlp = deepcopy_model(block.mlp)
        else:
            raise ValueError(f"{name}: expected a timm ViT Block or a vitfast ChannelIdleBlock, got {type(block).__name__}")
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.norm1 = deepcopy_model(block.norm1)
        new.attn = DWConvAttention.from_timm(block.attn, conv_heads, grid_size, kernel_size=kernel_size,
                                             ensemble=ensemble, kernel_form=kernel_form, decay_gamma=decay_gamma,
                                             kernel_init_std=kernel_init_std,
                                             prefix_tokens=prefix_tokens, name=f"{name}.attn")
        new.ls1 = deepcopy_model(block.ls1)
        new.drop_path1 = deepcopy_model(block.drop_path1)
        new.mlp = mlp
        new.train(block.training)
        return new

    def to_fused(self, name: str = "block") -> "FusedDWConvBlock":
        """The exact fused `FusedDWConvBlock` (eval-mode function)."""
        folded = fold_dwconv_attention(self.norm1, self.attn, self.ls1, name)
        weight = self.attn.proj.weight
        return FusedDWConvBlock.from_folded(folded, self.mlp.to_fused(f"{name}.mlp"), device=weight.device,
                                            dtype=weight.dtype)


def fold_dwconv_attention(norm1: nn.Module, attn: DWConvAttention, ls1: nn.Module, name: str) -> Dict[str, Any]:
    """norm1's affine into qkv and value (LN(x) = γ ⊙ n + β feeds only them), ls1 into the output projection,
    softmax(γ) of the ensembling into the value / output weights.  Returns constructor arguments and float64
    tensors."""
    dim = attn.proj.out_features
    norm_eps = _timm.check_layernorm(norm1, f"{name}.norm1", attn.value.in_features)
    gamma, beta = layernorm_affine(norm1, f"{name}.norm1")

    def fold_in(w: torch.Tensor, b: Optional[torch.Tensor]):
        w, b = w.detach().double(), b.detach().double() if b is not None else None
        if beta is not None:
            b = w @ beta + (b if b is not None else 0.0)
        if gamma is not None:
            w = w * gamma[None, :]
        return w, b

    w_v, b_v, w_o = (t.detach() if t is not None else None for t in attn.conv_weights())
    w_v, b_v = fold_in(w_v, b_v)
    w_o = w_o.double()
    b_o = attn.proj.bias.detach().double() if attn.proj.bias is not None else None
    ls = _timm.layer_scale_gamma(ls1, f"{name}.ls1")
    ls = ls.detach().double().reshape(-1) if ls is not None else None
    if ls is not None:
        w_o = w_o * ls[:, None]
        b_o = b_o * ls if b_o is not None else None
    tensors = {
        "value.weight": w_v, "value.bias": b_v, "conv_kernel": attn.depthwise_kernel().detach().double(),
        "out_proj.weight": w_o, "out_proj.bias": b_o,
    }
    if attn.qkv is not None:
        w_qkv, b_qkv = fold_in(attn.qkv.weight, attn.qkv.bias)
        cols = torch.as_tensor(_columns(attn.attn_heads, attn.head_dim), device=attn.proj.weight.device)
        w_ao = attn.proj.weight.detach().double().index_select(1, cols)
        if ls is not None:
            w_ao = w_ao * ls[:, None]
        tensors.update({"qkv.weight": w_qkv, "qkv.bias": b_qkv, "attn_proj.weight": w_ao})
    return dict(
        dim=dim,
        attn_heads=len(attn.attn_heads),
        head_dim=attn.head_dim,
        conv_width=w_v.shape[0],
        kernel_size=attn.kernel_size,
        grid_size=attn.grid_size,
        prefix_tokens=attn.prefix_tokens,
        # The folded bias: norm1's β gives qkv one even when the timm model had qkv_bias=False (keying this on
        # the original bias made the fused module's state dict refuse its own "qkv.bias").
        qkv_bias=tensors.get("qkv.bias") is not None,
        value_bias=b_v is not None,
        proj_bias=b_o is not None,
        norm_eps=norm_eps,
        tensors=tensors,
    )


def dwconv_heads(model: nn.Module) -> Dict[str, Tuple[int, ...]]:
    """{module path: replaced head indices} of every train-time `DWConvAttention` in `model`."""
    return {name: m.conv_heads for name, m in model.named_modules() if isinstance(m, DWConvAttention)}
