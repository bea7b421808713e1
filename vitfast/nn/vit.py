"""A fused timm VisionTransformer whose inference forward is one C++ call.

`FusedVisionTransformer` is timm's `VisionTransformer` (a subclass: same children, state-dict keys and methods) whose
`forward(x)` first tries `direct_forward`: the whole forward — patch rows, patch GEMM, cls / reg tokens and
pos_embed, the blocks, the final norm, pooling and the head — as one `vitfast._C._vit_forward` call
(csrc/ops/vit_forward.h), and otherwise runs timm's forward over the fused modules.  Why: on small models the
modules' Python is most of a forward.  At the digits demo's size (width 96, 4 blocks, 17 tokens, one thread,
batch 1) the module path took 281 µs of which the four block ops' own time was 126 µs; the rest was module calls,
timm's forward_features / _pos_embed / forward_head and each op's Python entry (docs/performance.md, "Tiny models").
Each step of the call is what the module path runs, with the same tensors (the same packed-weight cache entries,
kernels and ATen calls), so the output has exactly the module path's bits (tests/test_vit_forward.py).

`vitfast.fuse` and `vitfast.load` give a fused ViT this class (`use_fused_vit_forward`); checkpoints record the
class as timm's ("VisionTransformer"), so files are the same as before.

When the call is taken — all checked per forward, the structure once per plan:
- inference: grad mode off and the model in eval mode; a plain CPU tensor [B, C, H, W] of the model's image size
  and dtype, contiguous (NCHW): float32, or bfloat16 for a bf16 model (`vitfast.quantize(dtype="bf16")` or
  `.to(torch.bfloat16)`; BF16_BLOCK_KINDS: every fused block kind) on a CPU path with bf16 GEMMs (each block then
  the bf16 ops of its module path: one `vit_block`, or layer_norm → xwx_attention / dwconv_attention → the FFN, or
  the gate and its sub-blocks); no
  attn_mask / is_causal; no tracing (torch.compile, torch.export and ONNX export see timm's forward and the standard
  ops); the auto backend; the C++ extension loaded;
- a structure the call reproduces (planned once; `_plan_structure`): timm's PatchEmbed (flatten, no norm, fixed image
  size) on a `GemmPatchProjection` or an int8 `Int8PatchProjection`; an absolute pos_embed; optional cls / reg
  tokens; dropouts (identities in eval); norm_pre / norm / fc_norm each a plain LayerNorm or Identity; blocks that
  are `FusedBlock`s (each as its one whole-block call: fp32 `vit_block`, or an int8 block's five ops; an int8
  model's block with some layers kept fp32 as its two sub-blocks), non-deep `FusedXWXBlock`s, DW-conv
  `FusedDWConvBlock`s or USDC `FusedGatedBlock`s without a forced gate (the ops their modules call on the CPU: for a
  gated block the batch's decision, then the open sub-blocks), in fp32 or with vitfast.quantize's int8 FFNs,
  attention linears and non-deep attention GEMMs (a `ProjectedXWXAttention`); 'token', 'avg' or no pooling and no attention pool; a `PackedLinear`, `nn.Linear` or Identity
  head;
- nothing the module path would run besides: no forward hooks or pre-hooks (on the modules, or global ones), no
  forward patched on an instance, and the classes' forwards and timm's methods the call stands for as defined.

The plan is made again when a parameter, buffer or submodule of the model was replaced or removed (each forward
compares them by identity with those planned) or when a plain attribute the plan copied changed (LayerNorm eps,
num_heads, the FFN's residual flag, an int8 layer's scales, a gate's force, the pooling settings).  In-place updates
of parameters need no new plan: the call reads the same tensors (and the packed-weight cache repacks a weight whose
version changed).
"""
from __future__ import annotations

import itertools
from operator import is_not
from typing import Any, List, NamedTuple, Optional, Tuple

import torch
import torch.nn as nn
from timm.layers import PatchEmbed
from timm.layers.patch_dropout import PatchDropout
from timm.models.vision_transformer import VisionTransformer
from torch.nn.modules import module as _module

from .. import ops
from ._base import PLAIN_LAYER_NORMS, plain_norm_eps, tracing
from .block import (FusedAttention, FusedBlock, _current_plan, attention_products, int8_attention_params,
                    int8_block_params, int8_ffn_params, vit_block_params)
