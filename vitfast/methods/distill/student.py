"""Shallower students of a timm ViT/DeiT or Swin teacher (swin-distillation-compression, Algorithm 1).

    student = make_student(swin_t, depths=[2, 2, 2, 2])        # Swin-T [2,2,6,2] -> Swin-N, first 6 blocks copied
    student = make_student(vit, depth=6)                        # 12 -> 6 blocks, first 5 copied (default cut)
    scratch = make_student(vit, depth=6, init="random")         # the same architecture, nothing copied

What `make_student` does (Algorithm 1, lines 2-3, exactly):

    S      <- CreateNetworkLike(Compose(T[:p1], T[p2:]))
    S[:p1] <- CopyWeights(T[:p1])

The teacher T is read as a sequence of transformer blocks (Swin: stage by stage, the patch merging that opens a
stage belonging to that stage's first block; ViT: blocks[0..L)), preceded by its stem (patch embedding, class
and register tokens, position embedding, pre-norm) and followed by its final norm and classifier head.  Two
cut points p1 <= p2 split the blocks: F = stem + T[:p1] is kept, G = T[p1:] + norm + head is replaced by a
shorter Ĝ shaped like T[p2:] + norm + head.  So S is a fresh timm model of the same family and widths with
p2 - p1 fewer blocks; its F part gets the teacher's weights (every tensor: parameters, BatchNorm statistics,
relative-position tables), and everything in Ĝ — blocks, final norm and head included — keeps the fresh timm
initialisation (the paper: "the weights after the cut point need to be trained"), drawn from a generator seeded
with `seed`.  `init="random"` skips the copy (the "Random Initialization" rows of Table IX).

Choosing the cut.  Swin: exactly one stage may be shallower (the paper shrinks stage 3: [2,2,6,2] -> [2,2,2,2]
or [2,2,4,2]); p1 is the end of the kept part of that stage — by default all of the student's blocks there
(Swin-N: p1 = 2+2+2 = 6, p2 = 10; Ĝ = the last stage, its patch merging, norm and head) — and `cut` (blocks
copied in that stage) may lower it.  ViT: p1 = `cut` (default: depth − max(1, depth // 4), so Ĝ is the last
quarter of the student's blocks, at least one, like Swin-N's last stage), p2 = teacher depth − (depth − p1).

Only plain timm models (VisionTransformer, VisionTransformerDistilled, SwinTransformer) can be teachers here;
convert the student afterwards for the other methods (`vitfast.convert.from_timm(student, channel_idle=...)`).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import torch
import torch.nn as nn

from ...arch import build_timm, describe_timm

__all__ = ["make_student", "student_cut"]


def _is_swin(model: nn.Module) -> bool:
    from timm.models.swin_transformer import SwinTransformer

    return isinstance(model, SwinTransformer)


def _check_plain_timm(teacher: nn.Module) -> Dict[str, Any]:
    from ...nn.registry import is_fused_module

    odd = [n for n, m in teacher.named_modules() if callable(getattr(m, "to_fused", None)) or is_fused_module(m)]
    if odd:
        raise ValueError(
            f"teacher: expected a plain timm ViT/Swin (build the student before converting it), got vitfast modules "
            f"at {', '.join(odd[:3])}"
        )
    try:
        return describe_timm(teacher)
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"teacher: expected a timm VisionTransformer or SwinTransformer ({exc})") from exc


def student_cut(teacher: nn.Module, *, depth: Optional[int] = None, depths: Optional[Sequence[int]] = None,
                cut: Optional[int] = None) -> Dict[str, Any]:
    """The cut points of Algorithm 1 for this teacher and student shape (module doc) -> {"p1", "p2", ...}.

    Block indices are global (Swin: counted across stages).  Also returned: "student_depths" (Swin) or
    "student_depth" (ViT), and for Swin "stage" (the shallower stage) and "kept_in_stage".
    """
    if _is_swin(teacher):
        if depths is None or depth is not None:
            raise ValueError("depths: expected the student's per-stage depths for a Swin teacher (and no depth)")
        t_depths = [len(stage.blocks) for stage in teacher.layers]
        if isinstance(depths, (str, bytes)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in depths):
            raise ValueError(f"depths: expected integer block counts per stage, got {depths!r}")
        depths = [int(d) for d in depths]
        if len(depths) != len(t_depths):
            raise ValueError(f"depths: expected {len(t_depths)} stages like the teacher {t_depths}, got {depths}")
        diff = [i for i, (s, t) in enumerate(zip(depths, t_depths)) if s != t]
        if len(diff) != 1 or depths[diff[0]] > t_depths[diff[0]] or depths[diff[0]] < 1:
            raise ValueError(
                f"depths: expected the teacher's {t_depths} with exactly one stage made shallower (at least one "
                f"block left), got {depths}"
            )
        stage = diff[0]
        kept = depths[stage] if cut is None else cut
        if isinstance(kept, bool) or not isinstance(kept, int) or not 0 <= kept <= depths[stage]:
            raise ValueError(f"cut: expected 0 <= cut <= {depths[stage]} (blocks copied in stage {stage}), got {cut!r}")
        p1 = sum(t_depths[:stage]) + kept
        p2 = p1 + t_depths[stage] - depths[stage]
        return {"p1": p1, "p2": p2, "student_depths": depths, "stage": stage, "kept_in_stage": kept}
    if depth is None or depths is not None:
        raise ValueError("depth: expected the student's block count for a ViT teacher (and no depths)")
    t_depth = len(teacher.blocks)
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth < t_depth:
        raise ValueError(f"depth: expected an integer in [1, {t_depth}) (fewer blocks than the teacher), got {depth!r}")
    p1 = depth - max(1, depth // 4) if cut is None else cut
    if isinstance(p1, bool) or not isinstance(p1, int) or not 0 <= p1 <= depth:
        raise ValueError(f"cut: expected an integer in [0, {depth}] (blocks copied), got {cut!r}")
    return {"p1": p1, "p2": t_depth - (depth - p1), "student_depth": depth}


def _in_front(key: str, info: Dict[str, Any], swin: bool) -> bool:
    """Does state-dict `key` belong to F = stem + T[:p1] (module doc)?"""
    parts = key.split(".")
    if swin:
        if parts[0] == "patch_embed":
            return True
        if parts[0] != "layers":
            return False  # final norm, head
        s = int(parts[1])
        if s != info["stage"]:
            return s < info["stage"]
        if parts[2] == "downsample":  # the patch merging opens the stage: before its first block
            return True
        return parts[2] == "blocks" and int(parts[3]) < info["kept_in_stage"]
    if parts[0] in ("patch_embed", "cls_token", "reg_token", "pos_embed", "norm_pre", "dist_token"):
        return True
    return parts[0] == "blocks" and int(parts[1]) < info["p1"]


def make_student(
    teacher: nn.Module,
    *,
    depth: Optional[int] = None,
    depths: Optional[Sequence[int]] = None,
    cut: Optional[int] = None,
    init: str = "copy",
    seed: int = 0,
    **timm_kwargs: Any,
) -> nn.Module:
    """Algorithm 1, lines 2-3: a shallower student whose first p1 blocks (and stem) are the teacher's (module doc).

    Args:
        teacher: a plain timm VisionTransformer / VisionTransformerDistilled / SwinTransformer (fine-tuned).
        depth: ViT student block count.   depths: Swin student per-stage depths.
        cut: ViT: p1, blocks copied; Swin: blocks copied in the shallower stage (defaults in the module doc).
        init: "copy" (Algorithm 1) or "random" (same student, nothing copied: the from-scratch baseline).
        seed: seeds Ĝ's initialisation (and everything's, for init="random").
        timm_kwargs: more constructor arguments for the student (e.g. drop_path_rate=0.1).
    Returns the student on the teacher's device and dtype, in training mode, with `student.distill_cut` = the
    `student_cut` dict plus {"init": init, "copied": number of tensors copied}.
    """
    if init not in ("copy", "random"):
        raise ValueError(f"init: expected 'copy' or 'random', got {init!r}")
    desc = _check_plain_timm(teacher)
    swin = _is_swin(teacher)
    info = student_cut(teacher, depth=depth, depths=depths, cut=cut)
    kwargs = dict(desc["kwargs"])
    if swin:
        kwargs["depths"] = info["student_depths"]
    else:
        kwargs["depth"] = info["student_depth"]
    bad = sorted(k for k in timm_kwargs if k in ("depth", "depths"))
    if bad:
        raise ValueError(f"timm_kwargs: {bad} are set by depth/depths, not by extra arguments")
    kwargs.update(timm_kwargs)
    ref = next(teacher.parameters())
    with torch.random.fork_rng(devices=[ref.device.index or 0] if ref.is_cuda else []):
        torch.manual_seed(seed)
        student = build_timm({**desc, "kwargs": kwargs}, device=ref.device)
        # build_timm skips timm's initialisation (it expects weights to be loaded); Ĝ needs it: timm's own init
        student.weight_init_mode = ""
        student.init_weights("")
    student.to(dtype=ref.dtype)
    copied = 0
    if init == "copy":
        t_state = teacher.state_dict()
        s_state = student.state_dict()
        front = {}
        for key, value in s_state.items():
            if not _in_front(key, info, swin):
                continue
            t_key = key  # F keeps its paths: the blocks before the cut have the same index in teacher and student
            if t_key not in t_state or t_state[t_key].shape != value.shape:
                raise ValueError(f"teacher: expected {t_key} of shape {list(value.shape)} to copy into the student, "
                                 f"got {list(t_state[t_key].shape) if t_key in t_state else 'none'}")
            front[key] = t_state[t_key]
        with torch.no_grad():
            for key, value in front.items():
                s_state[key].copy_(value)
        copied = len(front)
    student.distill_cut = {**info, "init": init, "copied": copied}
    return student.train()

