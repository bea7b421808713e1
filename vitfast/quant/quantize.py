"""`vitfast.quantize`: a fused model → an int8 (or bf16) copy.

int8 (the default): every GEMM of the fused blocks' FFNs (`FusedChannelIdleFFN`, in every block kind), of the
fused / Swin attentions (qkv, proj) and of the patch embedding (`Int8PatchProjection`) gets symmetric
per-output-channel int8 weights and int8 activations, per token computed at run time (`activations="dynamic"`, needs
no data) or one scale per tensor from calibration images (`"static"`).  LayerNorm, softmax, GELU and the residual
adds stay fp32; so does the head (the last layer, a few hundred MACs per class).  A non-deep XWX attention is
quantized in its projected form (`ProjectedXWXAttention`, vitfast/nn/xwx.py): its projection and output GEMMs int8
(layers `attn.proj_in` / `attn.proj_out`), its heads (scores, softmax, values) `xwx_heads`, whose products follow
`attention=` below (`xwx_heads_int8`).  A DW-conv block's
value and output GEMMs (`value` / `out_proj`) and its remaining attention heads' `qkv` / `attn_proj` become int8 the
same way; its depthwise convolution (`dwconv_heads`) stays fp32.  The attention's score/value products (and the
non-deep heads') are int8 in the dynamic mode where int8 products measured faster on this CPU's int8 kernel at the
model's token count and head dim (`attention="auto"`, vitfast/quant/attention_choice.py; "int8", "bf16" or "fp32"
force one): `describe(model)` lists what stays fp32.
The patch embedding was fp32 too until measured: ~2% of the FLOPs but 7% of an int8 DeiT-S forward
(docs/quantization.md); `skip=["patch_embed.proj"]` keeps it fp32.

Reparameterization-aware options, each measured by the caller (`vitfast verify`, the demo, benchmarks):
* `smooth=α` (0 < α < 1; True = 0.5): SmoothQuant's per-channel migration (arXiv 2211.10438), s_j = max|X_j|^α /
  max|W_j|^(1−α): activation channels with outliers (a folded BatchNorm or LayerScale widens them) are divided by
  s_j inside the quantizer, the weight's input channel multiplied.  Needs calibration.  `smooth="auto"`: α per
  layer, the one of AUTO_ALPHAS (no migration included) with the smallest own error on the calibration images.
* `skip=`: layers kept in fp32.  A list of module paths or fnmatch patterns ("blocks.11.*"), or a float error budget:
  every layer whose own relative output error on the calibration images exceeds it stays fp32 (and every layer the
  calibration images never reach, behind a USDC gate closed on all of them: its error is unknown).
* `split_identity=True` (the default): a BatchNorm-variant FFN's linear path holds the block's shortcut (W_lin =
  I + W', eq. 5); its int8 rows get W' only and the shortcut is added exactly in fp32 (vitfast/nn/int8.py).  Without
  it the residual stream itself goes through int8 rows whose scale the diagonal sets: the largest error of a
  BatchNorm model (1-2% of each block's output on the digits demo model, benchmarks/quant_digits.py).
 * `weight_bits=7`: weight codes in [−64, 64] instead of [−127, 127] (ONNX Runtime's `reduce_range` for weights),
  for CPUs with AVX2 and no VNNI (`vitfast.ops.int8_kernel() == "avx2"`): there AVX2's int8 multiply (`vpmaddubsw`,
  u8 × s8 pairs summed with saturation) takes u8 activations against such weights exactly with no sign trick, 1.3×
  the 8-bit kernel (docs/quantization.md has the figures), and ONNX Runtime runs the exported QDQ graph exactly
  (with 8-bit weights its AVX2 GEMM saturates).  Every other kernel computes the same integer sums at the same
  speed either way.  It doubles the weights' rounding step.
The per-layer errors on the calibration images (when given) are kept in `model.vitfast_quantization["layers"]`.
A layer no calibration image reaches (without a budget) is int8 with per-token scales and no migration, listed in
`model.vitfast_quantization["uncalibrated"]`.
"""
from __future__ import annotations

import copy
import fnmatch
import math
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
import torch.nn as nn

from ..nn.block import FusedAttention
from ..nn.dwconv import FusedDWConvBlock
from ..nn.ffn import FusedChannelIdleFFN
from ..nn.int8 import Int8ChannelIdleFFN, Int8Linear, Int8PatchProjection, max_weight_code
from ..nn.patch_embed import is_patch_projection
from ..nn.xwx import ProjectedXWXAttention
from ..reference._int8 import WEIGHT_QMAX
from . import calibrate
from .attention_choice import int8_attention_pays, model_tokens, products_dim, why
from .structure import _replan_blocks, project_xwx_attentions, restore_fp32_xwx, set_submodule