from .dwconv import FusedDWConvBlock
from .gated import FusedBatchGate, FusedGatedBlock
from .ffn import FusedChannelIdleFFN
from .linear_head import PackedLinear
from .int8 import Int8ChannelIdleFFN, Int8Linear, Int8PatchProjection
from .patch_embed import GemmPatchProjection
from .xwx import FusedXWXAttention, FusedXWXBlock, ProjectedXWXAttention

__all__ = ["FusedVisionTransformer", "direct_forward", "use_fused_vit_forward"]


class FusedVisionTransformer(VisionTransformer):
    """timm's VisionTransformer with its inference forward as one C++ call where the structure allows (see the
    module doc); otherwise, and for every other method, timm's."""

    # The timm class checkpoints record (vitfast.arch): the subclass adds no state and no module.
    vitfast_timm_class = VisionTransformer

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                is_causal: bool = False) -> torch.Tensor:
        if attn_mask is None and not is_causal:
            out = direct_forward(self, x)
            if out is not None:
                return out
        return super().forward(x, attn_mask=attn_mask, is_causal=is_causal)


def use_fused_vit_forward(model: nn.Module) -> bool:
    """Give a fused timm `VisionTransformer` (exact class) the one-call forward, in place: its class becomes
    `FusedVisionTransformer` (no state added; parameters, hooks and keys stay the same objects).  Returns whether
    it did."""
    if type(model) is not VisionTransformer:
        return False
    model.__class__ = FusedVisionTransformer
    return True


class _Plan(NamedTuple):
    # Every parameter, buffer and submodule of the model when planned, as (dict, key, object): one replaced (or
    # removed) anywhere means the plan may hold tensors or modules that are no longer the model's.  (torch's global
    # registration hooks would say so for free, but with one registered a few torch.compile tests ran 1.4-1.9x
    # slower.)
    slot_dicts: tuple
    slot_keys: tuple
    slot_objects: tuple
    runner: Any            # vitfast._C._VitForwardPlan, or None: the module path runs
    image_shape: tuple     # (C, H, W)
    dtype: Any             # the images' dtype: torch.float32, or torch.bfloat16 for a bf16 model (see _plan_structure)
    # Checked per forward, each as one C-level pass (map over tuples): ~2 µs against ~10 for a Python loop.
    modules: tuple         # every module whose forward the call stands for ...
    types: tuple           # ... and its class when planned
    hook_dicts: tuple      # their forward hook and pre-hook dicts (must stay empty)
    instance_dicts: tuple  # their __dict__s (no instance-level "forward")
    method_owners: tuple   # (class, ...), (name, ...), (function, ...): the methods the plan relies on
    method_names: tuple
    methods: tuple
    scalar_owners: tuple   # (object, ...), (attribute, ...), (value, ...): plain attributes copied into the plan
    scalar_names: tuple
    values: tuple

    # A copy of the model (deepcopy, pickle, torch.save) plans anew: the plan holds the extension's object and the
    # original model's modules.
    def __deepcopy__(self, memo):
        return None

    def __reduce_ex__(self, protocol):
        return type(None), ()


# The block kinds a bf16 model's call takes: those whose module path is C++ ops on bf16 tensors the call runs too
# (every float kind; the int8 ones do not occur in a bf16 model).
BF16_BLOCK_KINDS = ("vit", "xwx", "dwconv", "gated")
# The forwards the one call stands for, as defined (a class patched since — before or after a plan was made — makes
# the module path run), and timm's VisionTransformer methods it replaces.
_FORWARDS = {cls: cls.forward for cls in (
    PatchEmbed, GemmPatchProjection, Int8PatchProjection, nn.Identity, nn.Dropout, PatchDropout, nn.Sequential,
    FusedBlock, FusedAttention, FusedChannelIdleFFN, Int8Linear, Int8ChannelIdleFFN, *PLAIN_LAYER_NORMS,
    PackedLinear, nn.Linear, FusedXWXBlock, FusedXWXAttention, ProjectedXWXAttention, FusedDWConvBlock, FusedGatedBlock,
    FusedBatchGate)}
