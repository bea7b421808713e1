"""The DW-conv paper's second-stage variant with a frozen backbone (appendix A.3.1, Table A.1): after the heads are
replaced, only the replaced heads train.

Table A.1 trains 25.3M of ViT-L's 284.4M parameters with 12 of 24 blocks replaced: 12 × (W^V and W^O of the block
with their biases, 1024² + 1024 each, plus the 3×3 kernels, 1024·9) = 25.30M.  So the stage trains, per replaced
block, the value projection of the replaced heads, the output projection, the convolution kernels (and γ when
ensembled), and nothing else — not the decoder/classifier either.
"""
from __future__ import annotations

from typing import List, Sequence

import torch.nn as nn

from .modules import DWConvAttention

__all__ = ["freeze_backbone", "set_gamma_weight_decay"]


def freeze_backbone(model: nn.Module, keep_trainable: Sequence[str] = ()) -> List[str]:
    """Freeze every parameter of `model` (requires_grad = False) except those of its convolution heads: each
    `DWConvAttention`'s `value`, `conv_kernel`, `gamma` and `proj` (appendix A.3.1).  In place; returns the names
    left trainable.

    A block with attention heads left (scattered selection) shares `proj` between its attention and convolution
    heads: the whole projection trains, its attention heads' columns included (requires_grad is per tensor).
    keep_trainable: parameter-name prefixes left trainable as well (e.g. ("head",) for a classifier on a new
    label set; the paper's stage trains none).  BatchNorm running statistics (RePaViT FFNs, norm="batch") still
    follow the data in train mode; put those modules in eval mode to freeze them too.
    """
    if isinstance(keep_trainable, str) or not all(isinstance(k, str) and k for k in keep_trainable):
        raise ValueError(f"keep_trainable: expected a sequence of parameter-name prefixes, got {keep_trainable!r}")
    heads = [(name, m) for name, m in model.named_modules() if isinstance(m, DWConvAttention)]
    if not heads:
        raise ValueError("model: expected DW-conv heads (DWConvAttention) to leave trainable, got none: convert with "
                         "dwconv_blocks/dwconv_heads first")
    names = {n for n, _ in model.named_parameters()}
    for prefix in keep_trainable:
        if not any(n == prefix or n.startswith(prefix + ".") for n in names):
            raise ValueError(f"keep_trainable: expected a prefix of the model's parameter names, got {prefix!r}")
    trainable = set()
    for path, attn in heads:
        pre = f"{path}." if path else ""
        trainable.update(n for n, _ in attn.value.named_parameters(prefix=f"{pre}value"))
        trainable.update(n for n, _ in attn.proj.named_parameters(prefix=f"{pre}proj"))
        trainable.add(f"{pre}conv_kernel")
        if attn.gamma is not None:
            trainable.add(f"{pre}gamma")
    for n in names:
        if any(n == p or n.startswith(p + ".") for p in keep_trainable):
            trainable.add(n)
    for n, p in model.named_parameters():
        p.requires_grad_(n in trainable)
    return sorted(trainable)


def set_gamma_weight_decay(model: nn.Module, decay: bool) -> int:
    """γ (head-ensembling weights, eq. 12) of every `DWConvAttention` in `model`: decayed (`decay=True`, the paper's
    rule, appendix A.2.1: only the kernels are excluded) or excluded from weight decay (`decay=False`, vitfast's
    earlier rule).  Set it before the optimizer is built; in place; returns the number of heads modules set."""
    if not isinstance(decay, bool):
        raise ValueError(f"decay: expected True or False, got {decay!r}")
    found = [m for m in model.modules() if isinstance(m, DWConvAttention)]
    for m in found:
        m.decay_gamma = decay
    return len(found)
