"""USDC blocks: the train-time gated + statically prunable ViT block, and its fused inference counterpart (`vitfast.nn.FusedGatedBlock`).

Train-time `USDCBlock` (usdc-static-dynamic-compression eq. 5 and 8, sec. 3.3):

    g      = hard Gumbel-softmax(G(pool(Z_{ℓ−1})))            [B, 2]  (per group/sample/batch, `level`)
    Z'     = Z_{ℓ−1} + g_0·a·ls1(MHSA'(LN1(Z_{ℓ−1})))          MHSA': head h's output × m_h
    Z_ℓ    = Z'      + g_1·f·ls2(FFN'(LN2(Z')))                FFN': hidden channel j × n_j

with the static keep factors a = α^a_0, f = α^f_0, m_h = α^h_{h,0}, n_j = α^n_{j,0} (soft Gumbel-softmax,
τ = 2, of learnable [·, 2] logits) when static compression is on, and 1 otherwise.  A closed gate (g = 0) skips
the sub-block with its LayerNorm and residual branch: the stream passes unchanged.

Deviation from eq. 8 as printed (Z'' = g_0 α^a_0 Z' + (1 − g_0) α^a_1 Z_{ℓ−1}): read literally it scales the whole
residual stream by α ∈ (0, 1) in both branches (and zeroes it for a kept block whose gate closes), which compounds
over depth; here α^a_0 scales the sub-block's contribution, which agrees with eq. 5 for a kept block (α^a_0 = 1)
and is the identity for a pruned one (α^a_0 = 0) — the two hard states the pruning ends in.

In eval mode everything is hard: one gate per batch (the batch mean of the pooled features, what
`torch.ops.vitfast.batch_gate` computes), a structure is pruned iff α_{·,0} < α_{·,1}.  `pruned()` removes the
pruned heads, channels and sub-blocks physically and keeps the best searched gate network (stage 2, sec. 3.4);
`to_fused()` gives the `FusedGatedBlock`.  Both are exact: same eval-mode outputs.

Composition: a RePaViT `ChannelIdleBlock` can be gated too (its FFN module owns norm and shortcut; gates and
block-level pruning apply to it, channel pruning does not, since its channels are folded differently).
"""
from __future__ import annotations

import copy
from typing import Any, Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Mlp
from timm.models.vision_transformer import Attention as TimmAttention

from ...nn import _timm
from ...nn.ffn import FusedChannelIdleFFN
from ...nn.gated import FusedBatchGate, FusedGatedBlock, fused_attention
from .gates import GATE_LEVELS, SEARCH_TAU, GateNet, GateSearch, group_assignment, hard_gates


def _keep(logits: Optional[torch.Tensor], training: bool) -> Optional[torch.Tensor]:
    """Static keep factor(s) from [..., 2] (keep, prune) logits: soft Gumbel-softmax (τ = 2) in training; in eval
    1 unless α_{·,0} < α_{·,1} (USDC sec. 3.3: then the structure is pruned)."""
    if logits is None:
        return None
    if training:
        return F.gumbel_softmax(logits, tau=SEARCH_TAU, hard=False, dim=-1)[..., 0]
    return (logits[..., 0] >= logits[..., 1]).to(logits.dtype)


