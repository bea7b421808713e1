"""One registry of Vision Transformer shapes for every benchmark (STYLE.md: one shared registry).

Each entry is a timm/DeiT configuration at 224×224 with 16×16 patches: N = 14·14 + 1 (cls token) = 197
tokens.  `channel_idle_dims` gives the RePaViT FFN split for an idle ratio θ: A = ceil(hidden·(1 − θ))
activated channels and L = C linear ones (the folded idle path, RePaViT eq. 6), or L = 0 at θ = 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class VitShape:
    name: str
    width: int  # C (embed dim)
    depth: int
    heads: int
    mlp_ratio: int = 4
    tokens: int = 197  # 224/16 = 14 → 196 patches + cls

    @property
    def hidden(self) -> int:
        return self.mlp_ratio * self.width


VIT_SHAPES = {
    "deit_tiny": VitShape("DeiT-Ti", width=192, depth=12, heads=3),
    "deit_small": VitShape("DeiT-S", width=384, depth=12, heads=6),
    "deit_base": VitShape("DeiT-B", width=768, depth=12, heads=12),
    "vit_large": VitShape("ViT-L", width=1024, depth=24, heads=16),
}


def channel_idle_dims(shape: VitShape, theta: float) -> tuple[int, int]:
    """(A, L) of a channel-idle FFN with idle ratio θ."""
    active = math.ceil(shape.hidden * (1.0 - theta))
    linear = shape.width if theta > 0 else 0
    return active, linear


def channel_idle_ffn_flops(shape: VitShape, theta: float, batch: int) -> int:
    """2·M·C·(A + L) + 2·M·A·C for M = batch·tokens rows (the two GEMMs; GELU and adds not counted)."""
    active, linear = channel_idle_dims(shape, theta)
    rows = batch * shape.tokens
    return 2 * rows * shape.width * (active + linear) + 2 * rows * active * shape.width


def linear_layers(shape: VitShape, num_classes: int = 1000) -> dict:
    """(in, out, rows per image, has residual) of the dense layers a fused ViT block/head runs on `linear`."""
    c = shape.width
    return {
        "qkv": (c, 3 * c, shape.tokens, False),
        "proj": (c, c, shape.tokens, True),  # the block's shortcut fused as residual
        "head": (c, num_classes, 1, False),  # on the cls token only
    }


def linear_flops(k: int, n: int, rows: int) -> int:
    """2·M·K·N (bias and residual adds not counted)."""
    return 2 * rows * k * n


def attention_qkv(shape: VitShape, batch: int):
    """The attention benchmarks' input: qkv [B, N, 3·C] from N(0, 1), seeded (the same in every attention bench)."""
    import torch

    return torch.randn(batch, shape.tokens, 3 * shape.width, generator=torch.Generator().manual_seed(0))


def attention_flops(shape: VitShape, batch: int) -> int:
    """Q·Kᵀ and P·V: 4·B·H·N²·D (softmax not counted)."""
    head_dim = shape.width // shape.heads
    return 4 * batch * shape.heads * shape.tokens**2 * head_dim
