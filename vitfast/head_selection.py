"""Which attention heads to replace by depthwise convolutions (dropin-depthwise-conv-attention, section 2.3).

Σ criterion (section 2.3.1, eq. 15-16), the paper's default:

    σ_(E^h)  = pointwise standard deviation of the attention map E(X)^h ∈ R^(N×N) over N_s input samples
    Σ_h      = Σ_(entries) σ_(E^h)                   (eq. 15; Σ_h = 0 ⟺ the map does not depend on the input)
    Σ_b      = (1 / n_h) Σ_(h in block b) Σ_h        (eq. 16)

Lowest scores first: blockwise selection takes the p_b blocks with the smallest Σ_b, scattered selection the
p_h heads with the smallest Σ_h.  `attention_std_scores` computes every head's Σ_h in ONE pass over the samples
with Welford's online algorithm (the model runs on batches, the statistics are updated image by image), so
the [N_s, n_h, N, N] maps are never stored; the state is one mean and one M2 per head entry (fp64).  σ is the
population standard deviation over the N_s samples (ddof = 0).

DSP alternative (section 2.3.2, eq. 17-18): `DSPGate` holds trainable logits (one per block, or one per head for
scattered selection) and draws the Gumbel top-k relaxation (Kool et al. 2019) of `topk(w, p)` during training,
with a temperature annealed geometrically from `tau_start` to 1e-3 over the run through the Trainer's
`set_step`; `attach_dsp` puts a `DSPGatedAttention` (eq. 18: (1 − w̃_b) MhSA + w̃_b M̃hSA) in every block.  At
evaluation the gate is the hard top-k of the logits; `DSPGate.selection()` is what `vitfast.convert.from_timm`
takes to replace the chosen blocks/heads for good (DSP-2S).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._copy import deepcopy_model
from .nn import _timm

__all__ = [
    "HeadRanking",
    "attention_std_scores",
    "attention_maps",
    "DSPGate",
    "DSPGatedAttention",
    "attach_dsp",
    "finalize_dsp",
    "gumbel_topk_relaxed",
]

RANKING_FORMAT = "vitfast.head_ranking"


# ---------------------------------------------------------------------------------------------- Σ criterion
@dataclass
class HeadRanking:
    """Σ_h of every head (`head_scores[b][h]`, blocks in depth order) and the selections it implies."""

    head_scores: List[List[float]]
    num_samples: int
    blocks: List[str] = field(default_factory=list)  # module path of each block's attention (informational)

    def __post_init__(self) -> None:
        if not self.head_scores or any(not row for row in self.head_scores):
            raise ValueError("head_scores: expected one non-empty row of Σ_h per block, got an empty table")
        for b, row in enumerate(self.head_scores):
            for h, s in enumerate(row):
                if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0:
                    raise ValueError(f"head_scores[{b}][{h}]: expected a finite number >= 0, got {s!r}")

    @property
    def num_blocks(self) -> int:
        return len(self.head_scores)

    def block_scores(self) -> List[float]:
        """Σ_b = mean of the block's Σ_h (eq. 16)."""
        return [sum(row) / len(row) for row in self.head_scores]

    def block_order(self) -> List[int]:
        """Block indices, lowest Σ_b first (ties: shallower first)."""
        scores = self.block_scores()
        return sorted(range(self.num_blocks), key=lambda b: (scores[b], b))

    def head_order(self) -> List[Tuple[int, int]]:
        """(block, head) pairs, lowest Σ_h first (ties: shallower, then lower head index, first)."""
        pairs = [(b, h) for b, row in enumerate(self.head_scores) for h in range(len(row))]
        return sorted(pairs, key=lambda p: (self.head_scores[p[0]][p[1]], p))

    def select_blocks(self, count: int) -> List[int]:
        """Blockwise selection S_b^[p_b]: the `count` blocks with the smallest Σ_b, in depth order."""
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= self.num_blocks:
            raise ValueError(f"count: expected an int in [0, {self.num_blocks}] blocks, got {count!r}")
        return sorted(self.block_order()[:count])

    def select_heads(self, count: int) -> Dict[int, List[int]]:
        """Scattered selection S_h^[p_h]: the `count` heads with the smallest Σ_h, as {block: [heads]}."""
        total = sum(len(row) for row in self.head_scores)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= total:
            raise ValueError(f"count: expected an int in [0, {total}] heads, got {count!r}")
        chosen: Dict[int, List[int]] = {}
        for b, h in self.head_order()[:count]:
            chosen.setdefault(b, []).append(h)
        return {b: sorted(hs) for b, hs in sorted(chosen.items())}

    # ------------------------------------------------------------------------------------------ JSON
    def to_dict(self) -> Dict[str, Any]:
        return {
            "format": RANKING_FORMAT,
            "version": 1,
            "num_samples": self.num_samples,
            "blocks": self.blocks,
            "head_scores": self.head_scores,
            "block_scores": self.block_scores(),
            "block_order": self.block_order(),
            "head_order": [list(p) for p in self.head_order()],
        }

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "HeadRanking":
        if not isinstance(data, dict) or data.get("format") != RANKING_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"ranking: expected a {RANKING_FORMAT!r} object, got format {got!r}")
        if data.get("version") != 1:
            raise ValueError(f"ranking['version']: expected 1, got {data.get('version')!r}")
        scores = data.get("head_scores")
        if not isinstance(scores, list) or not all(isinstance(r, list) for r in scores):
            raise ValueError("ranking['head_scores']: expected a list of per-block lists of Σ_h")
        samples = data.get("num_samples")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"ranking['num_samples']: expected an int >= 1, got {samples!r}")
        blocks = data.get("blocks", [])
        return cls([list(r) for r in scores], samples, list(blocks) if isinstance(blocks, list) else [])

    def save(self, path: Union[str, os.PathLike]) -> None:
        from ._io import atomic_write

        text = json.dumps(self.to_dict(), indent=1)

        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text + "\n")

        atomic_write(os.fspath(path), write)

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "HeadRanking":
        with open(path, "r", encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"ranking file {os.fspath(path)!r}: expected JSON, got a parse error ({e})") from None
        return cls.from_dict(data)

    def format_table(self, top: int = 10) -> str:
        """Human-readable ranking: blocks by Σ_b, then the `top` lowest-Σ_h heads."""
        lines = [f"Σ criterion over {self.num_samples} samples (lowest first = most convolution-like)",
                 "blocks by Σ_b:"]
        scores = self.block_scores()
        for rank, b in enumerate(self.block_order()):
            lines.append(f"  {rank + 1:3d}. block {b:3d}  Σ_b = {scores[b]:.6g}")
        lines.append(f"lowest {min(top, len(self.head_order()))} heads by Σ_h:")
        for rank, (b, h) in enumerate(self.head_order()[:top]):
            lines.append(f"  {rank + 1:3d}. block {b:3d} head {h:3d}  Σ_h = {self.head_scores[b][h]:.6g}")
        return "\n".join(lines)


