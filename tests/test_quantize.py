"""`vitfast.quantize` (vitfast/quant) and the int8 ops' references (vitfast/reference/_int8.py, linear_int8.py,
channel_idle_ffn_int8.py): the quantizer's definitions, the int8 model's structure, its file round trip, and the
errors.  Kernel parity (the C++ core against the references) is in tests/test_linear_int8.py,
test_channel_idle_ffn_int8.py and test_attention_int8.py."""
from __future__ import annotations

import json
import warnings

import pytest
import timm
import torch
import torch.nn as nn
from helpers import spy_returned_something

import vitfast
from vitfast.nn.int8 import Int8ChannelIdleFFN, Int8Linear, Int8PatchProjection, is_int8_module
from vitfast.reference._int8 import int8_matmul, quantize_rows, quantize_weight


def _fused(norm="batch", depth=2, **kw):
    m = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=32, depth=depth, **kw).eval()
    return vitfast.fuse(vitfast.convert.from_timm(m, channel_idle=0.75, norm=norm)).eval()


# ------------------------------------------------------------------------------------------ definitions
def test_quantize_rows_rounds_half_to_even_and_keeps_127():
    # amax 127 → inv 1: the values themselves are rounded (2.5 → 2, 3.5 → 4, −0.5 → −0)
    x = torch.tensor([[127.0, 2.5, 3.5, -0.5, -127.0, 1.49]])
    q, s = quantize_rows(x)
    assert q.tolist() == [[127, 2, 4, 0, -127, 1]] and s.tolist() == [1.0]
    q, s = quantize_rows(torch.tensor([[-3.0, 1.0]]))
    assert q.tolist() == [[-127, 42]] and q.dtype == torch.int8  # never −128


def test_quantize_rows_zero_and_nonfinite_rows():
    x = torch.tensor([[0.0, 0.0], [1.0, float("nan")], [float("inf"), 1.0], [1.0, 2.0]])
    q, s = quantize_rows(x)
    assert q[:3].abs().sum() == 0 and s[0] == 0 and s[1].isnan() and s[2].isnan() and s[3] == pytest.approx(2 / 127)


def test_static_scale_clamps():
    q, s = quantize_rows(torch.tensor([[1.0, -10.0, 0.25]]), act_scale=0.5)
    assert q.tolist() == [[2, -20, 0]] and s.tolist() == [0.5]
    q, _ = quantize_rows(torch.tensor([[1000.0, -1000.0]]), act_scale=0.5)
    assert q.tolist() == [[127, -127]]


def test_weight_quantization_is_per_output_channel():
    w = torch.tensor([[1.0, -0.5], [0.0, 0.0], [10.0, 5.0]])
    q, s = quantize_weight(w)
    assert q.tolist() == [[127, -64], [0, 0], [127, 64]]
    torch.testing.assert_close(s, torch.tensor([1 / 127, 0.0, 10 / 127]))


def test_int8_matmul_is_exact_integer_arithmetic():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (5, 3000), generator=g, dtype=torch.int8)
    qw = torch.randint(-127, 128, (7, 3000), generator=g, dtype=torch.int8)
    exact = (q.long() @ qw.long().t())  # int64: the true sums
    y = int8_matmul(q, torch.ones(5), qw, torch.ones(7))
    assert torch.equal(y, exact.float())  # one rounding of each exact sum (the kernels' int32 → fp32)


@pytest.mark.parametrize("k", [64, 384, 1536])
def test_linear_int8_error_is_the_quantization_error(k):
    """Gaussian x and W: the per-token / per-channel int8 product's relative error is ~1% (each operand's rounding
    noise is 0.5 quantum = amax/254, amax ≈ 3-4σ); 3% bounds it without hiding a wrong scale (which gives ≥ 30%)."""
    g = torch.Generator().manual_seed(k)
    x, w, b = torch.randn(64, k, generator=g), torch.randn(32, k, generator=g), torch.randn(32, generator=g)
    qw, sw = quantize_weight(w)
    y = vitfast.reference.linear_int8(x, qw, sw, b)
    ref = x @ w.t() + b
    assert ((y - ref).norm() / ref.norm()).item() < 0.03


