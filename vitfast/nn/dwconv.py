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

from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn

from .. import ops
from ._base import ConfigReader, apply_norm
from .ffn import FusedChannelIdleFFN
from .registry import register_fused

__all__ = ["DWConvAttention", "DWConvBlock", "FusedDWConvBlock", "set_grid_size", "follow_patch_grid", "dwconv_heads"]


def check_grid(grid_size, name: str = "grid_size") -> Tuple[int, int]:
    if (not isinstance(grid_size, (tuple, list)) or len(grid_size) != 2
            or any(isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in grid_size)):
        raise ValueError(f"{name}: expected (rows, cols), two ints >= 1, got {grid_size!r}")
    return int(grid_size[0]), int(grid_size[1])


def check_prefix_tokens(prefix_tokens, name: str = "prefix_tokens") -> Optional[int]:
    if prefix_tokens is None:
        return None
    if isinstance(prefix_tokens, bool) or not isinstance(prefix_tokens, int) or prefix_tokens < 0:
        raise ValueError(f"{name}: expected None (not known) or an int >= 0 (cls and register tokens), "
                         f"got {prefix_tokens!r}")
    return int(prefix_tokens)


def check_token_count(tokens: int, prefix_tokens: Optional[int], grid_size: Tuple[int, int]) -> None:
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


def check_kernel_size(kernel_size) -> int:
    if isinstance(kernel_size, bool) or not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size: expected an odd int >= 1 (a symmetric window Δ_k), got {kernel_size!r}")
    return kernel_size


def _linear(layer: nn.Module, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """An nn.Linear on the linear op; an int8 model's Int8Linear (vitfast.nn.int8) runs itself."""
    if type(layer) is nn.Linear:
        return ops.linear(x, layer.weight, layer.bias, residual)
    return layer(x, residual)


@register_fused("dwconv_block")
class FusedDWConvBlock(nn.Module):
    """Fused ViT block with drop-in depthwise-convolution heads: a drop-in for timm's `Block` (`block(x) -> x`).

        x1 = x + attention heads (if any) + dwconv heads     (one `ops.attention` + two `ops.linear` for the
                                                              attention heads, one `ops.dwconv_attention`; in an
                                                              int8 model value → `ops.dwconv_heads` → out_proj)
        out = mlp(x1)                                         (`FusedChannelIdleFFN`, owns its norm and shortcut)

    Children: `norm1` (LayerNorm without affine: folded), `qkv` / `attn_proj` (the remaining attention heads and
    their output columns; None when all heads are replaced), `value`, `conv_kernel`, `out_proj` (the replaced
    heads: value projection, [D, k, k] kernels, output columns with the block's output bias), `mlp`.
    The ensembled form is the same block with D = d_h.
    """

    vitfast_counts_prefix_tokens = True  # vitfast.convert.remove_prefix_tokens updates `prefix_tokens`
    vitfast_token_grid = True  # set_grid_size / follow_patch_grid update its grid

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
        self.kernel_size = check_kernel_size(kernel_size)
        self.grid_size = check_grid(grid_size)
        self.prefix_tokens = check_prefix_tokens(prefix_tokens)
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps, elementwise_affine=False)
        self.qkv = nn.Linear(dim, 3 * attn_heads * head_dim, bias=qkv_bias, **dd) if attn_heads else None
        self.attn_proj = nn.Linear(attn_heads * head_dim, dim, bias=False, **dd) if attn_heads else None
        self.value = nn.Linear(dim, conv_width, bias=value_bias, **dd)
        self.conv_kernel = nn.Parameter(torch.zeros(conv_width, kernel_size, kernel_size, **dd))
        self.out_proj = nn.Linear(conv_width, dim, bias=proj_bias, **dd)
        self.mlp = mlp

    def set_grid_size(self, grid_size: Tuple[int, int]) -> None:
        self.grid_size = check_grid(grid_size)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("attn_mask/is_causal: expected none (convolution heads have no mask), got a mask")
        check_token_count(x.shape[-2], self.prefix_tokens, self.grid_size)
        xn = apply_norm(self.norm1, x)  # the LayerNorm kernel on CPU, as in the other fused blocks
        shortcut = x
        if self.qkv is not None:
            heads = ops.attention(_linear(self.qkv, xn), self.attn_heads)
            shortcut = _linear(self.attn_proj, heads, x)  # x + attention heads · W^O
        value, out_proj = self.value, self.out_proj
        if type(value) is nn.Linear and type(out_proj) is nn.Linear:
            x = ops.dwconv_attention(xn, value.weight, value.bias, self.conv_kernel, out_proj.weight, out_proj.bias,
                                     self.grid_size[0], self.grid_size[1], shortcut)
        else:  # an int8 model's (vitfast.quantize): value GEMM → the heads on the values → output GEMM
            u = ops.dwconv_heads(_linear(value, xn), self.conv_kernel, self.grid_size[0], self.grid_size[1])
            x = _linear(out_proj, u, shortcut)
        return self.mlp(x)

    def vitfast_prepack(self) -> bool:
        """Pack the attention-side weights for the CPU kernels now (see `vitfast.ops.prepack`; the FFN packs itself):
        one call of each op on a one-token 1×1 grid with the real weight tensors; False when not on CPU or when an
        int8 model's layers are in (they pack on first use)."""
        if any(type(m) not in (nn.Linear, type(None)) for m in (self.qkv, self.attn_proj, self.value, self.out_proj)):
            return False
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
    def from_folded(cls, folded: Dict[str, Any], mlp: FusedChannelIdleFFN, *, device=None,
                    dtype=None) -> "FusedDWConvBlock":
        """The fused block from a folded attention (`vitfast.methods.dwconv.fold_dwconv_attention`: sizes, flags and
        float64 "tensors") and an already fused FFN, in the train-time block's `device` and `dtype`."""
        folded = dict(folded)
        tensors = folded.pop("tensors")
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
        read = ConfigReader(cfg, "dwconv_block", (
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
    (see `_PatchGridHook`); idempotent.  Returns whether the hook is installed: not for a model without a
    `patch_embed`, nor for one whose embedding flattens its output (no `dynamic_img_size`: the grid is fixed, and
    the hook would do nothing but make every forward run the embedding as a hooked module)."""
    embed = getattr(model, "patch_embed", None)
    if not isinstance(embed, nn.Module):
        return False
    for key, hook in list(embed._forward_hooks.items()):
        if isinstance(hook, _PatchGridHook):
            del embed._forward_hooks[key]
    if getattr(embed, "flatten", False):
        return False
    embed.register_forward_hook(_PatchGridHook(model))
    return True


def set_grid_size(model: nn.Module, grid_size: Tuple[int, int]) -> int:
    """Set the token grid (rows, cols) of every DW-conv module in `model` (another input resolution); returns how
    many modules were updated."""
    grid = check_grid(grid_size)
    count = 0
    for m in model.modules():
        if getattr(m, "vitfast_token_grid", False):  # DWConvAttention (train-time), FusedDWConvBlock
            m.set_grid_size(grid)
            count += 1
    return count
