"""`FusedVisionTransformer`'s one-call forward (vitfast.nn.vit, csrc/ops/vit_forward.h): the same bits as timm's
forward over the fused modules, for each structure it takes; the module path wherever the call must not run."""
import copy
import io
import pickle

import pytest
import torch
import torch.nn as nn
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast import ops
from vitfast.convert import from_timm
from vitfast.nn import FusedBlock, FusedVisionTransformer

from helpers import randomize

pytestmark = pytest.mark.skipif(not ops.extension_loaded(), reason="the C++ extension is not built")


def _fused(theta=0.75, norm="batch", seed=0, **kw) -> nn.Module:
    cfg = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=7, qkv_bias=True)
    cfg.update(kw)
    torch.manual_seed(seed)
    model = randomize(VisionTransformer(**cfg), seed=seed)
    return vitfast.fuse(from_timm(model, channel_idle=theta, norm=norm) if theta is not None else model)


def _images(batch=3, seed=1, size=32):
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


class _CountCalls:
    """Stands in for vitfast.ops._C, counting `_vit_forward` calls (everything else is the extension's)."""

    def __init__(self, real):
        self._real, self.calls, self.taken = real, 0, 0

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _vit_forward(self, plan, x):
        self.calls += 1
        out = self._real._vit_forward(plan, x)
        self.taken += out is not None  # (None: the C++ side refused, the module path ran)
        return out


@pytest.fixture
def counted(monkeypatch):
    spy = _CountCalls(ops._C)
    monkeypatch.setattr(ops, "_C", spy)
    return spy


def _module_path(model, x):
    return VisionTransformer.forward(model, x)


def _one_call(model, x, counted):
    """model(x), asserted to be one `_vit_forward` call with exactly the module path's bits."""
    with torch.no_grad():
        got = model(x)
        assert counted.calls == 1, "the one-call forward was not taken"
        want = _module_path(model, x)
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    return got


STRUCTURES = {
    "cls token, BN channel-idle FFNs": dict(),
    "LN channel-idle FFNs (explicit shortcut)": dict(norm="layer"),
    "vanilla FFNs (θ = 0)": dict(theta=0.0),
    "avg pool + fc_norm, no cls token": dict(class_token=False, global_pool="avg"),
    "reg tokens, no_embed_class": dict(reg_tokens=2, no_embed_class=True),
    "norm_pre, no qkv bias": dict(pre_norm=True, qkv_bias=False),
    "no head": dict(num_classes=0),
    "no pooling": dict(global_pool=""),
}


@pytest.mark.parametrize("name", list(STRUCTURES))
@pytest.mark.parametrize("batch", [1, 3])
def test_one_call_has_the_module_paths_bits(name, batch, counted):
    model = _fused(**STRUCTURES[name])
    assert type(model) is FusedVisionTransformer
    _one_call(model, _images(batch), counted)


METHOD_MODELS = {
    "non-deep (XWX blocks)": dict(branches=2),
    "non-deep, factored scores, avg pool": dict(branches=2, score_form="factored", global_pool="avg"),
    "DW-conv blocks": dict(dwconv_blocks=[1]),
    "DW-conv heads beside attention heads": dict(dwconv_heads={0: [0, 2]}),
}


def _method_models(name):
    """(train-time, fused) models of METHOD_MODELS[name]."""
    options = dict(METHOD_MODELS[name])
    score_form = options.pop("score_form", None)
    cfg = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, num_classes=7, qkv_bias=True)
    if "global_pool" in options:
        cfg.update(global_pool=options.pop("global_pool"), class_token=False)
    torch.manual_seed(0)
    train = from_timm(randomize(VisionTransformer(**cfg)), **options).eval()
    for block in train.blocks:
        if hasattr(block, "set_lambda"):
            block.set_lambda(1.0)  # joining finished: the non-deep blocks collapse exactly
    return train, vitfast.fuse(train, **({"score_form": score_form} if score_form else {}))


@pytest.mark.parametrize("name", list(METHOD_MODELS))
def test_method_blocks_one_call_has_the_module_paths_bits(name, counted):
    train, model = _method_models(name)
    x = _images(3)
    got = _one_call(model, x, counted)
    with torch.no_grad():
        torch.testing.assert_close(got, train(x), rtol=1e-4, atol=1e-4)  # and still the train-time model


