"""DW-conv conversion: which heads of which blocks become convolutions (blockwise Σ_b or scattered Σ_h selection
from a `HeadRanking`), the cls-token removal of the paper's appendix A.3.2, and the block replacement."""
from __future__ import annotations

from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

import torch.nn as nn

from ...nn._timm import vit_block_spec
from ..repavit.convert import convert_timm as convert_repavit


# ------------------------------------------------------------------------------------------------ drop-in DW conv
def _dwconv_plan(depth: int, heads: int, dwconv_blocks, dwconv_heads, ranking) -> Dict[int, Tuple[int, ...]]:
    """{block index: replaced heads} from the blockwise and scattered requests (validated, merged)."""
    from ...io.head_ranking import HeadRanking

    def need_ranking(arg: str) -> "HeadRanking":
        if ranking is None:
            raise ValueError(f"{arg}: a count needs `ranking` (a HeadRanking, its dict or JSON path), got ranking=None")
        r = ranking
        if isinstance(r, (str, bytes)) or hasattr(r, "__fspath__"):
            r = HeadRanking.load(r)
        elif isinstance(r, dict):
            r = HeadRanking.from_dict(r)
        if not isinstance(r, HeadRanking):
            raise ValueError(f"ranking: expected a HeadRanking, its dict or a JSON path, got {type(r).__name__}")
        if r.num_blocks != depth or any(len(row) != heads for row in r.head_scores):
            raise ValueError(f"ranking: expected scores for {depth} blocks × {heads} heads (this model), got "
                             f"{r.num_blocks} blocks × {len(r.head_scores[0])} heads")
        return r

    plan: Dict[int, set] = {}
    if dwconv_blocks is not None:
        if isinstance(dwconv_blocks, int) and not isinstance(dwconv_blocks, bool):
            chosen = need_ranking("dwconv_blocks").select_blocks(dwconv_blocks)
        elif isinstance(dwconv_blocks, Sequence) and not isinstance(dwconv_blocks, (str, bytes)):
            chosen = list(dwconv_blocks)
        else:
            raise ValueError(f"dwconv_blocks: expected a block count or a list of block indices, got {dwconv_blocks!r}")
        for b in chosen:
            if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < depth:
                raise ValueError(f"dwconv_blocks: expected block indices in [0, {depth}), got {b!r}")
            plan.setdefault(b, set()).update(range(heads))
    if dwconv_heads is not None:
        if isinstance(dwconv_heads, int) and not isinstance(dwconv_heads, bool):
            pairs = [(b, h) for b, hs in need_ranking("dwconv_heads").select_heads(dwconv_heads).items() for h in hs]
        elif isinstance(dwconv_heads, Mapping):
            pairs = []
            for b, hs in dwconv_heads.items():
                if isinstance(hs, (str, bytes)) or not isinstance(hs, Iterable):
                    raise ValueError(f"dwconv_heads[{b!r}]: expected a list of head indices, got {hs!r}")
                pairs.extend((b, h) for h in hs)
        elif isinstance(dwconv_heads, Sequence) and not isinstance(dwconv_heads, (str, bytes)):
            pairs = []
            for p in dwconv_heads:
                if not isinstance(p, (tuple, list)) or len(p) != 2:
                    raise ValueError(f"dwconv_heads: expected (block, head) pairs, got {p!r}")
                pairs.append(tuple(p))
        else:
            raise ValueError(f"dwconv_heads: expected a head count, {{block: [heads]}} or (block, head) pairs, got "
                             f"{dwconv_heads!r}")
        for b, h in pairs:
            if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < depth:
                raise ValueError(f"dwconv_heads: expected block indices in [0, {depth}), got {b!r}")
            if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < heads:
                raise ValueError(f"dwconv_heads: expected head indices in [0, {heads}) (block {b}), got {h!r}")
            plan.setdefault(b, set()).add(h)
    return {b: tuple(sorted(hs)) for b, hs in sorted(plan.items()) if hs}