# ------------------------------------------------------------------------------------------ quantize()
def test_quantize_returns_an_int8_copy():
    model = _fused()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = vitfast.quantize(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the model itself is unchanged
    kinds = [type(m) for m in q.modules()]
    assert kinds.count(Int8ChannelIdleFFN) == 2 and kinds.count(Int8Linear) == 4
    assert isinstance(q.patch_embed.proj, Int8PatchProjection)
    assert isinstance(q.head, nn.Linear) or not any(isinstance(m, Int8Linear) for m in [q.head])
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        y, yq = model(x), q(x)
    # Seven int8 layers of a random-weight model each add a 1-3% relative error (their own errors are measured in
    # test_calibrated_options_and_per_layer_errors), compounding to ~5% at the logits; a wrong scale, a transposed
    # or mis-packed weight gives > 50%.  Accuracy on trained models: docs/quantization.md.
    assert ((yq - y).norm() / y.norm()).item() < 0.1
    text = vitfast.quant.describe(q)
    assert "int8: the patch embedding, 2 channel-idle FFNs" in text and "4 attention linears" in text
    assert "fp32: " in text and "head" in text.split("fp32: ")[1] and "patch" not in text.split("fp32: ")[1]


@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_int8_block_runs_the_int8_ops_not_the_block_op(norm):
    q = vitfast.quantize(_fused(norm), attention="int8")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        q(x)
    counts = {e.key: e.count for e in prof.key_averages()}
    assert counts.get("vitfast::vit_forward", 0) == 1  # the whole model in one call (vitfast.nn.vit)
    assert counts.get("vitfast::vit_block", 0) == 0
    # each block's five int8 ops in one C++ call (csrc/ops/int8_block.h), which records them under the ops' names;
    # qkv and proj of each block, and the patch embedding
    assert counts.get("vitfast::int8_block", 0) == 2
    assert counts.get("vitfast::linear_int8", 0) == 4 + 1 and counts.get("vitfast::channel_idle_ffn_int8", 0) == 2
    assert counts.get("vitfast::attention_int8", 0) == 2 and counts.get("vitfast::attention", 0) == 0


def _spy_int8_block_forward(monkeypatch):
    """Records what each call of vitfast.nn.block.int8_block_forward returned: True where it ran the block."""
    import vitfast.nn.block as block_mod

    return spy_returned_something(monkeypatch, block_mod, "int8_block_forward")


def _blocks_path(model, x):
    """timm's forward over the model's modules, each block taking its own path (not the whole model's one call,
    vitfast.nn.vit)."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer.forward(model, x)


def _module_path(model, x, monkeypatch):
    import vitfast.nn.block as block_mod

    with monkeypatch.context() as m:
        m.setattr(block_mod, "int8_block_forward", lambda *args, **kwargs: None)
        with torch.no_grad():
            return _blocks_path(model, x)


@pytest.mark.parametrize("norm", ["batch", "layer"])
@pytest.mark.parametrize("options", [{}, {"attention": "bf16"}, {"attention": "fp32"}, {"split_identity": False},
                                     {"activations": "static", "smooth": 0.5}], ids=str)
def test_int8_block_calls_the_ops_straight_with_the_module_paths_bits(norm, options, monkeypatch):
    model = _fused(norm)
    calib = torch.randn(8, 3, 32, 32) if options.get("activations") == "static" else None
    q = vitfast.quantize(model, calib, **options)
    x = torch.randn(2, 3, 32, 32)
    expected = _module_path(q, x, monkeypatch)
    taken = _spy_int8_block_forward(monkeypatch)
    with torch.no_grad():
        got = _blocks_path(q, x)
    assert taken == [True, True]
    assert torch.equal(got, expected)
    with torch.no_grad():
        assert torch.equal(q(x), expected)  # the whole model as one call (vitfast.nn.vit): the same bits


def test_int8_block_errors_keep_their_type():
    """The one C++ call of an int8 block raises the ops' own errors (ValueError naming the argument), as the five
    torch.ops calls did."""
    q = vitfast.quantize(_fused())
    with torch.no_grad():
        q.blocks[1].attn.qkv.w_scale[0] = float("nan")
        with pytest.raises(ValueError, match="w_scale: expected finite values, got 1 non-finite"):
            q(torch.randn(2, 3, 32, 32))


def test_int8_block_runs_its_modules_where_they_would_differ(monkeypatch):
    q = vitfast.quantize(_fused())
    x = torch.randn(2, 3, 32, 32)
    expected = _module_path(q, x, monkeypatch)
    taken = _spy_int8_block_forward(monkeypatch)
    seen = []
    # A forward hook on an Int8Linear (the module path calls it as a module) must fire.
    handle = q.blocks[0].attn.qkv.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    with torch.no_grad():
        assert torch.equal(q(x), expected)
    handle.remove()
    assert seen == [torch.Size([2, 5, 576])] and taken == [False, True]
    # Recording gradients, the reference backend: the module path (with gradients nn.block.direct_forward declines
    # before asking int8_block_forward; under the reference backend each block's call declines).
    taken.clear()
    q(x)
    assert taken == []
    vitfast.set_backend("reference")
    try:
        with torch.no_grad():
            q(x)
    finally:
        vitfast.set_backend("auto")
    assert taken == [False] * 2
    # A forward patched on the class runs.
    taken.clear()
    calls = []
    original = Int8ChannelIdleFFN.forward
    monkeypatch.setattr(Int8ChannelIdleFFN, "forward", lambda self, x: calls.append(1) or original(self, x))
    with torch.no_grad():
        assert torch.equal(q(x), expected)
    assert taken == [False, False] and calls == [1, 1]


def test_attention_products_int8_or_fp32(tmp_path):
    fused = _fused()
    q = vitfast.quantize(fused, attention="int8")
    assert all(b.attn.__dict__.get("int8_attention") for b in q.blocks)
    assert "2 attentions' score/value products" in vitfast.quant.describe(q)
    vitfast.save(q, tmp_path / "q.safetensors")
    r = vitfast.load(tmp_path / "q.safetensors")
    assert all(b.attn.__dict__.get("int8_attention") for b in r.blocks)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(q(x), r(x))
    for model in (vitfast.quantize(fused, attention="fp32"),
                  vitfast.quantize(fused, torch.randn(4, 3, 32, 32), activations="static")):  # static: fp32 default
        assert not any(b.attn.__dict__.get("int8_attention") for b in model.blocks)
        assert "attention score/value products" in vitfast.quant.describe(model).split("fp32: ")[1]
    with pytest.raises(ValueError, match="attention: expected 'auto', 'int8', 'bf16' or 'fp32'"):
        vitfast.quantize(fused, attention="int4")


def test_attention_auto_rule():
    from vitfast.quant.attention_choice import int8_attention_pays as pays

    # AMX: DeiT shapes yes, few tokens or narrow heads no (the measured table in attention_choice.py)
    assert pays(197, 64, "amx_int8") and pays(65, 64, "amx_int8") and pays(577, 32, "amx_int8")
    assert not pays(17, 64, "amx_int8") and not pays(197, 32, "amx_int8") and not pays(17, 24, "amx_int8")
    # VNNI: head dim 64 at any token count; narrower heads from 101 / 197 tokens
    assert pays(17, 64, "avx512_vnni") and pays(101, 24, "avx512_vnni") and pays(197, 16, "avx512_vnni")
    assert not pays(65, 24, "avx512_vnni") and not pays(101, 16, "avx512_vnni")
    # AVX-VNNI: head dim 64 from 50 tokens, narrower heads from 65 / 197 tokens, never at 17
    assert pays(50, 64, "avx_vnni") and pays(65, 24, "avx_vnni") and pays(197, 16, "avx_vnni")
    assert not pays(17, 64, "avx_vnni") and not pays(50, 32, "avx_vnni") and not pays(101, 16, "avx_vnni")
    # AVX2: only wide heads over many tokens (DeiT's 197 tokens at head dim 64 and up)
    assert pays(577, 64, "avx2") and pays(197, 64, "avx2") and pays(197, 128, "avx2")
    assert not any(pays(n, d, "avx2") for n in (17, 101) for d in (16, 64, 128)) and not pays(197, 32, "avx2")
    # a kernel without a measurement keeps int8; an unknown token count is taken as 197
    assert pays(5, 8, "neon_dot") and pays(5, 8, "reference")
    assert pays(None, 64, "amx_int8") and not pays(None, 32, "amx_int8") and pays(None, 64, "avx2")
    assert not pays(None, 32, "avx2")


def test_attention_auto_rule_agrees_with_the_recorded_crossover():
    """The rule against its data (benchmarks/attention_variants.py --grid, every recorded table: a rule must hold on
    every machine measured): where it picks int8 products they measured no slower at either batch (0.95: a shared
    host's noise), and where it keeps fp32 no cell measured a clear win (1.15) at both batches."""
    import glob
    import os

    from vitfast.quant.attention_choice import RULES, int8_attention_pays

    root = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results")
    tables = [json.load(open(f))["tables"]["attention_crossover"] for f in sorted(glob.glob(os.path.join(root, "*.json")))
              if "attention_crossover" in json.load(open(f)).get("tables", {})]
    assert tables, "no attention_crossover table recorded"
    worst: dict = {}
    for row in (row for table in tables for row in table["rows"]):
        for key, ratio in row.items():
            if key.startswith("n") and key.endswith("_ratio"):
                cell = (row["kernel"], row["head_dim"], int(key[1:-6]))
                worst[cell] = min(worst.get(cell, ratio), ratio)
    assert set(RULES) <= {k for k, _, _ in worst}
    for (kernel, head_dim, tokens), ratio in worst.items():
        if int8_attention_pays(tokens, head_dim, kernel):
            assert ratio >= 0.95, (kernel, head_dim, tokens, ratio)
        else:
            assert ratio < 1.15, (kernel, head_dim, tokens, ratio)


@pytest.mark.parametrize("kernel", ["amx_int8", "avx512_vnni", "avx_vnni", "avx2"])
def test_attention_auto_follows_the_kernel_and_the_model_shape(kernel, monkeypatch, tmp_path):
    from vitfast.quant.attention_choice import int8_attention_pays, model_tokens

    monkeypatch.setattr(vitfast.ops, "int8_kernel", lambda: kernel)
    # 65 tokens (8 x 8 patches + class token), head dim 64 / 17 tokens, head dim 32
    wide = _fused(depth=1, patch_size=4, embed_dim=128, num_heads=2)
    narrow = _fused(depth=1, patch_size=8, embed_dim=64, num_heads=2)
    assert model_tokens(wide) == 65 and model_tokens(narrow) == 17
    for fused, tokens, head_dim in ((wide, 65, 64), (narrow, 17, 32)):
        q = vitfast.quantize(fused)  # dynamic: attention="auto"
        expected = int8_attention_pays(tokens, head_dim, kernel)
        assert all(bool(b.attn.__dict__.get("int8_attention")) == expected for b in q.blocks)
        text = vitfast.quant.describe(q)
        assert f"{tokens} tokens, head dim {head_dim} on {kernel}" in text
        assert ("put the score/value products on int8" if expected else "kept the score/value products fp32") in text
        vitfast.save(q, tmp_path / "q.safetensors")  # the choice and its reason survive the file
        r = vitfast.load(tmp_path / "q.safetensors")
        assert [bool(b.attn.__dict__.get("int8_attention")) for b in r.blocks] == [expected]
        assert f"on {kernel}" in vitfast.quant.describe(r)
    # the two shapes take both branches except on AVX2, where neither pays
    assert [int8_attention_pays(65, 64, kernel), int8_attention_pays(17, 32, kernel)] == [kernel != "avx2", False]
    # static activations: fp32 products whatever the kernel (no QDQ form for per-token scales)
    s = vitfast.quantize(wide, torch.randn(4, 3, 32, 32), activations="static", attention="auto")
    assert not any(b.attn.__dict__.get("int8_attention") for b in s.blocks)


def test_calibrated_options_and_per_layer_errors():
    model = _fused()
    calib = torch.randn(8, 3, 32, 32)
    q = vitfast.quantize(model, calib, activations="static", smooth=0.5)
    layers = q.vitfast_quantization["layers"]
    assert len(layers) == 7 and all(layer["relative_error"] is not None for layer in layers)
    assert layers[0]["path"] == "patch_embed.proj" and layers[0]["kind"] == "patch"
    assert all(m.act_scale > 0 for m in q.modules() if isinstance(m, (Int8Linear, Int8PatchProjection)))
    assert all(m.smooth is not None for m in q.modules() if isinstance(m, (Int8Linear, Int8PatchProjection)))
    assert "static per tensor" in vitfast.quant.describe(q) and "worst layer" in vitfast.quant.describe(q)
    # an error budget below every layer's error keeps them all in fp32; above all of them, none
    worst = max(layer["relative_error"] for layer in layers)
    none_int8 = vitfast.quantize(model, calib, skip=min(layer["relative_error"] for layer in layers) / 2)
    assert not any(isinstance(m, (Int8Linear, Int8ChannelIdleFFN, Int8PatchProjection)) for m in none_int8.modules())
    all_int8 = vitfast.quantize(model, calib, skip=worst * 2)
    assert sum(isinstance(m, (Int8Linear, Int8ChannelIdleFFN, Int8PatchProjection)) for m in all_int8.modules()) == 7


def test_skip_patterns_keep_layers_fp32():
    q = vitfast.quantize(_fused(), skip=["blocks.1.*"])
    assert type(q.blocks[1].mlp).__name__ == "FusedChannelIdleFFN" and isinstance(q.blocks[1].attn.qkv, nn.Linear)
    assert isinstance(q.blocks[0].mlp, Int8ChannelIdleFFN)
    assert "3 skipped layers" in vitfast.quant.describe(q)


def test_bf16_copy():
    model = _fused()
    q = vitfast.quantize(model, dtype="bf16")
    assert next(q.parameters()).dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.float32
    assert vitfast.quant.describe(q).startswith("bf16")


@pytest.mark.parametrize("kwargs, message", [
    (dict(dtype="int4"), "dtype: expected one of ('int8', 'bf16'), got 'int4'"),
    (dict(activations="weird"), "activations: expected one of"),
    (dict(activations="static"), "calibration: activations='static' needs calibration images"),
    (dict(smooth=0.5), "calibration: smooth needs calibration images"),
    (dict(smooth=1.5), "smooth: expected None, True, 'auto' or a migration strength α in (0, 1), got 1.5"),
    (dict(smooth="half"), "smooth: expected None, True, 'auto' or a migration strength α in (0, 1), got 'half'"),
    (dict(smooth="auto"), "calibration: smooth needs calibration images"),
    (dict(per_token=False), "per_token: expected True with activations='dynamic'"),
    (dict(skip=0.0), "skip: expected an error budget > 0"),
    (dict(skip=[3]), "skip: expected module paths or patterns (str), got 3"),
    (dict(weight_bits=4), "weight_bits: expected 8 or 7 (codes in [-127, 127] or [-64, 64]), got 4"),
    (dict(weight_bits=True), "weight_bits: expected 8 or 7"),
    (dict(weight_bits=7, dtype="bf16"), "weight_bits: 7-bit weights are an int8 option, got weight_bits=7 with "
                                        "dtype='bf16'"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError) as e:
        vitfast.quantize(_fused(), **kwargs)
    assert message in str(e.value)


def test_not_a_fused_model():
    with pytest.raises(ValueError, match="expected a fused model"):
        vitfast.quantize(nn.Sequential(nn.Linear(4, 4)))
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module"):
        vitfast.quantize("model.safetensors")
    with pytest.raises(ValueError, match=r"calibration: expected images \[B, C, H, W\]"):
        vitfast.quantize(_fused(), torch.randn(3, 32, 32), smooth=True)


# ------------------------------------------------------------------------------------------ files
@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_save_load_round_trip(tmp_path, norm):
    q = vitfast.quantize(_fused(norm), torch.randn(4, 3, 32, 32), activations="static", smooth=True)
    path = tmp_path / "q.safetensors"
    vitfast.save(q, path)
    config = vitfast.io.read_config(path)
    assert config["quantization"]["dtype"] == "int8" and config["quantization"]["activations"] == "static"
    r = vitfast.load(path)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(q(x), r(x))
    assert [type(m) for m in r.modules()] == [type(m) for m in q.modules()]
    assert r.blocks[0].mlp.qw_in.dtype == torch.int8


def test_7bit_weights(tmp_path):
    """weight_bits=7: every weight code in [−64, 64] (each channel's largest at ±64), said in the description, kept
    by save/load (the codes are the record), and a larger but still small error than 8-bit weights."""
    model = _fused()
    q8, q7 = vitfast.quantize(model), vitfast.quantize(model, weight_bits=7)
    codes = [t for m in q7.modules() if is_int8_module(m) for t in m.buffers() if t.dtype == torch.int8]
    assert codes and all(int(t.abs().max()) == 64 for t in codes)
    assert (q7.vitfast_quantization["weight_bits"], q8.vitfast_quantization["weight_bits"]) == (7, 8)
    assert "7-bit weights" in vitfast.quant.describe(q7) and "7-bit" not in vitfast.quant.describe(q8)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        y, y8, y7 = model(x), q8(x), q7(x)
    e8, e7 = ((y8 - y).norm() / y.norm()).item(), ((y7 - y).norm() / y.norm()).item()
    assert e8 < e7 < 0.1
    path = tmp_path / "q7.safetensors"
    vitfast.save(q7, path)
    r = vitfast.load(path)
    with torch.no_grad():
        assert torch.equal(r(x), y7)
    assert "7-bit weights" in vitfast.quant.describe(r)


def _rewrite_config(src, dst, edit):
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(src), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    config = json.loads(meta["config"])
    edit(config)
    meta["config"] = json.dumps(config)
    meta.pop("checksum", None)
    save_file(tensors, str(dst), metadata=meta)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["quantization"].update(dtype="int4"), "expected an object with 'dtype': 'int8'"),
    (lambda c: c["quantization"]["modules"].update({"blocks.9.mlp": c["quantization"]["modules"]["blocks.0.mlp"]}),
     "no module 'blocks.9.mlp'"),
    (lambda c: c["quantization"]["modules"]["patch_embed.proj"].update(out_channels=7), "expected to replace a patch"),
    (lambda c: c["quantization"]["modules"]["patch_embed.proj"].update(patch_size=[4, 4]),
     "expected to replace a patch"),
    (lambda c: c["quantization"]["modules"]["blocks.0.attn.qkv"].update(in_features=2**40), "expected an int of magnitude <= "),
    (lambda c: c["quantization"]["modules"]["blocks.0.attn.qkv"].update(kind="int8_conv"),
     "expected one of 'int8_linear', 'int8_channel_idle_ffn', 'int8_patch_projection'"),
    (lambda c: c["quantization"]["modules"]["blocks.0.attn.qkv"].update(out_features=7), "expected to replace"),
])
def test_bad_quantization_records_are_refused(tmp_path, edit, message):
    q = vitfast.quantize(_fused())
    vitfast.save(q, tmp_path / "q.safetensors")
    _rewrite_config(tmp_path / "q.safetensors", tmp_path / "bad.safetensors", edit)
    with warnings.catch_warnings(), pytest.raises(ValueError) as e:
        warnings.simplefilter("ignore")  # the rewritten file has no checksum record: a warning, not the point here
        vitfast.load(tmp_path / "bad.safetensors")
    assert message in str(e.value) and "bad.safetensors" in str(e.value)


# ------------------------------------------------------------------------------------------ patch embedding
def _patch_conv(seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    conv = nn.Conv2d(3, 24, kernel_size=4, stride=4, bias=bias)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=g) * 0.1)
        if bias:
            conv.bias.copy_(torch.randn(24, generator=g))
    return conv


