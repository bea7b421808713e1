"""Train-time non-deep ViT (non-deep-vit-progressive-reparam, sections 3-4, appendix B, E): one block = n parallel
branches, progressively joined so that it collapses exactly into one ordinary-width layer.

Block (n branches b = 1..n, λ = λ(t) from `JoinSchedule`, y = the shared normalised tokens):

    y = LN(x)                                         non-affine, before the branch point (eq. 1-2, see below)
    S_b = Q_b K_bᵀ = y W_b yᵀ + (bias terms)          W_{b,h} = W^Q_{b,h} W^K_{b,h}ᵀ per head (eq. 4)
    P_b = softmax((S_b + λ Σ_{b'≠b} S_b') / (√(1 + (n−1)λ²) √d_k))              (eq. 5, rescale generalised)
    x  = x + Σ_b Σ_h P_{b,h} V_{b,h} W^O_{b,h}                                  (eq. 3: head-wise projection)
    y = LN(x);  h_b = W_{1,b} y + b_{1,b}
    x  = x + Σ_b W_{2,b} act(h_b + λ Σ_{b'≠b} h_b') + b_{2,b}                  (eq. 8-9; GELU channels only)

LayerNorm placement (eq. 1-2).  Each branch starts as a different pretrained layer with its own LN affine
(γ_b, β_b), but the branches must share one normalisation.  vitfast absorbs both affines *forward*, exactly:
γ_b, β_b of the FFN norm into W_{1,b}, b_{1,b} (eq. 1) and those of the attention norm into the branch's
qkv (W ↦ W diag γ_b, b ↦ W β_b + b).  The paper absorbs the attention norm backward into the previous FFN's
W_2 (eq. 2); that is not exact — the LayerNorm re-normalises what W_2 produced, and the residual stream sits in
between — while the forward absorption is, and keeps the XWXᵀ form: X stays the shared normalised tokens,
W_{b,h} becomes diag γ_b W^Q W^Kᵀ diag γ_b, and β_b becomes q/k biases (handled below).  At inference no LN
affine is left (the fused block has a non-affine LN, as in the paper).

Variance rescale.  If the n score maps S_b are i.i.d. with variance σ², the joined logits S_b + λ Σ_{b'≠b} S_b'
have variance (1 + (n−1)λ²)σ², so the pre-softmax scale is √(1 + (n−1)λ²)·√d_k.  For n = 2 this is the
paper's √(1 + λ²)·√d_k (section 3.3, Algorithm 1 line 11).  At λ = 1 it is √n·√d_k (the paper's eq. 6 writes
2√d_k for two branches, which contradicts its own rescale at λ = 1; we follow the rescale — the collapse is
exact either way, the constant folds into W).

Biases.  q_i·k_j = y_i W yⱼᵀ + y_i W^Q b_kᵀ + b_q W^Kᵀ yⱼᵀ + b_q·b_k.  The 2nd and 4th terms are constant over
keys j and cancel in the softmax; the 3rd is a per-key bias yⱼ·(W^K b_q).  Joining mixes whole score maps, so
every term joins like W does and the collapse stays exact: the fused op gets key_bias_h = Σ_b W^K_{b,h} b_{q,b,h}.
V biases go through W^O into the output bias (softmax rows sum to 1).

Value path and the collapse.  At λ = 1 every branch has the same P_h, so the block's attention output is
P_h y Σ_b W^V_{b,h} W^O_{b,h}: exact with the branch factors side by side (value width n·d_h), not with
(Σ_b W^V_{b,h})(Σ_b W^O_{b,h}) as eq. 6-7 state — that product has cross terms W^V_b W^O_b' the branches never
computed.  `join_values=True` makes eq. 6-7 exact: the values are joined like the scores,
V_b ↦ (V_b + λ Σ_{b'≠b} V_b') / √(1 + (n−1)λ²), so at λ = 1 every branch sees Σ_b V_b / √n and the fused block
sums W^V and W^O (value width d_h: the cheaper inference layer).  Default False (the paper's description: joining
only at the inputs of non-linear functions).

FFN.  At λ = 1 every branch's GELU input is Σ_b h_b, so W_1 = Σ_b W_{1,b}, W_2 = Σ_b W_{2,b} (eq. 9).  With
channel-idle FFNs (RePaViT, θ > 0) only the GELU channels are joined; the idle channels are linear end to end
and collapse as Σ_b W_{2,b,idle} W_{1,b,idle} into the fused FFN's linear path.

Diversity regulariser (section 4, α = 0.05): during training each sub-block records the mean over branch pairs
of the squared cosine similarity of the branch outputs (per token, over channels); `extra_loss()` returns the
mean over the block's attention and FFN, and `extra_loss_weight` carries α (the Trainer adds weight × value;
`vitfast.convert.from_timm` sets α / number of blocks so the total is α × the mean over all sub-blocks).

`vitfast.fuse` calls `NonDeepBlock.to_fused()` → `vitfast.nn.xwx.FusedXWXBlock` (λ must be 1).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath, LayerNorm as TimmLayerNorm, Mlp
from timm.models.vision_transformer import Attention as TimmAttention

from ..._checks import check_finite_parameter, check_nonnegative_weight
from ...nn import _timm
from ...nn.ffn import active_channels
from ...nn.xwx import FusedXWXBlock
from ..repavit.modules import FFN_NORMS, tokens_batchnorm
from .fold import fold_nondeep_attention, fold_nondeep_mlp
from .schedule import JoinSchedule, _as_schedule

__all__ = [
    "JOIN_SCHEDULES",
    "join_lambda",
    "JoinSchedule",
    "NonDeepAttention",
    "NonDeepMlp",
    "NonDeepBlock",
    "branch_diversity",
]


def _join(t: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """Branch b ↦ t_b + λ Σ_{b'≠b} t_b' = (1 − λ) t_b + λ Σ_b' t_b' over the leading (branch) dimension."""
    return (1.0 - lam) * t + lam * t.sum(0, keepdim=True)


def _rescale(lam: torch.Tensor, branches: int) -> torch.Tensor:
    """√(1 + (n−1)λ²): the std of a sum of one map and (n−1) λ-weighted i.i.d. maps (module doc)."""
    return torch.sqrt(1.0 + (branches - 1) * lam * lam)


def branch_diversity(outputs: torch.Tensor) -> torch.Tensor:
    """Mean over branch pairs i < j of E[cos(f_i, f_j)²] (section 4), outputs [n, ..., C]; 0 for one branch."""
    n = outputs.shape[0]
    if n < 2:
        return outputs.new_zeros(())
    unit = F.normalize(outputs.float(), dim=-1)
    i, j = torch.triu_indices(n, n, offset=1, device=outputs.device)
    cos = (unit[i] * unit[j]).sum(-1)  # [pairs, ...]
    return cos.square().mean()


# ---------------------------------------------------------------------------------------------- attention
def _per_branch_message(name: str, where: str) -> str:
    return (
        f"{name}: a non-deep block has one {name} per branch ({where}.branches[i].{name}), so timm's fix_init=True "
        f"(which rescales {where}.{name}.weight) cannot apply; build with fix_init=False and rescale the branches' "
        f"weights yourself if you want that initialisation"
    )


class _AttentionBranch(nn.Module):
    """One branch's projections, timm layout: qkv rows [3, heads, head_dim], proj columns [heads, head_dim]."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, qkv_bias: bool, proj_bias: bool, **dd) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * num_heads * head_dim, bias=qkv_bias, **dd)
        self.proj = nn.Linear(num_heads * head_dim, dim, bias=proj_bias, **dd)


class NonDeepAttention(nn.Module):
    """n parallel attention branches on shared normalised tokens, joined before the softmax (module doc).

    forward(y, lam) -> [n, B, N, C] per-branch outputs (the block sums them).  Set `record_attention = True` to
    keep the branch-averaged attention maps of the last forward in `attention_maps` ([B, H, N, N], with grad) for
    attention-map distillation.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        branches: int,
        *,
        head_dim: Optional[int] = None,
        qkv_bias: bool = True,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        join_values: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"num_heads: expected a divisor of dim = {dim}, got {num_heads}")
            head_dim = dim // num_heads
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_branches = branches
        self.join_values = bool(join_values)
        self.record_attention = False
        self.attention_maps: Optional[torch.Tensor] = None
        self.diversity: Optional[torch.Tensor] = None
        self.compute_diversity = True
        self.attn_drop = nn.Dropout(attn_drop)
        self.branches = nn.ModuleList(
            _AttentionBranch(dim, num_heads, head_dim, qkv_bias, proj_bias, device=device, dtype=dtype)
            for _ in range(branches)
        )

    def __getattr__(self, name: str):
        if name == "proj":  # timm's fix_init=True rescales `block.attn.proj.weight`: name why it cannot here
            raise AttributeError(_per_branch_message("proj", "attn"))
        return super().__getattr__(name)

    def forward(self, y: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        n, heads, d = self.num_branches, self.num_heads, self.head_dim
        batch, tokens, _ = y.shape
        qkv = torch.stack([br.qkv(y) for br in self.branches])  # [n, B, N, 3·H·d]
        q, k, v = qkv.reshape(n, batch, tokens, 3, heads, d).permute(3, 0, 1, 4, 2, 5).unbind(0)  # [n, B, H, N, d]
        # q kᵀ is X W_{b,h} Xᵀ plus the bias terms (module doc), computed at head width d rather than C.
        scores = q @ k.transpose(-1, -2)
        rescale = _rescale(lam, n)
        logits = _join(scores, lam) / (rescale * math.sqrt(d))  # eq. 5 with the generalised rescale
        probs = logits.softmax(dim=-1)
        self.attention_maps = probs.mean(0) if self.record_attention else None
        probs = self.attn_drop(probs)
        if self.join_values:
            v = _join(v, lam) / rescale
        heads_out = probs @ v  # [n, B, H, N, d]
        outputs = []
        for b, br in enumerate(self.branches):
            w_o = br.proj.weight.t().reshape(heads, d, -1)  # W^O split into head blocks W^O_{b,h} (eq. 3)
            out = torch.einsum("bhnd,hdc->bnc", heads_out[b], w_o)
            outputs.append(out + br.proj.bias if br.proj.bias is not None else out)
        outputs = torch.stack(outputs)
        self.diversity = branch_diversity(outputs) if self.training and self.compute_diversity else None
        return outputs

    def extra_repr(self) -> str:
        return f"branches={self.num_branches}, num_heads={self.num_heads}, head_dim={self.head_dim}, join_values={self.join_values}"


# ---------------------------------------------------------------------------------------------- FFN
class _MlpBranch(nn.Module):
    def __init__(self, dim: int, hidden: int, bias1: bool, bias2: bool, hidden_norm: bool, **dd) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=bias1, **dd)
        self.hidden_norm = nn.BatchNorm1d(hidden, **dd) if hidden_norm else nn.Identity()
        self.fc2 = nn.Linear(hidden, dim, bias=bias2, **dd)


class NonDeepMlp(nn.Module):
    """The FFN sub-block of a non-deep block, shortcut included: x ↦ x + drop_path(Σ_b FFN_b(pre_norm(x))).

    pre_norm (shared, before the branch point): norm="layer" — non-affine LayerNorm (each branch's affine lives
    in its fc1, eq. 1); norm="batch" — one BatchNorm1d over C (RePaViT; its eval-mode affine folds into Σ_b fc1).
    GELU on the first `active_features` hidden channels of every branch (channel-idle FFN, θ = 1 − A/hidden; θ = 0
    is the vanilla FFN), joined across branches before the GELU (eq. 8-9).  norm="batch" adds a per-branch
    BatchNorm1d over the hidden width before fc2 (RePaViT), folded per branch.
    """

    def __init__(
        self,
        dim: int,
        hidden_features: int,
        branches: int,
        *,
        idle_ratio: float = 0.0,
        active_features: Optional[int] = None,
        norm: str = "layer",
        norm_eps: float = 1e-6,
        bias=True,
        drop: float = 0.0,
        drop_path: float = 0.0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if norm not in FFN_NORMS:
            raise ValueError(f"norm: expected one of {FFN_NORMS}, got {norm!r}")
        if active_features is None:
            active_features = active_channels(hidden_features, idle_ratio)
        elif isinstance(active_features, bool) or not isinstance(active_features, int) or not 0 <= active_features <= hidden_features:
            raise ValueError(f"active_features: expected an int in [0, {hidden_features}], got {active_features!r}")
        bias1, bias2 = (bias, bias) if isinstance(bias, bool) else tuple(bias)
        self.in_features = dim
        self.hidden_features = hidden_features
        self.active_features = active_features
        self.num_branches = branches
        self.norm_type = norm
        self.diversity: Optional[torch.Tensor] = None
        self.compute_diversity = True
        if norm == "layer":
            self.pre_norm = nn.LayerNorm(dim, eps=norm_eps, elementwise_affine=False, **dd)
        else:
            self.pre_norm = nn.BatchNorm1d(dim, **dd)
        self.act = nn.GELU()
        self.drop = nn.Dropout(drop)
        self.branches = nn.ModuleList(
            _MlpBranch(dim, hidden_features, bias1, bias2, norm == "batch", **dd) for _ in range(branches)
        )
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def _norm(self, norm: nn.Module, t: torch.Tensor) -> torch.Tensor:
        return tokens_batchnorm(norm, t) if isinstance(norm, nn.BatchNorm1d) else norm(t)

    def __getattr__(self, name: str):
        if name == "fc2":  # timm's fix_init=True rescales `block.mlp.fc2.weight`
            raise AttributeError(_per_branch_message("fc2", "mlp"))
        return super().__getattr__(name)

    def forward(self, x: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
        y = self._norm(self.pre_norm, x)
        h = torch.stack([br.fc1(y) for br in self.branches])  # [n, B, N, hidden]
        a = self.active_features
        if a > 0:  # eq. 9: only the GELU inputs are joined; idle channels are linear and need no joining
            h = torch.cat([self.act(_join(h[..., :a], lam)), h[..., a:]], dim=-1)
        h = self.drop(h)
        outputs = torch.stack([br.fc2(self._norm(br.hidden_norm, h[b])) for b, br in enumerate(self.branches)])
        self.diversity = branch_diversity(outputs) if self.training and self.compute_diversity else None
        return x + self.drop_path(self.drop(outputs.sum(0)))

    def extra_repr(self) -> str:
        return (f"branches={self.num_branches}, hidden_features={self.hidden_features}, "
                f"active_features={self.active_features}, norm={self.norm_type!r}")


# ---------------------------------------------------------------------------------------------- block
class NonDeepBlock(nn.Module):
    """Train-time non-deep ViT block: n parallel branches, progressive joining (module doc).

    Constructor arguments are timm `Block`'s (so `VisionTransformer(depth=L // n, block_fn=partial(NonDeepBlock,
    branches=n))` trains one from scratch) plus keyword-only `branches`, `schedule` (a `JoinSchedule` or its kind:
    "linear" | "cosine" | "exp" | "sqrt"), `join_values`, `idle_ratio` / `active_features` / `ffn_norm`
    (channel-idle FFN, as `ChannelIdleBlock`), `diversity_weight` (α; 0 turns the regulariser off), `mlp_bias`
    (fc1/fc2 bias flags; default `proj_bias` for both, like timm).
    Not supported (refused by name): qk_norm and scale norms (a LayerNorm between X W_Q and the scores breaks
    the XWXᵀ form), LayerScale (`from_timm_blocks` folds a pretrained one into the projections instead).

    λ is the buffer `lam` (saved with the model): the Trainer sets it each step through `set_step`, `set_lambda`
    sets it by hand.  `to_fused()` requires λ = 1.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_attn_norm: bool = False,
        scale_mlp_norm: bool = False,
        proj_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        init_values: Optional[float] = None,
        drop_path: float = 0.0,
        act_layer=nn.GELU,
        norm_layer=TimmLayerNorm,
        mlp_layer=Mlp,
        attn_layer=TimmAttention,
        depth: int = 0,
        device=None,
        dtype=None,
        *,
        branches: int = 2,
        schedule: Union[str, JoinSchedule] = "linear",
        join_values: bool = False,
        idle_ratio: float = 0.0,
        ffn_norm: str = "layer",
        active_features: Optional[int] = None,
        head_dim: Optional[int] = None,
        diversity_weight: float = 0.05,
        mlp_bias=None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if isinstance(branches, bool) or not isinstance(branches, int) or branches < 1:
            raise ValueError(f"branches: expected an int >= 1, got {branches!r}")
        for flag, value, why in (
            ("qk_norm", qk_norm, "a LayerNorm on q/k per head breaks the X W Xᵀ score form"),
            ("scale_attn_norm", scale_attn_norm, "a LayerNorm between heads and W_O breaks the head-wise sum"),
            ("scale_mlp_norm", scale_mlp_norm, "a LayerNorm inside the MLP cannot be joined or fused"),
        ):
            if value:
                raise ValueError(f"{flag}: expected False ({why}), got True")
        if init_values:
            raise ValueError(
                f"init_values: expected None (no LayerScale in a non-deep block; from_timm_blocks folds a pretrained "
                f"one into the projections), got {init_values!r}"
            )
        if mlp_layer not in (None, Mlp):
            raise ValueError(f"mlp_layer: expected timm.layers.Mlp, got {getattr(mlp_layer, '__name__', mlp_layer)!r}")
        if attn_layer not in (None, "", "attn", TimmAttention):
            raise ValueError(f"attn_layer: expected timm Attention, got {getattr(attn_layer, '__name__', attn_layer)!r}")
        check_nonnegative_weight("diversity_weight", diversity_weight)
        _timm.check_gelu(act_layer(), "act_layer")
        norm_eps = _timm.check_layernorm(norm_layer(dim), "norm_layer", dim)
        self.dim = dim
        self.num_branches = branches
        self.schedule = _as_schedule(schedule)
        self.extra_loss_weight = float(diversity_weight)
        self.register_buffer("lam", torch.zeros((), dtype=torch.float32, device=device))
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps, elementwise_affine=False, **dd)
        self.attn = NonDeepAttention(
            dim, num_heads, branches, head_dim=head_dim,
            qkv_bias=qkv_bias, proj_bias=proj_bias, attn_drop=attn_drop, join_values=join_values, **dd,
        )
        self.proj_drop = nn.Dropout(proj_drop)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.mlp = NonDeepMlp(
            dim, int(dim * mlp_ratio), branches, idle_ratio=idle_ratio, active_features=active_features,
            norm=ffn_norm, norm_eps=norm_eps, bias=proj_bias if mlp_bias is None else mlp_bias, drop=proj_drop,
            drop_path=drop_path, **dd,
        )
        for sub in (self.attn, self.mlp):
            sub.compute_diversity = self.extra_loss_weight > 0

    # -------------------------------------------------------------------------------------- λ
    @property
    def lambda_(self) -> float:
        return float(self.lam)

    def set_lambda(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise ValueError(f"value: expected λ in [0, 1], got {value!r}")
        self.lam.fill_(float(value))

    def set_step(self, step: int, total_steps: int) -> None:
        """Trainer hook: λ from the join schedule at the global step."""
        self.lam.fill_(self.schedule(step, total_steps))

    # -------------------------------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise ValueError("attn_mask/is_causal: expected none (non-deep blocks attend over all tokens), got a mask")
        lam = self.lam.to(x.dtype)
        attn = self.attn(self.norm1(x), lam).sum(0)
        x = x + self.drop_path1(self.proj_drop(attn))
        return self.mlp(x, lam)

    def extra_loss(self) -> Optional[torch.Tensor]:
        """Diversity regulariser of the last training forward: mean over this block's attention and FFN."""
        parts = [d for d in (self.attn.diversity, self.mlp.diversity) if d is not None]
        self.attn.diversity = self.mlp.diversity = None  # never hand the same forward's value out twice
        if not parts:
            return None
        return torch.stack(parts).mean()

    def extra_repr(self) -> str:
        return f"branches={self.num_branches}, schedule={self.schedule!r}, diversity_weight={self.extra_loss_weight:.4g}"

    # -------------------------------------------------------------------------------------- conversion
    @classmethod
    def from_timm_blocks(
        cls,
        blocks: Sequence[nn.Module],
        *,
        schedule: Union[str, JoinSchedule] = "linear",
        join_values: bool = False,
        idle_ratio: float = 0.0,
        ffn_norm: str = "layer",
        diversity_weight: float = 0.05,
        name: str = "blocks",
    ) -> "NonDeepBlock":
        """One non-deep block whose branch b is initialised from `blocks[b]` (pretrained timm ViT Blocks).

        Per branch: norm1's affine folded into qkv and norm2's into fc1 (exact, module doc), LayerScale folded
        into proj / fc2 rows, weights otherwise copied.  With θ > 0 the FFN's idle channels lose their GELU, and
        with ffn_norm="batch" the shared BatchNorm starts as (γ, β) = (1, 0), statistics (0, 1) — a data-free
        start, like `ChannelIdleMlp.from_timm`.  λ starts at 0: the block then computes
        x + Σ_b Attn_b(x), followed by x + Σ_b FFN_b(x), the first-order (parallel) approximation of the
        n pretrained layers in sequence.
        """
        blocks = list(blocks)
        if not blocks:
            raise ValueError(f"{name}: expected at least one timm Block, got none")
        specs = [_timm.vit_block_spec(b, f"{name}[{i}]") for i, b in enumerate(blocks)]
        first = specs[0]
        for i, spec in enumerate(specs[1:], 1):
            for key in ("dim", "num_heads", "head_dim", "hidden_features", "norm_eps", "ffn_norm_eps"):
                if spec[key] != first[key]:
                    raise ValueError(
                        f"{name}[{i}]: expected {key} = {first[key]!r} like {name}[0] (branches must have one shape), "
                        f"got {spec[key]!r}"
                    )
        for i, spec in enumerate(specs):
            if spec["qk_norm"] or spec["scale_attn_norm"]:
                raise ValueError(f"{name}[{i}].attn: expected no qk_norm / scale norm (breaks X W Xᵀ), got one")
            if spec["norm_eps"] != spec["ffn_norm_eps"]:
                raise ValueError(f"{name}[{i}].norm2.eps: expected {spec['norm_eps']} (= norm1.eps), got {spec['ffn_norm_eps']}")
        weight = blocks[0].attn.qkv.weight
        dim, hidden = first["dim"], first["hidden_features"]
        has_ln_bias = any(getattr(b.norm1, "bias", None) is not None for b in blocks)
        has_ln2_bias = any(getattr(b.norm2, "bias", None) is not None for b in blocks)
        new = cls(
            dim,
            first["num_heads"],
            mlp_ratio=hidden / dim if int(dim * (hidden / dim)) == hidden else (hidden + 0.5) / dim,
            qkv_bias=any(s["qkv_bias"] for s in specs) or has_ln_bias,  # norm1's β becomes a qkv bias
            proj_bias=any(s["proj_bias"] for s in specs),
            # the branches' regularisation (timm passes proj_drop to the MLP's dropout too); it was left at 0
            proj_drop=max(_timm.dropout_prob(b.attn.proj_drop) for b in blocks),
            attn_drop=max(_timm.dropout_prob(b.attn.attn_drop) for b in blocks),
            drop_path=max(s["drop_path"] for s in specs),
            norm_layer=lambda d, **kw: nn.LayerNorm(d, eps=first["norm_eps"], **kw),
            branches=len(blocks),
            schedule=schedule,
            join_values=join_values,
            idle_ratio=idle_ratio,
            ffn_norm=ffn_norm,
            head_dim=first["head_dim"],
            diversity_weight=diversity_weight,
            mlp_bias=(any(s["mlp_bias"][0] for s in specs) or has_ln2_bias, any(s["mlp_bias"][1] for s in specs)),
            device=weight.device,
            dtype=weight.dtype,
        )
        with torch.no_grad():
            for b, (block, attn_br, mlp_br) in enumerate(zip(blocks, new.attn.branches, new.mlp.branches)):
                where = f"{name}[{b}]"
                w, bias = _absorb_layernorm(block.norm1, block.attn.qkv.weight, block.attn.qkv.bias, f"{where}.norm1")
                _copy_linear(attn_br.qkv, w, bias)
                ls1 = _timm.layer_scale_gamma(block.ls1, f"{where}.ls1")
                w, bias = _scale_rows(block.attn.proj.weight, block.attn.proj.bias, ls1)
                _copy_linear(attn_br.proj, w, bias)
                w, bias = _absorb_layernorm(block.norm2, block.mlp.fc1.weight, block.mlp.fc1.bias, f"{where}.norm2")
                _copy_linear(mlp_br.fc1, w, bias)
                ls2 = _timm.layer_scale_gamma(block.ls2, f"{where}.ls2")
                w, bias = _scale_rows(block.mlp.fc2.weight, block.mlp.fc2.bias, ls2)
                _copy_linear(mlp_br.fc2, w, bias)
        new.train(blocks[0].training)
        return new

    # -------------------------------------------------------------------------------------- collapse
    def to_fused(self, name: str = "block", score_form: str = "auto") -> nn.Module:
        """The exact single-branch block at λ = 1 (eq. 6-9, module doc): `vitfast.nn.xwx.FusedXWXBlock`.

        score_form: "factored" stores W_h = U_h V_hᵀ from the branch factors (rank n·d_h), "full" stores the C×C
        matrix W_h = Σ_b W_{b,h}; "auto" takes "factored" when n·d_h ≤ C/2 (cheaper there), else "full".
        """
        if self.num_branches > 1 and float(self.lam) != 1.0:
            raise ValueError(
                f"{name}.lam: expected λ = 1 (joining finished) for an exact collapse, got {float(self.lam):.6g}; "
                "train through the join schedule's warm-up or call set_lambda(1.0)"
            )
        attention = fold_nondeep_attention(self.attn, name=f"{name}.attn", score_form=score_form)
        ffn = fold_nondeep_mlp(self.mlp, f"{name}.mlp")
        weight = self.attn.branches[0].qkv.weight
        return FusedXWXBlock.from_folded(attention, ffn, norm_eps=float(self.norm1.eps), device=weight.device, dtype=weight.dtype)


def _copy_linear(linear: nn.Linear, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
    linear.weight.copy_(weight)
    if linear.bias is not None:
        linear.bias.copy_(bias if bias is not None else torch.zeros_like(linear.bias))
    elif bias is not None and bool((bias != 0).any()):
        raise ValueError("bias: expected a Linear with a bias for a non-zero folded bias, got bias=False")


def _absorb_layernorm(norm: nn.Module, weight: torch.Tensor, bias: Optional[torch.Tensor], name: str):
    """W · LN(x) + b with LN = γ ⊙ n(x) + β  →  (W diag γ) n(x) + (W β + b)   (eq. 1), in float64."""
    w = weight.detach().double()
    b = bias.detach().double() if bias is not None else None
    gamma, beta = getattr(norm, "weight", None), getattr(norm, "bias", None)
    if beta is not None:
        check_finite_parameter(f"{name}.bias", beta)
        b = w @ beta.detach().double() + (b if b is not None else 0.0)
    if gamma is not None:
        check_finite_parameter(f"{name}.weight", gamma)
        w = w * gamma.detach().double()[None, :]
    return w, b


def _scale_rows(weight: torch.Tensor, bias: Optional[torch.Tensor], gamma: Optional[torch.Tensor]):
    """LayerScale γ ⊙ (W x + b) = (diag γ W) x + γ ⊙ b."""
    w = weight.detach().double()
    b = bias.detach().double() if bias is not None else None
    if gamma is not None:
        g = gamma.detach().double().reshape(-1)
        w = w * g[:, None]
        b = b * g if b is not None else None
    return w, b