class USDCBlock(nn.Module):
    """Train-time USDC block (see the module doc).  Build it with `USDCBlock.from_block(timm_or_channel_idle_block)`.

    Children: norm1, attn (timm Attention), ls1 — or attn None when the MHSA sub-block was pruned; norm2, mlp
    (timm Mlp), ls2 — or mlp a RePaViT ChannelIdleMlp (owns its norm and shortcut; norm2/ls2 None), or None when
    pruned; gate (GateSearch during the search, a GateNet after it).  Static logits (alpha_attn [2], alpha_ffn [2],
    alpha_heads [H, 2], alpha_channels [hidden, 2]) exist only while static compression is on.
    """

    # Architecture logits are not weights: no weight decay (it would pull keep/prune towards 50/50).
    _no_weight_decay = ("alpha_attn", "alpha_ffn", "alpha_heads", "alpha_channels")

    def __init__(self, *, dim: int, norm1, attn, ls1, norm2, mlp, ls2, gate: nn.Module, level: str = "group",
                 static: bool = False, static_init: float = 3.0, tokens: int = 197,
                 drop_path1: Optional[nn.Module] = None, drop_path2: Optional[nn.Module] = None) -> None:
        super().__init__()
        if level not in GATE_LEVELS:
            raise ValueError(f"level: expected one of {GATE_LEVELS}, got {level!r}")
        if not isinstance(gate, (GateNet, GateSearch)):
            raise ValueError(f"gate: expected a GateNet or GateSearch, got {type(gate).__name__}")
        self.dim, self.level, self.tokens = dim, level, int(tokens)
        self.norm1, self.attn, self.ls1 = norm1, attn, ls1
        self.norm2, self.mlp, self.ls2 = norm2, mlp, ls2
        self.gate = gate
        # The source block's drop-path (training regularisation; identity in eval), kept only when it drops:
        # a block without one has no such child, as before (trainable descriptions list every child).
        self.drop_path1 = drop_path1 if drop_path1 is not None and not isinstance(drop_path1, nn.Identity) else None
        self.drop_path2 = drop_path2 if drop_path2 is not None and not isinstance(drop_path2, nn.Identity) else None
        self.ffn_owned = mlp is not None and not isinstance(mlp, Mlp)
        # The shapes before stage-2 pruning (checkpoint descriptions rebuild the skeleton from them).
        self.orig_heads = attn.num_heads if attn is not None else 0
        self.orig_hidden = mlp.fc1.out_features if mlp is not None and not self.ffn_owned else 0
        self.last_flops: Optional[torch.Tensor] = None  # normalised by `flops_total` (set by vitfast.methods.usdc)
        self.flops_total = 1.0
        init = torch.tensor([static_init, -static_init])  # (+3, −3): keep ≈ 0.95 under the soft Gumbel (τ = 2)
        dev = next(self.parameters()).device
        self.alpha_attn = nn.Parameter(init.clone().to(dev)) if static and attn is not None else None
        self.alpha_ffn = nn.Parameter(init.clone().to(dev)) if static and mlp is not None else None
        self.alpha_heads = (nn.Parameter(init.repeat(attn.num_heads, 1).to(dev))
                            if static and attn is not None else None)
        self.alpha_channels = (nn.Parameter(init.repeat(mlp.fc1.out_features, 1).to(dev))
                               if static and mlp is not None and not self.ffn_owned else None)

    def structure(self) -> Dict[str, Any]:
        """JSON description of this block's trainable structure (see `vitfast.methods.usdc.describe_usdc`)."""
        search = isinstance(self.gate, GateSearch)
        net = self.gate.candidates[0] if search else self.gate
        return {
            "level": self.level, "search": search, "gate_kind": None if search else self.gate.kind,
            "gate_hidden": int(net.hidden) if net.layers == 2 else None, "static": self.static,
            "heads": self.attn.num_heads if self.attn is not None else 0,
            "hidden": (self.mlp.fc1.out_features if self.mlp is not None and not self.ffn_owned else None),
            "ffn": self.mlp is not None, "orig_heads": self.orig_heads, "orig_hidden": self.orig_hidden,
            "tokens": self.tokens, "flops_total": float(self.flops_total),
        }

    def __getstate__(self):
        # The last forward's FLOPs tensor is part of an autograd graph: copies (prune, fuse) start without it.
        state = self.__dict__.copy()
        state["last_flops"] = None
        return state

    @property
    def static(self) -> bool:
        return any(p is not None for p in (self.alpha_attn, self.alpha_ffn, self.alpha_heads, self.alpha_channels))

    # ------------------------------------------------------------------------------------------ construction
    @classmethod
    def from_block(cls, block: nn.Module, *, level: str = "group", search: bool = True, gate_kind: str = "G0",
                   gate_hidden: Optional[int] = None, static: bool = False, static_init: float = 3.0,
                   tokens: int = 197, name: str = "block") -> "USDCBlock":
        """Wrap a timm ViT `Block` (or a RePaViT `ChannelIdleBlock`); weights are shared, not copied."""
        from timm.models.vision_transformer import Block as TimmBlock

        from ..repavit.modules import ChannelIdleBlock

        # The type first: a parallel block has no .attn (an AttributeError once came out of the next line).
        if type(block) is TimmBlock:
            _timm.vit_block_spec(block, name)
            norm2, mlp, ls2 = block.norm2, block.mlp, block.ls2
        elif isinstance(block, ChannelIdleBlock):
            norm2, mlp, ls2 = None, block.mlp, None
        else:
            raise ValueError(f"{name}: expected a timm ViT Block or ChannelIdleBlock, got {type(block).__name__}")
        dim = block.attn.qkv.in_features
        if static and not isinstance(getattr(block.attn, "norm", nn.Identity()), nn.Identity):
            raise ValueError(f"{name}.attn.norm: head pruning needs no scale-norm over the heads, got a LayerNorm")
        device, dtype = block.attn.qkv.weight.device, block.attn.qkv.weight.dtype
        gate = (GateSearch(dim, gate_hidden, device=device, dtype=dtype) if search
                else GateNet(gate_kind, dim, gate_hidden, device=device, dtype=dtype))
        # drop_path2 only beside a timm Mlp: a ChannelIdleMlp applies its own.
        return cls(dim=dim, norm1=block.norm1, attn=block.attn, ls1=block.ls1, norm2=norm2, mlp=mlp, ls2=ls2,
                   gate=gate, level=level, static=static, static_init=static_init, tokens=tokens,
                   drop_path1=block.drop_path1, drop_path2=block.drop_path2 if norm2 is not None else None)

    # ------------------------------------------------------------------------------------------ forward
    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """[B, 2] gates (1 = execute) for the layer input x [B, N, C]."""
        features = x.mean(dim=1)
        if self.training:
            # One Gumbel draw per group, shared by its samples (sec. 3.2.2: "the gate values of each sample inside
            # the same group are consistent"; appendix B: one gate for the whole batch at the batch level).
            ids, groups = group_assignment(x.shape[0], self.level, device=x.device)
            return hard_gates(self.gate(features, ids, groups), True)[ids]
        # Inference: one decision per batch (batch_gate), broadcast to the samples.
        return hard_gates(self.gate(features.mean(dim=0, keepdim=True)), False).expand(x.shape[0], 2)

    def _attention(self, x: torch.Tensor, head_mask: Optional[torch.Tensor], attn_mask: Optional[torch.Tensor] = None,
                   is_causal: bool = False) -> torch.Tensor:
        attn = self.attn
        batch, tokens, _ = x.shape
        qkv = attn.qkv(x).reshape(batch, tokens, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = attn.q_norm(q), attn.k_norm(k)
        # timm's attention dropout, which SDPA applies to the probabilities (it was left out: never dropped)
        drop = _timm.dropout_prob(attn.attn_drop) if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=drop, is_causal=is_causal)
        if head_mask is not None:
            out = out * head_mask[None, :, None, None]
        out = out.transpose(1, 2).reshape(batch, tokens, attn.num_heads * attn.head_dim)
        return attn.proj_drop(attn.proj(attn.norm(out)))

    def _ffn(self, x: torch.Tensor, channel_mask: Optional[torch.Tensor]) -> torch.Tensor:
        if self.ffn_owned:
            return self.mlp(x) - x  # ChannelIdleMlp returns x + FFN(x): its contribution
        mlp = self.mlp
        h = mlp.drop1(mlp.act(mlp.fc1(self.norm2(x))))
        if channel_mask is not None:
            h = h * channel_mask
        return self.ls2(mlp.drop2(mlp.fc2(mlp.norm(h))))

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False) -> torch.Tensor:
        """timm's Block signature: `attn_mask` / `is_causal` go to the attention (SDPA), as in timm and FusedGatedBlock."""
        g = self.gates(x)
        a, f = _keep(self.alpha_attn, self.training), _keep(self.alpha_ffn, self.training)
        heads, channels = _keep(self.alpha_heads, self.training), _keep(self.alpha_channels, self.training)
        flops = self.gate.macs() if isinstance(self.gate, GateSearch) else torch.tensor(float(self.gate.macs()))
        z = x
        if self.attn is not None:
            ga = g[:, 0] if a is None else g[:, 0] * a
            if self.training or bool(ga.any()):
                y = self.ls1(self._attention(self.norm1(x), heads, attn_mask, is_causal))
                z = z + ga[:, None, None] * (self.drop_path1(y) if self.drop_path1 is not None else y)
            flops = flops + ga.mean() * self._attn_macs(heads)
        if self.mlp is not None:
            gf = g[:, 1] if f is None else g[:, 1] * f
            if self.training or bool(gf.any()):
                y = self._ffn(z, channels)
                z = z + gf[:, None, None] * (self.drop_path2(y) if self.drop_path2 is not None else y)
            flops = flops + gf.mean() * self._ffn_macs(channels)
        self.last_flops = flops / self.flops_total
        return z

    # ------------------------------------------------------------------------------------------ FLOPs (eq. 10)
    def _attn_macs(self, heads: Optional[torch.Tensor]):
        n, c, d = self.tokens, self.dim, self.attn.head_dim
        per_head = n * 3 * c * d + 2 * n * n * d + n * d * c  # qkv, scores + weighted sum, proj
        count = heads.sum() if heads is not None else float(self.attn.num_heads)
        return count * float(per_head)

    def _ffn_macs(self, channels: Optional[torch.Tensor]):
        n, c = self.tokens, self.dim
        if self.ffn_owned:
            return float(n * c * (self.mlp.fc1.out_features + self.mlp.fc2.in_features))
        count = channels.sum() if channels is not None else float(self.mlp.fc1.out_features)
        return count * float(2 * n * c)  # fc1 row + fc2 column per hidden channel

    # ------------------------------------------------------------------------------------------ stage 2
    @torch.no_grad()
    def pruned(self) -> "USDCBlock":
        """Stage 2 (sec. 3.4): a new block without the pruned heads, channels and sub-blocks, keeping the best
        searched gate network; no static logits.  Its eval-mode function equals this block's."""
        attn, mlp = self.attn, self.mlp
        if attn is not None:
            keep = _keep(self.alpha_heads, False)
            if _keep(self.alpha_attn, False) is not None and not bool(_keep(self.alpha_attn, False)):
                attn = None
            elif keep is not None:
                idx = torch.nonzero(keep).flatten()
                attn = _prune_heads(attn, idx) if idx.numel() else _bias_only_attention(attn)
        if mlp is not None:
            keep = _keep(self.alpha_channels, False)
            if _keep(self.alpha_ffn, False) is not None and not bool(_keep(self.alpha_ffn, False)):
                mlp = None
            elif keep is not None:
                idx = torch.nonzero(keep).flatten()
                mlp = _prune_channels(mlp, idx) if idx.numel() else _bias_only_mlp(mlp)
        gate = self.gate.selected() if isinstance(self.gate, GateSearch) else self.gate
        new = USDCBlock(dim=self.dim, norm1=self.norm1, attn=attn, ls1=self.ls1,
                        norm2=self.norm2 if mlp is not None else None, mlp=mlp, ls2=self.ls2,
                        gate=copy.deepcopy(gate), level=self.level, static=False, tokens=self.tokens,
                        drop_path1=self.drop_path1, drop_path2=self.drop_path2 if mlp is not None else None)
        new.flops_total = self.flops_total
        new.orig_heads, new.orig_hidden = self.orig_heads, self.orig_hidden
        return new.train(self.training)

    def to_fused(self, name: str = "block") -> "FusedGatedBlock":
        block = self.pruned() if (self.static or isinstance(self.gate, GateSearch)) else self
        gate = FusedBatchGate.from_gate_net(block.gate.eval())
        norm1 = attn = mlp = None
        if block.attn is not None:
            norm1, attn = fused_attention(block.norm1, block.attn, block.ls1, name)
        if block.mlp is not None:
            if block.ffn_owned:
                mlp = block.mlp.to_fused()
            else:
                mlp = FusedChannelIdleFFN.from_timm_mlp(
                    block.norm2, block.mlp, _timm.layer_scale_gamma(block.ls2, f"{name}.ls2"), name=f"{name}.mlp")
        return FusedGatedBlock(self.dim, gate=gate, norm1=norm1, attn=attn, mlp=mlp).eval()


