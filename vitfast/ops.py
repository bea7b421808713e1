"""The `torch.ops.vitfast` namespace: schemas (defined once, here), fake impls, and per-device impls.

CPU impl   = the C++ kernels in `vitfast._C` (registered from C++ with TORCH_LIBRARY_IMPL(vitfast, CPU)).
CUDA impl  = the Triton launchers in `vitfast.kernels` (imported lazily: `import vitfast` never needs a GPU).
Fake impl  = shape/dtype propagation so `torch.compile(fullgraph=True)` and `torch.export` trace the ops.
If the extension is missing we say so once and register the reference as the CPU impl instead.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Optional

import torch

from . import _autograd, _optimizer_versions, reference
from ._env import get_backend, get_cuda_kernels
from ._validate import check_attention_args, check_channel_idle_ffn_args, check_layer_norm_args, check_linear_args
from ._validate import check_tensor, check_vit_block_args, check_xwx_attention_args
from ._validate_dwconv import check_dwconv_attention_args

__all__ = ["attention", "channel_idle_ffn", "layer_norm", "linear", "xwx_attention", "extension_loaded", "cpu_isa",
           "batch_gate", "gate_select", "prepack", "clear_weight_cache", "vit_block"]

SCHEMAS = {
    "channel_idle_ffn": (
        "channel_idle_ffn(Tensor x, Tensor w_in, Tensor? b_in, Tensor w_out, "
        "Tensor? b_out=None, Tensor? residual=None) -> Tensor"
    ),
    "linear": "linear(Tensor x, Tensor weight, Tensor? bias=None, Tensor? residual=None) -> Tensor",
    "attention": "attention(Tensor qkv, int num_heads, float? scale=None) -> Tensor",
    "layer_norm": "layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> Tensor",
    # USDC (issue 6): the batch-level gate decision [MHSA, FFN] and the device-side select that applies it.
    "batch_gate": (
        "batch_gate(Tensor x, Tensor w1, Tensor? b1, Tensor? w2=None, Tensor? b2=None, bool layer_norm=False, "
        "str act='none', float eps=1e-05) -> Tensor"
    ),
    "gate_select": "gate_select(Tensor gate, int index, Tensor taken, Tensor skipped) -> Tensor",
    "xwx_attention": (
        "xwx_attention(Tensor x, Tensor w_q, Tensor? w_k, Tensor? key_bias, Tensor w_v, Tensor w_o, "
        "Tensor? b_o=None, Tensor? residual=None) -> Tensor"
    ),
}

# The fused ViT block (vitfast.nn.Block with its default attention) as one call: LN → qkv → attention → proj + x →
# [LN] → channel-idle FFN [+ shortcut].  On CPU one dispatch instead of six (csrc/ops/vit_block.cpp), the same
# kernels and bits as the op-by-op path; on CUDA the composition of the per-op CUDA impls.
SCHEMAS["vit_block"] = (
    "vit_block(Tensor x, float norm1_eps, Tensor w_qkv, Tensor? b_qkv, int num_heads, Tensor w_proj, "
    "Tensor? b_proj, float? ffn_norm_eps, Tensor w_in, Tensor? b_in, Tensor w_out, Tensor? b_out, "
    "bool ffn_residual) -> Tensor"
)

# dropin-depthwise-conv-attention: value projection + depthwise k×k conv over the token grid + output projection.
SCHEMAS["dwconv_attention"] = (
    "dwconv_attention(Tensor x, Tensor w_v, Tensor? b_v, Tensor kernel, Tensor w_o, Tensor? b_o, int grid_h, "
    "int grid_w, Tensor? residual=None) -> Tensor"
)

_lib = torch.library.Library("vitfast", "DEF")
for _schema in SCHEMAS.values():
    _lib.define(_schema)


# ---------------------------------------------------------------------------------------------- fake impls
def _register_fake(name):
    register = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract
    return register(f"vitfast::{name}")


@_register_fake("channel_idle_ffn")
def _channel_idle_ffn_fake(x, w_in, b_in, w_out, b_out=None, residual=None):
    _, _, c_out = check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, residual)
    return x.new_empty(tuple(x.shape[:-1]) + (c_out,))


@_register_fake("linear")
def _linear_fake(x, weight, bias=None, residual=None):
    n = check_linear_args(x, weight, bias, residual)
    return x.new_empty(tuple(x.shape[:-1]) + (n,))


@_register_fake("layer_norm")
def _layer_norm_fake(x, weight=None, bias=None, eps=1e-5):
    check_layer_norm_args(x, weight, bias, eps)
    return x.new_empty(x.shape)


@_register_fake("attention")
def _attention_fake(qkv, num_heads, scale=None):
    heads, head_dim = check_attention_args(qkv, num_heads, scale)
    return qkv.new_empty((qkv.shape[0], qkv.shape[1], heads * head_dim))


@_register_fake("vit_block")
def _vit_block_fake(x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out, b_out,
                    ffn_residual):
    check_vit_block_args(x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out,
                         b_out, ffn_residual)
    return x.new_empty(x.shape)


@_register_fake("xwx_attention")
def _xwx_attention_fake(x, w_q, w_k, key_bias, w_v, w_o, b_o=None, residual=None):
    _, _, _, c_out = check_xwx_attention_args(x, w_q, w_k, key_bias, w_v, w_o, b_o, residual)
    return x.new_empty((x.shape[0], x.shape[1], c_out))


# ---------------------------------------------------------------------------------------------- CUDA impls
# Rows (tokens × batch) from which the Triton channel-idle kernel beats the cuBLAS composition in half precision.
TRITON_FFN_MIN_ROWS = 8192
# Model width (x's channels) from which it does: the narrowest width measured faster (DeiT-B; DeiT-S's 384 mostly lost).
TRITON_FFN_MIN_WIDTH = 768


def use_triton_channel_idle_ffn(dtype: torch.dtype, rows: int, policy: str = "auto", *,
                                width: Optional[int] = None) -> bool:
    """The best available CUDA path for channel_idle_ffn ("use your own kernel where it beats the library").

    Measured on an H200 (torch 2.11, triton 3.6; benchmarks/cuda_report.py, medians, same run):
    - fp32 (TF32 off): the Triton kernel's ieee tl.dot runs on CUDA cores at 3–22 TFLOP/s, 0.40–0.57× the
      eager composition on cuBLAS at every DeiT-S/B shape and batch 1–64 → the composition.
    - bf16, batch 1–8 (M ≤ 1576 rows): launch-bound, 0.33–0.45× → the composition.
    - bf16, batch 64 (M = 12608): DeiT-B 1.10× (θ 0.5) and 1.27× (θ 0.75), DeiT-S 0.96× / 0.50× → Triton
      only from TRITON_FFN_MIN_ROWS rows in fp16/bf16.
    Two later runs at batch 64, bf16, θ 0.5 / 0.75: a second H200 session DeiT-B 1.14× / 1.22×, DeiT-S 1.28× / 1.39×;
    an H100 (2026-11-27) DeiT-B 1.17× / 1.26×, DeiT-S 0.60× / 0.56×.  DeiT-B (width 768) won all six times, DeiT-S
    (width 384) lost four of six (median 0.78×) → also only from TRITON_FFN_MIN_WIDTH channels, when `width` is given.
    `policy` "triton"/"torch" (VITFAST_CUDA_KERNELS) forces one path.
    """
    if policy == "triton":
        return True
    if policy == "torch":
        return False
    return (dtype in (torch.float16, torch.bfloat16) and rows >= TRITON_FFN_MIN_ROWS
            and (width is None or width >= TRITON_FFN_MIN_WIDTH))


def _channel_idle_ffn_cuda_unchecked(x, w_in, b_in, w_out, b_out=None, residual=None):
    """The CUDA channel_idle_ffn for checked arguments: the Triton kernel or the cuBLAS composition, by the policy."""
    rows = x.numel() // max(x.shape[-1], 1)
    if not use_triton_channel_idle_ffn(x.dtype, rows, get_cuda_kernels(), width=x.shape[-1]):
        return reference.channel_idle_ffn_unchecked(x, w_in, b_in, w_out, b_out, residual)
    from .kernels.channel_idle_ffn import channel_idle_ffn_triton

    return channel_idle_ffn_triton(x, w_in, b_in, w_out, b_out, residual)


def _channel_idle_ffn_cuda(x, w_in, b_in, w_out, b_out=None, residual=None):
    check_channel_idle_ffn_args(x, w_in, b_in, w_out, b_out, residual)
    return _channel_idle_ffn_cuda_unchecked(x, w_in, b_in, w_out, b_out, residual)


_lib.impl("channel_idle_ffn", _channel_idle_ffn_cuda, "CUDA")


def _linear_cuda(x, weight, bias=None, residual=None):
    """No Triton kernel yet: the reference composition (F.linear = cuBLAS with its bias epilogue, + residual)."""
    return reference.linear(x, weight, bias, residual)


_lib.impl("linear", _linear_cuda, "CUDA")


def _layer_norm_cuda(x, weight=None, bias=None, eps=1e-5):
    """No Triton kernel: torch's fused CUDA LayerNorm is one launch already."""
    return reference.layer_norm(x, weight, bias, eps)


