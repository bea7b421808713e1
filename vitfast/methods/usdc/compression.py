"""USDC model tools (usdc-static-dynamic-compression): conversion, the FLOPs resource loss, stage-2 pruning.

    model = vitfast.convert.from_timm(timm_model, gates=True, flops_target=0.7)   # stage 1: search + static α
    Trainer(model, ...).fit()            # L = L_cls + γ (F(α; g) − f_t)², γ = 100 (the resource module's extra_loss)
    model = vitfast.methods.usdc.prune(model)    # stage 2: pruned heads/channels/blocks removed, best gate net kept
    Trainer(model, ...).fit()            # fine-tune under the dynamic gates (F(g) of eq. 11 keeps the budget)
    fused = vitfast.fuse(model)          # GatedBlocks: batch_gate + the fused attention / FFN

FLOPs (eq. 10-11) are multiply-adds normalised by the unpruned, ungated model's total, so f_t is a ratio.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

import torch
import torch.nn as nn

from ..._copy import deepcopy_model
from ...nn.gated import FusedGatedBlock, set_gate_force
from .gates import GATE_KINDS, GATE_LEVELS
from .modules import USDCBlock

__all__ = ["convert_timm", "USDCResourceLoss", "prune", "usdc_blocks", "model_macs", "gate_rates", "set_gate_force",
           "RESOURCE_GAMMA", "arch_parameters", "arch_optimizer", "describe_usdc", "build_usdc"]

RESOURCE_GAMMA = 100.0  # γ of eq. 9 (sec. 3.4)


def _tokens(model: nn.Module) -> int:
    pe = model.patch_embed
    return int(pe.num_patches) + int(getattr(model, "num_prefix_tokens", 1))


def _outer_macs(model: nn.Module, tokens: int) -> float:
    """F_o: patch embedding and classifier head (the parts no gate or α touches)."""
    proj = model.patch_embed.proj
    patches = int(model.patch_embed.num_patches)
    embed = patches * proj.out_channels * proj.in_channels * proj.kernel_size[0] * proj.kernel_size[1]
    head = model.head
    head_macs = head.in_features * head.out_features if isinstance(head, nn.Linear) else 0
    return float(embed + head_macs)


def usdc_blocks(model: nn.Module) -> List[USDCBlock]:
    return [m for m in model.modules() if isinstance(m, USDCBlock)]


def model_macs(model: nn.Module) -> float:
    """Multiply-adds of the unpruned, ungated model (the normaliser of eq. 10)."""
    tokens = _tokens(model)
    total = _outer_macs(model, tokens)
    for block in usdc_blocks(model):
        if block.attn is not None:
            total += float(block._attn_macs(None))
        if block.mlp is not None:
            total += float(block._ffn_macs(None))
    return total


class USDCResourceLoss(nn.Module):
    """The resource term of eq. 9: (F(α; g) − f_t)², F = Σ_ℓ (g_ℓ,0 F'_attn + g_ℓ,1 F'_ffn + Σ_k α^g_k F_G,ℓ,k) + F_o,
    from the last training forward of every `USDCBlock` (g averaged over the batch).  `extra_loss_weight` = γ.

    It finds the blocks through the model it was attached to (a plain attribute, not a child: no parameters,
    nothing in the state dict), so stage-2 pruning, which replaces the blocks, keeps working.  `vitfast.fuse`
    drops it (`to_fused()` returns None).
    """

    def __init__(self, model: nn.Module, flops_target: float, gamma: float = RESOURCE_GAMMA) -> None:
        super().__init__()
        if isinstance(flops_target, bool) or not isinstance(flops_target, (int, float)) or not 0 < flops_target <= 1:
            raise ValueError(f"flops_target: expected a ratio in (0, 1], got {flops_target!r}")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or gamma < 0:
            raise ValueError(f"gamma: expected a number >= 0, got {gamma!r}")
        self.flops_target = float(flops_target)
        self.extra_loss_weight = float(gamma)
        self.outer = 0.0
        self.__dict__["_root"] = model

    def expected_flops(self) -> Optional[torch.Tensor]:
        """F(α; g) of the last training forward, as a ratio of the original model's FLOPs (None before one)."""
        parts = [b.last_flops for b in usdc_blocks(self.__dict__["_root"]) if b.last_flops is not None]
        if not parts:
            return None
        return sum(parts) + self.outer

    def extra_loss(self) -> Optional[torch.Tensor]:
        if not self.training:
            return None
        flops = self.expected_flops()
        return None if flops is None else (flops - self.flops_target) ** 2

    def to_fused(self):
        return None

    def extra_repr(self) -> str:
        return f"flops_target={self.flops_target}, gamma={self.extra_loss_weight}"