def _attention_modules(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    from timm.models.vision_transformer import Attention as TimmAttention

    found = [(name, m) for name, m in model.named_modules() if type(m) is TimmAttention]
    if not found:
        raise ValueError(f"model: expected timm ViT Attention modules to score, found none in {type(model).__name__}")
    return found


def attention_maps(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """E(X)^h = softmax(Q^h K^hᵀ / √d_h) of a timm `Attention` for its input x [B, N, C] -> [B, H, N, N] (fp32)."""
    batch, tokens, _ = x.shape
    qkv = attn.qkv(x).reshape(batch, tokens, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])
    return torch.softmax((q.float() @ k.float().transpose(-1, -2)) * attn.scale, dim=-1)


class _Welford:
    """Welford's running mean / M2 of a [H, N, N] map over samples, in fp64, one sample at a time.

    Per sample: δ = E − mean;  mean += δ / n;  M2 += δ ⊙ (E − mean).  The state is the only memory (no batch
    of fp64 maps), and a map that is the same for every input gives δ = 0 exactly, so its Σ_h is exactly 0.
    """

    def __init__(self) -> None:
        self.count = 0
        self.mean: Optional[torch.Tensor] = None
        self.m2: Optional[torch.Tensor] = None

    def update(self, batch: torch.Tensor) -> None:
        for sample in batch:
            sample = sample.double()
            if self.mean is None:
                self.count, self.mean, self.m2 = 1, sample.clone(), torch.zeros_like(sample)
                continue
            if self.mean.shape != sample.shape:
                raise ValueError(f"inputs: expected attention maps of shape {list(self.mean.shape)} for every "
                                 f"image (same resolution), got {list(sample.shape)}")
            self.count += 1
            delta = sample - self.mean
            self.mean += delta / self.count
            self.m2 += delta * (sample - self.mean)

    def head_scores(self) -> List[float]:
        """Σ_h = Σ over entries of the population standard deviation (eq. 15)."""
        std = (self.m2.clamp_min(0.0) / self.count).sqrt()
        return [float(s) for s in std.flatten(1).sum(1)]


def _batches(inputs) -> Iterable[torch.Tensor]:
    if isinstance(inputs, torch.Tensor):
        yield inputs
        return
    for item in inputs:
        yield item[0] if isinstance(item, (tuple, list)) else item


def attention_std_scores(
    model: nn.Module,
    inputs: Union[torch.Tensor, Iterable],
    *,
    num_samples: Optional[int] = None,
    batch_size: int = 16,
    progress: bool = True,
) -> HeadRanking:
    """Σ_h of every timm `Attention` head of `model` over N_s input images, in one pass (Welford).

    inputs: an image tensor [N_s, 3, H, W], or an iterable of batches (a DataLoader: (images, labels) tuples or
    image tensors).  num_samples: stop after this many images (the paper uses N_s = 1000).  The model runs in eval
    mode under no_grad (its mode is restored); a tqdm bar counts the images.
    """
    from tqdm.auto import tqdm

    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1):
        raise ValueError(f"num_samples: expected an int >= 1 or None, got {num_samples!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected an int >= 1, got {batch_size!r}")
    modules = _attention_modules(model)
    states = {name: _Welford() for name, _ in modules}
    total = num_samples
    if isinstance(inputs, torch.Tensor):
        if inputs.dim() != 4:
            raise ValueError(f"inputs: expected images [N_s, C, H, W], got shape {list(inputs.shape)}")
        total = inputs.shape[0] if num_samples is None else min(num_samples, inputs.shape[0])
        inputs = [inputs[i:i + batch_size] for i in range(0, total, batch_size)]
    elif total is None and hasattr(inputs, "dataset"):
        total = len(inputs.dataset)

    def hook(name):
        def record(module, args, output):
            states[name].update(attention_maps(module, args[0]))
        return record

    handles = [m.register_forward_hook(hook(name)) for name, m in modules]
    was_training = model.training
    model.eval()
    seen = 0
    device = next(model.parameters()).device
    try:
        with torch.no_grad(), tqdm(total=total, desc="Σ_h (attention std)", unit="img", disable=not progress) as bar:
            for images in _batches(inputs):
                if num_samples is not None:
                    images = images[: num_samples - seen]
                if images.shape[0] == 0:
                    break
                model(images.to(device))
                seen += images.shape[0]
                bar.update(images.shape[0])
                if num_samples is not None and seen >= num_samples:
                    break
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    if seen == 0:
        raise ValueError("inputs: expected at least one image, got none")
    return HeadRanking([states[name].head_scores() for name, _ in modules], seen, [name for name, _ in modules])


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
    from .nn.dwconv import _check_token_count

    batch, tokens, _ = x.shape
    # as the per-block path (DWConvAttention.forward): another resolution would read extra patches as prefix tokens
    _check_token_count(tokens, conv.prefix_tokens, conv.grid_size)
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

    from .nn.dwconv import DWConvAttention

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

    The selected blocks (or heads) become `vitfast.nn.DWConvBlock`s as `vitfast.convert.from_timm(dwconv_blocks= /
    dwconv_heads=)` builds them, then take the trained weights of their gated branch: a whole block its conv
    module (values, kernels, output projection); a single head its values and kernels (the per-head mix projects
    every head through the MhSA's output projection, which the block keeps).  So the result computes exactly what
    the gated model computes in eval mode; `vitfast.save_trainable`, `vitfast.fuse` and further training take it.
    DSP-2S instead re-initialises the kernels: `from_timm(source, dwconv_blocks=gate.selection())` and retrain.
    `model` itself is left as it was.
    """
    from timm.models.vision_transformer import Block as TimmBlock

    from . import convert

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
            new = convert.from_timm(model, dwconv_heads={b: hs for b, hs in plan.items()},
                                    dwconv_kernel_size=kernel_size)
        else:  # a converted model (ChannelIdleBlocks) that attach_dsp wrapped
            new = convert.replace_dwconv_blocks(deepcopy_model(model), plan, kernel_size=kernel_size)
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
