"""USDC dynamic gates (usdc-static-dynamic-compression, sec. 3.2): decision networks, their search and group-level
augmentation (the fused gate, `vitfast.nn.FusedBatchGate`, runs `torch.ops.vitfast.batch_gate`).

One decision network per encoder layer reads the layer input Z_{ℓ−1} and gives two gates, g_{ℓ,0} (execute the
MHSA sub-block) and g_{ℓ,1} (execute the FFN sub-block), eq. 5.  Every network here outputs four logits, read as
[gate, choice] with choice 0 = execute and 1 = skip; training draws a hard Gumbel-softmax over the choice (τ = 5,
straight-through gradients), inference takes the argmax, i.e. execute ⇔ logit_execute − logit_skip > 0.
Both temperatures (τ = 5 for the gates, τ = 2 for the search and static compression) are constants in the paper
(appendix A), not annealed: they stay fixed here.

Search space (sec. 3.2.1), hidden width H (default C/2) for the two-layer networks:

    G0  FC → LayerNorm → ReLU → FC          G4  1×1 conv → BatchNorm → ReLU → 1×1 conv
    G1  FC → BatchNorm → ReLU → FC          G5  1×1 conv → BatchNorm → GELU → 1×1 conv
    G2  FC → LayerNorm → GELU → FC          G6  1×1 conv
    G3  FC

Decisions made here (the paper does not say):
* Input of every network: the token mean-pool of Z_{ℓ−1} ([B, C]), and the 1×1 convolutions act on it as a
  [B, C, 1, 1] map.  Pooling first is what makes the gate nearly free (the paper's G FLOPs are ≤ 0.1 M per
  layer); on a 1×1 map a 1×1 conv is an FC with a different parameter layout and BatchNorm2d — kept as distinct
  candidates because that is the paper's search space.
* The LayerNorms of G0/G2 have no affine: an affine before the activation could not be folded into the next
  layer, and the fused op (`batch_gate`) takes one non-affine LN.  BatchNorms fold into the layer before them.
* Group-level gates average the pooled features inside a group, then run the network on every row (the rows of
  one group are equal), so a BatchNorm still sees B rows in training.  At inference the whole batch is one group,
  which is exactly what `batch_gate` computes (pool, batch mean, network, threshold).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

GATE_KINDS = ("G0", "G1", "G2", "G3", "G4", "G5", "G6")


GATE_LEVELS = ("group", "sample", "batch")


# Gumbel-softmax temperatures, fixed for the whole training (USDC appendix A: "The temperature of Gumbel Softmax is
# set to 5.0 for dynamic skipping of USDC, and 2.0 for dynamic gates networks searching and static compression").
# The paper gives constants and no annealing schedule, so unlike the DSP gate (vitfast/head_selection.py) nothing
# here implements the trainer's `set_step` hook.
GATE_TAU = 5.0  # hard Gumbel-softmax temperature of the dynamic gates


SEARCH_TAU = 2.0  # soft Gumbel-softmax temperature of the gate search and of static compression


# kind -> (layers, norm, activation, conv)
_SPEC = {
    "G0": (2, "layer", "relu", False),
    "G1": (2, "batch", "relu", False),
    "G2": (2, "layer", "gelu", False),
    "G3": (1, None, "none", False),
    "G4": (2, "batch", "relu", True),
    "G5": (2, "batch", "gelu", True),
    "G6": (1, None, "none", True),
}


# ---------------------------------------------------------------------------------------------- group-level gates
def group_sizes(batch: int) -> List[int]:
    """Recursive log₂ split of a mini-batch (USDC sec. 3.2.2, Fig. 2): B/2, B/4, …, 1, 1 (floor halves of what is
    left, so every B is covered: 10 → [5, 2, 1, 1, 1])."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch: expected an int >= 1, got {batch!r}")
    sizes, left = [], batch
    while left > 1:
        size = left // 2
        sizes.append(size)
        left -= size
    sizes.append(left)
    return sizes


def group_ids(batch: int, generator: Optional[torch.Generator] = None, device=None) -> torch.Tensor:
    """Group of every sample [B] (int64): samples randomly shuffled into the groups of `group_sizes(B)`."""
    sizes = group_sizes(batch)
    ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    perm = torch.randperm(batch, generator=generator)
    out = torch.empty(batch, dtype=torch.long)
    out[perm] = ids
    return out.to(device) if device is not None else out


def group_assignment(batch: int, level: str, generator: Optional[torch.Generator] = None,
                     device=None) -> Tuple[torch.Tensor, int]:
    """(group of every sample [B] int64, number of groups G) for a gate level (USDC sec. 3.2.2, appendix B):
    "sample" = B groups of one, "batch" = one group, "group" = the random recursive log₂ split."""
    if level not in GATE_LEVELS:
        raise ValueError(f"level: expected one of {GATE_LEVELS}, got {level!r}")
    if level == "sample":
        return torch.arange(batch, device=device), batch
    if level == "batch":
        return torch.zeros(batch, dtype=torch.long, device=device), 1
    return group_ids(batch, generator, device), len(group_sizes(batch))


