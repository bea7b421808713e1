"""The fused ViT block: `FusedBlock`, a drop-in for timm's ViT `Block` (same constructor arguments, forward
`block(x) -> x` on [B, N, C]): non-affine LayerNorm → `FusedAttention` (norm1's affine folded into qkv, ls1 into
proj) → the fused FFN (`ffn.FusedChannelIdleFFN`, which owns its norm and shortcut).  `FusedAttention` is
timm-compatible multi-head self-attention (same child names: qkv, q_norm, k_norm, norm, proj) on `vitfast.ops.linear`
(qkv, and proj with the block's shortcut fused) and `vitfast.ops.attention` (heads read straight from the qkv output,
no permute/copy); SDPA only for masks and qk-norm.  At inference the whole block may run as the one
`torch.ops.vitfast.vit_block` call (`plan_whole_block`, `whole_block_args`).

Registered with `@register_fused("block")`; the kind is stored in checkpoint files: never rename it or change the
meaning of a config key.  Fused modules are inference modules: dropout, attention dropout and drop-path arguments
are accepted for signature compatibility and have no effect (they are identities in eval mode, which is the function
fused).
"""
from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import LayerNorm as TimmLayerNorm, Mlp
from timm.models.vision_transformer import Attention as TimmAttention
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

from .. import ops
from . import _timm
from ._base import ConfigReader, apply_norm, default_if_none, layernorm_eps, plain_norm_eps, tracing
from ._fold import fold_attention
from .ffn import FusedChannelIdleFFN, active_channels
from .int8 import Int8ChannelIdleFFN, Int8Linear
from .registry import register_fused

__all__ = ["FusedChannelIdleFFN", "FusedAttention", "FusedBlock", "FusedSwinBlock", "active_channels"]