_TIMM_METHODS = {name: getattr(VisionTransformer, name) for name in ("forward_features", "forward_head", "_pos_embed",
                                                                      "pool")}


def direct_forward(model: nn.Module, x: torch.Tensor) -> Optional[torch.Tensor]:
    """`model(x)` as one `vitfast._C._vit_forward` call, or None where the module path must run (see the module
    doc).  The same bits as the module path."""
    if (torch.is_grad_enabled() or model.training or type(x) is not torch.Tensor
            or (x.dtype is not torch.float32 and x.dtype is not torch.bfloat16) or not x.is_cpu or x.dim() != 4
            or tracing()):
        return None
    plan = model.__dict__.get("_vitfast_forward_plan")
    if (plan is None or any(map(is_not, map(dict.get, plan.slot_dicts, plan.slot_keys), plan.slot_objects))
            or tuple(map(getattr, plan.scalar_owners, plan.scalar_names)) != plan.values):
        plan = _make_plan(model)
    if plan.runner is None or x.dtype is not plan.dtype or x.shape[1:] != plan.image_shape or not x.is_contiguous():
        return None
    if (_module._global_forward_hooks or _module._global_forward_pre_hooks or ops.get_backend() == "reference"
            or tuple(map(type, plan.modules)) != plan.types or any(plan.hook_dicts)
            or any(map(dict.__contains__, plan.instance_dicts, _FORWARD))
            or tuple(map(getattr, plan.method_owners, plan.method_names)) != plan.methods):
        return None
    return ops._C._vit_forward(plan.runner, x)


_FORWARD = itertools.repeat("forward")


def _make_plan(model: nn.Module) -> _Plan:
    slots = [(d, k, v) for m in model.modules() for d in (m._parameters, m._buffers, m._modules) for k, v in d.items()]
    scalars: List[tuple] = []
    try:
        parts = _plan_structure(model, scalars) if ops.extension_loaded() else None
    except (KeyError, AttributeError, TypeError, ValueError):
        # A structure the planner does not know (e.g. a parametrized weight, absent from its module's parameter
        # dict): the module path runs it, as for any structure the call does not take.
        parts = None
    if parts is None:
        # The attributes read before the structure was refused (a forced gate, the pooling): when one changes, the
        # model is planned again.
        owners, names = (tuple(map(tuple, zip(*scalars))) if scalars else ((), ()))
        try:
            values = tuple(map(getattr, owners, names))
        except AttributeError:
            owners, names, values = (), (), ()
        parts = (None, (), None) + ((),) * 7 + (owners, names, values)
    plan = _Plan(*(map(tuple, zip(*slots)) if slots else ((), (), ())), *parts)
    model.__dict__["_vitfast_forward_plan"] = plan  # not a module attribute (a copy of the model gets None)
    return plan


def _norm_spec(norm: Optional[nn.Module], scalars: list) -> Tuple[bool, Any]:
    """(whether `norm` is one the call runs, its spec: None for Identity, (weight, bias, eps) for a plain
    LayerNorm over the last dimension)."""
    if norm is None or type(norm) is nn.Identity:
        return True, None
    if (type(norm) not in PLAIN_LAYER_NORMS or len(norm.normalized_shape) != 1
            or norm.__dict__.get("_fast_norm", False)):
        return False, None
    scalars.append((norm, "eps"))
    params = norm._parameters
    return True, (params.get("weight"), params.get("bias"), float(norm.eps))