_lib.impl("layer_norm", _layer_norm_cuda, "CUDA")


def _attention_cuda(qkv, num_heads, scale=None):
    """No Triton kernel yet: the reference composition (permuted views + SDPA, i.e. flash attention on GPU)."""
    return reference.attention(qkv, num_heads, scale)


_lib.impl("attention", _attention_cuda, "CUDA")


def _vit_block_composed(x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out,
                        b_out, ffn_residual):
    """vit_block as its six ops (each on its own device impl; the same formula as reference.vit_block)."""
    args = (x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out, b_out,
            ffn_residual)
    check_vit_block_args(*args)
    vf = torch.ops.vitfast
    return reference.compose_vit_block((vf.layer_norm, vf.linear, vf.attention, vf.channel_idle_ffn), *args)


# No launch to save on CUDA by merging (each op is one or two launches either way): the composition.
_lib.impl("vit_block", _vit_block_composed, "CUDA")


_CUDA_EAGER_FNS = (reference.layer_norm_unchecked, reference.linear_unchecked, reference.attention_unchecked,
                   _channel_idle_ffn_cuda_unchecked)


def vit_block_cuda_eager(x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out,
                         b_out, ffn_residual):
    """A fused block on CUDA at eager inference, for `vitfast.nn.Block`: the torch calls of the four CUDA impls
    (LayerNorm, qkv, attention, proj + residual, LayerNorm, FFN), so the same kernels and bits as the op-by-op path,
    with one argument check for the block instead of one `torch.ops` dispatch into a Python impl plus one check per
    op.  That host time is what a launch-bound GPU waits on: on an H200, fused DeiT-B in bf16 at batch 64 took
    7.96 ms per forward op by op against 4.60 ms of GPU work (its CUDA-graph replay).  Callers make sure that
    nothing the op-by-op path does differently is in play (`nn.fused._whole_block_args`: no grad, no autocast, no
    tracing, no hooks)."""
    args = (x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out, b_out,
            ffn_residual)
    check_vit_block_args(*args, any_float=True)
    return reference.compose_vit_block(_CUDA_EAGER_FNS, *args)