def _prune_heads(attn: nn.Module, idx: torch.Tensor) -> nn.Module:
    heads, d = attn.num_heads, attn.head_dim
    dim = attn.qkv.in_features
    qk_norm = not isinstance(attn.q_norm, nn.Identity)
    new = TimmAttention(dim, num_heads=len(idx), attn_head_dim=d, qkv_bias=attn.qkv.bias is not None,
                        qk_norm=qk_norm, proj_bias=attn.proj.bias is not None,
                        norm_layer=type(attn.q_norm) if qk_norm else None,
                        device=attn.qkv.weight.device, dtype=attn.qkv.weight.dtype)
    rows = torch.cat([s * heads * d + h * d + torch.arange(d) for s in range(3) for h in idx.tolist()])
    cols = torch.cat([h * d + torch.arange(d) for h in idx.tolist()])
    new.qkv.weight.copy_(attn.qkv.weight[rows])
    if attn.qkv.bias is not None:
        new.qkv.bias.copy_(attn.qkv.bias[rows])
    new.proj.weight.copy_(attn.proj.weight[:, cols])
    if attn.proj.bias is not None:
        new.proj.bias.copy_(attn.proj.bias)
    # The block's regularisation stays through stage 2 (the rebuilt module had none: p = 0).
    new.attn_drop = copy.deepcopy(attn.attn_drop)
    new.proj_drop = copy.deepcopy(attn.proj_drop)
    if qk_norm:
        new.q_norm.load_state_dict(attn.q_norm.state_dict())
        new.k_norm.load_state_dict(attn.k_norm.state_dict())
    return new


