"""`vitfast.quantize` on every fused block kind: channel-idle ViT (FusedBlock), Swin (FusedSwinBlock: timm's window
attention's qkv/proj become Int8Linear), non-deep (FusedXWXBlock: the XWX attention's projection and output GEMMs
become Int8Linear in its projected form, its heads' products int8 where `attention=` asks), drop-in DW-conv
(FusedDWConvBlock: its value, output and attention-head linears become Int8Linear, the depthwise convolution stays
fp32) and USDC gated (FusedGatedBlock). For each kind and for dynamic and static + smooth quantization: the int8
modules are where expected and nowhere else, each int8 layer's own error and the model's output error stay at int8
rounding's size, `vitfast.save` → `vitfast.load` gives identical outputs, and `describe` names what stays fp32."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from helpers import randomize, spy_returned_something
from timm.models.swin_transformer import SwinTransformer, WindowAttention
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast.nn import FusedChannelIdleFFN
from vitfast.nn.block import FusedAttention
from vitfast.nn.dwconv import FusedDWConvBlock
from vitfast.nn.int8 import Int8ChannelIdleFFN, Int8Linear, Int8PatchProjection
from vitfast.nn.xwx import FusedXWXAttention, ProjectedXWXAttention

pytestmark = pytest.mark.usefixtures("one_thread")


def _vit(depth=4, **kw):
    torch.manual_seed(0)
    cfg = dict(img_size=32, patch_size=8, embed_dim=32, depth=depth, num_heads=4, num_classes=10, qkv_bias=True)
    cfg.update(kw)
    return randomize(VisionTransformer(**cfg))


def _bn_statistics(model: nn.Module) -> nn.Module:
    """BatchNorm statistics of the model's own activations (a few train-mode passes), as after training: the
    random statistics of `randomize` do not match the activations and blow the folded weights up."""
    g = torch.Generator().manual_seed(5)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(8, 3, 32, 32, generator=g))
    return model.eval()


def channel_idle():
    return vitfast.fuse(_bn_statistics(vitfast.convert.from_timm(_vit(), channel_idle=0.75, norm="batch")))


def swin():
    torch.manual_seed(0)
    m = randomize(SwinTransformer(img_size=32, patch_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4),
                                  window_size=4, num_classes=10))
    return vitfast.fuse(_bn_statistics(vitfast.convert.from_timm(m, channel_idle=0.5, norm="batch")))


def nondeep():
    model = vitfast.convert.from_timm(_vit(), branches=2)
    for block in model.blocks:
        block.set_lambda(1.0)
    return vitfast.fuse(model.eval())


def dwconv():
    # block 1 fully convolutional, block 2 mixed (head 0 a convolution, the others attention)
    return vitfast.fuse(vitfast.convert.from_timm(_vit(), dwconv_blocks=[1], dwconv_heads={2: [0]}).eval())


def gated():
    # the gates' init opens every sub-block: the int8 model takes the fp32 model's decisions
    return vitfast.fuse(vitfast.convert.from_timm(_vit(), gates=True, gate_search=False).eval())


# kind: (builder, int8 FFNs, int8 attention linears, describe()'s phrase for them, the phrase of what else stays fp32)
KINDS = {
    "channel_idle": (channel_idle, 4, 8, "8 attention linears (qkv/proj)", None),
    "swin": (swin, 4, 8, "8 attention linears (qkv/proj)", None),
    "nondeep": (nondeep, 2, 4, "4 non-deep XWX attention GEMMs (projection/output)",
                "2 × XWX attention heads (non-deep: scores, softmax, values)"),
    # blocks 0 and 3 keep a fused attention (qkv, proj), block 2 attention heads (qkv, attn_proj) beside its DW-conv
    # heads, blocks 1 and 2 the DW-conv heads' value and output GEMMs
    "dwconv": (dwconv, 4, 10, "6 attention linears (qkv/proj), 4 DW-conv head GEMMs (value/output)",
               "2 × DW-conv heads (depthwise convolution)"),
    "gated": (gated, 4, 8, "8 attention linears (qkv/proj)", "4 × USDC gate"),
}
OPTIONS = {"dynamic": dict(), "static_smooth": dict(activations="static", smooth=0.5),
           "static_smooth_auto": dict(activations="static", smooth="auto")}


def images(batch=8, seed=1):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=list(KINDS))
def fused(request):
    return request.param, KINDS[request.param][0]()


def _int8_paths(model):
    return {name: type(m) for name, m in model.named_modules() if type(m) in (Int8Linear, Int8ChannelIdleFFN)}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_quantize_every_kind(fused, option, tmp_path):
    kind, model = fused
    _, n_ffn, n_lin, lin_phrase, fp32_phrase = KINDS[kind]
    calib = images(16, seed=2)
    q = vitfast.quantize(model, calib, **OPTIONS[option])

    # the int8 modules are where expected: the patch embedding, every FusedChannelIdleFFN, every fused / window
    # attention's qkv and proj, every XWX attention's projection and output (not the DW-conv attentions, nor the
    # head), and nothing is left fp32
    found = _int8_paths(q)
    assert sum(t is Int8ChannelIdleFFN for t in found.values()) == n_ffn
    assert sum(t is Int8Linear for t in found.values()) == n_lin
    ffn_paths = {n for n, m in model.named_modules() if type(m) is FusedChannelIdleFFN}
    assert {n for n, t in found.items() if t is Int8ChannelIdleFFN} == ffn_paths
    attn_paths = {f"{n}.{c}" for n, m in model.named_modules()
                  if type(m) is FusedAttention or isinstance(m, WindowAttention) for c in ("qkv", "proj")}
    attn_paths |= {f"{n}.{c}" for n, m in model.named_modules() if type(m) is FusedXWXAttention
                   for c in ("proj_in", "proj_out")}
    attn_paths |= {f"{n}.{c}" for n, m in model.named_modules() if type(m) is FusedDWConvBlock
                   for c in ("qkv", "attn_proj", "value", "out_proj") if getattr(m, c) is not None}
    assert {n for n, t in found.items() if t is Int8Linear} == attn_paths
    assert not any(type(m) is FusedChannelIdleFFN for m in q.modules())  # (the sets above: nothing else is int8)
    assert isinstance(q.patch_embed.proj, Int8PatchProjection)
    if option == "static_smooth":
        assert all(m.act_scale > 0 and m.smooth is not None for m in q.modules()
                   if isinstance(m, (Int8Linear, Int8PatchProjection)))
        assert all(m.act_scale_in > 0 and m.smooth_in is not None for m in q.modules()
                   if isinstance(m, Int8ChannelIdleFFN))

    # Each layer's own relative output error (measured by quantize on the calibration images, the layer's fp32 input
    # given to both): int8 rounding of an operand is uniform noise of rms amax / (254·√3); for these Gaussian-like
    # operands (amax ≈ 3-4 rms) that is ≈ 0.9% of the operand, the two operands in quadrature ≈ 1.3%.  4% leaves room
    # for heavy-tailed inputs (GELU outputs, a per-tensor static scale set by the largest token); a wrong scale, a
    # transposed or mis-packed weight, a lost smooth factor gives errors of order 100%.
    layers = q.vitfast_quantization["layers"]
    assert len(layers) == 1 + n_ffn + n_lin and all(layer["relative_error"] is not None for layer in layers)
    assert max(layer["relative_error"] for layer in layers) < 0.04, layers
    # The model's output: the per-layer errors add through the residual stream (at most ~linearly in their number:
    # 3-6 int8 sub-layers on each path to the logits here), so a few times the worst layer's error; 10% bounds it,
    # while any broken layer alone pushes the logits off by > 30%.
    x = images()
    with torch.no_grad():
        y, yq = model(x), q(x)
    assert ((yq - y).norm() / y.norm()).item() < 0.1

    # describe names the int8 parts and what stays fp32
    text = vitfast.quant.describe(q)
    assert f"int8: the patch embedding, {n_ffn} channel-idle FFNs" in text and lin_phrase in text, text
    assert "head" in text.split("fp32: ")[1]
    if fp32_phrase:
        assert fp32_phrase in text, text
    assert ("static per tensor" if option.startswith("static") else "dynamic per token") in text

    # the file round trip: the same modules, identical outputs
    path = tmp_path / f"{kind}.safetensors"
    vitfast.save(q, path)
    r = vitfast.load(path)
    assert _int8_paths(r) == found
    with torch.no_grad():
        assert torch.equal(r(x), yq)


def test_a_sub_block_no_calibration_image_reaches():
    """A USDC gate that skips a sub-block on every calibration batch: its layers get no statistics.  They become int8
    with per-token scales and no migration (quantize once failed on them with smooth=, and gave them a static scale
    of 0 with activations="static"), the record and describe() say so, and the layer's error is None, not 0."""
    model = gated()
    model.blocks[1].gate.force = ("closed", None)  # attention of block 1 never runs; its FFN does
    q = vitfast.quantize(model, images(16, seed=2), activations="static", smooth=0.5)
    record = q.vitfast_quantization
    assert record["uncalibrated"] == ["blocks.1.attn.proj", "blocks.1.attn.qkv"]
    for name in ("qkv", "proj"):
        layer = getattr(q.blocks[1].attn, name)
        assert type(layer) is Int8Linear and layer.act_scale == 0.0 and layer.smooth is None
    errors = {layer["path"]: layer["relative_error"] for layer in record["layers"]}
    assert errors["blocks.1.attn.qkv"] is None and errors["blocks.1.mlp"] is not None
    assert "2 int8 layers never ran on the calibration images" in vitfast.quant.describe(q)
    assert all(m.act_scale > 0 for n, m in q.named_modules() if type(m) is Int8Linear and not n.startswith("blocks.1."))
    # under an error budget an unmeasured layer cannot be shown to be within it: fp32, like the layers above it
    budget = vitfast.quantize(model, images(16, seed=2), skip=1.0)
    assert type(budget.blocks[1].attn.qkv) is nn.Linear and type(budget.blocks[0].attn.qkv) is Int8Linear
    assert "blocks.1.attn.qkv" in budget.vitfast_quantization["fp32"] and not budget.vitfast_quantization["uncalibrated"]
    # once the gate opens, the uncalibrated layers compute like the others (int8 rounding only)
    model.blocks[1].gate.force = q.blocks[1].gate.force = None
    x = images()
    with torch.no_grad():
        y, yq = model(x), q(x)
    assert ((yq - y).norm() / y.norm()).item() < 0.1