@_register_fake("dwconv_attention")
def _dwconv_attention_fake(x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual=None):
    _, _, _, c_out = check_dwconv_attention_args(x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual)
    return x.new_empty((x.shape[0], x.shape[1], c_out))


def use_triton_dwconv_attention(policy: str = "auto") -> bool:
    """The best measured CUDA path for dwconv_attention.

    Measured on an H200 (torch 2.11, triton 3.6; benchmarks/bench_dwconv_attention.py --cuda, fp32, 24×24
    tokens, medians): the Triton kernel is 0.15–0.33× the reference composition (cuBLAS GEMMs + cuDNN depthwise
    conv) with all heads as DW conv at ViT-B/L width, and 0.26–0.58× in the ensembled form, at batch 1 and 8.
    It loses everywhere measured, so "auto" takes the composition; VITFAST_CUDA_KERNELS=triton forces the kernel.
    """
    return policy == "triton"


def _dwconv_attention_cuda(x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual=None):
    if not use_triton_dwconv_attention(get_cuda_kernels()):
        return reference.dwconv_attention(x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual)
    from .kernels.dwconv_attention import dwconv_attention_triton

    return dwconv_attention_triton(x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual)


_lib.impl("dwconv_attention", _dwconv_attention_cuda, "CUDA")

# ---------------------------------------------------------------------------------------------- USDC gate ops
# batch_gate: CPU = C++ (csrc/ops/batch_gate.cpp), CUDA = Triton.  gate_select: CPU = the reference (the CPU
# block branches on the decision instead, see vitfast/nn/gates.py), CUDA = Triton.  Neither ever copies the
# decision to the host, so a CUDA graph of a gated model stays valid.
@_register_fake("batch_gate")
def _batch_gate_fake(x, w1, b1, w2=None, b2=None, layer_norm=False, act="none", eps=1e-5):
    from ._validate_gate import check_batch_gate_args

    check_batch_gate_args(x, w1, b1, w2, b2, layer_norm, act, eps)
    return x.new_empty((2,))


@_register_fake("gate_select")
def _gate_select_fake(gate, index, taken, skipped):
    from ._validate_gate import check_gate_select_args

    check_gate_select_args(gate, index, taken, skipped)
    return taken.new_empty(taken.shape)


def _batch_gate_cuda(x, w1, b1, w2=None, b2=None, layer_norm=False, act="none", eps=1e-5):
    from .kernels.batch_gate import batch_gate_triton

    return batch_gate_triton(x, w1, b1, w2, b2, layer_norm, act, eps)


def _gate_select_cuda(gate, index, taken, skipped):
    from .kernels.batch_gate import gate_select_triton

    return gate_select_triton(gate, index, taken, skipped)