@pytest.mark.parametrize("bias", [True, False])
def test_int8_patch_projection_is_linear_int8_over_the_patch_rows(bias):
    """y[b, :, i, j] = W · patch(b, i, j) + bias with the patch in the weight's (channel, row, column) order: the op on
    the patch rows, as the conv's [B, C_out, H/p, W/q]; within the int8 error of the fp32 conv."""
    from vitfast.nn.patch_embed import patch_rows

    conv = _patch_conv(bias=bias)
    m = Int8PatchProjection.from_conv(conv)
    x = torch.randn(2, 3, 16, 12)
    with torch.no_grad():
        y, ref_conv = m(x), conv(x)
        rows, grid = patch_rows(x, (4, 4))
        ref = vitfast.reference.linear_int8(rows, m.qweight, m.w_scale, m.bias)
    assert y.shape == ref_conv.shape == (2, 24, 4, 3) and grid == (4, 3)
    torch.testing.assert_close(y, ref.transpose(1, 2).reshape(2, 24, 4, 3), rtol=1e-5, atol=1e-5)
    # per-token patches × per-channel weights: ~1% (test_linear_int8_error_is_the_quantization_error); a transposed
    # patch (row, column, channel order) or a lost bias gives ~100%
    assert ((y - ref_conv).norm() / ref_conv.norm()).item() < 0.03
    assert ((m.dequantized_weight() - conv.weight).norm() / conv.weight.norm()).item() < 0.01