DTYPES = ("int8", "bf16")
ACTIVATIONS = ("dynamic", "static")
DEFAULT_ALPHA = 0.5
# smooth="auto": the candidates per layer (None: no migration)
AUTO_ALPHAS = (None, 0.3, 0.5, 0.7, 0.85)
# Calibration batches read at most (a DataLoader over a whole dataset is cut here).
MAX_CALIBRATION_BATCHES = 64


def quantizable_layers(model: nn.Module) -> Dict[str, str]:
    """path -> "linear" | "ffn" | "patch" for every layer `quantize` turns into int8."""
    try:
        from timm.models.swin_transformer import WindowAttention
    except ImportError:  # pragma: no cover - timm is a dependency
        WindowAttention = ()
    layers: Dict[str, str] = {}
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    if proj is not None and is_patch_projection(proj):
        layers["patch_embed.proj"] = "patch"
    for name, m in model.named_modules():
        if type(m) is FusedChannelIdleFFN:
            layers[name] = "ffn"
        elif (type(m) in (FusedAttention, ProjectedXWXAttention, FusedDWConvBlock)
              or (WindowAttention and isinstance(m, WindowAttention))):
            for child in ("qkv", "proj", "proj_in", "proj_out", "attn_proj", "value", "out_proj"):
                if type(getattr(m, child, None)) is nn.Linear:
                    layers[f"{name}.{child}"] = "linear"
    return layers


def fp32_kinds(model: nn.Module) -> List[str]:
    """What computes in fp32 in an int8 model besides the norms, softmax, GELU and adds (for `describe`)."""
    from ..nn.gated import FusedBatchGate
    from ..nn.xwx import FusedXWXAttention

    kept = []
    counts = {"XWX attention (non-deep)": sum(isinstance(m, FusedXWXAttention) for m in model.modules()),
              "XWX attention heads (non-deep: scores, softmax, values)": sum(
                  isinstance(m, ProjectedXWXAttention) and not (m.int8_attention or m.bf16_attention)
                  for m in model.modules()),
              "DW-conv attention": sum(isinstance(m, FusedDWConvBlock) and type(m.value) is nn.Linear
                                       and type(m.out_proj) is nn.Linear for m in model.modules()),
              "DW-conv heads (depthwise convolution)": sum(
                  isinstance(m, FusedDWConvBlock) and not (type(m.value) is nn.Linear and type(m.out_proj) is nn.Linear)
                  for m in model.modules()),
              "USDC gate": sum(isinstance(m, FusedBatchGate) for m in model.modules())}
    for what, n in counts.items():
        if n:
            kept.append(f"{n} × {what}")
    return kept