def test_one_call_has_the_module_paths_bits_on_two_threads(counted):
    model = _fused(depth=3)
    x = _images(4)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with torch.inference_mode():
            got, want = model(x), _module_path(model, x)
    finally:
        torch.set_num_threads(previous)
    assert counted.calls == 1 and torch.equal(got, want)


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize("name", list(METHOD_MODELS))
def test_method_blocks_on_two_threads_have_the_module_paths_bits(name, int8, counted):
    """Small blocks run on the calling thread in the call (the serial rule, vit_forward.cpp), the module path's ops on
    two threads: the split never changes a row's arithmetic."""
    _, model = _method_models(name)
    if int8:
        model = vitfast.quantize(model)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for batch in (1, 8):
            counted.calls = 0
            _one_call(model, _images(batch), counted)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("policy, scale", [({}, 1), ({"OMP_WAIT_POLICY": "PASSIVE"}, 8),
                                           ({"OMP_WAIT_POLICY": "passive"}, 8), ({"OMP_WAIT_POLICY": "ACTIVE"}, 1),
                                           ({"GOMP_SPINCOUNT": "0"}, 8), ({"GOMP_SPINCOUNT": "10000"}, 1)])
def test_passive_wait_policy_raises_the_serial_threshold(policy, scale):
    """Where idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE, GOMP_SPINCOUNT=0) each parallel region pays a thread
    wake-up: small blocks stay serial longer."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(policy)
    out = subprocess.run([sys.executable, "-c", "import vitfast; print(vitfast.ops._C._parallel_block_macs_scale())"],
                         env=env, capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert int(out[-1]) == scale


def test_int8_model_one_call_has_the_module_paths_bits(counted):
    model = _fused()
    calibration = [_images(4, seed=s) for s in range(2)]
    q = vitfast.quantize(model, calibration)
    assert type(q) is FusedVisionTransformer
    x = _images(2, seed=5)
    with torch.no_grad():
        got = q(x)
        assert counted.calls == 1
        want = _module_path(q, x)
    assert torch.equal(got, want)


INT8_OPTIONS = {
    "dynamic": dict(),
    "static + smooth": dict(activations="static", smooth=0.5),
    "FFNs kept fp32": dict(skip=["blocks.*.mlp"]),
    # one of the attention's GEMMs int8, the other fp32: the non-deep projection / output, the DW-conv value / output
    # (and with both of those fp32 the DW-conv block's fused op between int8 attention-head linears)
    "attention input GEMM kept fp32": dict(skip=["blocks.*.attn.proj_in", "blocks.*.value"]),
    "attention output GEMM kept fp32": dict(skip=["blocks.*.attn.proj_out", "blocks.*.out_proj"]),
    "DW-conv value and output kept fp32": dict(skip=["blocks.*.value", "blocks.*.out_proj"]),
    # the score/value products on int8: the non-deep heads as xwx_heads_int8, the DW-conv block's attention heads
    "int8 products": dict(attention="int8"),
    "bf16 products": dict(attention="bf16"),
}


@pytest.mark.parametrize("options", list(INT8_OPTIONS))
@pytest.mark.parametrize("name", list(METHOD_MODELS))
def test_int8_method_blocks_one_call_has_the_module_paths_bits(name, options, counted):
    """The int8 FFNs and attention GEMMs of non-deep and DW-conv models run in the call too (the non-deep attention
    as proj_in → xwx_heads → proj_out, the DW-conv heads as value → dwconv_heads → out_proj), with any of them kept
    fp32."""
    _, model = _method_models(name)
    q = vitfast.quantize(model, [_images(4, seed=s) for s in range(2)], **INT8_OPTIONS[options])
    _one_call(q, _images(3, seed=5), counted)


def _gated_model(patterns):
    """A fused USDC model with one block per gate pattern (attn, ffn): 1 open, 0 closed, whatever the input."""
    torch.manual_seed(0)
    model = vitfast.fuse(from_timm(randomize(VisionTransformer(img_size=32, patch_size=8, embed_dim=48,
                                                               depth=len(patterns), num_heads=3, num_classes=7)),
                                   gates=True, gate_search=False).eval())
    with torch.no_grad():
        for block, (attn, ffn) in zip(model.blocks, patterns):
            gate = block.gate
            gate.w2.zero_()  # d = b2: the decision is the pattern whatever the input
            gate.b2.copy_(torch.tensor([10.0 if attn else -10.0, 10.0 if ffn else -10.0]))
    return model


@pytest.mark.parametrize("options", [dict(), dict(skip=["blocks.*.mlp"]), dict(skip=["blocks.*.attn.*"]),
                                     dict(attention="int8"), dict(attention="bf16")],
                         ids=["int8", "FFNs fp32", "attention fp32", "int8 products", "bf16 products"])
def test_int8_gated_blocks_one_call_has_the_module_paths_bits(options, counted):
    """Each gate pattern of an int8 USDC model: both open as one int8_block call, one open, none; and with one
    kind of sub-block kept fp32 (the open pair then runs as two sub-blocks)."""
    if options.get("attention") == "bf16" and ops._C.bf16_kernel() == "none":
        pytest.skip("no bf16 CPU extension: attention_bf16 computes in fp32")
    q = vitfast.quantize(_gated_model([(1, 1), (1, 0), (0, 1), (0, 0)]), [_images(4, seed=s) for s in range(2)],
                         **options)
    _one_call(q, _images(3), counted)


def _assert_flags_set_after_a_forward_are_followed(q, counted):
    """Every block's attention gets int8_attention = True after the plan was made: the call takes the int8 products
    as the module path does (and without the flag again, the fp32 ones)."""
    x = _images(2)
    with torch.no_grad():
        q(x)
        for block in q.blocks:
            block.attn.int8_attention = True
        got = q(x)
        assert counted.calls == 2
        want = _module_path(q, x)
        for block in q.blocks:
            del block.attn.int8_attention
        assert not torch.equal(q(x), got), "the int8 products were not taken"
    assert torch.equal(got, want)


def test_int8_attention_flags_set_after_a_forward_are_followed(counted):
    _assert_flags_set_after_a_forward_are_followed(vitfast.quantize(_fused(), attention="fp32"), counted)


def test_nondeep_int8_heads_flag_set_after_a_forward_is_followed(counted):
    """A projected non-deep attention's flag (xwx_heads_int8)."""
    _, model = _method_models("non-deep, factored scores, avg pool")
    _assert_flags_set_after_a_forward_are_followed(vitfast.quantize(model, attention="fp32"), counted)