def remove_prefix_tokens(model: nn.Module) -> nn.Module:
    """Remove the cls token of a timm ViT in place, as the paper does for its convolutional heads (appendix A.3.2):
    its position embedding row goes with it and class-token pooling becomes the mean of the tokens ("avg").
    Register tokens (if any) stay; a distilled DeiT (dist token) is refused.  Returns the model."""
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(model, VisionTransformer):
        raise ValueError(f"model: expected a timm VisionTransformer, got {type(model).__name__}")
    if getattr(model, "dist_token", None) is not None:
        raise ValueError("model: a distilled DeiT's dist token cannot be removed (its head reads it), got one")
    if model.cls_token is None:
        return model
    if model.pos_embed is not None and not model.no_embed_class:
        # pos_embed rows: [cls, registers..., patches...] in timm's original layout; drop the cls row.
        model.pos_embed = nn.Parameter(model.pos_embed.detach()[:, 1:].clone(),
                                       requires_grad=model.pos_embed.requires_grad)
    model.cls_token = None
    model.has_class_token = False
    model.num_prefix_tokens -= 1
    if model.global_pool == "token":
        model.global_pool = "avg"
    # A 'prr' attention pool reads the cls token itself (pool 'token'); timm builds it with 'avg' for a model
    # without one, which is what the model now is.  ('map' pools' 'token' is their own latent query: kept.)
    import timm.layers

    prr = getattr(timm.layers, "AttentionPoolPrr", None)  # newer timm only
    attn_pool = getattr(model, "attn_pool", None)
    if prr is not None and isinstance(attn_pool, prr) and attn_pool.pool == "token":
        attn_pool.pool = "avg"
    # Everything else that counts the prefix tokens: timm's patch dropout (it kept the first patch as if it were
    # the cls token) and DW-conv heads already in the model (they refused every input as the wrong resolution).
    if hasattr(model.patch_drop, "num_prefix_tokens"):
        model.patch_drop.num_prefix_tokens = model.num_prefix_tokens
    for module in model.modules():
        if getattr(module, "vitfast_counts_prefix_tokens", False) and module.prefix_tokens is not None:
            module.prefix_tokens = int(model.num_prefix_tokens)
    return model


def _check_no_patch_dropout(model: nn.Module, name: str) -> None:
    """Convolution heads need the whole patch grid: timm's patch dropout (patch_drop_rate > 0) removes patches in
    training, which the first training forward refused with a misleading "input resolution" error."""
    rate = float(getattr(getattr(model, "patch_drop", None), "prob", 0.0) or 0.0)
    if rate > 0:
        raise ValueError(f"{name}: depthwise-convolution heads need every patch of the grid, but the model drops "
                         f"patches in training (patch_drop_rate = {rate}); build it with patch_drop_rate=0")


def convert_timm(model: nn.Module, channel_idle=None, norm: Optional[str] = None, heuristic: str = "static", *,
                 spread: float = 0.25, calibration_images=None, dwconv_blocks=None, dwconv_heads=None, ranking=None,
                 kernel_size: int = 3, ensemble: bool = False, kernel_init_std: Optional[float] = None,
                 remove_cls_token: bool = False, kernel_form: str = "depthwise") -> nn.Module:
    """Drop-in DW-conv conversion (`vitfast.convert.from_timm` with dwconv_blocks / dwconv_heads / remove_cls_token;
    see there for the options): the RePaViT conversion of every block (θ = 0 with LayerNorm, timm's FFN exactly,
    unless `channel_idle` is given), then the planned heads of the planned blocks become convolutions."""
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(model, VisionTransformer):
        given = "dwconv_blocks/dwconv_heads" if dwconv_blocks is not None or dwconv_heads is not None else "remove_cls_token"
        raise ValueError(f"{given}: only timm VisionTransformer models (ViT/DeiT), got {type(model).__name__}")
    if dwconv_blocks is not None or dwconv_heads is not None:  # removing the cls token alone keeps every patch
        _check_no_patch_dropout(model, "dwconv_blocks/dwconv_heads")
    depth = len(model.blocks)
    for i, block in enumerate(model.blocks):  # before any .attn access: parallel blocks have none
        vit_block_spec(block, f"model.blocks[{i}]")
    heads = model.blocks[0].attn.num_heads if depth else 0
    plan = _dwconv_plan(depth, heads, dwconv_blocks, dwconv_heads, ranking)
    if channel_idle is None:
        channel_idle, norm = 0.0, norm or "layer"
    converted = convert_repavit(model, channel_idle, norm, heuristic, spread=spread,
                                calibration_images=calibration_images)
    if remove_cls_token:
        remove_prefix_tokens(converted)
    return replace_dwconv_blocks(converted, plan, kernel_size=kernel_size, ensemble=ensemble,
                                 kernel_init_std=kernel_init_std, kernel_form=kernel_form)


def replace_dwconv_blocks(converted: nn.Module, plan: Mapping[int, Sequence[int]], *, kernel_size: int = 3,
                          ensemble: bool = False, kernel_init_std: Optional[float] = None,
                          kernel_form: str = "depthwise") -> nn.Module:
    """In place: block b of a converted ViT (ChannelIdleBlocks) becomes a `DWConvBlock` with the heads plan[b]
    replaced, on the model's patch grid and prefix-token count (kernel_form: "depthwise", eq. 11, or "full",
    eq. 9-10: see `DWConvAttention`)."""
    from ...nn.dwconv import follow_patch_grid
    from .modules import DWConvBlock

    grid = tuple(int(g) for g in converted.patch_embed.grid_size)
    for b, hs in plan.items():
        converted.blocks[b] = DWConvBlock.from_block(
            converted.blocks[b], hs, grid, kernel_size=kernel_size, ensemble=ensemble, kernel_form=kernel_form,
            kernel_init_std=kernel_init_std,
            prefix_tokens=int(converted.num_prefix_tokens), name=f"model block {b}",
        )
    follow_patch_grid(converted)  # under dynamic_img_size, the grid of each input (not only its token count)
    return converted
