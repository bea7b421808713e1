"""DSP gating: the alternative head selector of the drop-in DW-conv paper, a Gumbel top-k relaxation that learns which
heads become convolutions during training (`attach_dsp`), then makes the choice hard (`finalize_dsp`)."""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..._copy import deepcopy_model
from ...nn import _timm


# ---------------------------------------------------------------------------------------------- DSP gating
def gumbel_topk_relaxed(logits: torch.Tensor, k: int, tau: float, *, noise: bool = True) -> torch.Tensor:
    """Relaxed k-hot of topk(logits + Gumbel noise, k) (Gumbel top-k trick, Kool et al. 2019; the successive
    softmax relaxation DSP uses): k rounds of p_j = softmax(r / τ) with r ← r + log(1 − p_(j−1)).  Sums to k;
    tends to the hard top-k as τ → 0.  At high τ a component can exceed 1 (the rounds are not exclusive):
    `DSPGate` clips the weights to [0, 1] so eq. 18 stays a convex mix."""
    r = logits.float()
    if noise:
        u = torch.rand_like(r).clamp_(1e-10, 1.0 - 1e-7)
        r = r - torch.log(-torch.log(u))
    khot = torch.zeros_like(r)
    p = torch.zeros_like(r)
    for _ in range(k):
        r = r + torch.log((1.0 - p).clamp_min(1e-20))
        p = torch.softmax(r / tau, dim=-1)
        khot = khot + p
    return khot.to(logits.dtype)


class DSPGate(nn.Module):
    """Trainable selection logits w (one per block, or per head) with a Gumbel top-k gate (eq. 17, relaxed).

    Training: `weights()` draws the relaxed k-hot once per forward of the model (the first block to ask draws,
    the others reuse it, `DSPGatedAttention` resets it at block 0).  Eval: the hard top-k of the logits.
    τ follows a geometric annealing from `tau_start` to `tau_end` = 1e-3 (the paper's end value) over the
    Trainer's steps (`set_step`).  The logits are excluded from weight decay.
    """

    _no_weight_decay = True

    def __init__(self, num_units: int, num_selected: int, *, tau_start: float = 1.0, tau_end: float = 1e-3,
                 heads_per_block: Optional[int] = None) -> None:
        super().__init__()
        if isinstance(num_units, bool) or not isinstance(num_units, int) or num_units < 1:
            raise ValueError(f"num_units: expected an int >= 1, got {num_units!r}")
        if heads_per_block is not None and (isinstance(heads_per_block, bool) or not isinstance(heads_per_block, int)
                                            or heads_per_block < 1 or num_units % heads_per_block):
            raise ValueError(f"heads_per_block: expected None (one unit per block) or an int >= 1 dividing "
                             f"num_units = {num_units}, got {heads_per_block!r}")
        self.heads_per_block = heads_per_block
        if isinstance(num_selected, bool) or not isinstance(num_selected, int) or not 1 <= num_selected <= num_units:
            raise ValueError(f"num_selected: expected an int in [1, {num_units}], got {num_selected!r}")
        if not (0 < tau_end <= tau_start) or not math.isfinite(tau_start):
            raise ValueError(f"tau_start/tau_end: expected 0 < tau_end <= tau_start, got {tau_start!r}, {tau_end!r}")
        self.num_selected = num_selected
        self.tau_start, self.tau_end = float(tau_start), float(tau_end)
        self.logits = nn.Parameter(torch.zeros(num_units))
        self.register_buffer("tau", torch.tensor(float(tau_start)))
        self._current: Optional[torch.Tensor] = None

    def set_step(self, step: int, total_steps: int) -> None:
        """Trainer hook: τ(t) = τ_start · (τ_end / τ_start)^(t / T)."""
        frac = min(max(step / max(total_steps, 1), 0.0), 1.0)
        self.tau.fill_(self.tau_start * (self.tau_end / self.tau_start) ** frac)

    def reset(self) -> None:
        self._current = None

    def train(self, mode: bool = True) -> "DSPGate":
        self._current = None  # a draw of the last training forward: part of its autograd graph, stale after it
        return super().train(mode)

    def __getstate__(self):
        # copy.deepcopy (vitfast.fuse, EMA copies) cannot copy the non-leaf draw kept between the blocks of one
        # forward: copies start without it, as a new forward would
        state = self.__dict__.copy()
        state["_current"] = None
        return state

    def weights(self) -> torch.Tensor:
        if not self.training:
            hard = torch.zeros_like(self.logits)
            hard[torch.topk(self.logits.detach(), self.num_selected).indices] = 1.0
            return hard
        if self._current is None:
            self._current = gumbel_topk_relaxed(self.logits, self.num_selected, float(self.tau)).clamp(0.0, 1.0)
        return self._current

    def selection(self) -> Union[List[int], List[Tuple[int, int]]]:
        """The hard top-k units, sorted, in the form `vitfast.convert.from_timm` takes: block indices
        (`dwconv_blocks=`), or with one unit per head (block, head) pairs (`dwconv_heads=`)."""
        units = sorted(int(i) for i in torch.topk(self.logits.detach(), self.num_selected).indices)
        if self.heads_per_block is None:
            return units
        return [divmod(u, self.heads_per_block) for u in units]

    def extra_repr(self) -> str:
        return f"units={self.logits.numel()}, selected={self.num_selected}, tau={float(self.tau):.4g}"