BF16_STRUCTURES = ["cls token, BN channel-idle FFNs", "avg pool + fc_norm, no cls token", "reg tokens, no_embed_class",
                   "norm_pre, no qkv bias", "no head"]


@pytest.mark.skipif(not ops.extension_loaded() or ops.bf16_kernel() == "none",
                    reason="no CPU bf16 extension: a bf16 model's blocks take the module path")
@pytest.mark.parametrize("name", BF16_STRUCTURES)
def test_bf16_model_one_call_has_the_module_paths_bits(name, counted):
    """A bf16 model of FusedBlocks (vitfast.quantize(dtype="bf16"), or .to(torch.bfloat16)) on bf16 images."""
    model = vitfast.quantize(_fused(**STRUCTURES[name]), dtype="bf16")
    x = _images(3).to(torch.bfloat16)
    assert _one_call(model, x, counted).dtype == torch.bfloat16
    # fp32 images: timm's forward, whatever it does with them (the call takes the model's dtype only)
    calls = counted.calls
    with torch.no_grad():
        try:
            model(x.float())
        except RuntimeError:
            pass
    assert counted.calls == calls


@pytest.mark.skipif(not ops.extension_loaded() or ops.bf16_kernel() == "none",
                    reason="no CPU bf16 extension: a bf16 model's blocks take the module path")
@pytest.mark.parametrize("name", list(METHOD_MODELS))
def test_bf16_method_models_one_call_has_the_module_paths_bits(name, counted):
    """bf16 non-deep and DW-conv models run in the call (layer_norm → the bf16 xwx_attention / dwconv_attention, with
    the DW-conv block's attention heads → the FFN: the module path's ops) with its bits."""
    _, model = _method_models(name)
    _one_call(vitfast.quantize(model, dtype="bf16"), _images(3).to(torch.bfloat16), counted)


def test_bf16_model_on_a_path_without_bf16_gemms_takes_the_module_path(counted):
    """A bf16 plan made on a bf16 path is not used after a switch to a path without bf16 GEMMs (the module path then
    runs each block as its six ops, computed in fp32)."""
    if ops.bf16_kernel() == "none" or "avx2" not in ops._C.supported_cpu_isas():
        pytest.skip("needs a bf16 GEMM path and the avx2 path to switch to")
    model = vitfast.quantize(_fused(), dtype="bf16")
    x = _images(2).to(torch.bfloat16)
    with torch.no_grad():
        model(x)
    assert counted.calls == 1
    assert counted.taken == 1
    previous = ops._C.set_cpu_isa("avx2")
    try:
        assert ops.bf16_kernel() == "none"
        with torch.no_grad():
            out, want = model(x), _module_path(model, x)
    finally:
        ops._C.set_cpu_isa(previous)
    assert counted.taken == 1 and torch.equal(out, want)


@pytest.mark.skipif(not ops.extension_loaded() or ops.bf16_kernel() == "none",
                    reason="no CPU bf16 extension: a bf16 model's blocks take the module path")