def test_open_gated_int8_block_calls_its_ops_straight(monkeypatch):
    """Both gates open: an int8 gated block runs as vitfast.nn.block.int8_block_forward (as an int8 FusedBlock), with
    the bits of its sub-block modules."""
    import vitfast.nn.block as block_mod

    q = vitfast.quantize(gated())
    x = images(4)
    blocks_path = VisionTransformer.forward  # each block's own path, not the whole model's one call (test_vit_forward)
    with monkeypatch.context() as m:
        m.setattr(block_mod, "int8_block_forward", lambda *args, **kwargs: None)
        with torch.no_grad():
            expected = blocks_path(q, x)
    taken = spy_returned_something(monkeypatch, block_mod, "int8_block_forward")
    with torch.no_grad():
        assert torch.equal(blocks_path(q, x), expected)
    assert taken == [True] * len(q.blocks)


@pytest.mark.parametrize("kept", [(), ("proj_in",), ("proj_out",), ("proj_in", "proj_out")],
                         ids=["both int8", "projection fp32", "output fp32", "both fp32"])
def test_nondeep_attention_gemms_int8_or_kept(kept, tmp_path):
    """A non-deep attention's two GEMMs, each int8 or kept fp32 by skip=: in its projected form while either is int8
    (a kept one an nn.Linear on the fp32 op), the fused op again when both are kept; the output is the fp32 model's
    up to int8 rounding, and the file round trip (the record names attn.proj_in / attn.proj_out) gives the same
    modules and identical outputs."""
    model = nondeep()
    q = vitfast.quantize(model, skip=[f"blocks.*.attn.{name}" for name in kept])
    for block in q.blocks:
        attn = block.attn
        if len(kept) == 2:
            assert type(attn) is FusedXWXAttention
            continue
        assert type(attn) is ProjectedXWXAttention
        for name in ("proj_in", "proj_out"):
            assert type(getattr(attn, name)) is (nn.Linear if name in kept else Int8Linear)
    x = images()
    with torch.no_grad():
        y, yq = model(x), q(x)
        assert ((yq - y).norm() / y.norm()).item() < 0.1
    path = tmp_path / "nondeep.safetensors"
    vitfast.save(q, path)
    r = vitfast.load(path)
    assert [type(b.attn) for b in r.blocks] == [type(b.attn) for b in q.blocks]
    assert _int8_paths(r) == _int8_paths(q)
    with torch.no_grad():
        assert torch.equal(r(x), yq)


