"""USDC in fused form: `FusedGatedBlock` (a ViT block whose MHSA and FFN sub-blocks are skipped for the whole batch when
their gate closes) and `FusedBatchGate` (the decision network as one `torch.ops.vitfast.batch_gate` call).

The train-time side (gate networks, their search, `USDCBlock`, pruning) is `vitfast.methods.usdc`; its `to_fused()`
builds these.  At inference the batch is one group: pool the tokens, average over the batch, run the network,
threshold → one decision per batch for MHSA and FFN.  A closed gate skips the sub-block with its LayerNorm and
residual branch.  On CUDA the decision stays on the device (`gate_select`): no host sync, CUDA graphs still work.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn

from .. import ops
from .._env import get_cuda_kernels
from ._base import ConfigReader, apply_norm, tracing
from ._fold import fold_attention
from .block import FusedAttention, direct_forward, plan_whole_block
from .ffn import FusedChannelIdleFFN
from .registry import register_fused

__all__ = ["FusedGatedBlock", "FusedBatchGate", "set_gate_force", "fused_attention"]



def _attention_config(attn: FusedAttention) -> Dict[str, Any]:
    qk_norm = not isinstance(attn.q_norm, nn.Identity)
    scale_norm = not isinstance(attn.norm, nn.Identity)
    return {
        "num_heads": attn.num_heads, "head_dim": attn.head_dim, "qkv_bias": attn.qkv.bias is not None,
        "qk_norm": qk_norm, "qk_norm_eps": float(attn.q_norm.eps) if qk_norm else None,
        "scale_norm": scale_norm, "scale_norm_eps": float(attn.norm.eps) if scale_norm else None,
        "proj_bias": attn.proj.bias is not None,
    }


def _attention_from_config(dim: int, cfg: Dict[str, Any], dd) -> FusedAttention:
    return FusedAttention(dim, num_heads=cfg["num_heads"], head_dim=cfg["head_dim"], qkv_bias=cfg["qkv_bias"],
                     qk_norm=cfg["qk_norm"], qk_norm_eps=cfg["qk_norm_eps"] or 1e-6, scale_norm=cfg["scale_norm"],
                     scale_norm_eps=cfg["scale_norm_eps"] or 1e-6, proj_bias=cfg["proj_bias"], **dd)


@torch.no_grad()
def fused_attention(norm1, attn, ls1, name):
    folded = fold_attention(norm1, attn, ls1, name)
    tensors = folded.pop("tensors")
    device, dtype = attn.qkv.weight.device, attn.qkv.weight.dtype
    cfg = {"num_heads": folded["num_heads"], "head_dim": folded["head_dim"], "qkv_bias": folded["qkv_bias"],
           "qk_norm": folded["qk_norm"], "qk_norm_eps": folded["qk_norm_eps"],
           "scale_norm": folded["scale_attn_norm"], "scale_norm_eps": folded["scale_attn_norm_eps"],
           "proj_bias": folded["proj_bias"]}
    fused = _attention_from_config(folded["dim"], cfg, {"device": device, "dtype": dtype})
    state = {k[len("attn."):]: v.to(dtype) for k, v in tensors.items() if v is not None}
    fused.load_state_dict(state, strict=True)
    return nn.LayerNorm(folded["dim"], eps=folded["norm_eps"], elementwise_affine=False), fused


# ---------------------------------------------------------------------------------------------- fused block
@register_fused("gated_block")
class FusedGatedBlock(nn.Module):
    """Fused USDC block: drop-in for a timm ViT `Block` (`block(x) -> x` on [B, N, C]).

    d = gate(x) ([2] on x's device, `ops.batch_gate`), then MHSA sub-block x + attn(norm1(x)) if d[0], FFN
    sub-block mlp(x) (owns its norm and shortcut) if d[1].  Pruned sub-blocks are None; pruned heads/channels
    are simply absent from the shapes, which the config records.

    How the decision is applied without a host synchronisation:
    * CPU eager (the decision tensor lives on the CPU): the block reads it and branches — a closed gate really
      skips the sub-block's LayerNorm, GEMMs and residual add, and returns the stream itself.
    * CUDA, or under torch.compile: never read on the host.  Each sub-block is one op, `ops.gated_mhsa` /
      `ops.gated_ffn`, given the decision tensor: on CUDA every one of its Triton kernels (LayerNorm, qkv, attention,
      proj; LayerNorm, fc1+GELU, fc2) reads the flag and returns at once when it is closed, the last one writing
      out = x (kernels/gated.py).  So a closed sub-block costs no GEMM, nothing waits for the GPU, and the model
      stays capturable as one CUDA graph whose replays follow each batch's own decision.
    * Fallback, same semantics without the saving: attention with a mask, `is_causal`, qk-norm or scale-norm (the
      gated attention kernel has none of them), VITFAST_CUDA_KERNELS=torch (A/B against cuBLAS), or fp32 on CUDA
      under the default policy (`ops.use_gated_cuda_kernels`: measured faster there, because the gated fp32
      GEMMs lose to cuBLAS when open), runs the sub-block and lets `ops.gate_select` pick its output or the
      unchanged stream on the device.
    """

    def __init__(self, dim: int, *, gate: FusedBatchGate, norm1: Optional[nn.Module] = None,
                 attn: Optional[FusedAttention] = None, mlp: Optional[FusedChannelIdleFFN] = None) -> None:
        super().__init__()
        if (norm1 is None) != (attn is None):
            raise ValueError("norm1, attn: expected both or neither (a pruned MHSA sub-block has neither)")
        self.dim = dim
        self.gate = gate
        self.norm1 = norm1
        self.attn = attn
        self.mlp = mlp
        plan_whole_block(self)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                is_causal: bool = False) -> torch.Tensor:
        decision = self.gate(x)
        # Under torch.compile or a TorchScript trace no host-side decision: it would be baked into the graph (the ONNX
        # export through the tracer froze every gate's trace-time decision: 19% off on other batches).
        if decision.device.type == "cpu" and not tracing():
            run_attn, run_ffn = (bool(v) for v in decision.tolist())
            if run_attn and run_ffn and attn_mask is None and not is_causal:
                # Both sub-blocks open: the whole block as one op, as vitfast.nn.FusedBlock runs it (same kernels and
                # bits as the two sub-block calls below; None when anything those calls would do differently is
                # in play, e.g. a pruned sub-block, grad mode, hooks, fp16).
                out = direct_forward(self, x)
                if out is not None:
                    return out
            if self.attn is not None and run_attn:
                # The ungated FusedBlock's norm call (the LayerNorm kernel on CPU): an open gate gives its bits.
                x = self.attn(apply_norm(self.norm1, x), attn_mask=attn_mask, is_causal=is_causal, residual=x)
            if self.mlp is not None and run_ffn:
                x = self.mlp(x)
            return x
        # On CUDA the measured policy picks gated kernels or compute + gate_select (ops.use_gated_cuda_kernels);
        # under torch.compile on the CPU the gated ops' CPU impl reads the flag and skips for real.
        gated_ops = (ops.use_gated_cuda_kernels(x.dtype, get_cuda_kernels()) if x.device.type == "cuda"
                     else get_cuda_kernels() != "torch")
        if self.attn is not None:
            if gated_ops and self._gated_mhsa_supported(attn_mask, is_causal):
                x = ops.gated_mhsa(decision, 0, x, *self.gated_mhsa_args())
            else:
                y = self.attn(apply_norm(self.norm1, x), attn_mask=attn_mask, is_causal=is_causal, residual=x)
                x = ops.gate_select(decision, 0, y, x)
        if self.mlp is not None:
            if gated_ops and isinstance(self.mlp, FusedChannelIdleFFN):
                x = ops.gated_ffn(decision, 1, x, *self.gated_ffn_args())
            else:
                x = ops.gate_select(decision, 1, self.mlp(x), x)
        return x

    def _gated_mhsa_supported(self, attn_mask, is_causal) -> bool:
        attn = self.attn
        return (attn_mask is None and not is_causal and isinstance(attn.q_norm, nn.Identity)
                and isinstance(attn.qkv, nn.Linear) and isinstance(attn.proj, nn.Linear)  # not an int8 model's layers
                and isinstance(attn.norm, nn.Identity) and type(self.norm1) is nn.LayerNorm
                and self.norm1.weight is None)

    def gated_mhsa_args(self) -> tuple:
        """The MHSA sub-block as `ops.gated_mhsa` arguments after (gate, index, x)."""
        attn = self.attn
        return (float(self.norm1.eps), attn.qkv.weight, attn.qkv.bias, attn.num_heads, attn.proj.weight,
                attn.proj.bias)

    def gated_ffn_args(self) -> tuple:
        """The FFN sub-block as `ops.gated_ffn` arguments after (gate, index, x)."""
        mlp = self.mlp
        return (float(mlp.norm.eps) if mlp.norm is not None else None, mlp.w_in, mlp.b_in, mlp.w_out, mlp.b_out,
                mlp.residual)

    def vitfast_config(self) -> Dict[str, Any]:
        return {
            "kind": self.vitfast_kind,
            "dim": self.dim,
            "norm_eps": float(self.norm1.eps) if self.norm1 is not None else None,
            "attn": _attention_config(self.attn) if self.attn is not None else None,
            "mlp": self.mlp.vitfast_config() if self.mlp is not None else None,
            "gate": self.gate.vitfast_config(),
        }

    @classmethod
    def from_vitfast_config(cls, cfg: Dict[str, Any], *, device=None, dtype=None) -> "FusedGatedBlock":
        read = ConfigReader(cfg, "gated_block", ("dim", "norm_eps", "attn", "mlp", "gate"))
        dim = read.int("dim")
        dd = {"device": device, "dtype": dtype}
        gate = FusedBatchGate.from_vitfast_config(read.dict("gate"), **dd)
        norm1 = attn = mlp = None
        if cfg.get("attn") is not None:
            sub = ConfigReader(dict(read.dict("attn"), kind="attn"), "attn", (
                "num_heads", "head_dim", "qkv_bias", "qk_norm", "qk_norm_eps", "scale_norm", "scale_norm_eps",
                "proj_bias"))
            qk_norm, scale_norm = sub.bool("qk_norm"), sub.bool("scale_norm")
            acfg = {"num_heads": sub.int("num_heads"), "head_dim": sub.int("head_dim"), "qkv_bias": sub.bool("qkv_bias"),
                    "qk_norm": qk_norm, "qk_norm_eps": sub.eps("qk_norm_eps", optional=not qk_norm),
                    "scale_norm": scale_norm, "scale_norm_eps": sub.eps("scale_norm_eps", optional=not scale_norm),
                    "proj_bias": sub.bool("proj_bias")}
            attn = _attention_from_config(dim, acfg, dd)
            norm1 = nn.LayerNorm(dim, eps=read.eps("norm_eps"), elementwise_affine=False)
        if cfg.get("mlp") is not None:
            mlp = FusedChannelIdleFFN.from_vitfast_config(read.dict("mlp"), **dd)
        return cls(dim, gate=gate, norm1=norm1, attn=attn, mlp=mlp)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, attn={'pruned' if self.attn is None else self.attn.num_heads}, " \
               f"mlp={'pruned' if self.mlp is None else self.mlp.active_features}"


def set_gate_force(model: nn.Module, force: Any) -> int:
    """Set `force` on every fused gate of `model` (None, "open", "closed", or a [MHSA, FFN] pair); returns how
    many gates were set.  For tests and ablations: forced open, a gated model equals its ungated fused model."""
    count = 0
    for module in model.modules():
        if isinstance(module, FusedBatchGate):
            module.force = force
            module._forced()  # validate now
            count += 1
    return count


# ---------------------------------------------------------------------------------------------- fused gate
@register_fused("batch_gate")
class FusedBatchGate(nn.Module):
    """The folded decision network of one layer: forward(x [B, N, C]) -> decision [2] (1 = execute) on x's device,
    through `ops.batch_gate` (C++ on CPU, Triton on CUDA).

    `force` (not stored in files) overrides the decision for tests and ablations: None (the network decides),
    "open" (always execute) or "closed" (always skip); or a pair for [MHSA, FFN], e.g. ("open", None).
    """

    def __init__(self, dim: int, hidden: int, two_layers: bool, layer_norm: bool = False, act: str = "none",
                 eps: float = 1e-5, *, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if not two_layers and (hidden != 2 or layer_norm or act != "none"):
            raise ValueError(f"hidden, layer_norm, act: expected 2, False, 'none' for a one-layer gate, got "
                             f"{hidden}, {layer_norm}, {act!r}")
        self.dim, self.hidden, self.two_layers = dim, hidden, bool(two_layers)
        self.layer_norm, self.act, self.eps = bool(layer_norm), act, float(eps)
        self.w1 = nn.Parameter(torch.zeros(hidden, dim, **dd))
        self.b1 = nn.Parameter(torch.zeros(hidden, **dd))
        self.w2 = nn.Parameter(torch.zeros(2, hidden, **dd)) if two_layers else None
        self.b2 = nn.Parameter(torch.zeros(2, **dd)) if two_layers else None
        self.force: Any = None

    @classmethod
    def from_gate_net(cls, net: nn.Module) -> "FusedBatchGate":
        f = net.folded()
        weight = net.fc1.weight
        gate = cls(net.dim, f["w1"].shape[0], f["w2"] is not None, f["layer_norm"], f["act"], f["eps"],
                   device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            for name in ("w1", "b1", "w2", "b2"):
                if f[name] is not None:
                    getattr(gate, name).copy_(f[name])
        return gate

    def _forced(self) -> Tuple[Optional[float], Optional[float]]:
        force = self.force
        pair = force if isinstance(force, (tuple, list)) else (force, force)
        values = {None: None, "open": 1.0, "closed": 0.0}
        if len(pair) != 2 or any(p not in values for p in pair):
            raise ValueError(f"force: expected None, 'open', 'closed' or a pair of them, got {force!r}")
        return values[pair[0]], values[pair[1]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        forced = self._forced()
        if forced[0] is not None and forced[1] is not None:
            return torch.tensor(forced, dtype=x.dtype, device=x.device)
        decision = ops.batch_gate(x, self.w1, self.b1, self.w2, self.b2, self.layer_norm, self.act, self.eps)
        if forced[0] is not None or forced[1] is not None:
            decision = decision.clone()
            for i, v in enumerate(forced):
                if v is not None:
                    decision[i] = v
        return decision

    def macs(self) -> int:
        return self.dim * self.hidden + (self.hidden * 2 if self.two_layers else 0)

    def vitfast_config(self) -> Dict[str, Any]:
        return {"kind": self.vitfast_kind, "dim": self.dim, "hidden": self.hidden, "two_layers": self.two_layers,
                "layer_norm": self.layer_norm, "act": self.act, "eps": self.eps}

    @classmethod
    def from_vitfast_config(cls, cfg: Dict[str, Any], *, device=None, dtype=None) -> "FusedBatchGate":
        from .block import ConfigReader

        read = ConfigReader(cfg, "batch_gate", ("dim", "hidden", "two_layers", "layer_norm", "act", "eps"))
        return cls(read.int("dim"), read.int("hidden"), read.bool("two_layers"), read.bool("layer_norm"),
                   read.choice("act", ("none", "relu", "gelu")), read.eps("eps"), device=device, dtype=dtype)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, hidden={self.hidden}, two_layers={self.two_layers}, layer_norm={self.layer_norm}, "
                f"act={self.act!r}")