class DSPGatedAttention(nn.Module):
    """Eq. 18 for one block: (1 − w̃_b) · MhSA(X) + w̃_b · M̃hSA(X), M̃hSA = all heads as DW convolutions.

    With per-head units (scattered DSP) the gate mixes per head: each head's contribution to the output
    projection is (1 − w̃_h) · Att^h W^O_h + w̃_h · Ãtt_DW^h W^O_h.  The gate is shared by every block (not a
    child: it lives on the model as `dsp_gate`)."""

    def __init__(self, attn: nn.Module, conv, gate: DSPGate, index: int, *, per_head: bool) -> None:
        super().__init__()
        self.mhsa = attn
        self.conv = conv
        self.index = index
        self.per_head = per_head
        object.__setattr__(self, "_gate", gate)  # shared, owned by the model

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False) -> torch.Tensor:
        if self.index == 0 and self.training:
            self._gate.reset()  # a new forward of the model: draw a new relaxed top-k
        w = self._gate.weights()
        if not self.per_head:
            g = w[self.index].to(x.dtype)
            return (1 - g) * self.mhsa(x) + g * self.conv(x)
        heads = self.conv.num_heads
        g = w[self.index * heads:(self.index + 1) * heads].to(x.dtype)
        return _per_head_mix(self.mhsa, self.conv, x, g)


