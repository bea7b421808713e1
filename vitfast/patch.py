"""`vitfast.patch_timm(model)`: swap timm transformer blocks for vitfast's fused blocks, outputs unchanged.

Every timm ViT `Block` becomes `vitfast.nn.FusedBlock.from_timm(block)` (norm affines and LayerScale folded,
attention on scaled_dot_product_attention, FFN through `torch.ops.vitfast.channel_idle_ffn`), every
`SwinTransformerBlock` becomes `vitfast.nn.FusedSwinBlock.from_timm(block)`; the patch-embedding Conv2d becomes a
`GemmPatchProjection` and the classifier heads `PackedLinear`.  Other modules are untouched.  Each part has a switch
(`blocks=`, `patch_embed=`, `head=`, like Liger-Kernel's `apply_liger_kernel_to_*(rope=, swiglu=)`) and
`filter_fn(module, path)` picks single modules (like torchao's `quantize_(model, config, filter_fn=)`).

Patching is idempotent: what is already fused is left alone, so a second call changes nothing (its report lists
no path) instead of failing to find timm blocks.

The fused blocks are inference modules (no dropout, no drop-path, LayerScale folded), so patching a model in
training mode would silently change what it trains: it is refused — call `model.eval()` first.  All blocks are
converted before any is swapped in, so an unsupported block leaves the model exactly as it was.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

__all__ = ["PatchReport", "patch_timm"]


@dataclass(frozen=True)
class PatchReport:
    """What `patch_timm(..., return_report=True)` did: the patched model and the paths of the modules it replaced
    (in model order); false when it replaced none, as on a second call."""

    model: nn.Module
    replaced: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.replaced)


def patch_timm(model: nn.Module, inplace: bool = True, *, blocks: bool = True, patch_embed: bool = True,
               head: bool = True, filter_fn: Callable[[nn.Module, str], bool] | None = None,
               prepack: bool = True, return_report: bool = False):
    """Replace the timm blocks of `model` by fused vitfast blocks (`blocks`), its patch-embedding Conv2d by a
    `vitfast.nn.GemmPatchProjection` (the same conv run as one GEMM on CPU; `patch_embed`) and its classifier
    heads by `vitfast.nn.PackedLinear` (`head`); return the model (the same object if inplace), or with
    `return_report=True` a `PatchReport` of it and the replaced modules' paths.

    `filter_fn(module, path) -> bool`, if given, is asked about every module that would be replaced (a timm block,
    the patch Conv2d, a head) with its path in the model ("blocks.3", "patch_embed.proj", "head"); False keeps it.
    Modules that are already vitfast's are left alone: a second call replaces nothing.
    `prepack=True` packs the fused weights for the CPU kernels before returning (`vitfast.ops.prepack`).

    Raises ValueError if blocks are to be patched in a model in training mode, if the model contains neither a
    timm block nor a vitfast fused module (not a timm transformer), or if a block uses a feature the fused blocks
    cannot reproduce exactly (the message names the block and the feature).
    """
    from timm.models.swin_transformer import SwinTransformerBlock
    from timm.models.vision_transformer import Block as TimmBlock

    from .arch import remember_source
    from .nn.block import FusedBlock
    from .nn.linear_head import PackedLinear, head_layers
    from .nn.patch_embed import GemmPatchProjection, patch_projection
    from .nn.registry import is_fused_module
    from .nn.swin import FusedSwinBlock

    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(
            f"filter_fn: expected a callable (module, path) -> bool or None, got {type(filter_fn).__name__}"
        )
    if blocks and model.training:
        raise ValueError(
            "model: expected eval mode (fused blocks are inference-only: no dropout or drop-path), got training "
            "mode; call model.eval() first"
        )
    timm_blocks = {TimmBlock: FusedBlock, SwinTransformerBlock: FusedSwinBlock}
    # Exact types: subclasses may change the forward, and the fused blocks subclass SwinTransformerBlock themselves.
    if not any(type(m) in timm_blocks or is_fused_module(m) for m in model.modules()):
        raise ValueError(
            "model: expected a timm model containing vision_transformer.Block or SwinTransformerBlock modules, "
            f"found none in {type(model).__name__}"
        )

    def wanted(module: nn.Module, path: str) -> bool:
        return filter_fn is None or bool(filter_fn(module, path))

    target = model if inplace else copy.deepcopy(model)
    remember_source(target, model)  # before any block is replaced: the skeleton still says what the model is
    replacements = []
    if blocks:
        with torch.no_grad():
            for path, module in target.named_modules():
                fused_cls = timm_blocks.get(type(module))
                if not path or fused_cls is None or not wanted(module, path):
                    continue
                parent_path, _, child = path.rpartition(".")
                parent = target.get_submodule(parent_path) if parent_path else target
                replacements.append((path, parent, child, fused_cls.from_timm(module, name=path)))
    # The stem and heads change class only (same parameters and keys): nothing can fail once the blocks converted.
    retyped = []
    proj = patch_projection(target) if patch_embed else None
    if proj is not None and wanted(proj, "patch_embed.proj"):
        retyped.append(("patch_embed.proj", proj, GemmPatchProjection))
    if head:
        retyped += [(path, layer, PackedLinear) for path, layer in head_layers(target) if wanted(layer, path)]
    for _, parent, child, fused in replacements:
        setattr(parent, child, fused)
    for _, module, cls in retyped:
        module.__class__ = cls
    if prepack:
        from .ops import prepack as prepack_weights

        prepack_weights(target)  # also after a call that replaced nothing: weights changed since are packed now
    if not return_report:
        return target
    order = {path: i for i, (path, _) in enumerate(target.named_modules())}
    paths = [r[0] for r in replacements] + [r[0] for r in retyped]
    return PatchReport(target, tuple(sorted(paths, key=lambda p: order.get(p, len(order)))))