def _fused_block_spec(block: nn.Module, modules: list, scalars: list) -> Optional[tuple]:
    """A FusedBlock: ("vit", vit_block's arguments after x) or ("int8", _int8_block's) for one that runs as one
    whole-block call, else ("parts", MHSA sub-block, FFN sub-block) as its forward calls them (an int8 model with
    some of the block's layers kept fp32)."""
    whole, children = _current_plan(block)
    norm1, attn, mlp, _, _, ffn_norm = children
    if not (whole.int8_ops or whole.runs_as_one_op):
        eps = plain_norm_eps(norm1)
        mhsa = _mhsa_spec(attn, eps, modules, scalars) if eps is not None and attn is not None else None
        ffn = _ffn_spec(mlp, modules, scalars) if mhsa is not None else None
        if ffn is None:
            return None
        modules += [(block, FusedBlock), (norm1, type(norm1))]
        scalars.append((norm1, "eps"))
        return ("parts", mhsa, ffn)
    modules += [(m, type(m)) for m in (block, norm1, attn, mlp, ffn_norm) if m is not None]
    scalars += [(norm1, "eps"), (attn, "num_heads"), (mlp, "residual")]
    if ffn_norm is not None:
        scalars.append((ffn_norm, "eps"))
    if whole.int8_ops:
        qkv, proj = attn._modules["qkv"], attn._modules["proj"]
        modules += [(qkv, type(qkv)), (proj, type(proj))]
        scalars += [(qkv, "act_scale"), (proj, "act_scale"), (mlp, "act_scale_in"), (mlp, "act_scale_out"),
                    (mlp, "split_identity")]
        scalars += [(attn, "int8_attention"), (attn, "bf16_attention")]
        return ("int8",) + int8_block_params(children)
    params = vit_block_params(children)
    return None if params is None else ("vit",) + params


def _ffn_spec(mlp: Optional[nn.Module], modules: list, scalars: list) -> Optional[tuple]:
    """The FFN sub-block as its forward runs it (`apply_norm(norm, x)`, then the op), or None:
    ("fp32", norm, w_in, b_in, w_out, b_out, residual) for a FusedChannelIdleFFN (channel_idle_ffn), ("int8", norm,
    _int8_block's FFN arguments) for an int8 model's Int8ChannelIdleFFN (channel_idle_ffn_int8)."""
    kind = type(mlp)
    if kind is not FusedChannelIdleFFN and kind is not Int8ChannelIdleFFN:
        return None
    norm = mlp._modules.get("norm")
    if norm is not None:
        ok, norm_spec = _norm_spec(norm, scalars)
        if not ok or norm_spec is None:
            return None
        modules.append((norm, type(norm)))
    else:
        norm_spec = None
    modules.append((mlp, kind))
    scalars.append((mlp, "residual"))
    if kind is Int8ChannelIdleFFN:
        scalars += [(mlp, a) for a in ("split_identity", "act_scale_in", "act_scale_out")]
        return ("int8", norm_spec, *int8_ffn_params(mlp))
    params = mlp._parameters
    if params.get("w_in") is None or params.get("w_out") is None:
        return None
    return ("fp32", norm_spec, params["w_in"], params.get("b_in"), params["w_out"], params.get("b_out"),
            bool(mlp.residual))


def _linear_spec(layer: nn.Module, modules: list, scalars: list) -> Optional[tuple]:
    """One layer as its owner's forward runs it: ("fp32", weight, bias) for an nn.Linear (ops.linear), ("int8",
    qweight, w_scale, bias, smooth, act_scale) for an int8 model's Int8Linear (linear_int8), or None."""
    kind = type(layer)
    if kind is nn.Linear:
        modules.append((layer, kind))
        return ("fp32", layer.weight, layer.bias)
    if kind is not Int8Linear:
        return None
    modules.append((layer, kind))
    scalars.append((layer, "act_scale"))
    buffers = layer._buffers
    return ("int8", buffers["qweight"], buffers["w_scale"], layer._parameters.get("bias"), buffers.get("smooth"),
            layer.__dict__["act_scale"])