@pytest.mark.parametrize("convert", ["quantize", "to"])
def test_bf16_gated_model_one_call_has_the_module_paths_bits(convert, counted):
    """A bf16 USDC model, every gate pattern (both open as one bf16 vit_block, one open, none; the gate's op computes
    bf16 in fp32), from vitfast.quantize(dtype="bf16") or .to(torch.bfloat16)."""
    model = _gated_model([(1, 1), (1, 0), (0, 1), (0, 0)])
    model = vitfast.quantize(model, dtype="bf16") if convert == "quantize" else model.to(torch.bfloat16)
    _one_call(model, _images(3).to(torch.bfloat16), counted)


def test_train_time_accuracy_kept():
    """The fused model through the one call still equals the train-time model (fp32, eval)."""
    torch.manual_seed(0)
    train = from_timm(randomize(VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3,
                                                  num_classes=7)), channel_idle=0.5, norm="layer").eval()
    fused = vitfast.fuse(train)
    x = _images(2)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), train(x), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------- where the modules run
def _runs_module_path(model, x, counted, grad=False):
    before = counted.calls
    with torch.set_grad_enabled(grad):
        out = model(x)
    return counted.calls == before, out


def test_gradients_train_mode_and_other_inputs_take_the_module_path(counted):
    model = _fused()
    x = _images(2)
    assert _runs_module_path(model, x, counted, grad=True)[0]
    model.train()
    assert _runs_module_path(model, x, counted)[0]
    model.eval()
    assert _runs_module_path(model, x.contiguous(memory_format=torch.channels_last), counted)[0]
    with pytest.raises(Exception, match="Input height"):  # timm's own error for another image size
        with torch.no_grad():
            model(_images(1, size=40))
    assert not _runs_module_path(model, x, counted)[0]  # and the call again for the model's size