# Every head (channel) pruned while α keeps the sub-block: its eval-mode output is still the constant
# ls·proj.bias (ls·fc2.bias), added whenever the gate opens.  Dropping the sub-block lost that constant (the
# fused model was off by it); it is kept as one head (channel) whose output weights are zero, so it contributes
# exactly the bias.  Without the bias there is nothing left: the sub-block goes.
def _bias_only_attention(attn: nn.Module) -> Optional[nn.Module]:
    if attn.proj.bias is None:
        return None
    new = _prune_heads(attn, torch.zeros(1, dtype=torch.long))
    new.proj.weight.zero_()
    return new


def _bias_only_mlp(mlp: Mlp) -> Optional[Mlp]:
    if mlp.fc2.bias is None:
        return None
    new = _prune_channels(mlp, torch.zeros(1, dtype=torch.long))
    new.fc2.weight.zero_()
    return new


def _prune_channels(mlp: Mlp, idx: torch.Tensor) -> Mlp:
    if not isinstance(mlp.norm, nn.Identity):
        raise ValueError("mlp.norm: channel pruning needs no norm inside the MLP, got a norm")
    w = mlp.fc1.weight
    new = Mlp(mlp.fc1.in_features, hidden_features=len(idx), out_features=mlp.fc2.out_features,
              act_layer=type(mlp.act), bias=(mlp.fc1.bias is not None, mlp.fc2.bias is not None))
    new = new.to(device=w.device, dtype=w.dtype)
    new.act = copy.deepcopy(mlp.act)
    new.drop1, new.drop2 = copy.deepcopy(mlp.drop1), copy.deepcopy(mlp.drop2)
    new.fc1.weight.copy_(mlp.fc1.weight[idx])
    if mlp.fc1.bias is not None:
        new.fc1.bias.copy_(mlp.fc1.bias[idx])
    new.fc2.weight.copy_(mlp.fc2.weight[:, idx])
    if mlp.fc2.bias is not None:
        new.fc2.bias.copy_(mlp.fc2.bias)
    return new