def group_mean(values: torch.Tensor, ids: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, ...] → [G, ...]: the mean of each group's rows."""
    count = torch.bincount(ids, minlength=groups).to(values.dtype).clamp_min(1)
    sums = values.new_zeros((groups, *values.shape[1:])).index_add(0, ids, values)
    return sums / count.reshape(groups, *([1] * (values.dim() - 1)))


def group_features(features: torch.Tensor, level: str, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Gate features [B, C] → the features each sample's gate is computed from (USDC appendix B/D).

    "sample": unchanged (one gate per sample); "batch": every row = the batch mean (one gate per batch, what
    inference does); "group": every row = the mean of its random group (recursive log₂ split).
    """
    if features.dim() != 2:
        raise ValueError(f"features: expected [B, C], got {list(features.shape)}")
    ids, groups = group_assignment(features.shape[0], level, generator, features.device)
    if level == "sample":
        return features
    return group_mean(features, ids, groups)[ids]


def hard_gates(logits: torch.Tensor, training: bool, tau: float = GATE_TAU) -> torch.Tensor:
    """[R, 2, 2] gate logits → [R, 2] gates g ∈ {0, 1} (1 = execute): hard Gumbel-softmax in training
    (straight-through: the forward value is the one-hot sample, the gradient the soft one's), argmax otherwise."""
    if training:
        return F.gumbel_softmax(logits, tau=tau, hard=True, dim=-1)[..., 0]
    return (logits[..., 0] > logits[..., 1]).to(logits.dtype)


# ---------------------------------------------------------------------------------------------- candidates
class GateNet(nn.Module):
    """One decision network G_k of the search space (see the module doc); forward([R, C]) -> logits [R, 2, 2]."""

    def __init__(self, kind: str, dim: int, hidden: Optional[int] = None, *, device=None, dtype=None) -> None:
        super().__init__()
        if kind not in _SPEC:
            raise ValueError(f"kind: expected one of {GATE_KINDS}, got {kind!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim: expected an int >= 1, got {dim!r}")
        hidden = max(1, dim // 2) if hidden is None else hidden
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError(f"hidden: expected an int >= 1, got {hidden!r}")
        dd = {"device": device, "dtype": dtype}
        layers, norm, act, conv = _SPEC[kind]
        self.kind, self.dim, self.layers, self.norm_type, self.act_type, self.conv = kind, dim, layers, norm, act, conv
        self.hidden = hidden if layers == 2 else 4
        width = hidden if layers == 2 else 4
        self.fc1 = nn.Conv2d(dim, width, 1, **dd) if conv else nn.Linear(dim, width, **dd)
        if layers == 2:
            if norm == "layer":
                self.norm = nn.LayerNorm(hidden, elementwise_affine=False)
            else:
                self.norm = (nn.BatchNorm2d if conv else nn.BatchNorm1d)(hidden, **dd)
            self.act = nn.ReLU() if act == "relu" else nn.GELU()
            self.fc2 = nn.Conv2d(hidden, 4, 1, **dd) if conv else nn.Linear(hidden, 4, **dd)
        self._init_execute()

    def _init_execute(self) -> None:
        # Start with every sub-block executed (the pretrained function): the last layer's bias favours
        # "execute" by a margin the Gumbel noise at τ = 5 rarely beats, and training moves it from there.
        last = self.fc2 if self.layers == 2 else self.fc1
        with torch.no_grad():
            last.weight.mul_(0.1)
            last.bias.copy_(torch.tensor([3.0, -3.0, 3.0, -3.0], dtype=last.bias.dtype))

    def forward(self, features: torch.Tensor, ids: Optional[torch.Tensor] = None,
                groups: Optional[int] = None) -> torch.Tensor:
        """Logits [R, 2, 2] of features [R, C]; with `ids` [R] (a group per row) and `groups` G: the logits of
        each group's mean feature, [G, 2, 2].

        Grouped, fc1 and a BatchNorm run on the rows and the mean is taken after them: both are affine per
        channel, so this is the network on the group means, while the BatchNorm's training statistics are
        those of the samples.  On rows that already repeat a group mean (one row per batch at the batch level)
        they had zero variance: the normalised output was the bias whatever the input, and running_var decayed
        to ~0.  A LayerNorm is not affine per channel: it runs on the means.
        """
        if self.training and self.norm_type == "batch" and features.shape[0] < 2:
            # BatchNorm's training statistics are those of the batch's samples: undefined for one sample
            raise ValueError(
                f"features: a {self.kind} gate normalises with BatchNorm over the batch, so training needs at least 2 "
                f"samples per batch (per process under DDP), got {features.shape[0]}; train with a larger batch, or "
                f"(without the gate search, which includes G1/G4/G5) a gate_kind without BatchNorm: G0, G2, G3 or G6"
            )
        h = features[:, :, None, None] if self.conv else features
        h = self.fc1(h)
        if self.layers == 2 and self.norm_type == "batch":
            h = self.norm(h)
        if ids is not None:
            h = group_mean(h, ids, groups)
        if self.layers == 2:
            if self.norm_type != "batch":
                h = self.norm(h)
            h = self.fc2(self.act(h))
        return h.reshape(h.shape[0], 2, 2)

    def macs(self) -> int:
        """Multiply-adds of one decision (the F_{G,ℓ,k} of eq. 10, before normalising)."""
        if self.layers == 1:
            return self.dim * 4
        return self.dim * self.hidden + self.hidden * 4

    @torch.no_grad()
    def folded(self) -> Dict[str, Any]:
        """The eval-mode network as `batch_gate` arguments (float64 tensors): BatchNorm folded into the first layer,
        the (execute − skip) difference of each gate's two logits folded into the last layer's rows."""
        def matrix(layer):
            w = layer.weight.detach().double()
            return w.reshape(w.shape[0], -1), layer.bias.detach().double()

        diff = torch.tensor([[1.0, -1.0, 0.0, 0.0], [0.0, 0.0, 1.0, -1.0]], dtype=torch.float64)
        w1, b1 = matrix(self.fc1)
        if self.layers == 1:
            return dict(w1=diff @ w1, b1=diff @ b1, w2=None, b2=None, layer_norm=False, act="none", eps=1e-5)
        eps = 1e-5
        if self.norm_type == "batch":
            bn = self.norm
            scale = bn.weight.detach().double() / torch.sqrt(bn.running_var.double() + bn.eps)
            w1 = w1 * scale[:, None]
            b1 = (b1 - bn.running_mean.double()) * scale + bn.bias.detach().double()
        else:
            eps = float(self.norm.eps)
        w2, b2 = matrix(self.fc2)
        return dict(w1=w1, b1=b1, w2=diff @ w2, b2=diff @ b2, layer_norm=self.norm_type == "layer",
                    act=self.act_type, eps=eps)

    def extra_repr(self) -> str:
        return f"kind={self.kind}, dim={self.dim}, hidden={self.hidden}"


class GateSearch(nn.Module):
    """DARTS-style search over the candidates (sec. 3.2.1, eq. 6): g = Σ_k α^g_k G_k(Z), α^g = Gumbel-softmax of the
    learnable architecture logits (soft, τ = 2) in training; in eval mode only the best candidate runs.

    Mixing happens on the four logits, before the gates' own hard Gumbel-softmax.  `selected()` returns the best
    candidate (argmax of the architecture logits): what each layer keeps after the search.
    """

    _no_weight_decay = ("arch_logits",)  # architecture weights, not model weights

    def __init__(self, dim: int, hidden: Optional[int] = None, kinds=GATE_KINDS, *, device=None, dtype=None) -> None:
        super().__init__()
        kinds = tuple(kinds)
        if not kinds or any(k not in _SPEC for k in kinds):
            raise ValueError(f"kinds: expected a non-empty subset of {GATE_KINDS}, got {kinds!r}")
        self.kinds = kinds
        self.candidates = nn.ModuleList(GateNet(k, dim, hidden, device=device, dtype=dtype) for k in kinds)
        self.arch_logits = nn.Parameter(torch.zeros(len(kinds), device=device, dtype=dtype))
        self.tau = SEARCH_TAU
        self.last_weights: Optional[torch.Tensor] = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["last_weights"] = None  # part of an autograd graph: copies start without it
        return state

    def weights(self) -> torch.Tensor:
        if self.training:
            return F.gumbel_softmax(self.arch_logits, tau=self.tau, hard=False)
        return F.one_hot(self.arch_logits.argmax(), len(self.kinds)).to(self.arch_logits.dtype)

    def forward(self, features: torch.Tensor, ids: Optional[torch.Tensor] = None,
                groups: Optional[int] = None) -> torch.Tensor:
        w = self.weights()
        self.last_weights = w
        if not self.training:
            return self.candidates[int(w.argmax())](features, ids, groups)
        return sum(w[k] * net(features, ids, groups) for k, net in enumerate(self.candidates))

    def macs(self) -> torch.Tensor:
        """Σ_k α^g_k F_{G,k} with the weights of the last forward (the gate term of eq. 10)."""
        w = self.last_weights if self.last_weights is not None else self.weights()
        return sum(w[k] * float(net.macs()) for k, net in enumerate(self.candidates))

    def selected(self) -> GateNet:
        return self.candidates[int(self.arch_logits.argmax())]

    def extra_repr(self) -> str:
        return f"kinds={self.kinds}"