def test_channels_last_images_give_the_same_result(counted):
    model = _fused()
    x = _images(2)
    with torch.no_grad():
        want = model(x)
        got = model(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_hooks_and_patched_forwards_run(counted, monkeypatch):
    model = _fused()
    x = _images(2)
    seen = []
    handle = model.blocks[1].register_forward_hook(lambda m, i, o: seen.append(o.shape))
    try:
        module_path, _ = _runs_module_path(model, x, counted)
        assert module_path and seen == [torch.Size([2, 17, 48])]
    finally:
        handle.remove()
    assert not _runs_module_path(model, x, counted)[0]
    handle = nn.modules.module.register_module_forward_pre_hook(lambda m, i: None)
    try:
        assert _runs_module_path(model, x, counted)[0]
    finally:
        handle.remove()
    with monkeypatch.context() as patch:
        patch.setattr(FusedBlock, "forward", lambda self, x, **kw: x)  # a class-level patch is obeyed
        module_path, out = _runs_module_path(model, x, counted)
        assert module_path and torch.equal(out, _module_path(model, x))
    assert not _runs_module_path(model, x, counted)[0]


@pytest.mark.filterwarnings("ignore")  # torch.jit.trace: deprecation and tracer warnings
def test_a_class_patched_before_the_first_call_is_obeyed(counted, monkeypatch):
    model = _fused()
    x = _images(2)
    monkeypatch.setattr(FusedBlock, "forward", lambda self, x, **kw: x + 1)
    module_path, out = _runs_module_path(model, x, counted)
    assert module_path
    with torch.no_grad():
        assert torch.equal(out, _module_path(model, x))


def test_reference_backend_and_tracing_take_the_module_path(counted):
    model = _fused()
    x = _images(2)
    previous = vitfast.get_backend()
    vitfast.set_backend("reference")
    try:
        assert _runs_module_path(model, x, counted)[0]
    finally:
        vitfast.set_backend(previous)
    with torch.no_grad():
        traced = torch.jit.trace(model, x, check_trace=False)
    before = counted.calls
    with torch.no_grad():
        torch.testing.assert_close(traced(x), model(x), rtol=1e-4, atol=1e-4)
    assert counted.calls == before + 1  # only the eager call


def test_changes_to_the_model_are_seen(counted):
    model = _fused(norm="layer", depth=3)
    x = _images(2)

    def check():
        with torch.no_grad():
            got = model(x)
            want = _module_path(model, x)
        assert torch.equal(got, want)
        return got

    first = check()
    with torch.no_grad():
        model.head.weight.mul_(2.0)  # in place: the same tensors, repacked by version
    assert not torch.equal(check(), first)
    model.head.bias = nn.Parameter(torch.ones_like(model.head.bias))  # replaced: planned again
    check()
    model.norm.eps = 0.5  # a plain attribute copied into the plan
    check()
    model.blocks[0].mlp.norm.eps = 0.25
    check()
    model.blocks[1].attn.num_heads = 1
    model.blocks[1].attn.head_dim = 48
    check()
    del model.blocks[2]  # the container changed without an assignment
    check()
    model.blocks[0] = copy.deepcopy(model.blocks[1])
    check()
    model.global_pool = "avg"
    check()
    assert counted.calls >= 9


def test_save_load_deepcopy_and_pickle(tmp_path, counted):
    model = _fused()
    x = _images(2)
    with torch.no_grad():
        want = model(x)
    path = tmp_path / "m.safetensors"
    vitfast.save(model, path)
    loaded = vitfast.load(path)
    assert type(loaded) is FusedVisionTransformer
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for other in (loaded, copy.deepcopy(model), pickle.loads(pickle.dumps(model)),
                  torch.load(buffer, weights_only=False)):
        with torch.no_grad():
            assert torch.equal(other(x), want)
    assert counted.calls == 5


@pytest.mark.parametrize("kind", ["int8 non-deep", "int8 DW-conv", "bf16"])
def test_saved_low_precision_models_load_into_the_one_call(kind, tmp_path, counted):
    if kind == "bf16":
        if ops.bf16_kernel() == "none":
            pytest.skip("no CPU bf16 extension: a bf16 model takes the module path")
        model, x = vitfast.quantize(_fused(), dtype="bf16"), _images(2).to(torch.bfloat16)
    else:
        _, fused = _method_models("non-deep (XWX blocks)" if kind == "int8 non-deep" else "DW-conv blocks")
        model, x = vitfast.quantize(fused), _images(2)
    vitfast.save(model, tmp_path / "m.safetensors")
    loaded = vitfast.load(tmp_path / "m.safetensors")
    with torch.no_grad():
        want, got = model(x), loaded(x)
        assert counted.taken == 2, "the one-call forward was not taken"
        assert torch.equal(got, want) and torch.equal(got, _module_path(loaded, x))


def test_only_timms_own_class_is_given_the_forward():
    class MyViT(VisionTransformer):
        pass

    model = _fused()
    assert vitfast.nn.use_fused_vit_forward(model) is False  # already
    mine = MyViT(img_size=32, patch_size=8, embed_dim=48, depth=1, num_heads=3)
    assert vitfast.nn.use_fused_vit_forward(mine) is False and type(mine) is MyViT


def test_dwconv_model_of_fixed_size_has_no_grid_hook(counted):
    """vitfast's DW-conv grid hook (nn.dwconv.follow_patch_grid) is for dynamic_img_size models only: a fixed-size
    model's patch embedding carries none, so the call is taken; a user's hook there is obeyed."""
    from vitfast.nn.dwconv import follow_patch_grid

    torch.manual_seed(0)
    model = vitfast.fuse(from_timm(randomize(VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2,
                                                               num_heads=3, num_classes=7)), dwconv_blocks=[1]))
    assert follow_patch_grid(model) is False and not model.patch_embed._forward_hooks
    x = _images(2)
    assert not _runs_module_path(model, x, counted)[0]
    seen = []
    handle = model.patch_embed.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    try:
        assert _runs_module_path(model, x, counted)[0] and seen == [torch.Size([2, 16, 48])]
    finally:
        handle.remove()
    assert not _runs_module_path(model, x, counted)[0]


def test_a_parametrized_weight_takes_the_module_path(counted):
    from torch.nn.utils import parametrize

    class Double(nn.Module):
        def forward(self, w):
            return 2 * w

    model = _fused()
    x = _images(2)
    parametrize.register_parametrization(model.head, "weight", Double())
    module_path, out = _runs_module_path(model, x, counted)
    assert module_path
    with torch.no_grad():
        assert torch.equal(out, _module_path(model, x))


@pytest.mark.parametrize("batch", [1, 3])
def test_usdc_gated_blocks_one_call_has_the_module_paths_bits(batch, counted):
    """Each gate pattern — both sub-blocks open (one vit_block call), one open, none — with the module path's bits."""
    model = _gated_model([(1, 1), (1, 0), (0, 1), (0, 0)])
    x = _images(batch)
    _one_call(model, x, counted)
    # A forced gate is a setting the call does not read: the module path runs it.
    vitfast.nn.set_gate_force(model, "open")
    assert _runs_module_path(model, x, counted)[0]
    vitfast.nn.set_gate_force(model, None)
    assert not _runs_module_path(model, x, counted)[0]