def _xwx_block_spec(block: nn.Module, modules: list, scalars: list) -> Optional[tuple]:
    """("xwx", ...) for a FusedXWXBlock: LayerNorm, xwx_attention with the block input as residual, the FFN; or
    ("xwx_proj", ...) for one whose attention is a ProjectedXWXAttention (an int8 model's): LayerNorm, proj_in,
    xwx_heads (xwx_heads_int8 / _bf16 with its product flags), proj_out with the block input as residual, the FFN."""
    mods = block._modules
    norm1, attn = mods.get("norm1"), mods.get("attn")
    eps = plain_norm_eps(norm1)
    ffn = _ffn_spec(mods.get("mlp"), modules, scalars)
    if eps is None or ffn is None or type(attn) not in (FusedXWXAttention, ProjectedXWXAttention):
        return None
    if type(attn) is ProjectedXWXAttention:
        layers = [_linear_spec(attn._modules.get(n), modules, scalars) for n in ("proj_in", "proj_out")]
        if None in layers:
            return None
        modules += [(block, FusedXWXBlock), (norm1, type(norm1)), (attn, ProjectedXWXAttention)]
        scalars += [(norm1, "eps"), (attn, "num_heads"), (attn, "value_dim"), (attn, "score_form"),
                    (attn, "int8_attention"), (attn, "bf16_attention")]
        return ("xwx_proj", eps, layers[0], attn.num_heads, attn.value_dim, attn.score_form == "full", layers[1],
                ffn, attention_products(attn))
    modules += [(block, FusedXWXBlock), (norm1, type(norm1)), (attn, FusedXWXAttention)]
    scalars.append((norm1, "eps"))
    p = attn._parameters
    return ("xwx", eps, p["w_q"], p.get("w_k"), p.get("key_bias"), p["w_v"], p["w_o"], p.get("b_o"), ffn)


def _dwconv_block_spec(block: nn.Module, tokens: int, modules: list, scalars: list) -> Optional[tuple]:
    """("dwconv", ...) for a FusedDWConvBlock whose grid fits the model's tokens: LayerNorm, the attention heads
    (qkv, attention, proj + x) if any, dwconv_attention with that shortcut, the FFN."""
    mods = block._modules
    norm1, qkv, attn_proj, value, out_proj = (mods.get(n) for n in ("norm1", "qkv", "attn_proj", "value", "out_proj"))
    eps = plain_norm_eps(norm1)
    ffn = _ffn_spec(mods.get("mlp"), modules, scalars)
    rows, cols = block.grid_size
    if (eps is None or ffn is None or value is None or out_proj is None or (qkv is None) != (attn_proj is None)
            or (block.prefix_tokens is not None and block.prefix_tokens + rows * cols != tokens)):
        return None
    modules += [(block, FusedDWConvBlock), (norm1, type(norm1))]
    scalars += [(norm1, "eps"), (block, "grid_size"), (block, "prefix_tokens"), (block, "attn_heads")]
    if any(type(m) not in (nn.Linear, type(None)) for m in (qkv, attn_proj, value, out_proj)):
        # an int8 model's block: each layer as its forward runs it; value → dwconv_heads → out_proj unless both fp32
        layers = {n: (None if m is None else _linear_spec(m, modules, scalars))
                  for n, m in (("qkv", qkv), ("attn_proj", attn_proj), ("value", value), ("out_proj", out_proj))}
        if layers["value"] is None or layers["out_proj"] is None or (qkv is not None and None in (
                layers["qkv"], layers["attn_proj"])):
            return None
        return ("dwconv_q", eps, layers["qkv"], block.attn_heads, layers["attn_proj"], layers["value"],
                block.conv_kernel, layers["out_proj"], rows, cols, ffn)
    heads = (qkv.weight, qkv.bias, block.attn_heads, attn_proj.weight) if qkv is not None else (None, None, 0, None)
    return ("dwconv", eps, *heads, value.weight, value.bias, block.conv_kernel, out_proj.weight, out_proj.bias, rows,
            cols, ffn)


def _mhsa_spec(attn: nn.Module, eps: float, modules: list, scalars: list) -> Optional[tuple]:
    """The MHSA sub-block of a gated block, or of a FusedBlock run as its two sub-blocks, as
    `attn(norm1(x), residual=x)` runs it: ("fp32", eps, w_qkv, b_qkv, heads,
    w_proj, b_proj) with nn.Linear qkv / proj and fp32 products, ("int8", eps, _int8_block's attention arguments)
    with an int8 model's Int8Linear ones (and its flagged products), or None."""
    attn_mods = attn._modules
    qkv, proj = attn_mods.get("qkv"), attn_mods.get("proj")
    if (type(attn) is not FusedAttention or type(attn_mods.get("q_norm")) is not nn.Identity
            or type(attn_mods.get("norm")) is not nn.Identity):
        return None
    modules.append((attn, FusedAttention))
    scalars += [(attn, "num_heads"), (attn, "int8_attention"), (attn, "bf16_attention")]
    if type(qkv) is Int8Linear and type(proj) is Int8Linear:
        modules += [(qkv, Int8Linear), (proj, Int8Linear)]
        scalars += [(qkv, "act_scale"), (proj, "act_scale")]
        return ("int8", eps, *int8_attention_params(attn))
    flags = attn.__dict__
    if (not isinstance(qkv, nn.Linear) or not isinstance(proj, nn.Linear) or flags.get("int8_attention")
            or flags.get("bf16_attention")):
        return None
    return ("fp32", eps, qkv.weight, qkv.bias, attn.num_heads, proj.weight, proj.bias)