def test_int8_patch_projection_drops_partial_patches_and_reads_any_layout():
    conv = _patch_conv()
    m = Int8PatchProjection.from_conv(conv)
    x = torch.randn(2, 3, 18, 15)  # 2 and 3 pixels past the last whole patch: the strided conv drops them
    with torch.no_grad():
        y = m(x)
        assert y.shape == conv(x).shape == (2, 24, 4, 3)
        assert torch.equal(y, m(x[:, :, :16, :12].contiguous()))
        assert torch.equal(y, m(x.contiguous(memory_format=torch.channels_last)))
        # the token-major result: timm's flatten(2).transpose(1, 2) is contiguous without a copy
        assert y.flatten(2).transpose(1, 2).is_contiguous()
    with pytest.raises(ValueError, match=r"x: expected images \[B, 3, H, W\], got shape \[2, 4, 16, 16\]"):
        m(torch.randn(2, 4, 16, 16))
    with pytest.raises(ValueError, match="conv: expected a patch projection"):
        Int8PatchProjection.from_conv(nn.Conv2d(3, 8, kernel_size=3, stride=1))


def test_patch_embedding_can_stay_fp32():
    q = vitfast.quantize(_fused(), skip=["patch_embed.proj"])
    assert type(q.patch_embed.proj).__name__ == "GemmPatchProjection"
    text = vitfast.quant.describe(q)
    assert text.startswith("int8: 2 channel-idle FFNs") and "patch embedding" in text.split("fp32: ")[1]
    assert q.vitfast_quantization["fp32"] == ["patch_embed.proj"]


