"""Attention-map distillation for non-deep ViTs (non-deep-vit-progressive-reparam, section 4): the loss is the MSE
between a teacher's attention maps and the student's branch-averaged maps.

    distill = AttentionDistillation(student, teacher)             # student: from_timm(..., branches=n)
    trainer = AttentionDistillTrainer(student, loader, distill=distill, distill_weight=1.0, total_steps=...)

or by hand, after a student forward on `images`: `loss = distill(images)`.

Layer pairing (the paper does not give one): student block i (of L_s) ↔ teacher block ⌈(i+1)·L_t/L_s⌉ − 1, the
last teacher layer of the group the student block replaces (L_t = 12, L_s = 6: teacher blocks 1, 3, 5, …, 11),
so each student map is matched with the teacher's map at the same depth of the residual stream.  Pass
`layer_map` to choose otherwise.  Teacher and student must have the same heads and tokens per map.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..._checks import check_nonnegative_weight
from ...training.trainer import Trainer
from ..distill.trainer import check_teacher_input
from .modules import NonDeepAttention

__all__ = ["teacher_attention_maps", "default_layer_map", "attention_map_loss", "AttentionDistillation",
           "AttentionDistillTrainer"]


def _teacher_attentions(teacher: nn.Module) -> List[nn.Module]:
    blocks = getattr(teacher, "blocks", None)
    attns = [getattr(b, "attn", None) for b in blocks] if isinstance(blocks, nn.Sequential) else []
    if not attns or any(a is None or not hasattr(a, "qkv") or not hasattr(a, "num_heads") for a in attns):
        raise ValueError(
            f"teacher: expected a timm VisionTransformer (blocks[i].attn with qkv and num_heads), got "
            f"{type(teacher).__name__}"
        )
    return attns


def _attention_map(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ · scale) of a timm Attention on its input x (the map timm's fused SDPA path never exposes)."""
    batch, tokens, _ = x.shape
    heads = attn.num_heads
    head_dim = attn.qkv.out_features // (3 * heads)
    q, k, _ = attn.qkv(x).reshape(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    # A fused teacher (vitfast.patch_timm / vitfast.load) runs SDPA's default scale and keeps no `scale`.
    scale = getattr(attn, "scale", None)
    scale = head_dim ** -0.5 if scale is None else scale
    return (q @ k.transpose(-1, -2) * scale).softmax(dim=-1)


def teacher_attention_maps(teacher: nn.Module, images: torch.Tensor) -> List[torch.Tensor]:
    """Every teacher block's attention maps [B, H, N, N] for `images`, in depth order, without gradients."""
    attns = _teacher_attentions(teacher)
    maps: Dict[int, torch.Tensor] = {}
    hooks = [a.register_forward_pre_hook(lambda m, args, i=i: maps.__setitem__(i, _attention_map(m, args[0])))
             for i, a in enumerate(attns)]
    try:
        with torch.no_grad():
            teacher(images)
    finally:
        for h in hooks:
            h.remove()
    return [maps[i] for i in range(len(attns))]


def default_layer_map(student_depth: int, teacher_depth: int) -> List[int]:
    """Student block i → teacher block ⌈(i+1)·L_t/L_s⌉ − 1 (module doc)."""
    if student_depth < 1 or teacher_depth < student_depth:
        raise ValueError(
            f"teacher_depth: expected >= the student's depth {student_depth}, got {teacher_depth}"
        )
    return [-(-(i + 1) * teacher_depth // student_depth) - 1 for i in range(student_depth)]


def attention_map_loss(student_maps: Sequence[torch.Tensor], teacher_maps: Sequence[torch.Tensor]) -> torch.Tensor:
    """Mean over the paired layers of MSE(student map, teacher map)."""
    if len(student_maps) != len(teacher_maps) or not student_maps:
        raise ValueError(
            f"teacher_maps: expected one map per student map ({len(student_maps)}), got {len(teacher_maps)}"
        )
    losses = []
    for i, (s, t) in enumerate(zip(student_maps, teacher_maps)):
        if s.shape != t.shape:
            raise ValueError(
                f"teacher_maps[{i}]: expected shape {list(s.shape)} (the student's [B, heads, N, N]), got {list(t.shape)}"
            )
        losses.append(F.mse_loss(s, t.to(s.dtype)))
    return torch.stack(losses).mean()


class AttentionDistillation:
    """Distil a teacher's attention maps into a non-deep student's branch-averaged maps (module doc).

    Turns on map recording in every `NonDeepAttention` of the student; `__call__(images)` must follow a student
    forward on the same images (it uses the maps recorded there) and runs the teacher itself (eval mode, no
    gradient).
    """

    def __init__(self, student: nn.Module, teacher: nn.Module, layer_map: Optional[Sequence[int]] = None) -> None:
        self.attentions = [m for m in student.modules() if isinstance(m, NonDeepAttention)]
        if not self.attentions:
            raise ValueError("student: expected a non-deep model (vitfast.convert.from_timm(..., branches=n)), "
                             "got no NonDeepAttention")
        depth = len(_teacher_attentions(teacher))
        check_teacher_input(teacher, student)
        if layer_map is None:
            layer_map = default_layer_map(len(self.attentions), depth)
        layer_map = list(layer_map)
        if len(layer_map) != len(self.attentions) or any(
            isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < depth for j in layer_map
        ):
            raise ValueError(
                f"layer_map: expected {len(self.attentions)} teacher block indices in [0, {depth}), got {layer_map!r}"
            )
        self.layer_map = layer_map
        self.teacher = teacher.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        for attn in self.attentions:
            attn.record_attention = True

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        student_maps = [a.attention_maps for a in self.attentions]
        if any(m is None for m in student_maps):
            raise ValueError("student: expected a forward pass with recorded attention maps before the loss, got none")
        teacher_maps = teacher_attention_maps(self.teacher, images)
        return attention_map_loss(student_maps, [teacher_maps[j] for j in self.layer_map])


class AttentionDistillTrainer(Trainer):
    """`Trainer` whose loss adds `distill_weight` × the attention-map distillation loss (logged "distill/attn")."""

    def __init__(self, *args, distill: AttentionDistillation, distill_weight: float = 1.0, **kwargs) -> None:
        if not isinstance(distill, AttentionDistillation):
            raise TypeError(f"distill: expected an AttentionDistillation, got {type(distill).__name__}")
        check_nonnegative_weight("distill_weight", distill_weight)
        super().__init__(*args, **kwargs)
        distill.teacher.to(self.device)  # as DistillTrainer does: the teacher runs on the student's device
        self.distill = distill
        self.distill_weight = float(distill_weight)

    def compute_loss(self, images: torch.Tensor, targets: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, float]]:
        total, logits, parts = super().compute_loss(images, targets)
        value = self.distill(images)
        parts["distill/attn"] = float(value.detach())
        return total + self.distill_weight * value, logits, parts