_lib.impl("batch_gate", _batch_gate_cuda, "CUDA")
_lib.impl("gate_select", _gate_select_cuda, "CUDA")


# Widest model (C) up to which the Triton xwx kernel beats the eager composition in half precision.
TRITON_XWX_MAX_WIDTH = 256


def use_triton_xwx_attention(dtype: torch.dtype, width: int, policy: str = "auto") -> bool:
    """The best measured CUDA path for xwx_attention.

    Measured on an H200 (torch 2.11, triton 3.6; benchmarks/bench_xwx_attention.py, do_bench medians, same run):
    - fp32: 0.14–0.48× the eager composition at DeiT-Ti and DeiT-S widths, batch 1/8/64, both score forms
      (ieee tl.dot on CUDA cores) → the composition.
    - fp16, DeiT-Ti (C = 192): 1.25–1.54× factored, 1.33–1.43× full → Triton.
    - fp16, DeiT-S (C = 384): factored 0.98–1.12×, full 0.86–0.91× at batch 1–8 and 1.25× at batch 64 — no
      consistent win → the composition.
    `policy` "triton"/"torch" (VITFAST_CUDA_KERNELS) forces one path.
    """
    if policy == "triton":
        return True
    if policy == "torch":
        return False
    return dtype in (torch.float16, torch.bfloat16) and width <= TRITON_XWX_MAX_WIDTH


def use_gated_cuda_kernels(dtype: torch.dtype, policy: str = "auto") -> bool:
    """Whether a gated USDC block on CUDA runs its sub-blocks as `gated_mhsa`/`gated_ffn` (Triton kernels that read
    the device decision and return early) or as cuBLAS/SDPA + `gate_select` (computes, then picks on the device).

    Measured on an H200 (torch 2.11, triton 3.6; benchmarks/bench_batch_gate.py --cuda, CUDA-graph replays, DeiT-S,
    a 12-block model whose gates close half of the sub-blocks, relative to the same model ungated):
    - fp32: gated kernels 165.8% (b8) / 115.9% (b64), compute + gate_select 118.3% / 107.5%.  The gated kernels make
      a closed sub-block nearly free (0.10–0.34× of an ungated block) but their ieee fp32 GEMMs make an open one
      2.2–3.5× slower than cuBLAS → gate_select.
    - fp16: gated kernels 157.4% (b8) / 111.7% (b64), compute + gate_select 191.9% / 144.0% → the gated kernels.
    Neither beats the ungated model on this GPU (the CPU path does: a closed sub-block is skipped outright).
    `policy` "triton"/"torch" (VITFAST_CUDA_KERNELS) forces one path.
    """
    if policy == "triton":
        return True
    if policy == "torch":
        return False
    return dtype in (torch.float16, torch.bfloat16)


def _xwx_attention_cuda(x, w_q, w_k, key_bias, w_v, w_o, b_o=None, residual=None):
    check_xwx_attention_args(x, w_q, w_k, key_bias, w_v, w_o, b_o, residual)  # before reading x.shape[-1]
    if not use_triton_xwx_attention(x.dtype, x.shape[-1], get_cuda_kernels()):
        return reference.xwx_attention(x, w_q, w_k, key_bias, w_v, w_o, b_o, residual)
    from .kernels.xwx_attention import xwx_attention_triton

    return xwx_attention_triton(x, w_q, w_k, key_bias, w_v, w_o, b_o, residual)


_lib.impl("xwx_attention", _xwx_attention_cuda, "CUDA")


# ---------------------------------------------------------------------------------------------- gated sub-blocks
# USDC (issue 6): a whole MHSA / FFN sub-block that runs only if gate[index] != 0, the decision staying on the
# device.  CUDA = the gated Triton kernels (kernels/gated.py: every kernel reads the flag and returns at once when
# closed, the last one writes x), so a skipped sub-block costs no GEMM and no host synchronisation, and a CUDA
# graph of the model stays valid.  CPU = read the flag (no device to wait for) and run the C++ ops or copy x.
SCHEMAS["gated_mhsa"] = (
    "gated_mhsa(Tensor gate, int index, Tensor x, float? norm_eps, Tensor w_qkv, Tensor? b_qkv, int num_heads, "
    "Tensor w_proj, Tensor? b_proj) -> Tensor"
)
SCHEMAS["gated_ffn"] = (
    "gated_ffn(Tensor gate, int index, Tensor x, float? norm_eps, Tensor w_in, Tensor? b_in, Tensor w_out, "
    "Tensor? b_out, bool residual) -> Tensor"
)
_lib.define(SCHEMAS["gated_mhsa"])
_lib.define(SCHEMAS["gated_ffn"])