def _smooth_scale(act_max: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """1/s with s_j = max|X_j|^α / max|W_j|^(1−α) over input channel j (clamped away from 0 and ∞)."""
    w_max = weight.detach().float().abs().amax(dim=0).clamp(min=1e-5)
    a_max = act_max.float().clamp(min=1e-5)
    s = (a_max.pow(alpha) / w_max.pow(1.0 - alpha)).clamp(min=1e-5, max=1e5)
    return (1.0 / s).float()


def _check_args(model, calibration, dtype, activations, per_token, smooth, skip) -> Optional[float]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module (a fused model), got {type(model).__name__}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {DTYPES}, got {dtype!r}")
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations: expected one of {ACTIVATIONS}, got {activations!r}")
    if per_token not in (True, False):
        raise ValueError(f"per_token: expected True or False, got {per_token!r}")
    if activations == "dynamic" and not per_token:
        raise ValueError("per_token: expected True with activations='dynamic' (the kernels take one scale per token; "
                         "a per-tensor scale is activations='static'), got False")
    if activations == "static" and per_token:
        raise ValueError("per_token: expected False with activations='static' (one calibrated scale per tensor), "
                         "got True")
    alpha = None
    if smooth is True:
        alpha = DEFAULT_ALPHA
    elif smooth == "auto":
        alpha = "auto"
    elif smooth not in (None, False):
        if isinstance(smooth, bool) or not isinstance(smooth, (int, float)) or not 0.0 < float(smooth) < 1.0:
            raise ValueError(f"smooth: expected None, True, 'auto' or a migration strength α in (0, 1), got "
                             f"{smooth!r}")
        alpha = float(smooth)
    if skip is not None and not isinstance(skip, (float, int, str, list, tuple)) or isinstance(skip, bool):
        raise ValueError(f"skip: expected None, a list of module paths/patterns or an error budget (float > 0), "
                         f"got {skip!r}")
    if isinstance(skip, (int, float)) and not (math.isfinite(skip) and skip > 0):
        raise ValueError(f"skip: expected an error budget > 0 (a relative output error such as 0.05), got {skip!r}")
    needs = [what for what, on in (("activations='static'", activations == "static"), ("smooth", alpha is not None),
                                   ("an error budget skip=", isinstance(skip, (int, float)))) if on]
    if dtype == "int8" and needs and calibration is None:
        raise ValueError(f"calibration: {', '.join(needs)} needs calibration images (a tensor [B, C, H, W] or a "
                         f"DataLoader), got None")
    return alpha


def _skipped(layers: Dict[str, str], skip) -> List[str]:
    if skip is None or isinstance(skip, (int, float)):
        return []
    patterns = [skip] if isinstance(skip, str) else list(skip)
    for p in patterns:
        if not isinstance(p, str):
            raise ValueError(f"skip: expected module paths or patterns (str), got {p!r}")
    return [path for path in layers if any(fnmatch.fnmatchcase(path, p) for p in patterns)]


def _calibrated(kind: str, recorder) -> bool:
    """Whether the layer saw calibration inputs (a USDC gate can skip a sub-block on every calibration batch)."""
    if recorder is None:
        return False
    return (recorder.stats_in if kind == "ffn" else recorder.stats).channel is not None


def _build(path: str, kind: str, module: nn.Module, recorder, alpha: Optional[float], static: bool,
           split_identity: bool = True, qmax: float = WEIGHT_QMAX[8]) -> nn.Module:
    if not _calibrated(kind, recorder):
        # No statistics (no calibration, or the layer never ran on it): no migration, per-token scales.
        alpha, static, recorder = None, False, None
    if kind in ("linear", "patch"):
        stats = recorder.stats if recorder is not None else None
        weight = module.weight if kind == "linear" else Int8PatchProjection.weight_matrix(module)
        sm = _smooth_scale(stats.channel, weight, alpha) if alpha is not None else None
        act = 0.0
        if static:
            # the static scale is of the smoothed activation: x · smooth
            m = (stats.channel * sm).max() if sm is not None else torch.tensor(stats.tensor)
            act = float(m) / 127.0
        build = Int8Linear.from_linear if kind == "linear" else Int8PatchProjection.from_conv
        return build(module, smooth=sm, act_scale=act if act > 0 else 0.0, qmax=qmax)
    stats_in = recorder.stats_in if recorder is not None else None
    stats_out = recorder.stats_out if recorder is not None else None
    a = module.active_features
    split = split_identity and Int8ChannelIdleFFN.folded_shortcut(module)
    w_in = Int8ChannelIdleFFN.input_weight(module, split)
    sm_in = _smooth_scale(stats_in.channel, w_in, alpha) if alpha is not None else None
    sm_out = (_smooth_scale(stats_out.channel, module.w_out, alpha) if alpha is not None and a > 0
              and stats_out.channel is not None else None)
    act_in = act_out = 0.0
    if static:
        act_in = float((stats_in.channel * sm_in).max() if sm_in is not None else stats_in.tensor) / 127.0
        if a > 0 and stats_out.channel is not None:
            act_out = float((stats_out.channel * sm_out).max() if sm_out is not None else stats_out.tensor) / 127.0
    return Int8ChannelIdleFFN.from_ffn(module, smooth_in=sm_in, smooth_out=sm_out, act_scale_in=act_in,
                                       act_scale_out=act_out, split_identity=split, qmax=qmax)


def quantize(
    model: nn.Module,
    calibration: Any = None,
    *,
    dtype: str = "int8",
    activations: str = "dynamic",
    per_token: Optional[bool] = None,
    smooth: Union[None, bool, float, str] = None,
    skip: Union[None, float, str, Sequence[str]] = None,
    split_identity: bool = True,
    attention: Optional[str] = None,
    weight_bits: int = 8,
    progress: bool = False,
) -> nn.Module:
    """A low-precision copy of the fused `model` (the model itself is not changed); see the module doc.

    calibration: images [B, C, H, W], or an iterable (DataLoader) of image tensors or (images, labels) pairs (at most
    64 batches are read); needed for activations="static", smooth and an error-budget skip, optional otherwise (then
    it measures each layer's error for the report).  `per_token` defaults to True for dynamic, False for static.
    """
    if per_token is None:
        per_token = activations == "dynamic"
    alpha = _check_args(model, calibration, dtype, activations, per_token, smooth, skip)
    if attention is None:  # int8 products where they pay (attention_choice.py); none in the all-static (QDQ) mode
        attention = "auto" if activations == "dynamic" else "fp32"
    if attention not in ("auto", "int8", "bf16", "fp32"):
        raise ValueError(f"attention: expected 'auto', 'int8', 'bf16' or 'fp32' (the score and value products), got "
                         f"{attention!r}")
    if attention == "auto" and activations == "static":
        attention = "fp32"  # per-token Q/K/P scales have no QDQ form: the static mode's products stay fp32
    if split_identity not in (True, False):
        raise ValueError(f"split_identity: expected True or False, got {split_identity!r}")
    if isinstance(weight_bits, bool) or weight_bits not in WEIGHT_QMAX:
        raise ValueError(f"weight_bits: expected 8 or 7 (codes in [-127, 127] or [-64, 64]), got {weight_bits!r}")
    if weight_bits != 8 and dtype != "int8":
        raise ValueError(f"weight_bits: 7-bit weights are an int8 option, got weight_bits={weight_bits} with "
                         f"dtype={dtype!r}")
    qmax = WEIGHT_QMAX[weight_bits]
    if dtype == "bf16":
        out = copy.deepcopy(model).to(torch.bfloat16).eval()
        out.vitfast_quantization = {"dtype": "bf16"}
        return out
    out = copy.deepcopy(model).eval()
    # non-deep attentions as projection GEMM → heads → output GEMM, so their two GEMMs become int8 layers
    fused_xwx = project_xwx_attentions(out)
    layers = quantizable_layers(out)
    if not layers:
        raise ValueError("model: expected a fused model with FFNs or attentions to quantize (vitfast.fuse(model) "
                         "first), found none")
    static = activations == "static"
    kept = set(_skipped(layers, skip))
    stats: Dict[str, Any] = {}
    errors: Dict[str, Optional[float]] = {}
    alphas: Dict[str, Any] = {}  # path -> the layer's α (None: no migration)
    if calibration is not None:
        def pass_one(recorders):
            calibrate.run_model(out, calibration, max_batches=MAX_CALIBRATION_BATCHES, progress=progress,
                                what="calibration statistics")
            stats.update(recorders)

        calibrate.with_recorders(out, layers, pass_one)

        def measure(alpha_of: Dict[str, Any], trial: str = "") -> Dict[str, Optional[float]]:
            """Each layer's own error, built with alpha_of[path], on the calibration images (`trial`: which of
            smooth="auto"'s passes this is, for the progress line)."""
            measured: Dict[str, Optional[float]] = {}

            def pass_two(recorders):
                for path, rec in recorders.items():
                    module = calibrate.recorded_layer(rec)
                    rec.candidate = _build(path, layers[path], module, stats[path], alpha_of[path], static,
                                           split_identity, qmax)
                calibrate.run_model(out, calibration, max_batches=MAX_CALIBRATION_BATCHES, progress=progress,
                                    what="per-layer int8 error" + trial)
                measured.update({path: rec.error.relative for path, rec in recorders.items()})

            calibrate.with_recorders(out, layers, pass_two)
            return measured

        if alpha == "auto":
            # every layer's error is measured on fp32 inputs, so the layers' choices are independent: one pass per α
            trials = {a: measure({p: a for p in layers},
                                 f", SmoothQuant α {a}" if a is not None else ", no SmoothQuant migration")
                      for a in AUTO_ALPHAS}
            for path in layers:
                best = min(AUTO_ALPHAS, key=lambda a: math.inf if trials[a][path] is None else trials[a][path])
                alphas[path], errors[path] = best, trials[best][path]
        else:
            alphas.update({p: alpha for p in layers})
            errors.update(measure(alphas))
        if isinstance(skip, (int, float)):
            # a layer the calibration images never reached (a closed gate) has no measured error: it cannot be shown
            # to be within the budget, so it stays fp32 too
            kept |= {path for path, e in errors.items() if e is None or e > float(skip)}

    # layers that never ran on the calibration images (a closed gate): int8 with per-token scales and no
    # migration whatever the options (_build), listed so the record says so
    uncalibrated = sorted(p for p in layers if calibration is not None and p not in kept
                          and not _calibrated(layers[p], stats.get(p)))
    for path, kind in layers.items():
        if path in kept:
            continue
        module = out.get_submodule(path)
        set_submodule(out, path, _build(path, kind, module, stats.get(path), alphas.get(path, alpha), static,
                                        split_identity, qmax))
    restore_fp32_xwx(out, fused_xwx)  # both GEMMs kept fp32 (skip=): the fused op, as before quantizing
    auto: Dict[str, Any] = {}
    if attention == "auto":
        from .. import ops

        auto = {"kernel": ops.int8_kernel(), "tokens": model_tokens(out)}
    if attention != "fp32":
        patterns = [skip] if isinstance(skip, str) else list(skip) if isinstance(skip, (list, tuple)) else []
        for name, m in out.named_modules():
            # the fused ViT attention's products (not Swin's windows: its bias table and masks stay on fp32 SDPA)
            # and a projected non-deep attention's heads; an attention whose input GEMM (qkv / proj_in) a skip=
            # pattern kept in fp32 keeps its products fp32 too
            first = "qkv" if type(m) is FusedAttention else "proj_in"
            if (type(m) not in (FusedAttention, ProjectedXWXAttention) or f"{name}.{first}" in kept
                    or any(fnmatch.fnmatchcase(name, p) for p in patterns)):
                continue
            if attention == "auto":
                if int8_attention_pays(auto["tokens"], products_dim(m), auto["kernel"]):
                    m.int8_attention = True
            else:
                setattr(m, f"{attention}_attention", True)
    out.vitfast_quantization = {
        "dtype": "int8", "activations": activations, "smooth": alpha, "fp32": sorted(kept), "attention": attention,
        **({"attention_auto": auto} if auto else {}),
        "uncalibrated": uncalibrated, "split_identity": split_identity, "weight_bits": weight_bits,
        "layers": [{"path": p, "kind": layers[p], "relative_error": errors.get(p), "int8": p not in kept,
                    **({"alpha": alphas.get(p)} if alpha == "auto" else {})} for p in layers],
    }
    _replan_blocks(out)
    return out


def describe(model: nn.Module) -> str:
    """One paragraph: what of `model` is int8 / bf16 and what stays fp32, and the worst layer's error if measured."""
    from ..nn.int8 import is_int8_module

    record = getattr(model, "vitfast_quantization", None) or {}
    first = next(model.parameters(), None)
    if record.get("dtype") == "bf16" or (not record and first is not None and first.dtype == torch.bfloat16):
        from .. import ops

        kernel = ops.bf16_kernel()
        how = (f"GEMMs on the {kernel} kernels with fp32 accumulation" if kernel != "none" else
               "this CPU has no bf16 extension: computed in fp32 and rounded once, no faster than fp32")
        from ..nn.gated import FusedBatchGate

        # the kinds whose bf16 computes in fp32 inside their op (a few multiply-adds per value beside the GEMMs)
        n_conv = sum(isinstance(m, FusedDWConvBlock) for m in model.modules())
        n_gate = sum(isinstance(m, FusedBatchGate) for m in model.modules())
        extra = "".join([f"; {n_conv} × DW-conv heads' depthwise convolution in fp32" if n_conv else "",
                         f"; {n_gate} × USDC gate in fp32" if n_gate else ""])
        return f"bf16 model (weights and activations bf16; norms, softmax and GELU in fp32; {how}{extra})"
    int8 = [(n, m) for n, m in model.named_modules() if is_int8_module(m)]
    if not int8:
        return "fp32 model (no int8 layers)"
    def owned(kind, children):
        return sum(isinstance(m, Int8Linear) and n.rpartition(".")[2] in children
                   and isinstance(model.get_submodule(n.rpartition(".")[0]), kind) for n, m in int8)

    n_xwx = owned(ProjectedXWXAttention, ("proj_in", "proj_out"))
    n_dw = owned(FusedDWConvBlock, ("value", "out_proj"))
    n_lin = sum(isinstance(m, Int8Linear) for _, m in int8) - n_xwx - n_dw
    n_ffn = sum(isinstance(m, Int8ChannelIdleFFN) for _, m in int8)
    static = any(getattr(m, "act_scale", 0.0) > 0 or getattr(m, "act_scale_in", 0.0) > 0 for _, m in int8)
    n_att = sum(bool(m.__dict__.get("int8_attention")) for m in model.modules() if type(m) is FusedAttention)
    n_bf16 = sum(bool(m.__dict__.get("bf16_attention")) for m in model.modules() if type(m) is FusedAttention)
    n_xwx_heads = sum(bool(m.__dict__.get("int8_attention")) for m in model.modules()
                      if type(m) is ProjectedXWXAttention)
    n_xwx_bf16 = sum(bool(m.__dict__.get("bf16_attention")) for m in model.modules()
                     if type(m) is ProjectedXWXAttention)
    all_att = sum(type(m) is FusedAttention for m in model.modules())
    att = f", {n_att} attentions' score/value products" if n_att else ""
    att += f", {n_xwx_heads} non-deep XWX attention heads' score/value products" if n_xwx_heads else ""
    if n_bf16 or n_xwx_bf16:
        from .. import ops

        what = [f"{n_bf16} attentions' score/value products" if n_bf16 else "",
                f"{n_xwx_bf16} non-deep XWX attention heads' score/value products" if n_xwx_bf16 else ""]
        att += f"; bf16: {', '.join(w for w in what if w)} (the {ops.bf16_kernel()} kernels)"
    n_patch = sum(isinstance(m, Int8PatchProjection) for _, m in int8)
    patch = "the patch embedding, " if n_patch else ""
    xwx = f", {n_xwx} non-deep XWX attention GEMMs (projection/output)" if n_xwx else ""
    xwx += f", {n_dw} DW-conv head GEMMs (value/output)" if n_dw else ""
    lin = f", {n_lin} attention linears (qkv/proj)" if n_lin or not (n_xwx or n_dw) else ""
    parts = [f"int8: {patch}{n_ffn} channel-idle FFNs (2 GEMMs each){lin}{xwx}{att}; "
             f"activations {'static per tensor' if static else 'dynamic per token'}"]
    if 0 < max_weight_code(model) <= WEIGHT_QMAX[7]:  # the weights themselves say it
        parts[0] += "; 7-bit weights (codes in [-64, 64])"
    auto = record.get("attention_auto")
    if isinstance(auto, dict) and isinstance(auto.get("kernel"), str):
        heads = sorted({products_dim(m) for m in model.modules()
                        if type(m) in (FusedAttention, ProjectedXWXAttention)})
        if len(heads) == 1:  # (structure.apply checked the flags)
            parts.append(why(auto.get("tokens"), heads[0], auto["kernel"], n_att + n_xwx_heads > 0))
    if record.get("smooth") == "auto":
        chosen = [layer.get("alpha") for layer in record.get("layers", []) if layer.get("int8")]
        parts.append("SmoothQuant α per layer (" + ", ".join(
            f"{'none' if a is None else f'{a:g}'}: {chosen.count(a)}" for a in AUTO_ALPHAS if chosen.count(a)) + ")")
    elif record.get("smooth"):
        parts.append(f"SmoothQuant α = {record['smooth']:g}")
    n_low = n_att + n_bf16
    products = (None if all_att == 0 and (n_xwx or n_dw) else "attention score/value products" if n_low == 0 else
                f"{all_att - n_low} attentions' score/value products" if all_att > n_low else None)
    fp32 = ["norms, softmax, GELU, residual adds", *([products] if products else []),
            *([] if n_patch else ["patch embedding"]), "head"]
    fp32 += fp32_kinds(model)
    if record.get("fp32"):
        fp32.append(f"{len(record['fp32'])} skipped layers ({', '.join(record['fp32'][:4])}"
                    f"{', ...' if len(record['fp32']) > 4 else ''})")
    parts.append("fp32: " + "; ".join(fp32))
    if record.get("uncalibrated"):
        n = len(record["uncalibrated"])
        parts.append(f"{n} int8 layer{'s' if n > 1 else ''} never ran on the calibration images (a gate skipped "
                     f"{'them' if n > 1 else 'it'}: {', '.join(record['uncalibrated'][:4])}"
                     f"{', ...' if n > 4 else ''}), per-token scales without migration")
    measured = [layer for layer in record.get("layers", []) if layer.get("relative_error") is not None]
    if measured:
        worst = max(measured, key=lambda layer: layer["relative_error"])
        parts.append(f"worst layer on the calibration images: {worst['path']} ({worst['kind']}), relative output error "
                     f"{worst['relative_error']:.2%}{'' if worst['int8'] else ' (kept fp32)'}")
    return ". ".join(parts)