def _set_normaliser(model: nn.Module) -> None:
    total = model_macs(model)
    for block in usdc_blocks(model):
        block.flops_total = total
    for m in model.modules():
        if isinstance(m, USDCResourceLoss):
            m.outer = _outer_macs(model, _tokens(model)) / total


def convert_timm(
    model: nn.Module,
    *,
    flops_target: Optional[float] = None,
    level: str = "group",
    search: bool = True,
    gate_kind: str = "G0",
    gate_hidden: Optional[int] = None,
    static: Optional[bool] = None,
    static_init: float = 3.0,
    gamma: float = RESOURCE_GAMMA,
) -> nn.Module:
    """USDC train-time model from a timm ViT/DeiT (blocks: timm `Block` or RePaViT `ChannelIdleBlock`); a copy.

    level: gate level in training — "group" (USDC's augmentation), "sample" or "batch" (ablations, appendix B).
    search: DARTS search over G0…G6 per layer (else every layer uses `gate_kind`).
    static: learnable keep/prune logits for heads, FFN channels and MHSA/FFN blocks (default: on when a
        `flops_target` is given).  flops_target: f_t of the resource loss, attached as `model.usdc_resource`.
    """
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(model, VisionTransformer):
        raise TypeError(f"model: expected a timm VisionTransformer (ViT/DeiT), got {type(model).__qualname__}")
    if level not in GATE_LEVELS:
        raise ValueError(f"level: expected one of {GATE_LEVELS}, got {level!r}")
    if gate_kind not in GATE_KINDS:
        raise ValueError(f"gate_kind: expected one of {GATE_KINDS}, got {gate_kind!r}")
    static = flops_target is not None if static is None else bool(static)
    converted = deepcopy_model(model)
    tokens = _tokens(converted)
    for i, block in enumerate(list(converted.blocks)):
        converted.blocks[i] = USDCBlock.from_block(
            block, level=level, search=search, gate_kind=gate_kind, gate_hidden=gate_hidden, static=static,
            static_init=static_init, tokens=tokens, name=f"model block {i}").train(block.training)
    if flops_target is not None:
        converted.usdc_resource = USDCResourceLoss(converted, flops_target, gamma)
    _set_normaliser(converted)
    return converted


@torch.no_grad()
def prune(model: nn.Module) -> nn.Module:
    """Stage 2 (sec. 3.4): a copy with every USDCBlock physically pruned (α_{·,0} < α_{·,1} removed) and its best
    gate network selected; the resource loss (if any) stays, now measuring F(g) of eq. 11."""
    pruned = deepcopy_model(model)
    total = model_macs(pruned)
    for parent in list(pruned.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, USDCBlock):
                setattr(parent, name, child.pruned())
    for block in usdc_blocks(pruned):
        block.flops_total = total  # still relative to the original model
    return pruned


@torch.no_grad()
def gate_rates(model: nn.Module, loader: Iterable, max_batches: Optional[int] = None) -> List[List[float]]:
    """Fraction of batches in which each layer executed [MHSA, FFN] (the R of the paper's Fig. 5), eval mode.
    Works on train-time (USDCBlock) and fused (FusedGatedBlock) models."""
    gates = []
    for m in model.modules():
        if isinstance(m, (USDCBlock, FusedGatedBlock)):
            gates.append(m)
    counts = torch.zeros(len(gates), 2)
    seen = 0
    handles = []
    for i, m in enumerate(gates):
        def hook(module, args, i=i):
            x = args[0]
            d = module.gates(x)[0] if isinstance(module, USDCBlock) else module.gate(x)
            counts[i] += d.float().cpu()
        handles.append(m.register_forward_pre_hook(hook))
    was_training = model.training
    model.eval()
    try:
        for b, (images, _) in enumerate(loader):
            if max_batches is not None and b >= max_batches:
                break
            model(images)
            seen += 1
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return (counts / max(seen, 1)).tolist()


def arch_parameters(model: nn.Module) -> List[nn.Parameter]:
    """The USDC decision parameters: static keep/prune logits α, search logits α^g and the gate networks."""
    params = []
    for block in usdc_blocks(model):
        params.extend(p for p in (block.alpha_attn, block.alpha_ffn, block.alpha_heads, block.alpha_channels)
                      if p is not None)
        params.extend(block.gate.parameters())
    return params


