"""Drop-in depthwise convolution for attention heads (dropin-depthwise-conv-attention, sections 2.2 and A.1).

A replaced head h keeps its value projection and its block of the output projection and trades the attention
map for a k×k depthwise convolution over the token grid (eq. 11):

    Ãtt_DW(X)^h = Conv_DW(V^h, K^h),   V^h = X W^V_h                  (K^h: one k×k filter per value channel)
    MhSA(X)     = Σ_(h attention) Att^h(X) W^O_h + Σ_(h replaced) Ãtt_DW(X)^h W^O_h + b^O

Blockwise replacement (all heads of a block) and mixed blocks (some heads attention, some convolution) are the
same module.  Head ensembling (eq. 12-13) collapses the replaced heads into one head of width d_h with softmax(γ)
weights: W^Ve = Σ_h σ(γ)_h W^V_h, W^Oe = Σ_h σ(γ)_h W^O_h, out = Conv_DW(X W^Ve, K^e) W^Oe.

Train-time modules (reference PyTorch, autograd): `DWConvAttention` (timm Attention's forward contract) and
`DWConvBlock` (a `ChannelIdleBlock` whose attention is a `DWConvAttention`, so it composes with the channel-idle
FFN: θ = 0 with the LayerNorm FFN is timm's block exactly).  `DWConvBlock.to_fused()` gives the registered
inference block `FusedDWConvBlock` ("dwconv_block"): norm1's affine folded into the value / qkv projections,
LayerScale into the output projection, the ensembling weights folded (exact: softmax(γ) is a constant at
inference), replaced heads on `torch.ops.vitfast.dwconv_attention`, the remaining heads on `ops.attention`.

Token grid: tokens are [prefix tokens, then the grid row-major], timm's layout; `grid_size` = (rows, cols) of
the patch grid (non-square grids work: 336×448 images with 16-pixel patches are 21×28).  The number of prefix
tokens is N − rows·cols.  `set_grid_size(model, grid)` changes it everywhere (another input resolution).  A model
built with timm's `dynamic_img_size` follows its input instead: `follow_patch_grid(model)` (installed by every
vitfast path that puts DW-conv modules into a ViT) sets the grid from the patch embedding's output at each forward.
Prefix tokens kept in the model (cls / registers) get, from a replaced head, the mean of its values over the
grid (see `vitfast.reference.dwconv_attention`); the paper removes the cls token instead and pools the mean of
the tokens (`vitfast.convert.remove_prefix_tokens`).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models.vision_transformer import Attention as TimmAttention
from timm.models.vision_transformer import Block as TimmBlock

from .. import ops, reference
from .._copy import deepcopy_model
from . import _timm
from ._fold import layernorm_affine
from .channel_idle import ChannelIdleBlock, ChannelIdleMlp
from .fused import FusedChannelIdleFFN, _ConfigReader, _layer_norm
from .registry import register_fused

__all__ = ["DWConvAttention", "DWConvBlock", "FusedDWConvBlock", "set_grid_size", "follow_patch_grid", "dwconv_heads"]


def _check_grid(grid_size, name: str = "grid_size") -> Tuple[int, int]:
    if (not isinstance(grid_size, (tuple, list)) or len(grid_size) != 2
            or any(isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in grid_size)):
        raise ValueError(f"{name}: expected (rows, cols), two ints >= 1, got {grid_size!r}")
    return int(grid_size[0]), int(grid_size[1])


def _check_prefix_tokens(prefix_tokens, name: str = "prefix_tokens") -> Optional[int]:
    if prefix_tokens is None:
        return None
    if isinstance(prefix_tokens, bool) or not isinstance(prefix_tokens, int) or prefix_tokens < 0:
        raise ValueError(f"{name}: expected None (not known) or an int >= 0 (cls and register tokens), "
                         f"got {prefix_tokens!r}")
    return int(prefix_tokens)


def _check_token_count(tokens: int, prefix_tokens: Optional[int], grid_size: Tuple[int, int]) -> None:
    """The tokens must be the prefix tokens plus the grid.  Without this a model built with timm's
    dynamic_img_size fed a larger image reads the extra patches as prefix tokens (they get the grid mean instead of
    their convolution: a silently wrong result)."""
    if prefix_tokens is None:
        return  # modules built without it (older files): the op still refuses fewer tokens than the grid
    rows, cols = grid_size
    expected = prefix_tokens + rows * cols
    if tokens != expected:
        raise ValueError(
            f"x: expected {expected} tokens ({prefix_tokens} prefix + a {rows}×{cols} patch grid), got {tokens}: the "
            f"input resolution is not the one this model's grid was set for; call "
            f"vitfast.nn.set_grid_size(model, (rows, cols)) with the new patch grid first")


def _check_kernel_size(kernel_size) -> int:
    if isinstance(kernel_size, bool) or not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size: expected an odd int >= 1 (a symmetric window Δ_k), got {kernel_size!r}")
    return kernel_size


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

    Kernel initialisation: Gaussian N(0, kernel_init_std²), default std = 1/k (the paper's appendix A.2.1
    initialises the kernels from a Gaussian; 1/k keeps the output variance of the k² taps equal to V's).
    `conv_kernel` and `gamma` are excluded from weight decay (appendix A.2.1; see `vitfast.train.param_groups`).
    """

    _no_weight_decay = ("conv_kernel", "gamma")
    vitfast_counts_prefix_tokens = True  # vitfast.convert.remove_prefix_tokens updates `prefix_tokens`

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
        self.grid_size = _check_grid(grid_size)
        self.prefix_tokens = _check_prefix_tokens(prefix_tokens)
        self.kernel_size = _check_kernel_size(kernel_size)
        self.ensemble = bool(ensemble)
        n_conv, n_attn = len(self.conv_heads), len(self.attn_heads)
        self.qkv = nn.Linear(dim, 3 * n_attn * head_dim, bias=qkv_bias, **dd) if n_attn else None
        self.value = nn.Linear(dim, n_conv * head_dim, bias=qkv_bias, **dd)
        width = head_dim if self.ensemble else n_conv * head_dim
        if kernel_init_std is not None and (isinstance(kernel_init_std, bool) or not isinstance(kernel_init_std, (int, float))
                                            or not math.isfinite(kernel_init_std) or kernel_init_std < 0):
            raise ValueError(f"kernel_init_std: expected None (1/k) or a finite number >= 0, got {kernel_init_std!r}")
        std = 1.0 / kernel_size if kernel_init_std is None else float(kernel_init_std)
        self.conv_kernel = nn.Parameter(torch.randn(width, kernel_size, kernel_size, **dd) * std)
        self.gamma = nn.Parameter(torch.zeros(n_conv, **dd)) if self.ensemble else None
        self.attn_drop = float(attn_drop)
        self.proj = nn.Linear(num_heads * head_dim, dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

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
            kernel_size=kernel_size, ensemble=ensemble, qkv_bias=attn.qkv.bias is not None,
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

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("attn_mask/is_causal: expected none (convolution heads have no mask), got a mask")
        batch, tokens, _ = x.shape
        _check_token_count(tokens, self.prefix_tokens, self.grid_size)
        rest = None
        if self.qkv is not None:
            n = len(self.attn_heads)
            q, k, v = self.qkv(x).reshape(batch, tokens, 3, n, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            a = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
            cols = torch.as_tensor(_columns(self.attn_heads, self.head_dim), device=x.device)
            rest = F.linear(a.transpose(1, 2).reshape(batch, tokens, n * self.head_dim),
                            self.proj.weight.index_select(1, cols))
        w_v, b_v, w_o = self.conv_weights()
        out = reference.dwconv_attention(x, w_v, b_v, self.conv_kernel, w_o, self.proj.bias, *self.grid_size, rest)
        return self.proj_drop(out)

    def extra_repr(self) -> str:
        return (f"conv_heads={list(self.conv_heads)}, attn_heads={list(self.attn_heads)}, head_dim={self.head_dim}, "
                f"kernel_size={self.kernel_size}, grid_size={self.grid_size}, prefix_tokens={self.prefix_tokens}, "
                f"ensemble={self.ensemble}")


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
                                             ensemble=ensemble, kernel_init_std=kernel_init_std,
                                             prefix_tokens=prefix_tokens, name=f"{name}.attn")
        new.ls1 = deepcopy_model(block.ls1)
        new.drop_path1 = deepcopy_model(block.drop_path1)
        new.mlp = mlp
        new.train(block.training)
        return new

    def to_fused(self, name: str = "block") -> "FusedDWConvBlock":
        """The exact fused `FusedDWConvBlock` (eval-mode function)."""
        return FusedDWConvBlock._from_parts(self.norm1, self.attn, self.ls1, self.mlp.to_fused(f"{name}.mlp"), name)


def _fold_dwconv_attention(norm1: nn.Module, attn: DWConvAttention, ls1: nn.Module, name: str) -> Dict[str, Any]:
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
        "value.weight": w_v, "value.bias": b_v, "conv_kernel": attn.conv_kernel.detach().double(),
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


@register_fused("dwconv_block")
class FusedDWConvBlock(nn.Module):
    """Fused ViT block with drop-in depthwise-convolution heads: a drop-in for timm's `Block` (`block(x) -> x`).

        x1 = x + attention heads (if any) + dwconv heads     (one `ops.attention` + two `ops.linear` for the
                                                              attention heads, one `ops.dwconv_attention`)
        out = mlp(x1)                                         (`FusedChannelIdleFFN`, owns its norm and shortcut)

    Children: `norm1` (LayerNorm without affine: folded), `qkv` / `attn_proj` (the remaining attention heads and
    their output columns; None when all heads are replaced), `value`, `conv_kernel`, `out_proj` (the replaced
    heads: value projection, [D, k, k] kernels, output columns with the block's output bias), `mlp`.
    The ensembled form is the same block with D = d_h.
    """

    vitfast_counts_prefix_tokens = True  # vitfast.convert.remove_prefix_tokens updates `prefix_tokens`

    def __init__(
        self,
        dim: int,
        attn_heads: int,
        head_dim: int,
        conv_width: int,
        kernel_size: int,
        grid_size: Tuple[int, int],
        mlp: FusedChannelIdleFFN,
        *,
        qkv_bias: bool = True,
        value_bias: bool = True,
        proj_bias: bool = True,
        norm_eps: float = 1e-6,
        prefix_tokens: Optional[int] = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if not isinstance(mlp, FusedChannelIdleFFN) or mlp.features != dim:
            raise ValueError(f"mlp: expected a FusedChannelIdleFFN over {dim} features, got {type(mlp).__name__}")
        self.dim = dim
        self.attn_heads = attn_heads
        self.head_dim = head_dim
        self.conv_width = conv_width
        self.kernel_size = _check_kernel_size(kernel_size)
        self.grid_size = _check_grid(grid_size)
        self.prefix_tokens = _check_prefix_tokens(prefix_tokens)
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps, elementwise_affine=False)
        self.qkv = nn.Linear(dim, 3 * attn_heads * head_dim, bias=qkv_bias, **dd) if attn_heads else None
        self.attn_proj = nn.Linear(attn_heads * head_dim, dim, bias=False, **dd) if attn_heads else None
        self.value = nn.Linear(dim, conv_width, bias=value_bias, **dd)
        self.conv_kernel = nn.Parameter(torch.zeros(conv_width, kernel_size, kernel_size, **dd))
        self.out_proj = nn.Linear(conv_width, dim, bias=proj_bias, **dd)
        self.mlp = mlp

    def set_grid_size(self, grid_size: Tuple[int, int]) -> None:
        self.grid_size = _check_grid(grid_size)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("attn_mask/is_causal: expected none (convolution heads have no mask), got a mask")
        _check_token_count(x.shape[-2], self.prefix_tokens, self.grid_size)
        xn = _layer_norm(self.norm1, x)  # the LayerNorm kernel on CPU, as in the other fused blocks
        shortcut = x
        if self.qkv is not None:
            heads = ops.attention(ops.linear(xn, self.qkv.weight, self.qkv.bias), self.attn_heads)
            shortcut = ops.linear(heads, self.attn_proj.weight, None, x)  # x + attention heads · W^O
        x = ops.dwconv_attention(xn, self.value.weight, self.value.bias, self.conv_kernel, self.out_proj.weight,
                                 self.out_proj.bias, self.grid_size[0], self.grid_size[1], shortcut)
        return self.mlp(x)

    def vitfast_prepack(self) -> bool:
        """Pack the attention-side weights for the CPU kernels now (see `vitfast.ops.prepack`; the FFN packs itself):
        one call of each op on a one-token 1×1 grid with the real weight tensors; False when not on CPU."""
        if self.value.weight.device.type != "cpu":
            return False
        x = self.value.weight.new_zeros(1, 1, self.dim)
        if self.qkv is not None:
            ops.linear(x, self.qkv.weight, self.qkv.bias)
            ops.linear(x.new_zeros(1, 1, self.attn_proj.in_features), self.attn_proj.weight, None)
        ops.dwconv_attention(x, self.value.weight, self.value.bias, self.conv_kernel, self.out_proj.weight,
                             self.out_proj.bias, 1, 1)
        return True

    # -------------------------------------------------------------------------------------- construction
    @classmethod
    def _from_parts(cls, norm1, attn: DWConvAttention, ls1, mlp: FusedChannelIdleFFN, name: str) -> "FusedDWConvBlock":
        folded = _fold_dwconv_attention(norm1, attn, ls1, name)
        tensors = folded.pop("tensors")
        device, dtype = attn.proj.weight.device, attn.proj.weight.dtype
        block = cls(
            folded["dim"], folded["attn_heads"], folded["head_dim"], folded["conv_width"], folded["kernel_size"],
            folded["grid_size"], mlp, qkv_bias=folded["qkv_bias"], value_bias=folded["value_bias"],
            proj_bias=folded["proj_bias"], norm_eps=folded["norm_eps"], prefix_tokens=folded["prefix_tokens"],
            device=device, dtype=dtype,
        )
        state = {k: v.to(dtype) for k, v in tensors.items() if v is not None}
        state.update({"mlp." + k: v for k, v in mlp.state_dict().items()})
        block.load_state_dict(state, strict=True)
        return block.eval()

    def vitfast_config(self) -> Dict[str, Any]:
        cfg = {
            "kind": self.vitfast_kind,
            "dim": self.dim,
            "attn_heads": self.attn_heads,
            "head_dim": self.head_dim,
            "conv_width": self.conv_width,
            "kernel_size": self.kernel_size,
            "grid_size": list(self.grid_size),
            "qkv_bias": self.qkv is not None and self.qkv.bias is not None,
            "value_bias": self.value.bias is not None,
            "proj_bias": self.out_proj.bias is not None,
            "norm_eps": float(self.norm1.eps),
            "mlp": self.mlp.vitfast_config(),
        }
        if self.prefix_tokens is not None:  # optional: files written before it load without the token check
            cfg["prefix_tokens"] = self.prefix_tokens
        return cfg

    @classmethod
    def from_vitfast_config(cls, cfg: Dict[str, Any], *, device=None, dtype=None) -> "FusedDWConvBlock":
        read = _ConfigReader(cfg, "dwconv_block", (
            "dim", "attn_heads", "head_dim", "conv_width", "kernel_size", "grid_size", "qkv_bias", "value_bias",
            "proj_bias", "norm_eps", "mlp", "prefix_tokens",
        ))
        kernel_size = read.int("kernel_size")
        if kernel_size % 2 == 0:
            raise ValueError(f"cfg['kernel_size']: expected an odd int >= 1, got {kernel_size}")
        return cls(
            read.int("dim"),
            read.int("attn_heads", minimum=0),
            read.int("head_dim"),
            read.int("conv_width"),
            kernel_size,
            read.pair("grid_size", 1),
            FusedChannelIdleFFN.from_vitfast_config(read.dict("mlp"), device=device, dtype=dtype),
            qkv_bias=read.bool("qkv_bias"),
            value_bias=read.bool("value_bias"),
            proj_bias=read.bool("proj_bias"),
            norm_eps=read.eps("norm_eps"),
            prefix_tokens=read.int("prefix_tokens", minimum=0, optional=True),
            device=device,
            dtype=dtype,
        )

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, attn_heads={self.attn_heads}, head_dim={self.head_dim}, conv_width={self.conv_width}, "
                f"kernel_size={self.kernel_size}, grid_size={self.grid_size}, prefix_tokens={self.prefix_tokens}")