def _per_head_mix(attn: nn.Module, conv, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Σ_h [(1 − g_h) Att^h + g_h Ãtt^h] W^O_h + b^O, with Ãtt^h the head's DW convolution."""
    from ...nn.dwconv import check_token_count

    batch, tokens, _ = x.shape
    # as the per-block path (DWConvAttention.forward): another resolution would read extra patches as prefix tokens
    check_token_count(tokens, conv.prefix_tokens, conv.grid_size)
    heads, hd = attn.num_heads, attn.head_dim
    qkv = attn.qkv(x).reshape(batch, tokens, 3, heads, hd).permute(2, 0, 3, 1, 4)
    # timm's attention and projection dropout, as the per-block path (timm's own forward) applies them
    drop = _timm.dropout_prob(attn.attn_drop) if attn.training else 0.0
    a = F.scaled_dot_product_attention(attn.q_norm(qkv[0]), attn.k_norm(qkv[1]), qkv[2], dropout_p=drop)
    w_v, b_v, _ = conv.conv_weights()
    v = F.linear(x, w_v, b_v)  # [B, N, H·hd]
    prefix = tokens - conv.grid_size[0] * conv.grid_size[1]
    grid = v[:, prefix:].transpose(1, 2).reshape(batch, heads * hd, *conv.grid_size)
    u = F.conv2d(grid, conv.conv_kernel.unsqueeze(1), padding=conv.kernel_size // 2, groups=heads * hd)
    u = u.flatten(2).transpose(1, 2)
    if prefix:
        u = torch.cat([v[:, prefix:].mean(1, keepdim=True).expand(batch, prefix, -1), u], dim=1)
    u = u.reshape(batch, tokens, heads, hd).transpose(1, 2)
    mixed = (1 - g)[None, :, None, None] * a + g[None, :, None, None] * u
    return attn.proj_drop(attn.proj(mixed.transpose(1, 2).reshape(batch, tokens, heads * hd)))


def attach_dsp(
    model: nn.Module,
    num_selected: int,
    *,
    per_head: bool = False,
    kernel_size: int = 3,
    tau_start: float = 1.0,
    tau_end: float = 1e-3,
) -> nn.Module:
    """Wrap every block's attention of a timm ViT (or converted ViT) for DSP selection; returns the model (in place).

    `model.dsp_gate` is the shared `DSPGate` (num_selected blocks, or heads with per_head=True).  Train with the
    Trainer (τ anneals via set_step), then read `model.dsp_gate.selection()`.
    """
    from timm.models.vision_transformer import Attention as TimmAttention

    from .modules import DWConvAttention

    if not isinstance(getattr(model, "blocks", None), nn.Module) or not hasattr(model, "patch_embed"):
        raise ValueError(f"model: expected a timm ViT/DeiT (blocks over a patch grid), got {type(model).__name__}")
    grid = tuple(int(g) for g in model.patch_embed.grid_size)
    blocks = list(model.blocks)
    # Every block is checked before any is wrapped: a refusal used to leave the model half converted.
    for i, block in enumerate(blocks):
        if type(getattr(block, "attn", None)) is not TimmAttention:
            got = type(getattr(block, "attn", None)).__name__
            raise ValueError(f"model.blocks.{i}.attn: expected timm Attention, got {got}")
    if not blocks:
        raise ValueError("model.blocks: expected at least one block, got none")
    from .convert import _check_no_patch_dropout

    _check_no_patch_dropout(model, "model")
    heads = blocks[0].attn.num_heads
    gate = DSPGate(len(blocks) * heads if per_head else len(blocks), num_selected, tau_start=tau_start, tau_end=tau_end,
                   heads_per_block=heads if per_head else None)
    for i, block in enumerate(blocks):
        conv = DWConvAttention.from_timm(block.attn, range(block.attn.num_heads), grid, kernel_size=kernel_size,
                                         prefix_tokens=getattr(model, "num_prefix_tokens", None),
                                         name=f"model.blocks.{i}.attn")
        block.attn = DSPGatedAttention(block.attn, conv, gate, i, per_head=per_head)
    model.dsp_gate = gate
    return model


def finalize_dsp(model: nn.Module) -> nn.Module:
    """DSP-e2e (section 2.3.2, the gates trained end to end with eq. 18; paper Table 5): a new train-time model in
    which the DSP gate's hard top-k is permanent, with the convolution weights the DSP training learned.

    The selected blocks (or heads) become `vitfast.methods.dwconv.DWConvBlock`s as `vitfast.convert.from_timm(dwconv_blocks= /
    dwconv_heads=)` builds them, then take the trained weights of their gated branch: a whole block its conv
    module (values, kernels, output projection); a single head its values and kernels (the per-head mix projects
    every head through the MhSA's output projection, which the block keeps).  So the result computes exactly what
    the gated model computes in eval mode; `vitfast.io.save_trainable`, `vitfast.fuse` and further training take it.
    DSP-2S instead re-initialises the kernels: `from_timm(source, dwconv_blocks=gate.selection())` and retrain.
    `model` itself is left as it was.
    """
    from timm.models.vision_transformer import Block as TimmBlock

    from ...arch import remember_source
    from .convert import convert_timm, replace_dwconv_blocks

    gate = getattr(model, "dsp_gate", None)
    if not isinstance(gate, DSPGate):
        raise ValueError(f"model: expected a model prepared by attach_dsp (with a dsp_gate), got "
                         f"{type(model).__name__} without one")
    blocks = list(model.blocks)
    wrapped = [block.attn for block in blocks]
    for i, w in enumerate(wrapped):
        if not isinstance(w, DSPGatedAttention):
            raise ValueError(f"model.blocks.{i}.attn: expected DSPGatedAttention (attach_dsp), got {type(w).__name__}")
    heads = wrapped[0].conv.num_heads
    plan: Dict[int, List[int]] = {}
    for unit in gate.selection():
        b, h = unit if isinstance(unit, tuple) else (unit, None)
        plan.setdefault(b, []).extend(range(heads) if h is None else [h])
    kernel_size = wrapped[0].conv.kernel_size
    # The model with its plain attention back, converted as from_timm converts a timm model (a copy: `model` keeps
    # its DSP wrappers and gate).
    try:
        for block, w in zip(blocks, wrapped):
            block.attn = w.mhsa
        del model.dsp_gate
        if all(type(block) is TimmBlock for block in blocks):
            new = convert_timm(model, dwconv_heads={b: hs for b, hs in plan.items()}, kernel_size=kernel_size)
            remember_source(new, model)  # as from_timm records it
        else:  # a converted model (ChannelIdleBlocks) that attach_dsp wrapped
            new = replace_dwconv_blocks(deepcopy_model(model), plan, kernel_size=kernel_size)
    finally:
        for block, w in zip(blocks, wrapped):
            block.attn = w
        model.dsp_gate = gate
    with torch.no_grad():
        for b, hs in plan.items():
            conv, target = wrapped[b].conv, new.blocks[b].attn
            if gate.heads_per_block is None:
                target.load_state_dict(conv.state_dict())
                continue
            hd = conv.head_dim
            rows = torch.as_tensor([h * hd + i for h in target.conv_heads for i in range(hd)])
            target.value.weight.copy_(conv.value.weight[rows])
            if conv.value.bias is not None:
                target.value.bias.copy_(conv.value.bias[rows])
            target.conv_kernel.copy_(conv.conv_kernel[rows])
    new.train(model.training)
    return new