def test_projected_nondeep_attention_fp32_equals_the_fused_op():
    """The projected form in fp32 (before any layer is int8) computes the fused op's attention: same columns, same
    GEMM core, same phases (nn/xwx.py ProjectedXWXAttention)."""
    model = nondeep()
    y = torch.randn(2, 17, 32)
    with torch.no_grad():
        for block in model.blocks:
            projected = ProjectedXWXAttention.from_fused(block.attn)
            torch.testing.assert_close(projected(y, residual=y), block.attn(y, residual=y), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", ["int8", "bf16", "fp32"])
def test_nondeep_attention_heads_products(attention, tmp_path):
    """attention="int8" / "bf16" puts a non-deep attention's heads on `xwx_heads_int8` / `xwx_heads_bf16` (its
    int8_attention / bf16_attention flag), "fp32" keeps them fp32; the flag goes through save/load, `describe` says
    where the products run, the output is the fp32 model's up to int8 rounding, and an attention whose projection
    skip= kept fp32 keeps fp32 heads."""
    model = nondeep()
    q = vitfast.quantize(model, attention=attention, skip=["blocks.0.attn.proj_in"])
    attns = [b.attn for b in q.blocks]
    assert all(type(a) is ProjectedXWXAttention for a in attns[1:])
    flag = f"{attention}_attention"
    want = [False] + [attention != "fp32"] * (len(attns) - 1)
    assert [bool(a.__dict__.get(flag)) for a in attns] == want
    assert not any(a.__dict__.get(f) for a in attns for f in ("int8_attention", "bf16_attention") if f != flag)
    calls = []
    op_name = f"xwx_heads_{attention}" if attention != "fp32" else "xwx_heads_int8"
    original = getattr(vitfast.ops, op_name)
    x = images()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(vitfast.ops, op_name, lambda *a: calls.append(1) or original(*a))
        with torch.no_grad():
            y, yq = model(x), VisionTransformer.forward(q, x)  # each block's module path
    assert len(calls) == sum(want)
    assert ((yq - y).norm() / y.norm()).item() < 0.1
    text = vitfast.quant.describe(q)
    heads_fp32 = f"{len(attns) - sum(want)} × XWX attention heads (non-deep: scores, softmax, values)"
    assert heads_fp32 in text
    heads = f"{sum(want)} non-deep XWX attention heads' score/value products"
    assert (f", {heads};" in text) == (attention == "int8")
    assert (f"bf16: {heads} (the " in text) == (attention == "bf16")
    path = tmp_path / "nondeep.safetensors"
    vitfast.save(q, path)
    r = vitfast.load(path)
    assert [bool(b.attn.__dict__.get(flag)) for b in r.blocks] == want
    with torch.no_grad():
        assert torch.equal(r(x), q(x))


def test_nondeep_attention_heads_auto_follows_the_rule(monkeypatch):
    """attention="auto" reads the rule of vitfast/quant/attention_choice.py with the heads' narrower width
    (`products_dim`: min(score width, value width)) for the non-deep attention too."""
    import importlib

    from vitfast.quant import attention_choice

    quantize_module = importlib.import_module("vitfast.quant.quantize")
    model = nondeep()
    dims = set()
    for pays in (False, True):
        monkeypatch.setattr(attention_choice, "int8_attention_pays",
                            lambda tokens, dim, kernel, pays=pays: dims.add(dim) or pays)
        monkeypatch.setattr(quantize_module, "int8_attention_pays", attention_choice.int8_attention_pays)
        q = vitfast.quantize(model)
        assert all(bool(b.attn.__dict__.get("int8_attention")) == pays for b in q.blocks)
    attn = ProjectedXWXAttention.from_fused(model.blocks[0].attn)
    kb = int(attn.has_key_bias)
    score = attn.score_rank + kb if attn.score_form == "factored" else attn.dim + kb
    assert dims == {min(score, attn.value_dim)} == {attention_choice.products_dim(attn)}


@pytest.mark.parametrize("kind", list(KINDS))
def test_bf16_describe_names_what_computes_in_fp32(kind):
    """A bf16 model's description names the kinds whose bf16 computes in fp32 inside their op: the DW-conv heads'
    convolution (2 DW-conv blocks in the dwconv model) and the USDC gates (4)."""
    text = vitfast.quant.describe(vitfast.quantize(KINDS[kind][0](), dtype="bf16"))
    assert text.startswith("bf16 model")
    assert ("2 × DW-conv heads' depthwise convolution in fp32" in text) == (kind == "dwconv")
    assert ("4 × USDC gate in fp32" in text) == (kind == "gated")
