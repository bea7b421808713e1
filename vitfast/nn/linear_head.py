"""The classifier head of a fused ViT on the vitfast GEMM (packed weight).

timm's head is an `nn.Linear` applied to one token per image (the cls token, or the pooled features), so at small
batch it is memory-bound: its weight (C × 1000 floats: 0.77 MB for DeiT-Ti, 3 MB for DeiT-B) comes from DRAM at
every forward.  `ops.linear` reads it from the packed panels with software prefetch: measured with the weight
evicted between calls (one thread, batch 1), F.linear 118.7 -> 52.1 µs at 192 → 1000 and 262.3 -> 114.7 µs at
768 → 1000.

`PackedLinear` is that nn.Linear with the same parameters and state-dict keys (checkpoints only record its kind,
"packed_linear"); on CPU it calls `ops.linear`, elsewhere (and under tracing: exported graphs keep the standard
op; or under VITFAST_BACKEND=reference) the nn.Linear itself.  Gradients work either way (`ops.linear` differentiates its reference).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .. import ops
from ._base import ConfigReader, cpu_kernel_applies
from .patch_embed import use_gemm_patch_projection
from .registry import register_fused


@register_fused("packed_linear")
class PackedLinear(nn.Linear):
    """An `nn.Linear` that runs on the CPU GEMM with its weight packed once (see the module doc)."""

    def vitfast_config(self) -> dict:
        return {"kind": self.vitfast_kind, "in_features": self.in_features, "out_features": self.out_features,
                "bias": self.bias is not None}

    @classmethod
    def from_vitfast_config(cls, cfg: dict, *, device=None, dtype=None) -> "PackedLinear":
        read = ConfigReader(cfg, "packed_linear", ("in_features", "out_features", "bias"))
        return cls(read.int("in_features"), read.int("out_features"), bias=read.bool("bias"), device=device,
                   dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu_kernel_applies(x, self.weight):
            return ops.linear(x, self.weight, self.bias)
        return super().forward(x)

    def vitfast_prepack(self) -> bool:
        """Pack the weight for the CPU GEMM now (see `vitfast.ops.prepack`); False when not on CPU."""
        if not self.weight.is_cpu or not ops.extension_loaded():
            return False
        ops.linear(self.weight.new_zeros(1, self.in_features), self.weight, self.bias)
        return True


def head_layers(model: nn.Module) -> list:
    """The plain `nn.Linear` classifier heads of a timm ViT / distilled DeiT / Swin (`head`, `head_dist`,
    `head.fc`), as (path, layer) pairs."""
    head = getattr(model, "head", None)
    candidates = [("head", head), ("head_dist", getattr(model, "head_dist", None)),
                  ("head.fc", getattr(head, "fc", None))]
    return [(path, layer) for path, layer in candidates if type(layer) is nn.Linear]


def use_packed_linear_head(model: nn.Module) -> int:
    """Turn the classifier heads of a timm ViT / distilled DeiT / Swin (`head`, `head_dist`, `head.fc`) into
    `PackedLinear` in place where they are plain `nn.Linear`; the parameters and keys stay the same objects.
    Returns how many it turned."""
    layers = head_layers(model)
    for _, layer in layers:
        layer.__class__ = PackedLinear
    return len(layers)


def use_gemm_stem_and_head(model: nn.Module) -> None:
    """What `vitfast.fuse` and `vitfast.patch_timm` do to the layers around the blocks: the patch Conv2d becomes a
    `GemmPatchProjection`, the classifier heads `PackedLinear` (same parameters and keys; each runs its torch
    layer wherever the CPU kernel cannot)."""
    use_gemm_patch_projection(model)
    use_packed_linear_head(model)