# Under torch.autocast the activations reaching an op can be bf16/fp16 (SDPA, a timm Linear such as Swin's patch
# merging) while the module's weights stay fp32, and every op refuses mixed dtypes: fused blocks crashed where
# timm runs.  Inside an autocast region the ops therefore take fp32 inputs and run in fp32 (exact; fp32 weights
# are not copied, so the packed-weight cache still hits).  This is torch.library.register_autocast(op, device,
# torch.float32), registered by hand on the Autocast dispatch keys: torch 2.4 has no register_autocast, and its
# plain `.float()` of a bf16/fp16 weight made a new tensor every call, which the packed-weight cache (keyed on
# tensor identity) repacked every call: a bf16 DeiT-S block under autocast ran 2.2x slower (17.2 vs 7.8 ms).
_fp32_weights: dict = {}  # id(parameter) -> (weakref to it, its identity at copy time, its fp32 copy)


def _weight_identity(p: torch.Tensor) -> tuple:
    # The version counter sees in-place updates; the data pointer, dtype, device and shape see `p.data = new`
    # (which keeps the version).  Writes through `.data` in place are not seen: clear_weight_cache() drops the
    # copies with the packed weights.
    return p._version, p.data_ptr(), p.dtype, p.device, tuple(p.shape), tuple(p.stride())


def _fp32_weight(p: torch.Tensor) -> torch.Tensor:
    """The fp32 copy of a low-precision parameter, made once per parameter version and kept while it lives, so
    that the packed-weight cache sees the same tensor on every call.  Dropped with the parameter."""
    key, identity = id(p), _weight_identity(p)
    entry = _fp32_weights.get(key)
    if entry is not None and entry[0]() is p and entry[1] == identity:
        return entry[2]
    copy = p.detach().float()
    _fp32_weights[key] = (weakref.ref(p, lambda _, key=key: _fp32_weights.pop(key, None)), identity, copy)
    return copy


def _autocast_input(a: torch.Tensor) -> torch.Tensor:
    """One floating op input under the autocast rule: in fp32."""
    if a.dtype == torch.float32:
        return a
    # A CPU parameter that autograd does not track (inference) keeps one fp32 copy, for the packed-weight cache;
    # anything else is cast per call: a training step must differentiate through the cast, inference tensors have
    # no version to check, and on CUDA (no packed cache) a kept copy would only hold memory.
    if (isinstance(a, torch.nn.Parameter) and a.device.type == "cpu" and not a.is_inference()
            and not (torch.is_grad_enabled() and a.requires_grad)):
        try:
            return _fp32_weight(a)
        except RuntimeError:  # a fake/functional tensor under torch.compile / torch.export: no storage to key on
            pass
    return a.float()


def _register_autocast_fp32(name: str, device: str) -> None:
    """A kernel on the Autocast<device> key: floating inputs on `device` to fp32 (`_autocast_input`; a gate keeps
    its dtype, see _autograd.AUTOCAST_KEEP), then the op with autocast off (which also excludes the key, so the
    call goes on to the backend kernel)."""
    op = getattr(torch.ops.vitfast, name).default

    def kernel(*args, **kwargs):
        with torch.autocast(device, enabled=False):
            # (keyword arguments, if the dispatcher passes any, by name: the gate keeps its dtype)
            named = {k: v if k == "gate" else _autograd.autocast_args("", [v], device, _autocast_input)[0]
                     for k, v in kwargs.items()}
            return op(*_autograd.autocast_args(name, args, device, _autocast_input), **named)

    _lib.impl(name, kernel, "Autocast" + device.upper())


for _name in SCHEMAS:
    for _device in ("cpu", "cuda"):
        _register_autocast_fp32(_name, _device)


@_register_fake("gated_mhsa")
def _gated_mhsa_fake(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj):
    from ._validate_gate import check_gated_mhsa_args

    check_gated_mhsa_args(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj)
    return x.new_empty(x.shape)


@_register_fake("gated_ffn")
def _gated_ffn_fake(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual):
    from ._validate_gate import check_gated_ffn_args

    check_gated_ffn_args(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual)
    return x.new_empty(x.shape)


def _gated_mhsa_cuda(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj):
    from .kernels.gated import gated_mhsa_triton

    return gated_mhsa_triton(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj)


def _gated_ffn_cuda(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual):
    from .kernels.gated import gated_ffn_triton

    return gated_ffn_triton(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual)


def _gated_norm(x, norm_eps):
    # The same LayerNorm kernel as the ungated fused block's pre-norm (nn.fused._layer_norm): a gate forced open
    # gives that block's bits.
    return torch.ops.vitfast.layer_norm(x, None, None, norm_eps) if norm_eps is not None else x


