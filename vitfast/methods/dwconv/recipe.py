"""Drop-in depthwise-convolution heads in the train-time file format.

`describe_dwconv` / `build_dwconv` are the "dwconv" entry of `vitfast.io.describe_trainable` /
`build_trainable`: which blocks hold a `DWConvBlock`, which of their heads are convolutions, k, the token grid
and whether the heads are ensembled (eq. 12-13).  The rest of the model is described by what is already there:
the timm skeleton (`class_token=False, global_pool="avg"` once the cls token is removed, so the skeleton itself
rebuilds without it) and the channel-idle FFN of every block (a DW-conv conversion makes every FFN a
`ChannelIdleMlp`: θ = 0 with LayerNorm, timm's FFN exactly, unless `channel_idle` was given).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

if TYPE_CHECKING:
    import torch.nn as nn

__all__ = ["describe_dwconv", "build_dwconv"]


# ---------------------------------------------------------------------------------------------- file format
def describe_dwconv(model: nn.Module, architecture: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """The DW-conv part of a train-time model description, or None when `model` has no `DWConvBlock`.

    {"blocks": [{"path", "conv_heads", "kernel_size", "ensemble", "grid_size", "prefix_tokens", "kernel_form",
    "decay_gamma"}, ...]}: enough to rebuild every
    replaced block with `DWConvBlock.from_block` on the rebuilt channel-idle skeleton (the weights, kernels and
    γ are then overwritten from the file).  With `architecture` (describe_timm's dict), its num_heads, qkv_bias
    and proj_bias are taken from a DW-conv attention: when every block has one, describe_timm sees no timm
    Attention and would guess them.
    """
    from .modules import DWConvAttention, DWConvBlock

    blocks: List[Dict[str, Any]] = []
    for name, module in model.named_modules():
        if isinstance(module, DWConvBlock):
            attn = module.attn
            blocks.append({
                "path": name,
                "conv_heads": [int(h) for h in attn.conv_heads],
                "kernel_size": int(attn.kernel_size),
                "ensemble": bool(attn.ensemble),
                "grid_size": [int(g) for g in attn.grid_size],
                "prefix_tokens": attn.prefix_tokens,
                "kernel_form": attn.kernel_form,
                # γ's optimizer group: a resumed run must put γ where its optimizer state expects it
                "decay_gamma": bool(attn.decay_gamma),
            })
    stray = [name for name, m in model.named_modules()
             if isinstance(m, DWConvAttention) and not any(name == f"{b['path']}.attn" for b in blocks)]
    if stray:
        raise ValueError(f"model: expected DWConvAttention only inside DWConvBlocks (what the file format rebuilds), "
                         f"got it at {', '.join(stray[:5])}")
    if blocks and architecture is not None:
        attn = model.get_submodule(f"{blocks[0]['path']}.attn")
        architecture.setdefault("kwargs", {}).update(
            num_heads=int(attn.num_heads), qkv_bias=attn.value.bias is not None, proj_bias=attn.proj.bias is not None)
    return {"blocks": blocks} if blocks else None


def build_dwconv(model: nn.Module, desc: Dict[str, Any]) -> nn.Module:
    """Replace the blocks listed by `describe_dwconv` on a rebuilt skeleton whose blocks are `ChannelIdleBlock`s
    (`build_trainable` converts them first).  In place; returns the model."""
    from ...nn.dwconv import follow_patch_grid
    from ..repavit.modules import ChannelIdleBlock
    from .modules import DWConvBlock

    blocks = desc.get("blocks") if isinstance(desc, dict) else None
    if not blocks:
        raise ValueError(f"description['dwconv']['blocks']: expected at least one block, got {blocks!r}")
    for spec in blocks:
        path = spec["path"]
        parent, _, child = path.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        block = getattr(owner, child, None)  # ModuleList children are attributes named "0", "1", ...
        if not isinstance(block, ChannelIdleBlock) or isinstance(block, DWConvBlock):
            got = type(block).__name__ if block is not None else "nothing"
            raise ValueError(f"description['dwconv']: expected a ChannelIdleBlock at {path!r} to replace, got {got}")
        new = DWConvBlock.from_block(block, [int(h) for h in spec["conv_heads"]], tuple(spec["grid_size"]),
                                     kernel_size=int(spec["kernel_size"]), ensemble=bool(spec["ensemble"]),
                                     kernel_form=spec.get("kernel_form", "depthwise"),
                                     # files from before the option: γ was excluded from weight decay
                                     decay_gamma=bool(spec.get("decay_gamma", False)),
                                     prefix_tokens=spec.get("prefix_tokens"), name=path)
        setattr(owner, child, new)
    follow_patch_grid(model)
    return model