def arch_optimizer(model: nn.Module, lr: float, arch_lr: Optional[float] = None, betas=(0.9, 0.999)):
    """An optimizer factory for `Trainer(optimizer=...)`: AdamW with the decision parameters (`arch_parameters`) in
    their own group at `arch_lr`, without weight decay (the Trainer's LR schedule scales both groups alike).

    arch_lr: None (or lr) is the paper's recipe, one learning rate for the model and the architecture parameters
    (appendix: 5e-4, AdamW, 300 epochs).  A larger rate was vitfast's choice for short runs, on the argument that
    the static logits start at (+3, −3) and Adam moves a scalar by about lr per step; measured on the digits study
    (`vitfast usdc`, seeds 0-2) the two give the same accuracy (mean 98.70 / 98.80% at batch 1 / 64 for both) and
    realised FLOPs near f_t, and at neither rate does static compression prune anything in 400 steps (the gates
    meet the budget).  `vitfast train` and `vitfast usdc` keep 10 × lr unless told (`--arch-lr-scale`), so that
    the published study and earlier runs reproduce; the paper's recipe uses one rate.
    """
    if arch_lr is None:
        arch_lr = lr
    arch = {id(p) for p in arch_parameters(model)}

    def make(groups):
        new, arch_params = [], []
        for g in groups:
            keep = [p for p in g["params"] if id(p) not in arch]
            arch_params.extend(p for p in g["params"] if id(p) in arch)
            if keep:
                new.append({**g, "params": keep})
        if arch_params:
            new.append({"params": arch_params, "weight_decay": 0.0, "lr": float(arch_lr)})
        return torch.optim.AdamW(new, lr=float(lr), betas=tuple(betas))

    return make


def describe_usdc(model: nn.Module, architecture: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """The USDC part of a train-time model description (`vitfast.io.describe_trainable`), or None without
    USDC blocks.  With `architecture` (describe_timm's dict), its num_heads / mlp_ratio are reset to the
    shapes before pruning, so the skeleton always builds and stage-2 blocks are rebuilt from their own entry."""
    blocks = []
    for name, module in model.named_modules():
        if isinstance(module, USDCBlock):
            blocks.append({"path": name, **module.structure()})
    if not blocks:
        return None
    resource = [m for m in model.modules() if isinstance(m, USDCResourceLoss)]
    if architecture is not None:
        kwargs = architecture.get("kwargs", {})
        first = blocks[0]
        if first["orig_heads"]:
            kwargs["num_heads"] = first["orig_heads"]
        if first["orig_hidden"] and kwargs.get("embed_dim"):
            kwargs["mlp_ratio"] = first["orig_hidden"] / kwargs["embed_dim"]
    return {
        "blocks": blocks,
        "flops_target": resource[0].flops_target if resource else None,
        "gamma": resource[0].extra_loss_weight if resource else RESOURCE_GAMMA,
    }


@torch.no_grad()
def build_usdc(model: nn.Module, desc: Dict[str, Any]) -> nn.Module:
    """Rebuild the USDC train-time structure described by `describe_usdc` on a freshly built skeleton (weights
    are overwritten by the caller)."""
    from .gates import GateNet
    from .modules import _prune_channels, _prune_heads

    blocks = desc.get("blocks") or []
    if not blocks:
        raise ValueError("description['usdc']['blocks']: expected at least one block, got none")
    first = blocks[0]
    converted = convert_timm(model, flops_target=desc.get("flops_target"), level=first["level"],
                             search=bool(first["search"]), gate_kind=first["gate_kind"] or "G0",
                             gate_hidden=first["gate_hidden"], static=bool(first["static"]),
                             gamma=float(desc.get("gamma", RESOURCE_GAMMA)))
    modules = dict(converted.named_modules())
    for spec in blocks:
        block = modules.get(spec["path"])
        if not isinstance(block, USDCBlock):
            raise ValueError(f"description['usdc']: no USDC block at {spec['path']!r}")
        attn, mlp = block.attn, block.mlp
        if spec["heads"] == 0:
            attn = None
        elif spec["heads"] != attn.num_heads:
            attn = _prune_heads(attn, torch.arange(spec["heads"]))
        if not spec["ffn"]:
            mlp = None
        elif spec["hidden"] is not None and spec["hidden"] != mlp.fc1.out_features:
            mlp = _prune_channels(mlp, torch.arange(spec["hidden"]))
        changed = attn is not block.attn or mlp is not block.mlp or bool(spec["static"]) != block.static
        gate = block.gate
        if not spec["search"] and (not isinstance(gate, GateNet) or gate.kind != spec["gate_kind"]):
            gate = GateNet(spec["gate_kind"], block.dim, spec["gate_hidden"])
            changed = True
        if changed:
            new = USDCBlock(dim=block.dim, norm1=block.norm1, attn=attn, ls1=block.ls1,
                            norm2=block.norm2 if mlp is not None else None, mlp=mlp, ls2=block.ls2, gate=gate,
                            level=spec["level"], static=bool(spec["static"]), tokens=spec["tokens"])
            parent, _, child = spec["path"].rpartition(".")
            setattr(converted.get_submodule(parent) if parent else converted, child, new)
            block = new
        block.flops_total = float(spec["flops_total"])
        block.orig_heads, block.orig_hidden = spec["orig_heads"], spec["orig_hidden"]
    return converted