def _gated_mhsa_cpu(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj):
    from ._validate_gate import check_gated_mhsa_args

    check_gated_mhsa_args(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj)
    if not bool(gate[index] != 0):
        return x.clone()  # an op's output never aliases its input
    qkv = torch.ops.vitfast.linear(_gated_norm(x, norm_eps), w_qkv, b_qkv)
    return torch.ops.vitfast.linear(torch.ops.vitfast.attention(qkv, num_heads), w_proj, b_proj, x)


def _gated_ffn_cpu(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual):
    from ._validate_gate import check_gated_ffn_args

    check_gated_ffn_args(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual)
    if not bool(gate[index] != 0):
        return x.clone()
    return torch.ops.vitfast.channel_idle_ffn(_gated_norm(x, norm_eps), w_in, b_in, w_out, b_out,
                                              x if residual else None)


_lib.impl("gated_mhsa", _gated_mhsa_cuda, "CUDA")
_lib.impl("gated_ffn", _gated_ffn_cuda, "CUDA")
_lib.impl("gated_mhsa", _gated_mhsa_cpu, "CPU")
_lib.impl("gated_ffn", _gated_ffn_cpu, "CPU")


# ---------------------------------------------------------------------------------------------- CPU impls
_EXTENSION_ERROR: Optional[BaseException] = None
try:
    from . import _C  # noqa: F401  (registers the CPU kernels with the dispatcher)
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    _C = None
    _EXTENSION_ERROR = exc
    warnings.warn(
        f"vitfast: the C++ extension vitfast._C did not load ({exc}); CPU ops fall back to "
        "vitfast.reference (correct but slow). Rebuild with `pip install --no-build-isolation -e .`.",
        RuntimeWarning,
        stacklevel=2,
    )

_REFERENCE_CPU_FALLBACKS = []
for _name in SCHEMAS:
    # An op without a C++ CPU kernel (extension missing, or op not ported yet) runs its reference on CPU.
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"vitfast::{_name}", "CPU"):
        _lib.impl(_name, getattr(reference, _name), "CPU")
        _REFERENCE_CPU_FALLBACKS.append(_name)


# Optimizer steps must reach the packed-weight cache's version check (vitfast/_optimizer_versions.py).
_optimizer_versions.install()


def clear_weight_cache() -> None:
    """Drop every packed weight the CPU ops keep (csrc/ops/weight_cache.h); each is repacked on its next use.

    Needed only after writes the cache cannot see: it recognises a changed weight by its autograd version
    counter, which in-place ops on the tensor, `load_state_dict` and optimizer steps (fused ones included, see
    vitfast/_optimizer_versions.py) bump, but writes through `w.data`, numpy views or raw pointers do not (nor
    swapping `.data` with another tensor and back, as some EMA code does).  Also drops the fp32 copies that
    low-precision parameters keep under autocast.
    """
    _fp32_weights.clear()
    if _C is not None:
        _C._weight_cache_clear()


def extension_loaded() -> bool:
    """True when the C++ CPU kernels are registered (False: CPU falls back to the reference)."""
    return _C is not None


def cpu_isa() -> str:
    """The CPU code path the C++ kernels chose at run time: 'avx512', 'avx2', 'neon' or 'scalar'."""
    if _C is None:
        return "reference"
    return _C.cpu_isa()


# ---------------------------------------------------------------------------------------------- functional API
def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch 2.4: no device argument
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


def _device_type_of(args) -> str:
    return next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")


def _reference(name: str, *args) -> torch.Tensor:
    """vitfast.reference.<name>(*args) for VITFAST_BACKEND=reference, under the ops' autocast rule (see
    _register_autocast_fp32 above): inside an autocast region fp32 inputs, run in fp32, so the two backends agree (the
    reference alone refused the bf16 activations next to fp32 weights)."""
    fn = getattr(reference, name)
    device = _device_type_of(args)
    if not _autocast_enabled(device):
        return fn(*args)
    args = _autograd.autocast_args(name, args, device, _autocast_input)
    with torch.autocast(device, enabled=False):
        return fn(*args)