# ------------------------------------------------------------------------------------------ split_identity
def test_split_identity_takes_the_folded_shortcut_off_the_int8_rows(tmp_path):
    """A BatchNorm-variant FFN holds its block's shortcut in the linear path (W_lin = I + W'): the int8 rows get W'
    only, the shortcut is added exactly (the op's residual).  Same function in exact arithmetic (the dequantized
    weight + I is W_lin to the int8 rounding of W', not of I + W'), a smaller error, and the flag survives the file."""
    model = _fused("batch")
    ffn = model.blocks[0].mlp
    assert Int8ChannelIdleFFN.folded_shortcut(ffn) and not Int8ChannelIdleFFN.folded_shortcut(_fused("layer").blocks[0].mlp)
    a = ffn.active_features
    split = Int8ChannelIdleFFN.from_ffn(ffn, split_identity=True)
    whole = Int8ChannelIdleFFN.from_ffn(ffn, split_identity=False)
    w_lin = ffn.w_in[a:].detach().double()
    deq = lambda m: m.qw_in[a:].double() * m.s_in[a:].double().unsqueeze(1)  # noqa: E731
    eye = torch.eye(w_lin.shape[0], dtype=torch.float64)
    # each row's rounding is at most half a quantum, the quantum set by the row's largest |entry|: with I split off
    # that is W''s own amax, not ≈ 1 + W'_jj
    assert ((deq(split) + eye - w_lin).abs() <= (split.s_in[a:].double() / 2 + 1e-12).unsqueeze(1)).all()
    assert (split.s_in[a:] < whole.s_in[a:]).all()
    x = torch.randn(2, 17, ffn.features)
    with torch.no_grad():
        y = ffn(x)
        err = {k: float((m(x) - y).norm() / y.norm()) for k, m in (("split", split), ("whole", whole))}
    assert err["split"] < err["whole"]
    q = vitfast.quantize(model)
    assert all(m.split_identity for m in q.modules() if isinstance(m, Int8ChannelIdleFFN))
    assert not any(m.split_identity for m in vitfast.quantize(model, split_identity=False).modules()
                   if isinstance(m, Int8ChannelIdleFFN))
    assert not any(m.split_identity for m in vitfast.quantize(_fused("layer")).modules()
                   if isinstance(m, Int8ChannelIdleFFN))  # its shortcut is explicit already
    with pytest.raises(ValueError, match="split_identity: expected an FFN whose shortcut is folded"):
        Int8ChannelIdleFFN.from_ffn(_fused("layer").blocks[0].mlp, split_identity=True)
    vitfast.save(q, tmp_path / "q.safetensors")
    r = vitfast.load(tmp_path / "q.safetensors")
    assert r.blocks[0].mlp.split_identity
    xi = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(r(xi), q(xi))


