"""Which timm architectures each method converts: `vitfast.list_models(pattern=None, method=None)`.

    vitfast.list_models("deit*")                      # {"repavit": [...], "nondeep": [...], ..., "distill": [...]}
    vitfast.list_models("*patch16_224", method="usdc") # the names alone

A name is listed when its model passes the checks the conversion itself makes: the class (ViT/DeiT, distilled DeiT,
Swin; the methods other than RePaViT and distillation take ViT/DeiT only), timm's plain blocks (pre-norm
LayerNorm, attention, Mlp with the exact GELU) and an architecture vitfast can describe and rebuild.  The skeleton
is built on the meta device (no weights are allocated or downloaded) once per name and process; only the timm
modules that hold these classes are looked at, so a pattern that narrows the names keeps it quick.
"""
from __future__ import annotations

import functools
import warnings
from typing import Dict, List, Optional, Sequence, Union

__all__ = ["list_models", "METHODS"]

# the timm modules whose entry points build the classes vitfast converts (vitfast.arch.SUPPORTED_CLASSES)
_TIMM_MODULES = ("vision_transformer", "deit", "swin_transformer")
_VIT = ("VisionTransformer", "VisionTransformerDistilled")
_SWIN = ("SwinTransformer",)
# method -> the timm classes its conversion takes (see each method's convert_timm)
METHODS: Dict[str, tuple] = {
    "repavit": _VIT + _SWIN,   # from_timm(model, channel_idle=...)
    "nondeep": _VIT,           # from_timm(model, branches=n), n a divisor of the depth
    "dwconv": _VIT,            # from_timm(model, dwconv_blocks=... / dwconv_heads=...)
    "usdc": _VIT,              # from_timm(model, gates=True)
    "distill": _VIT + _SWIN,   # vitfast.methods.distill.make_student(teacher, ...)
}


@functools.lru_cache(maxsize=None)
def _architecture(name: str) -> Optional[tuple]:
    """(class name, depth) of the timm model `name` when vitfast converts it, else None."""
    import timm
    import torch

    from .arch import describe_timm
    from .nn._timm import swin_block_spec, vit_block_spec

    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            model = timm.create_model(name, pretrained=False)
        describe_timm(model)
        cls = type(model).__name__
        if cls in _SWIN:
            blocks = [block for stage in model.layers for block in stage.blocks]
            for i, block in enumerate(blocks):
                swin_block_spec(block, f"block {i}")
        else:
            blocks = list(model.blocks)
            for i, block in enumerate(blocks):
                vit_block_spec(block, f"block {i}")
    except Exception:  # noqa: BLE001 - any refusal (or a model timm cannot build on meta) means "not listed"
        return None
    return cls, len(blocks)


def _supports(method: str, arch: Optional[tuple]) -> bool:
    if arch is None or arch[0] not in METHODS[method]:
        return False
    if method == "nondeep":  # n ≥ 2 parallel branches per block, n dividing the depth (at worst n = depth)
        return arch[1] >= 2
    return True


def list_models(pattern: Union[str, Sequence[str], None] = None,
                method: Optional[str] = None) -> Union[Dict[str, List[str]], List[str]]:
    """The timm model names each method converts, sorted as timm sorts them.

    pattern: a wildcard pattern (or several) as `timm.list_models` takes them, e.g. "deit*" or "*patch16_224".
    method: one of METHODS ("repavit", "nondeep", "dwconv", "usdc", "distill") -> that method's list alone;
        None -> {method: names} for all of them.
    """
    import timm
    from timm.models import get_arch_name
    from timm.models._registry import _model_to_module

    if method is not None and method not in METHODS:
        raise ValueError(f"method: expected one of {tuple(METHODS)}, got {method!r}")
    names = [n for n in timm.list_models(pattern or "") if _model_to_module.get(get_arch_name(n)) in _TIMM_MODULES]
    methods = [method] if method is not None else list(METHODS)
    found = {m: [n for n in names if _supports(m, _architecture(n))] for m in methods}
    return found[method] if method is not None else found
