"""The USDC recipe on the scikit-learn digits, end to end (`vitfast usdc`): the batch-size consistency study.

    pretrain a small ViT  →  convert (gates + static α, resource loss f_t)  →  stage 1 (search + static)
      →  prune (stage 2 shapes)  →  stage 2 fine-tune under the gates  →  fuse  →  accuracy at inference
      batch sizes 1, 8, 64 (USDC appendix B, Fig. 4), per training gate level (group / batch / sample)

Everything is seeded: one command reproduces the numbers on the same machine and torch version.  The baseline
is trained once and shared by every gate level, so the levels differ only in how their gates were trained.
The fused model runs batch-level gates (one decision per inference batch), which is exactly what changes with
the batch size.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .._copy import deepcopy_model

__all__ = ["run_usdc_study", "accuracy_at_batch_sizes", "full_batches", "STUDY_MODEL"]

# The demo's digits ViT (vitfast.demos.demo.DEMO_MODEL): 32×32 input, 8×8 patches (16 tokens + cls), width 96, 4 blocks.
STUDY_MODEL = dict(img_size=32, patch_size=8, embed_dim=96, depth=4, num_heads=4, mlp_ratio=4.0, num_classes=10)


def _sub_block_macs(model: nn.Module, tokens: int) -> List[List[float]]:
    """[MHSA, FFN] multiply-adds per image of every FusedGatedBlock (0 for a pruned sub-block)."""
    from ..nn.gated import FusedGatedBlock

    out = []
    for block in model.modules():
        if not isinstance(block, FusedGatedBlock):
            continue
        attn = 0.0
        if block.attn is not None:
            width = block.attn.num_heads * block.attn.head_dim
            attn = float(tokens * (3 * block.dim * width + 2 * tokens * width + width * block.dim))
        ffn = 0.0
        if block.mlp is not None:
            ffn = float(tokens * (block.mlp.w_in.numel() + block.mlp.w_out.numel()))
        out.append([attn, ffn])
    return out


def full_batches(count: int, batch_size: int) -> List[Tuple[List[int], int]]:
    """The evaluation batches of `accuracy_at_batch_sizes`: (indices, real) pairs covering 0..count−1 in order, every
    batch exactly `batch_size` long.  The last one is filled up by wrapping around to the first images and only its
    first `real` predictions count, so each image is counted once and every decision is taken on a batch of the
    size being measured (a plain DataLoader would run the tail — 40 of 360 images at batch 64 — as a batch of 40)."""
    if count < 1 or batch_size < 1:
        raise ValueError(f"count, batch_size: expected ints >= 1, got {count!r}, {batch_size!r}")
    return [([(start + i) % count for i in range(batch_size)], min(batch_size, count - start))
            for start in range(0, count, batch_size)]


@torch.no_grad()
def accuracy_at_batch_sizes(model: nn.Module, dataset, batch_sizes: Sequence[int], original_macs: float,
                            tokens: int) -> Dict[int, Dict[str, float]]:
    """Top-1 accuracy and realised FLOPs ratio (executed sub-block MACs / the unpruned ungated model's) of a fused
    gated model over `dataset`, read in order in batches of exactly each size (`full_batches`: the last batch is
    completed with the first images, whose extra predictions are not counted)."""
    from torch.utils.data import DataLoader

    from ..methods.usdc.compression import _outer_macs
    from ..nn.gated import FusedGatedBlock

    blocks = [m for m in model.modules() if isinstance(m, FusedGatedBlock)]
    macs = _sub_block_macs(model, tokens)
    other = _outer_macs(model, tokens)  # patch embedding + head: never gated
    model.eval()
    all_images, all_labels = next(iter(DataLoader(dataset, batch_size=len(dataset), shuffle=False)))
    results = {}
    for bs in batch_sizes:
        executed = 0.0
        log: List[torch.Tensor] = []
        handles = [b.register_forward_pre_hook(lambda m, a: log.append(m.gate(a[0]).cpu())) for b in blocks]
        correct = total = 0
        try:
            for indices, real in full_batches(len(dataset), bs):
                log.clear()
                idx = torch.tensor(indices)
                pred = model(all_images[idx]).argmax(-1)[:real]
                correct += int((pred == all_labels[idx[:real]]).sum())
                total += real
                for d, (a, f) in zip(log, macs):
                    executed += real * (float(d[0]) * a + float(d[1]) * f)
        finally:
            for h in handles:
                h.remove()
        gate_macs = sum(b.gate.macs() for b in blocks)
        results[bs] = {"acc": correct / total, "flops": (executed / total + other + gate_macs) / original_macs}
    return results


def _original_macs(timm_model: nn.Module, tokens: int) -> float:
    from ..methods.usdc.compression import _outer_macs

    total = _outer_macs(timm_model, tokens)
    for blk in timm_model.blocks:
        width = blk.attn.num_heads * blk.attn.head_dim
        c = blk.attn.qkv.in_features
        total += tokens * (3 * c * width + 2 * tokens * width + width * c)
        total += tokens * 2 * c * blk.mlp.fc1.out_features
    return float(total)


def run_usdc_study(
    *,
    levels: Sequence[str] = ("group", "batch"),
    pretrain_steps: int = 800,
    stage1_steps: int = 400,
    stage2_steps: int = 300,
    flops_target: float = 0.6,
    batch_size: int = 64,
    eval_batch_sizes: Sequence[int] = (1, 8, 64),
    seed: int = 0,
    lr: float = 3e-3,
    arch_lr_scale: float = 10.0,
    out_dir: Optional[str] = None,
    threads: Optional[int] = None,
    progress: bool = True,
    model_cfg: Optional[Dict[str, Any]] = None,
    log=print,
) -> Dict[str, Any]:
    """Run the study; returns {"baseline_acc", "levels": {level: {"acc": {bs: ...}, "flops": {bs: ...},
    "spread": max − min accuracy over the batch sizes (points), ...}}} and logs a table."""
    import timm.models.vision_transformer as tvit

    import vitfast

    from ..methods.usdc.compression import _tokens, arch_optimizer, gate_rates, prune
    from ..methods.usdc.gates import GATE_LEVELS
    from ..training.data import digits_loaders
    from ..training.rng import seed_everything
    from ..training.trainer import Trainer

    for level in levels:
        if level not in GATE_LEVELS:
            raise ValueError(f"levels: expected values in {GATE_LEVELS}, got {level!r}")
    if threads is not None:
        torch.set_num_threads(threads)
    cfg = dict(STUDY_MODEL if model_cfg is None else model_cfg)
    t0 = time.perf_counter()
    train_loader, val_loader = digits_loaders(img_size=cfg["img_size"], batch_size=batch_size, seed=seed)
    common = dict(lr=lr, weight_decay=0.05, warmup_fraction=0.1, grad_clip=1.0, seed=seed, progress=progress)

    seed_everything(seed)
    baseline = tvit.VisionTransformer(**cfg)
    pretrain = Trainer(baseline, train_loader, val_loader, total_steps=pretrain_steps, desc="baseline", **common)
    pretrain.fit()
    base_acc = pretrain.evaluate()["acc"]
    baseline.eval()
    tokens = _tokens(baseline)
    original = _original_macs(baseline, tokens)
    log(f"baseline ViT {cfg}: val acc {base_acc:.4f} after {pretrain_steps} steps")

    report: Dict[str, Any] = {"baseline_acc": base_acc, "config": cfg, "flops_target": flops_target, "levels": {}}
    for level in levels:
        seed_everything(seed)
        model = vitfast.convert.from_timm(deepcopy_model(baseline).train(), gates=True, flops_target=flops_target,
                                          gate_level=level)
        Trainer(model, train_loader, val_loader, total_steps=stage1_steps, desc=f"{level} stage 1",
                optimizer=arch_optimizer(model, lr, lr * arch_lr_scale), **common).fit()
        stage2 = prune(model.eval()).train()
        Trainer(stage2, train_loader, val_loader, total_steps=stage2_steps, desc=f"{level} stage 2",
                optimizer=arch_optimizer(stage2, lr / 3, lr / 3 * arch_lr_scale), **{**common, "lr": lr / 3}).fit()
        stage2.eval()
        fused = vitfast.fuse(stage2)
        if out_dir is not None:
            os.makedirs(out_dir, exist_ok=True)
            vitfast.save(fused, os.path.join(out_dir, f"usdc_{level}.safetensors"))
        res = accuracy_at_batch_sizes(fused, val_loader.dataset, eval_batch_sizes, original, tokens)
        accs = [r["acc"] for r in res.values()]
        kept = [[b.attn is not None, b.mlp is not None] for b in fused.blocks]
        heads = [b.attn.num_heads if b.attn is not None else 0 for b in fused.blocks]
        hidden = [b.mlp.active_features if b.mlp is not None else 0 for b in fused.blocks]
        kinds = [getattr(b.gate, "kind", "?") for b in stage2.blocks]
        report["levels"][level] = {
            "acc": {bs: r["acc"] for bs, r in res.items()},
            "flops": {bs: r["flops"] for bs, r in res.items()},
            "spread_points": 100 * (max(accs) - min(accs)),
            "heads": heads, "hidden": hidden, "sub_blocks_kept": kept, "gate_kinds": kinds,
            "gate_rates_b64": gate_rates(fused, [(x, y) for x, y in
                                                 torch.utils.data.DataLoader(val_loader.dataset, batch_size=64)]),
        }
        r = report["levels"][level]
        log(f"[{level}] heads {heads}, FFN hidden {hidden}, gates {kinds}; "
            + ", ".join(f"b{bs}: acc {res[bs]['acc']:.4f} FLOPs {res[bs]['flops']:.3f}" for bs in eval_batch_sizes)
            + f"; accuracy spread over batch sizes {r['spread_points']:.2f} points")
    report["seconds"] = time.perf_counter() - t0
    return report