def _number(name: str, value) -> float:
    """A float argument converted only after it is checked: float('small') or float(None) named nothing."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    return float(value)


def _run(name: str, *args) -> torch.Tensor:
    """`torch.ops.vitfast.<name>(*args)`; when autograd must record the call, with the reference's gradient
    (vitfast/_autograd.py): a fused model can be fine-tuned, no fused weight gets a silent None gradient."""
    op = getattr(torch.ops.vitfast, name)
    if torch.is_grad_enabled() and _autograd.any_requires_grad(args):
        device = _device_type_of(args)
        return _autograd.with_reference_gradient(name, op, args, device if _autocast_enabled(device) else None)
    return op(*args)


def channel_idle_ffn(
    x: torch.Tensor,
    w_in: torch.Tensor,
    b_in: Optional[torch.Tensor],
    w_out: torch.Tensor,
    b_out: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """`torch.ops.vitfast.channel_idle_ffn`, or the reference when VITFAST_BACKEND=reference."""
    if get_backend() == "reference":
        return _reference("channel_idle_ffn", x, w_in, b_in, w_out, b_out, residual)
    return _run("channel_idle_ffn", x, w_in, b_in, w_out, b_out, residual)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """`torch.ops.vitfast.linear` (x · weightᵀ + bias + residual), or the reference when VITFAST_BACKEND=reference."""
    if get_backend() == "reference":
        return _reference("linear", x, weight, bias, residual)
    return _run("linear", x, weight, bias, residual)


def layer_norm(
    x: torch.Tensor, weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, eps: float = 1e-5
) -> torch.Tensor:
    """`torch.ops.vitfast.layer_norm` (over the last dimension, = F.layer_norm), or the reference when
    VITFAST_BACKEND=reference."""
    if get_backend() == "reference":
        return _reference("layer_norm", x, weight, bias, eps)
    return _run("layer_norm", x, weight, bias, eps)


def attention(qkv: torch.Tensor, num_heads: int, scale: Optional[float] = None) -> torch.Tensor:
    """`torch.ops.vitfast.attention` (heads of packed qkv → [B, N, H·D]), or the reference when
    VITFAST_BACKEND=reference."""
    if get_backend() == "reference":
        return _reference("attention", qkv, num_heads, scale)
    check_tensor("qkv", qkv)  # its only tensor: with None the dispatcher has nothing to dispatch on
    return _run("attention", qkv, num_heads, scale)


def vit_block(
    x: torch.Tensor,
    norm1_eps: float,
    w_qkv: torch.Tensor,
    b_qkv: Optional[torch.Tensor],
    num_heads: int,
    w_proj: torch.Tensor,
    b_proj: Optional[torch.Tensor],
    ffn_norm_eps: Optional[float],
    w_in: torch.Tensor,
    b_in: Optional[torch.Tensor],
    w_out: torch.Tensor,
    b_out: Optional[torch.Tensor],
    ffn_residual: bool,
) -> torch.Tensor:
    """`torch.ops.vitfast.vit_block` (the fused ViT block as one op, see reference.vit_block), or the reference when
    VITFAST_BACKEND=reference.  When autograd must record the call it runs as its six ops, each with its reference
    gradient (a block op's gradient would be that composition's anyway)."""
    args = (x, norm1_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj, ffn_norm_eps, w_in, b_in, w_out, b_out,
            ffn_residual)
    if get_backend() == "reference":
        return _reference("vit_block", *args)
    check_tensor("x", x)  # before the dispatcher reads its device
    if torch.is_grad_enabled() and _autograd.any_requires_grad(args):
        check_vit_block_args(*args)  # the block's own rules (fp32, its width), not only each op's
        return reference.compose_vit_block((layer_norm, linear, attention, channel_idle_ffn), *args)
    return torch.ops.vitfast.vit_block(*args)


__all__ += ["dwconv_attention"]


def dwconv_attention(
    x: torch.Tensor,
    w_v: torch.Tensor,
    b_v: Optional[torch.Tensor],
    kernel: torch.Tensor,
    w_o: torch.Tensor,
    b_o: Optional[torch.Tensor],
    grid_h: int,
    grid_w: int,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """`torch.ops.vitfast.dwconv_attention` (drop-in depthwise-conv heads, see `vitfast.reference.dwconv_attention`),
    or the reference when VITFAST_BACKEND=reference."""
    if get_backend() == "reference":
        return _reference("dwconv_attention", x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual)
    return _run("dwconv_attention", x, w_v, b_v, kernel, w_o, b_o, grid_h, grid_w, residual)


def batch_gate(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: Optional[torch.Tensor],
    w2: Optional[torch.Tensor] = None,
    b2: Optional[torch.Tensor] = None,
    layer_norm: bool = False,
    act: str = "none",
    eps: float = 1e-5,
) -> torch.Tensor:
    """`torch.ops.vitfast.batch_gate` (USDC batch-level decision [MHSA, FFN], 1 = execute), or the reference
    when VITFAST_BACKEND=reference."""
    if get_backend() == "reference":
        return _reference("batch_gate", x, w1, b1, w2, b2, layer_norm, act, eps)
    with torch.no_grad():  # a 0/1 decision: no gradient, as for a comparison (and no autograd recording)
        return torch.ops.vitfast.batch_gate(x, w1, b1, w2, b2, layer_norm, act, _number("eps", eps))


def gate_select(gate: torch.Tensor, index: int, taken: torch.Tensor, skipped: torch.Tensor) -> torch.Tensor:
    """`torch.ops.vitfast.gate_select`: taken if gate[index] != 0 else skipped, decided on the device."""
    if get_backend() == "reference":
        return _reference("gate_select", gate, index, taken, skipped)
    return _run("gate_select", gate, index, taken, skipped)


def xwx_attention(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_k: Optional[torch.Tensor],
    key_bias: Optional[torch.Tensor],
    w_v: torch.Tensor,
    w_o: torch.Tensor,
    b_o: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """`torch.ops.vitfast.xwx_attention` (collapsed non-deep attention, see `vitfast.reference.xwx_attention`), or
    the reference when VITFAST_BACKEND=reference."""
    if get_backend() == "reference":
        return _reference("xwx_attention", x, w_q, w_k, key_bias, w_v, w_o, b_o, residual)
    return _run("xwx_attention", x, w_q, w_k, key_bias, w_v, w_o, b_o, residual)


# ---------------------------------------------------------------------------------------------- prepacking
def prepack(module: torch.nn.Module) -> int:
    """Pack the CPU kernels' weights of every fused submodule of `module` now, so the first inference packs none.

    The C++ ops keep each weight packed (transposed into 16-column panels, NaN/Inf-checked) in a process-wide
    cache keyed on the weight tensors and their version counters (csrc/ops/weight_cache.h).  Without this the
    first forward pays that cost (about one batch-1 forward's worth of memory traffic); `vitfast.fuse`,
    `vitfast.load` and `vitfast.patch_timm` call it for you.  Each submodule with a `vitfast_prepack()` method
    runs its ops once on a one-row zero input — the same op, the same weight tensors, so the same cache
    entries the real forward hits.  Weights changed later (in place, `.to(...)`, `load_state_dict`) are
    repacked on their next use, as before.

    Returns the number of submodules prepacked: 0 under VITFAST_BACKEND=reference, without the C++
    extension, or when the weights are not on the CPU (the CUDA kernels read weights as they are).  Modules
    whose weights the kernels refuse (float64, NaN/Inf) are skipped with one RuntimeWarning naming them.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    if get_backend() == "reference" or _C is None:
        return 0
    count, refused = 0, []
    with torch.no_grad():
        for name, sub in module.named_modules():
            hook = getattr(sub, "vitfast_prepack", None)
            if not callable(hook):
                continue
            try:
                count += bool(hook())
            except ValueError as e:  # the kernel's own argument check: float64 or non-finite weights
                refused.append(f"{name or type(sub).__name__} ({e})")
    if refused:
        # Not an error here: vitfast.load(allow_nonfinite=True) and float64 files must still load (to inspect,
        # or to run under VITFAST_BACKEND=reference); a CPU-kernel forward of these modules raises the same error.
        more = f"; ... and {len(refused) - 3} more" if len(refused) > 3 else ""
        warnings.warn(
            f"vitfast.ops.prepack: {len(refused)} modules not packed, the CPU kernels refuse their weights: "
            f"{'; '.join(refused[:3])}{more}. Their kernel forward raises the same error; "
            "VITFAST_BACKEND=reference runs them.",
            RuntimeWarning,
            stacklevel=2,
        )
    return count


__all__ += ["gated_mhsa", "gated_ffn"]


def gated_mhsa(gate, index, x, norm_eps, w_qkv, b_qkv, num_heads, w_proj, b_proj) -> torch.Tensor:
    """`torch.ops.vitfast.gated_mhsa`: x + proj(attention(qkv(LN(x)))) if gate[index] != 0 else x, decided on the
    device (see `vitfast.reference.gated_mhsa`), or the reference when VITFAST_BACKEND=reference."""
    eps = _number("norm_eps", norm_eps) if norm_eps is not None else None
    if get_backend() == "reference":
        return _reference("gated_mhsa", gate, index, x, eps, w_qkv, b_qkv, num_heads, w_proj, b_proj)
    return _run("gated_mhsa", gate, index, x, eps, w_qkv, b_qkv, num_heads, w_proj, b_proj)


def gated_ffn(gate, index, x, norm_eps, w_in, b_in, w_out, b_out, residual) -> torch.Tensor:
    """`torch.ops.vitfast.gated_ffn`: channel_idle_ffn(LN(x), …, x if residual) if gate[index] != 0 else x, decided on
    the device (see `vitfast.reference.gated_ffn`), or the reference when VITFAST_BACKEND=reference."""
    eps = _number("norm_eps", norm_eps) if norm_eps is not None else None
    if get_backend() == "reference":
        return _reference("gated_ffn", gate, index, x, eps, w_in, b_in, w_out, b_out, bool(residual))
    return _run("gated_ffn", gate, index, x, eps, w_in, b_in, w_out, b_out, bool(residual))