def _gated_block_spec(block: nn.Module, modules: list, scalars: list) -> Optional[tuple]:
    """("gated", ...) for a FusedGatedBlock without a forced gate: the decision, then the whole block (both open)
    or each open sub-block, as its CPU forward runs them."""
    mods = block._modules
    gate, norm1, attn, mlp = (mods.get(n) for n in ("gate", "norm1", "attn", "mlp"))
    if type(gate) is not FusedBatchGate:
        return None
    scalars += [(gate, "force"), (gate, "layer_norm"), (gate, "act"), (gate, "eps")]
    if gate.force is not None:
        return None
    modules += [(block, FusedGatedBlock), (gate, FusedBatchGate)]
    mhsa = None
    if attn is not None:
        eps = plain_norm_eps(norm1)
        mhsa = _mhsa_spec(attn, eps, modules, scalars) if eps is not None else None
        if mhsa is None:
            return None
        modules.append((norm1, type(norm1)))
        scalars.append((norm1, "eps"))
    ffn = None
    if mlp is not None:
        ffn = _ffn_spec(mlp, modules, scalars)
        if ffn is None:
            return None
    # Both open: the module path's direct_forward (vitfast.nn.block) — one vit_block call, or an int8 block's
    # int8_block call — where the block's plan allows, with the FFN norm's eps as that call reads it.
    whole, children = _current_plan(block)
    ffn_norm = children[5]
    if attn is not None and mlp is not None and mhsa[0] == ffn[0] == "int8":
        run_whole = whole.int8_ops
    else:
        run_whole = (whole.runs_as_one_op and attn is not None and mlp is not None
                     and vit_block_params(children) is not None)
    gp = gate._parameters
    ffn_norm_eps = None if ffn_norm is None or not run_whole else float(ffn_norm.eps)
    return ("gated", mhsa, ffn_norm_eps, ffn, gp["w1"], gp.get("b1"), gp.get("w2"), gp.get("b2"),
            bool(gate.layer_norm), str(gate.act), float(gate.eps), run_whole)


def _identity_in_eval(module: Optional[nn.Module]) -> bool:
    return module is None or type(module) in (nn.Identity, nn.Dropout, PatchDropout)