def dwconv_heads(model: nn.Module) -> Dict[str, Tuple[int, ...]]:
    """{module path: replaced head indices} of every train-time `DWConvAttention` in `model`."""
    return {name: m.conv_heads for name, m in model.named_modules() if isinstance(m, DWConvAttention)}


class _PatchGridHook:
    """Forward hook on a timm ViT's `patch_embed`: under `dynamic_img_size` the embedding returns the patches as a
    grid (NHWC), whose (rows, cols) become the DW-conv modules' grid before the blocks run.  Counting tokens could
    not tell a 14×14 grid from a 7×28 one (both 196 patches), so a same-count image of another shape ran on the old
    grid, silently wrong.  It holds the root model, not its modules: a deepcopy (vitfast.fuse) maps it to the copy,
    and the fused blocks that replace the train-time ones are found at call time."""

    def __init__(self, root: nn.Module) -> None:
        self.root = root

    def __call__(self, module: nn.Module, args, output) -> None:
        if not isinstance(output, torch.Tensor) or output.dim() != 4:
            return  # a flattened [B, N, C] embedding: the fixed grid the modules were built on
        fmt = getattr(getattr(module, "output_fmt", None), "value", getattr(module, "output_fmt", None))
        if fmt == "NHWC":
            rows, cols = output.shape[1], output.shape[2]
        elif fmt == "NCHW":
            rows, cols = output.shape[2], output.shape[3]
        else:
            return
        if not (isinstance(rows, int) and isinstance(cols, int)):
            return  # symbolic sizes (torch.export): the traced graph keeps the grid the modules hold
        set_grid_size(self.root, (rows, cols))


def follow_patch_grid(model: nn.Module) -> bool:
    """Make the DW-conv modules of a timm ViT follow the input's patch grid when the model has `dynamic_img_size`
    (see `_PatchGridHook`); idempotent.  Returns False (nothing installed) for a model without a `patch_embed`.
    Without `dynamic_img_size` the embedding's output is flattened and the hook does nothing: the grid is fixed."""
    embed = getattr(model, "patch_embed", None)
    if not isinstance(embed, nn.Module):
        return False
    for key, hook in list(embed._forward_hooks.items()):
        if isinstance(hook, _PatchGridHook):
            del embed._forward_hooks[key]
    embed.register_forward_hook(_PatchGridHook(model))
    return True


def set_grid_size(model: nn.Module, grid_size: Tuple[int, int]) -> int:
    """Set the token grid (rows, cols) of every DW-conv module in `model` (another input resolution); returns how
    many modules were updated."""
    grid = _check_grid(grid_size)
    count = 0
    for m in model.modules():
        if isinstance(m, DWConvAttention):
            m.grid_size = grid
            count += 1
        elif isinstance(m, FusedDWConvBlock):
            m.set_grid_size(grid)
            count += 1
    return count
