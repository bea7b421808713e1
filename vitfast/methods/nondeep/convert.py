"""Non-deep conversion: L timm blocks → L/n `NonDeepBlock`s of n parallel branches (consecutive layers side by side,
see `vitfast.convert.from_timm`), each FFN optionally channel-idle."""
from __future__ import annotations

from typing import Optional

import torch.nn as nn

from ..._copy import deepcopy_model
from ..dwconv.convert import remove_prefix_tokens
from ..repavit.convert import model_blocks, resolve_ratios
from ..repavit.modules import FFN_NORMS, HEURISTICS
from .modules import NonDeepBlock


def convert_timm(model: nn.Module, branches: int, channel_idle=0.0, norm: str = "layer", heuristic: str = "static", *,
                 spread: float = 0.25, schedule="linear", join_values: bool = False,
                 diversity_weight: float = 0.05, global_pool: Optional[str] = None) -> nn.Module:
    """The non-deep conversion of `vitfast.convert.from_timm(model, branches=n)` (see there for the options and the
    branch mapping); the argument is deep-copied, never modified.

    global_pool="avg": the class token is removed (its position-embedding row with it) and the head reads the mean
    of the patch tokens, as the paper fine-tunes (section 4: "global average pooled features replace the class
    token"); None / "token" keep the model's pooling.  The blocks attend over all tokens either way, so the
    collapse at λ = 1 and the fused model are the same algebra."""
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(model, VisionTransformer):
        raise ValueError(
            f"branches: only timm VisionTransformer models (ViT/DeiT) can be made non-deep, got {type(model).__name__}"
        )
    if isinstance(branches, bool) or not isinstance(branches, int) or branches < 2:
        raise ValueError(f"branches: expected an int >= 2, got {branches!r}")
    if global_pool not in (None, "token", "avg"):
        raise ValueError(f"global_pool: expected None, 'token' or 'avg', got {global_pool!r}")
    blocks = model_blocks(model)
    if len(blocks) % branches:
        raise ValueError(f"branches: expected a divisor of the model depth {len(blocks)}, got {branches}")
    if norm not in FFN_NORMS:
        raise ValueError(f"norm: expected one of {FFN_NORMS}, got {norm!r}")
    if heuristic not in HEURISTICS:
        raise ValueError(f"heuristic: expected one of {HEURISTICS}, got {heuristic!r}")
    depth = len(blocks) // branches
    ratios = resolve_ratios(channel_idle, depth, heuristic, spread)
    converted = deepcopy_model(model)
    timm_blocks = [block for _, _, block in model_blocks(converted)]
    new_blocks = [
        NonDeepBlock.from_timm_blocks(
            timm_blocks[g * branches:(g + 1) * branches],
            schedule=schedule,
            join_values=join_values,
            idle_ratio=ratio,
            ffn_norm=norm,
            diversity_weight=diversity_weight / depth,
            name=f"model blocks {g * branches}..{(g + 1) * branches - 1}",
        )
        for g, ratio in enumerate(ratios)
    ]
    converted.blocks = nn.Sequential(*new_blocks)
    if global_pool == "avg":
        remove_prefix_tokens(converted)
    reduction = getattr(converted.patch_embed, "patch_size", (1,))[0]
    converted.feature_info = [dict(module=f"blocks.{i}", num_chs=converted.embed_dim, reduction=reduction)
                              for i in range(depth)]
    return converted