def _plan_structure(model: nn.Module, scalars: List[tuple]) -> Optional[tuple]:
    """_Plan's fields after `blocks` for a structure the one call reproduces, or None.  `scalars` collects the
    (object, attribute) pairs the decisions read, also when it refuses."""
    mods = model._modules
    modules: List[tuple] = []  # (the model's own hooks run around this forward either way)
    scalars += [(model, a) for a in ("global_pool", "num_prefix_tokens", "no_embed_class", "dynamic_img_size",
                                     "pool_include_prefix") if a in model.__dict__]
    if (getattr(model, "dynamic_img_size", False) or mods.get("attn_pool") is not None
            or model.global_pool not in ("token", "avg", "") or model.pos_embed is None):
        return None
    # ---- stem
    pe = mods.get("patch_embed")
    if type(pe) is not PatchEmbed:
        return None
    proj, pe_norm = pe._modules.get("proj"), pe._modules.get("norm")
    if not pe.flatten or pe.dynamic_img_pad or pe.img_size is None or type(pe_norm) is not nn.Identity:
        return None
    scalars += [(pe, a) for a in ("flatten", "dynamic_img_pad", "img_size", "strict_img_size") if a in pe.__dict__]
    modules += [(pe, PatchEmbed), (proj, type(proj)), (pe_norm, nn.Identity)]
    dtype = torch.float32
    if type(proj) is GemmPatchProjection:
        weight = proj._parameters["weight"]
        dtype = weight.dtype
        # bf16: where the blocks' vit_block op computes in bf16 (a CPU bf16 extension); the other blocks' bf16 runs
        # through their ops' Python entries, so only FusedBlocks (checked below)
        if dtype is not torch.float32 and (dtype is not torch.bfloat16 or ops._C.bf16_kernel() == "none"):
            return None
        stem = ("float", *proj.kernel_size, weight, proj._parameters.get("bias"))
    elif type(proj) is Int8PatchProjection:
        b = proj._buffers
        scalars.append((proj, "act_scale"))
        stem = ("int8", *proj.kernel_size, b["qweight"], b["w_scale"], proj._parameters.get("bias"), b.get("smooth"),
                proj.act_scale)
    else:
        return None
    image_shape = (proj.in_channels, *pe.img_size)
    # ---- tokens
    params = model._parameters
    tokens = (params.get("cls_token"), params.get("reg_token"), params.get("pos_embed"), bool(model.no_embed_class))
    if tokens[2] is None:
        return None
    for name in ("patch_drop", "pos_drop", "head_drop"):
        if not _identity_in_eval(mods.get(name)):
            return None
        if mods.get(name) is not None:
            modules.append((mods[name], type(mods[name])))
    ok, norm_pre = _norm_spec(mods.get("norm_pre"), scalars)
    if not ok:
        return None
    # ---- blocks
    blocks = mods.get("blocks")
    if type(blocks) is not nn.Sequential:
        return None
    modules.append((blocks, nn.Sequential))
    block_specs = []
    patch_tokens = (image_shape[1] // proj.kernel_size[0]) * (image_shape[2] // proj.kernel_size[1])
    token_count = int(model.num_prefix_tokens) + patch_tokens
    for block in blocks:
        if type(block) is FusedXWXBlock:
            spec = _xwx_block_spec(block, modules, scalars)
        elif type(block) is FusedDWConvBlock:
            spec = _dwconv_block_spec(block, token_count, modules, scalars)
        elif type(block) is FusedBlock:
            spec = _fused_block_spec(block, modules, scalars)
        elif type(block) is FusedGatedBlock:
            spec = _gated_block_spec(block, modules, scalars)
        else:
            return None
        if spec is None or (dtype is not torch.float32 and spec[0] not in BF16_BLOCK_KINDS):
            return None
        block_specs.append(spec)
    # ---- final norm, pooling, head
    ok_norm, norm = _norm_spec(mods.get("norm"), scalars)
    ok_fc, fc_norm = _norm_spec(mods.get("fc_norm"), scalars)
    if not (ok_norm and ok_fc):
        return None
    modules += [(m, type(m)) for m in (mods.get("norm_pre"), mods.get("norm"), mods.get("fc_norm")) if m is not None]
    head = mods.get("head")
    if head is None or type(head) is nn.Identity:
        head_spec = (0, None, None)
    elif type(head) in (PackedLinear, nn.Linear):
        head_spec = (1 if type(head) is PackedLinear else 2, head._parameters["weight"], head._parameters.get("bias"))
    else:
        return None
    if head is not None:
        modules.append((head, type(head)))
    pool = {"": 0, "token": 1, "avg": 2}[model.global_pool]
    runner = ops._C._vit_forward_plan(
        stem, tokens, norm_pre, block_specs, norm, pool, int(model.num_prefix_tokens),
        bool(getattr(model, "pool_include_prefix", False)), fc_norm, head_spec)
    classes = {cls for _, cls in modules}
    if not classes <= _FORWARDS.keys():
        return None
    methods = [(cls, "forward", _FORWARDS[cls]) for cls in classes]
    methods += [(type(model), name, fn) for name, fn in _TIMM_METHODS.items()]
    mods_ = tuple(m for m, _ in modules)
    hook_dicts = tuple(d for m in mods_ for d in (m._forward_hooks, m._forward_pre_hooks))
    return (runner, tuple(image_shape), dtype, mods_, tuple(cls for _, cls in modules), hook_dicts,
            tuple(m.__dict__ for m in mods_), *map(tuple, zip(*methods)), *map(tuple, zip(*scalars)),
            tuple(getattr(o, a) for o, a in scalars))