# ------------------------------------------------------------------------------------------ attention
class FusedAttention(nn.Module):
    """timm-compatible multi-head self-attention on the vitfast ops.

    qkv and proj run on `ops.linear` (packed weights; on CPU the C++ GEMM), the heads on `ops.attention`,
    which reads q/k/v straight from the qkv output and writes [B, N, H·D] in proj's layout (on CPU the C++
    kernel beat SDPA at every DeiT-Ti/S/B shape measured: see benchmarks/bench_attention.py).  An attention
    mask, `is_causal` or qk-norm take the SDPA path.  `residual` (keyword, not in timm's signature) is added
    by proj's epilogue: `FusedBlock` passes its shortcut, so `x + attn(norm1(x))` costs no extra pass.

    Child names and qkv layout ([3, heads, head_dim] along the output rows) are timm's, so timm Attention state
    dicts load unchanged.  Not registered on its own: it is part of `FusedBlock`.
    """

    # The score / value products' flags vitfast.quantize sets on an instance (read from its __dict__); the class
    # defaults let a plan read them as attributes whether set or not (vitfast.nn.vit follows their values).
    int8_attention = False
    bf16_attention = False

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        head_dim: Optional[int] = None,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        qk_norm_eps: float = 1e-6,
        scale_norm: bool = False,
        scale_norm_eps: float = 1e-6,
        proj_bias: bool = True,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(f"num_heads: expected a divisor of dim = {dim}, got {num_heads}")
            head_dim = dim // num_heads
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.attn_dim = num_heads * head_dim
        self.qkv = nn.Linear(dim, 3 * self.attn_dim, bias=qkv_bias, **dd)
        self.q_norm = nn.LayerNorm(head_dim, eps=qk_norm_eps, **dd) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(head_dim, eps=qk_norm_eps, **dd) if qk_norm else nn.Identity()
        self.norm = nn.LayerNorm(self.attn_dim, eps=scale_norm_eps, **dd) if scale_norm else nn.Identity()
        self.proj = nn.Linear(self.attn_dim, dim, bias=proj_bias, **dd)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
        *,
        residual: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        qkv_layer, proj_layer, norm = self.qkv, self.proj, self.norm
        # An int8 model's layers (vitfast.nn.int8.Int8Linear, put in by vitfast.quantize) run themselves.
        qkv = ops.linear(x, qkv_layer.weight, qkv_layer.bias) if isinstance(qkv_layer, nn.Linear) else qkv_layer(x)
        if attn_mask is None and not is_causal and type(self.q_norm) is nn.Identity:
            # int8 models (vitfast.quantize, attention="int8" / "bf16"): the score and value products on the int8
            # core / the bf16 GEMMs
            flags = self.__dict__
            x = (ops.attention_int8 if flags.get("int8_attention") else
                 ops.attention_bf16 if flags.get("bf16_attention") else ops.attention)(qkv, self.num_heads)
        else:
            batch, tokens, _ = x.shape
            q, k, v = qkv.reshape(batch, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            q, k = self.q_norm(q), self.k_norm(k)
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
            x = x.transpose(1, 2).reshape(batch, tokens, self.attn_dim)
        if type(norm) is not nn.Identity:  # scale_norm; the Identity's module call alone is ~1.5 µs per block
            x = norm(x)
        if not isinstance(proj_layer, nn.Linear):
            return proj_layer(x, residual)
        return ops.linear(x, proj_layer.weight, proj_layer.bias, residual)

    def vitfast_prepack(self) -> bool:
        """Pack qkv's and proj's weights for the CPU kernel now (see `vitfast.ops.prepack`)."""
        if not isinstance(self.qkv, nn.Linear) or not isinstance(self.proj, nn.Linear) or self.qkv.weight.device.type != "cpu":
            return False
        for layer in (self.qkv, self.proj):
            ops.linear(layer.weight.new_zeros(1, layer.in_features), layer.weight, layer.bias)
        return True


# The forwards the block op replaces, as defined here: a later patch of either makes FusedBlock call the modules.
_ATTENTION_FORWARD = FusedAttention.forward
_FFN_FORWARD = FusedChannelIdleFFN.forward


class WholeBlockPlan(NamedTuple):
    """Whether a block's structure lets it run as the one `torch.ops.vitfast.vit_block` call, decided once when the
    block is built (by `vitfast.fuse`, `vitfast.load`, `vitfast.patch_timm`), not per forward.  The children it was
    decided for are kept: a block whose children were replaced since plans again.

    `runs_as_one_op` is False when the structure rules the op out: another attention or FFN class, qk_norm /
    scale_norm, LayerNorms with an affine or a fast-norm path.  (The norms' eps are read at each call: they are
    plain attributes a user may set.)
    """

    children: tuple
    runs_as_one_op: bool
    # An int8 block (vitfast.quantize: Int8Linear qkv / proj, Int8ChannelIdleFFN) whose five ops may be called
    # straight through torch.ops (`int8_block_forward`).
    int8_ops: bool = False


def _children(block: nn.Module) -> tuple:
    modules = block._modules
    attn, mlp = modules.get("attn"), modules.get("mlp")  # (a pruned FusedGatedBlock sub-block is None, maybe unregistered)
    attn_modules = attn._modules if isinstance(attn, nn.Module) else {}
    mlp_modules = mlp._modules if isinstance(mlp, nn.Module) else {}
    return (modules.get("norm1"), attn, mlp, attn_modules.get("q_norm"), attn_modules.get("norm"),
            mlp_modules.get("norm"))


def plan_whole_block(block: nn.Module) -> WholeBlockPlan:
    """Decide, from its structure alone, whether `block` (a `FusedBlock`, or a `FusedGatedBlock` whose gates are both open) may
    run as `torch.ops.vitfast.vit_block` (csrc/ops/vit_block.cpp: the same kernels and bits as the six-op path,
    without its per-op Python and dispatch cost, ~35 µs per block: docs/performance.md), and store the decision."""
    children = _children(block)
    norm1, attn, mlp, q_norm, scale_norm, ffn_norm = children
    plain = (type(attn) is FusedAttention and type(q_norm) is nn.Identity and type(scale_norm) is nn.Identity
             and plain_norm_eps(norm1) is not None and (ffn_norm is None or plain_norm_eps(ffn_norm) is not None))
    int8 = (plain and type(mlp) is Int8ChannelIdleFFN and type(attn.qkv) is Int8Linear
            and type(attn.proj) is Int8Linear)
    plan = WholeBlockPlan(children, plain and type(mlp) is FusedChannelIdleFFN and isinstance(attn.qkv, nn.Linear)
                          and isinstance(attn.proj, nn.Linear), int8)
    block.__dict__["_whole_block_plan"] = plan  # not a module attribute: deepcopy maps its children along
    return plan


def whole_block_args(block: nn.Module, x: torch.Tensor, current: Optional[tuple] = None) -> Optional[tuple]:
    """The arguments of `torch.ops.vitfast.vit_block` for this forward of `block`, or None to run its sub-blocks.

    The structure was decided when the block was built (`plan_whole_block`); what can change between two forwards
    is checked here: inference (grad mode off), a [B, N, C] input that is CPU fp32 or bf16 on a CPU with a bf16
    extension (the C++ op) or CUDA without autocast (`ops.vit_block_cuda_eager`: the same torch calls as the six ops'
    CUDA impls, with one check and no dispatch per op), the auto backend, no tracing (exported graphs keep the per-op
    calls), the planned children still in place, and no forward hooks or patched forwards that calling `attn` / `mlp`
    as modules would run.  `current`: `_current_plan(block)` when the caller has it.
    """
    if torch.is_grad_enabled() or x.dim() != 3:
        return None
    if x.is_cpu:
        # bf16 only where the op runs bf16 GEMMs (a bf16 CPU extension: ops._C.bf16_kernel()); elsewhere the six ops
        # keep their bf16 behaviour.
        # (tracing first: dynamo cannot trace into the extension's bf16_kernel, and a trace keeps the six ops anyway)
        if x.dtype != torch.float32 and (x.dtype != torch.bfloat16 or ops._C is None or tracing()
                                         or ops._C.bf16_kernel() == "none"):
            return None
    elif x.is_cuda:
        if ops._autocast_enabled("cuda"):  # the ops cast to fp32 under autocast (their Autocast kernels)
            return None
    else:
        return None
    plan, children = current or _current_plan(block)
    if not plan.runs_as_one_op:
        return None
    norm1, attn, mlp = children[:3]
    # A forward patched on the class must run.
    if _hooked(attn, mlp) or FusedChannelIdleFFN.forward is not _FFN_FORWARD:
        return None
    params = vit_block_params(children)
    if params is None or ops.get_backend() == "reference" or tracing() or params[1].dtype != x.dtype:
        return None
    if x.is_cpu and not ops.extension_loaded():
        return None
    return (x,) + params


def vit_block_params(children: tuple) -> Optional[tuple]:
    """`torch.ops.vitfast.vit_block`'s arguments after x for a block planned `runs_as_one_op`, from its children
    (`_children`), or None when a parameter is missing from its module's dict."""
    norm1, attn, mlp = children[:3]
    # Parameters straight from the dicts: each nn.Module attribute lookup costs ~2 µs, and this runs once per block
    # per forward.  (A parametrized tensor is not in the dict, its property is: the six-op path reads it through that.)
    attn_modules = attn._modules
    qkv, proj, ffn = attn_modules["qkv"]._parameters, attn_modules["proj"]._parameters, mlp._parameters
    try:
        tensors = (qkv["weight"], qkv["bias"], proj["weight"], proj["bias"], ffn["w_in"], ffn["b_in"], ffn["w_out"],
                   ffn["b_out"])
    except KeyError:
        return None
    w_qkv, b_qkv, w_proj, b_proj, w_in, b_in, w_out, b_out = tensors
    ffn_norm = children[5]
    ffn_norm_eps = float(ffn_norm.eps) if ffn_norm is not None else None
    return (float(norm1.eps), w_qkv, b_qkv, attn.num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out, b_out,
            mlp.residual)


def _current_plan(block: nn.Module) -> tuple:
    """(the block's WholeBlockPlan, its children now): planned again if it was built without a plan or its children
    were replaced since."""
    plan = block.__dict__.get("_whole_block_plan")
    children = _children(block)
    if plan is None or any(a is not b for a, b in zip(plan.children, children)):
        plan = plan_whole_block(block)
    return plan, children


def _hooked(*modules: nn.Module) -> bool:
    """Whether calling the block's `modules` as modules would run something a direct call does not: forward hooks
    (theirs or global ones), a forward patched on an instance (accelerate's add_hook_to_module does this) or on
    FusedAttention."""
    return (bool(_global_forward_hooks or _global_forward_pre_hooks) or FusedAttention.forward is not _ATTENTION_FORWARD
            or any(m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__ for m in modules))


# The int8 modules' forwards as defined (a later patch of either makes the block call the modules).
_INT8_LINEAR_FORWARD = Int8Linear.forward
_INT8_FFN_FORWARD = Int8ChannelIdleFFN.forward


def int8_block_forward(block: nn.Module, x: torch.Tensor, current: Optional[tuple] = None) -> Optional[torch.Tensor]:
    """An int8 block's forward (vitfast.quantize: `plan.int8_ops`) as its five CPU ops in one C++ call
    (`vitfast._C._int8_block`, csrc/ops/int8_block.h) — LayerNorm, qkv, attention (int8 / bf16 / fp32 products as
    flagged), proj + x, [LayerNorm,] FFN — the bits of the module path without its module calls, the ops' Python
    entries (which repeat, in Python, checks the C++ ops make) and their dispatches: measured ~70 µs less per DeiT-S
    block at batch 1 on one thread than the module path with the five ops called through torch.ops, ~25 µs less
    again in one call.  None where the module path must run instead: gradients, tracing / export, the reference backend,
    a non-fp32 or non-CPU input, hooks or patched forwards on the block's modules, children replaced since the plan."""
    if torch.is_grad_enabled() or x.dim() != 3 or not x.is_cpu or x.dtype != torch.float32:
        return None
    plan, children = current or _current_plan(block)
    if not plan.int8_ops:
        return None
    attn, mlp = children[1:3]
    attn_modules = attn._modules
    qkv, proj = attn_modules["qkv"], attn_modules["proj"]
    if (_hooked(attn, mlp, qkv, proj) or Int8Linear.forward is not _INT8_LINEAR_FORWARD
            or Int8ChannelIdleFFN.forward is not _INT8_FFN_FORWARD or ops.get_backend() == "reference" or tracing()
            or not ops.extension_loaded()):
        return None
    # The five ops in one C++ call (csrc/ops/int8_block.h): each is the op's CPU binding, so the same bits as
    #   h = linear_int8(layer_norm(x)); h = attention[_int8|_bf16](h); x1 = linear_int8(h, residual=x);
    #   out = channel_idle_ffn_int8([layer_norm](x1), residual=x1 if the FFN adds its shortcut)
    # through torch.ops, without their dispatches and the Python between them (~25 µs per block).
    return ops._C._int8_block(x, *int8_block_params(children))


def int8_block_params(children: tuple) -> tuple:
    """`vitfast._C._int8_block`'s arguments after x for a block planned `int8_ops`, from its children (`_children`)."""
    norm1, attn, mlp, _, _, ffn_norm = children
    return (float(norm1.eps), *int8_attention_params(attn), None if ffn_norm is None else float(ffn_norm.eps),
            *int8_ffn_params(mlp))


def int8_attention_params(attn: nn.Module) -> tuple:
    """An int8 FusedAttention's part of `_int8_block`'s arguments: qkv's (qweight, w_scale, bias, smooth,
    act_scale), num_heads, the products (0 fp32, 1 int8, 2 bf16), proj's five."""
    attn_modules = attn._modules
    qkv, proj = attn_modules["qkv"], attn_modules["proj"]
    qb, pb = qkv._buffers, proj._buffers  # (act_scale: a plain attribute beside the buffers)
    return (qb["qweight"], qb["w_scale"], qkv._parameters.get("bias"), qb.get("smooth"), qkv.__dict__["act_scale"],
            attn.num_heads, attention_products(attn),
            pb["qweight"], pb["w_scale"], proj._parameters.get("bias"), pb.get("smooth"), proj.__dict__["act_scale"])


def attention_products(attn: nn.Module) -> int:
    """Where an attention's score/value products run, as the C++ side's BlockAttention reads it: 0 fp32, 1 int8,
    2 bf16 (its int8_attention / bf16_attention flags, set on the instance by vitfast.quantize)."""
    flags = attn.__dict__
    return 1 if flags.get("int8_attention") else 2 if flags.get("bf16_attention") else 0


def int8_ffn_params(mlp: nn.Module) -> tuple:
    """An Int8ChannelIdleFFN's part of `_int8_block`'s arguments: (qw_in, s_in, b_in, qw_out, s_out, b_out,
    smooth_in, smooth_out, act_scale_in, act_scale_out, whether it adds its input)."""
    f, fb, params = mlp.__dict__, mlp._buffers, mlp._parameters
    return (fb["qw_in"], fb["s_in"], params.get("b_in"), fb["qw_out"], fb["s_out"], params.get("b_out"),
            fb.get("smooth_in"), fb.get("smooth_out"), f["act_scale_in"], f["act_scale_out"],
            bool(f["residual"] or f["split_identity"]))


def direct_forward(block: nn.Module, x: torch.Tensor) -> Optional[torch.Tensor]:
    """`block`'s forward without calling its modules — one `vit_block` op (fp32, or bf16 on a bf16 extension), or an
    int8 block's five ops in one C++ call — or None where its modules must run (see `whole_block_args` and
    `int8_block_forward`).  The plan is looked up once for both."""
    if torch.is_grad_enabled() or x.dim() != 3:
        return None
    current = _current_plan(block)
    if current[0].int8_ops:
        return int8_block_forward(block, x, current=current)
    args = whole_block_args(block, x, current=current)
    if args is None:
        return None
    return torch.ops.vitfast.vit_block(*args) if x.is_cpu else ops.vit_block_cuda_eager(*args)


@register_fused("block")
class FusedBlock(nn.Module):
    """Fused drop-in for `timm.models.vision_transformer.Block`.

    Same constructor arguments and `forward(x, attn_mask=None, is_causal=False)`; children `norm1` (LayerNorm
    without affine), `attn` (`FusedAttention`) and `mlp` (`FusedChannelIdleFFN`, which owns the FFN's norm and
    shortcut).  Keyword-only extras choose the FFN shape: `idle_ratio` θ (default 0: a vanilla FFN),
    `ffn_norm` ("layer": LN variant with explicit residual; "batch": BN variant, norms and shortcut folded) or
    an explicit `active_features`.  `init_values`, dropout and drop-path arguments are accepted and ignored:
    LayerScale is folded into the projections, the rest are identities at inference.

    Build one from trained weights with `FusedBlock.from_timm(timm_block)` or `vitfast.fuse(model)`.
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
        head_dim: Optional[int] = None,
        idle_ratio: float = 0.0,
        ffn_norm: str = "layer",
        active_features: Optional[int] = None,
    ) -> None:
        super().__init__()
        if scale_mlp_norm:
            raise ValueError("scale_mlp_norm: expected False (a LayerNorm inside the MLP cannot be fused), got True")
        if mlp_layer not in (None, Mlp):
            raise ValueError(f"mlp_layer: expected timm.layers.Mlp, got {getattr(mlp_layer, '__name__', mlp_layer)!r}")
        if attn_layer not in (None, "", "attn", TimmAttention, FusedAttention):
            raise ValueError(
                f"attn_layer: expected timm Attention, got {getattr(attn_layer, '__name__', attn_layer)!r}"
            )
        _timm.check_gelu(act_layer(), "act_layer")
        norm_eps = layernorm_eps(norm_layer, dim)
        hidden = int(dim * mlp_ratio)
        active = active_features if active_features is not None else active_channels(hidden, idle_ratio)
        ffn = FusedChannelIdleFFN.for_structure(dim, hidden, active, ffn_norm, norm_eps, device=device, dtype=dtype)
        head_eps = layernorm_eps(norm_layer, head_dim or dim // num_heads) if qk_norm else norm_eps
        self._build(
            dim=dim,
            num_heads=num_heads,
            head_dim=head_dim,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            qk_norm_eps=head_eps,
            scale_attn_norm=scale_attn_norm,
            scale_attn_norm_eps=norm_eps,
            proj_bias=proj_bias,
            norm_eps=norm_eps,
            mlp=ffn,
            device=device,
            dtype=dtype,
        )

    def _build(
        self, *, dim, num_heads, head_dim, qkv_bias, qk_norm, qk_norm_eps, scale_attn_norm, scale_attn_norm_eps,
        proj_bias, norm_eps, mlp, device=None, dtype=None,
    ) -> None:
        dd = {"device": device, "dtype": dtype}
        self.dim = dim
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps, elementwise_affine=False)
        self.attn = FusedAttention(
            dim,
            num_heads=num_heads,
            head_dim=head_dim,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            qk_norm_eps=qk_norm_eps,
            scale_norm=scale_attn_norm,
            scale_norm_eps=scale_attn_norm_eps,
            proj_bias=proj_bias,
            **dd,
        )
        if mlp.features != dim:
            raise ValueError(f"mlp: expected a FusedChannelIdleFFN over {dim} features, got {mlp.features}")
        self.mlp = mlp
        plan_whole_block(self)

    def forward(
        self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False
    ) -> torch.Tensor:
        if attn_mask is None and not is_causal:
            out = direct_forward(self, x)
            if out is not None:
                return out
        x = self.attn(apply_norm(self.norm1, x), attn_mask=attn_mask, is_causal=is_causal, residual=x)  # x + attn(...)
        return self.mlp(x)  # the FFN sub-block adds its own shortcut (explicitly, or folded into W̃)

    # -------------------------------------------------------------------------------------- construction
    @classmethod
    def from_parts(cls, norm1: nn.Module, attn: nn.Module, ls1: nn.Module, mlp: FusedChannelIdleFFN, name: str):
        """The fused block from a ViT block's attention parts (norm1's affine and ls1 folded, `fold_attention`) and an
        already fused FFN: what `from_timm` and the train-time channel-idle blocks' `to_fused()` build."""
        folded = fold_attention(norm1, attn, ls1, name)
        tensors = folded.pop("tensors")
        device, dtype = attn.qkv.weight.device, attn.qkv.weight.dtype
        block = cls.__new__(cls)
        nn.Module.__init__(block)
        block._build(**folded, mlp=mlp, device=device, dtype=dtype)
        state = {k: v for k, v in tensors.items() if v is not None}
        state.update({"mlp." + k: v for k, v in mlp.state_dict().items()})
        block.load_state_dict({k: v.to(dtype=dtype) for k, v in state.items()}, strict=True)
        return block.eval()

    @classmethod
    def from_timm(cls, block: nn.Module, name: str = "block") -> "FusedBlock":
        """Fuse a vanilla timm ViT `Block` (eval-mode function): outputs equal the timm block's."""
        _timm.vit_block_spec(block, name)  # validates everything the folding relies on
        ffn = FusedChannelIdleFFN.from_timm_mlp(
            block.norm2, block.mlp, _timm.layer_scale_gamma(block.ls2, f"{name}.ls2"), name=f"{name}.mlp"
        )
        return cls.from_parts(block.norm1, block.attn, block.ls1, ffn, name)

    def vitfast_config(self) -> Dict[str, Any]:
        attn = self.attn
        qk_norm = not isinstance(attn.q_norm, nn.Identity)
        scale_norm = not isinstance(attn.norm, nn.Identity)
        return {
            "kind": self.vitfast_kind,
            "dim": self.dim,
            "num_heads": attn.num_heads,
            "head_dim": attn.head_dim,
            "qkv_bias": attn.qkv.bias is not None,
            "qk_norm": qk_norm,
            "qk_norm_eps": float(attn.q_norm.eps) if qk_norm else None,
            "scale_attn_norm": scale_norm,
            "scale_attn_norm_eps": float(attn.norm.eps) if scale_norm else None,
            "proj_bias": attn.proj.bias is not None,
            "norm_eps": float(self.norm1.eps),
            "mlp": self.mlp.vitfast_config(),
        }

    @classmethod
    def from_vitfast_config(cls, cfg: Dict[str, Any], *, device=None, dtype=None) -> "FusedBlock":
        read = ConfigReader(cfg, "block", (
            "dim", "num_heads", "head_dim", "qkv_bias", "qk_norm", "qk_norm_eps", "scale_attn_norm",
            "scale_attn_norm_eps", "proj_bias", "norm_eps", "mlp",
        ))
        qk_norm, scale_norm = read.bool("qk_norm"), read.bool("scale_attn_norm")
        block = cls.__new__(cls)
        nn.Module.__init__(block)
        block._build(
            dim=read.int("dim"),
            num_heads=read.int("num_heads"),
            head_dim=read.int("head_dim"),
            qkv_bias=read.bool("qkv_bias"),
            qk_norm=qk_norm,
            qk_norm_eps=default_if_none(read.eps("qk_norm_eps", optional=not qk_norm), 1e-6),
            scale_attn_norm=scale_norm,
            scale_attn_norm_eps=default_if_none(read.eps("scale_attn_norm_eps", optional=not scale_norm), 1e-6),
            proj_bias=read.bool("proj_bias"),
            norm_eps=read.eps("norm_eps"),
            mlp=FusedChannelIdleFFN.from_vitfast_config(read.dict("mlp"), device=device, dtype=dtype),
            device=device,
            dtype=dtype,
        )
        return block