def test_int8_ffn_records_without_split_identity_still_load():
    """Files written before split_identity existed have no such key: they load as split_identity=False."""
    cfg = Int8ChannelIdleFFN.from_ffn(_fused("batch").blocks[0].mlp).quant_config()
    del cfg["split_identity"]
    assert Int8ChannelIdleFFN.from_quant_config(cfg).split_identity is False


def test_smooth_auto_picks_each_layers_best_alpha():
    """smooth="auto": each layer gets the α of AUTO_ALPHAS (None = no migration) with the smallest own error on the
    calibration images; the layers' errors are measured on fp32 inputs, so each equals that of a fixed-α run."""
    from vitfast.quant.quantize import AUTO_ALPHAS

    model, calib = _fused(), torch.randn(8, 3, 32, 32)
    q = vitfast.quantize(model, calib, smooth="auto", activations="static")
    layers = {layer["path"]: layer for layer in q.vitfast_quantization["layers"]}
    fixed = {a: {layer["path"]: layer["relative_error"] for layer in vitfast.quantize(
        model, calib, smooth=a, activations="static").vitfast_quantization["layers"]} for a in AUTO_ALPHAS}
    for path, layer in layers.items():
        assert layer["alpha"] in AUTO_ALPHAS
        assert layer["relative_error"] == min(fixed[a][path] for a in AUTO_ALPHAS)
        assert layer["relative_error"] == fixed[layer["alpha"]][path]
        module = q.get_submodule(path)
        has_smooth = (module.smooth_in if isinstance(module, Int8ChannelIdleFFN) else module.smooth) is not None
        assert has_smooth == (layer["alpha"] is not None)
    assert "SmoothQuant α per layer (" in vitfast.quant.describe(q)


def test_smooth_auto_progress_names_each_pass(capsys):
    # One calibration pass per α: each progress line says which (five identical lines told the user nothing).
    from vitfast.quant.quantize import AUTO_ALPHAS

    vitfast.quantize(_fused(), torch.randn(4, 3, 32, 32), smooth="auto", progress=True)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "vitfast.quantize: calibration statistics: 4 images"
    assert err[1:] == [f"vitfast.quantize: per-layer int8 error, "
                       f"{'no SmoothQuant migration' if a is None else f'SmoothQuant α {a}'}: 4 images"
                       for a in AUTO_ALPHAS]
