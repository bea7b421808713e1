"""vitfast.save / vitfast.load and vitfast.arch: round trips, the file format, and every way a file can be bad.

Most tests use small fused modules registered here (real registered classes with a vitfast_config, so they go
through the same code path as the library's own) because they can exercise what the library's modules do not
(nested fused modules, tied weights, mixed dtypes); the last section runs the real ones (vitfast.nn.block,
vitfast.convert + vitfast.fuse, an official-layout RePaViT state dict).
"""
from __future__ import annotations

import functools
import json
import os
import pickle

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from timm.models.swin_transformer import SwinTransformer
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast.arch import build_timm, describe_timm
from vitfast.io import _checksum
from vitfast.io.fused import FORMAT, VERSION, load, read_config, save
from vitfast.nn.registry import register_fused

from helpers import official_repavit_state_dict

# ------------------------------------------------------------------------------------------ test modules


@register_fused("test_ckpt_ffn")
class _TestFFN(nn.Module):
    """Stands in for a fused FFN: parameters plus a persistent buffer, config = its shape."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.dim, self.hidden = dim, hidden
        self.w_in = nn.Parameter(torch.empty(hidden, dim))
        self.b_in = nn.Parameter(torch.empty(hidden))
        self.w_out = nn.Parameter(torch.empty(dim, hidden))
        self.register_buffer("scale", torch.ones(dim))

    def forward(self, x):
        # scale may be kept in higher precision than the weights (the mixed-dtype test); compute in x's dtype
        return F.linear(F.gelu(F.linear(x, self.w_in, self.b_in)), self.w_out) * self.scale.to(x.dtype)

    def vitfast_config(self):
        return {"kind": "test_ckpt_ffn", "dim": self.dim, "hidden": self.hidden}

    @classmethod
    def from_vitfast_config(cls, cfg):
        return cls(cfg["dim"], cfg["hidden"])


@register_fused("test_ckpt_block")
class _TestBlock(nn.Module):
    """Stands in for a fused block: contains a nested fused module and two tied linears (shared tensors)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.dim, self.hidden = dim, hidden
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.proj_a = nn.Linear(dim, dim)
        self.proj_b = self.proj_a  # tied: one tensor under two state-dict names
        self.mlp = _TestFFN(dim, hidden)

    def forward(self, x):
        y = self.norm(x)
        return x + self.proj_b(self.proj_a(y)) + self.mlp(y)

    def vitfast_config(self):
        return {"kind": "test_ckpt_block", "dim": self.dim, "hidden": self.hidden}

    @classmethod
    def from_vitfast_config(cls, cfg):
        return cls(cfg["dim"], cfg["hidden"])


class _Unregistered(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return self.fc(x)


def _randomize(model: nn.Module) -> nn.Module:
    # Fused test modules start from torch.empty; give every stored floating tensor defined, distinct values
    # (only the state dict: non-persistent buffers such as Swin's attention mask are derived, not stored).
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)
    return model


def tiny_vit(**kw) -> nn.Module:
    args = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5)
    args.update(kw)
    return VisionTransformer(**args).eval()


def tiny_swin(**kw) -> nn.Module:
    args = dict(img_size=32, patch_size=4, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=4, num_classes=5)
    args.update(kw)
    return SwinTransformer(**args).eval()


def fused_vit(**kw) -> nn.Module:
    """ViT with a fused FFN in block 0 and a fused block (with a nested fused FFN and tied weights) at 1."""
    model = tiny_vit(**kw)
    model.blocks[0].mlp = _TestFFN(32, 48)
    model.blocks[1] = _TestBlock(32, 40)
    return _randomize(model).eval()


def fused_swin() -> nn.Module:
    model = tiny_swin()
    model.layers[0].blocks[1].mlp = _TestFFN(16, 24)
    model.layers[1].blocks[0].mlp = _TestFFN(32, 64)
    return _randomize(model).eval()


def _img(batch=2, size=32):
    return torch.randn(batch, 3, size, size)


def _assert_same_model(a: nn.Module, b: nn.Module, x: torch.Tensor) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype, k
        assert torch.equal(sa[k], sb[k]), k
    with torch.no_grad():
        assert torch.equal(a(x), b(x))


def _rewrite(src, dst, *, metadata=None, config=None, tensors=None, resign=True):
    """Copy a checkpoint, changing its metadata, its config or its tensors (a tampered/odd file).

    `resign=True` recomputes the checksum record after the config and tensor changes (before `metadata`), so the
    file reaches the checks behind it, as a deliberately edited file would; False leaves the record stale."""
    with safe_open(str(src), framework="pt") as f:
        meta = dict(f.metadata())
        data = {k: f.get_tensor(k) for k in f.keys()}
    if config is not None:
        cfg = json.loads(meta["config"])
        config(cfg)
        meta["config"] = json.dumps(cfg)
    if tensors is not None:
        tensors(data)
    if resign and "checksum" in meta:
        meta["checksum"] = _checksum.record(data, meta["config"])
    if metadata is not None:
        metadata(meta)
    save_file(data, str(dst), metadata=meta)
    return dst


@pytest.fixture
def saved(tmp_path):
    model = fused_vit()
    path = tmp_path / "model.safetensors"
    save(model, path)
    return model, path


# ------------------------------------------------------------------------------------------ arch


ARCH_CASES = {
    "vit": lambda: tiny_vit(),
    "vit_avg_fcnorm_reg_layerscale": lambda: tiny_vit(global_pool="avg", reg_tokens=2, init_values=1e-4, no_embed_class=True),
    "vit_no_cls_qknorm": lambda: tiny_vit(class_token=False, global_pool="avg", qk_norm=True, qkv_bias=False, mlp_ratio=2.5),
    "vit_gelu_tanh_eps": lambda: tiny_vit(act_layer="gelu_tanh", norm_layer=nn.LayerNorm),
    "vit_map_pool": lambda: tiny_vit(global_pool="map"),
    "vit_layernorm_fp32": lambda: tiny_vit(norm_layer=__import__("timm").layers.LayerNormFp32),
    "vit_norm_without_bias": lambda: tiny_vit(norm_layer=functools.partial(nn.LayerNorm, eps=1e-6, bias=False)),
    "vit_norm_without_affine": lambda: tiny_vit(
        norm_layer=functools.partial(__import__("timm").layers.LayerNorm, affine=False)),
    "vit_embed_norm_differs": lambda: tiny_vit(
        embed_norm_layer=functools.partial(nn.LayerNorm, eps=1e-5, bias=False)),
    "vit_dynamic": lambda: tiny_vit(dynamic_img_size=True),
    "repavit_pre_norm": lambda: tiny_vit(pre_norm=True),  # timm drops the patch bias with pre_norm
    "deit_distilled": lambda: __import__("timm").models.deit.VisionTransformerDistilled(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5).eval(),
    "swin": lambda: tiny_swin(),
    "swin_head_dim_ratio": lambda: tiny_swin(head_dim=8, mlp_ratio=3.0, qkv_bias=False, window_size=(4, 2)),
}


def _repavit_no_bias():
    # RePaViT: BN-style blocks (fused away) and a patch embedding without bias, but no pre-norm; timm can
    # only express "no bias" through pre_norm, so describe/build must carry it separately.
    model = tiny_vit()
    p = model.patch_embed.proj
    model.patch_embed.proj = nn.Conv2d(p.in_channels, p.out_channels, p.kernel_size, p.stride, bias=False)
    return model.eval()


ARCH_CASES["repavit_no_patch_bias"] = _repavit_no_bias


@pytest.mark.parametrize("case", sorted(ARCH_CASES))
def test_describe_build_roundtrip(case):
    from vitfast.io._rebuild import structure_mismatches

    model = _randomize(ARCH_CASES[case]())
    desc = describe_timm(model)
    desc = json.loads(json.dumps(desc))  # what a file gives back: lists, no tuples
    rebuilt = build_timm(desc).eval()
    assert structure_mismatches(model, rebuilt) == []
    rebuilt.load_state_dict(model.state_dict(), strict=True)
    x = _img()
    with torch.no_grad():
        assert torch.equal(model(x), rebuilt(x))


@pytest.mark.parametrize("strict", [True, False])
def test_describe_swin_image_size_policy_on_older_timm(strict):
    # timm 1.0.29 (the GPU machine's) has no `dynamic_img_size` on SwinTransformer: the flag lives on its
    # PatchEmbed as `strict_img_size`; describe_timm must read it there.
    model = tiny_swin(strict_img_size=strict)
    assert describe_timm(model)["kwargs"]["strict_img_size"] is strict
    if "dynamic_img_size" in vars(model):
        del model.dynamic_img_size  # what an older timm's model looks like
    assert model.patch_embed.strict_img_size is strict
    assert describe_timm(model)["kwargs"]["strict_img_size"] is strict


def test_describe_records_patch_bias_and_norm():
    desc = describe_timm(_repavit_no_bias())
    assert desc["patch_embed_bias"] is False and desc["kwargs"]["pre_norm"] is False
    assert build_timm(desc).patch_embed.proj.bias is None
    desc = describe_timm(tiny_vit(norm_layer=nn.LayerNorm))
    assert desc["norm_layer"] == {"type": "torch.nn.LayerNorm", "eps": 1e-5}
    # The flags are written only when false (files of ordinary models are unchanged), and the patch embedding's
    # own norm (embed_norm_layer) does not stand for the model's norm_layer.
    desc = describe_timm(tiny_vit(embed_norm_layer=functools.partial(nn.LayerNorm, eps=1e-5, bias=False)))
    assert desc["norm_layer"] == {"type": "timm.LayerNorm", "eps": 1e-6}
    assert desc["embed_norm_layer"] == {"type": "torch.nn.LayerNorm", "eps": 1e-5, "bias": False}
    desc = describe_timm(tiny_vit(norm_layer=functools.partial(nn.LayerNorm, elementwise_affine=False)))
    assert desc["norm_layer"] == {"type": "torch.nn.LayerNorm", "eps": 1e-5, "affine": False}


def test_describe_skips_fused_modules():
    # Every block's MLP is fused: the ratio cannot be read and must not come from a fused module.
    model = tiny_vit(mlp_ratio=2.0)
    for block in model.blocks:
        block.mlp = _TestFFN(32, 48)
    desc = describe_timm(model)
    assert desc["kwargs"]["mlp_ratio"] == 4.0  # the documented fallback, harmless: every mlp is replaced
    assert desc["kwargs"]["num_heads"] == 2


def test_describe_rejects_unsupported_class():
    with pytest.raises(TypeError, match="model: expected a timm model of class VisionTransformer"):
        describe_timm(nn.Linear(2, 2))

    class MyViT(VisionTransformer):
        pass

    with pytest.raises(TypeError, match="MyViT"):
        describe_timm(MyViT(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2))


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda d: d.update({"class": "ResNet"}), r"architecture\['class'\]: expected one of"),
        (lambda d: d["kwargs"].update({"block_fn": "os.system"}), r"unexpected keys \['block_fn'\]"),
        (lambda d: d["kwargs"].update({"bogus": 1}), r"unexpected keys \['bogus'\]"),
        (lambda d: d.update({"norm_layer": {"type": "builtins.eval", "eps": 1e-6}}), r"norm_layer.*expected one of"),
        (lambda d: d.update({"act_layer": "os.system"}), r"act_layer.*expected one of"),
        (lambda d: d["kwargs"].update({"embed_dim": 30, "num_heads": 4}), r"timm VisionTransformer rejected"),
        (lambda d: d.update({"patch_embed_bias": "yes"}), r"patch_embed_bias.*expected true or false"),
        (lambda d: d["norm_layer"].update({"bias": 0}), r"\['norm_layer'\]\['bias'\]: expected true or false"),
        (lambda d: d["norm_layer"].update({"scale": False}), r"\['norm_layer'\]: expected .*optionally 'affine'"),
    ],
)
def test_build_rejects_bad_description(change, match):
    desc = describe_timm(tiny_vit())
    change(desc)
    with pytest.raises(ValueError, match=match):
        build_timm(desc)


# ------------------------------------------------------------------------------------------ round trips


def test_lazy_names_resolve():
    assert vitfast.save is save and vitfast.load is load


def test_roundtrip_fused_vit_exact(saved):
    model, path = saved
    loaded = vitfast.load(path)
    assert not loaded.training
    assert type(loaded.blocks[0].mlp) is _TestFFN and type(loaded.blocks[1]) is _TestBlock
    assert loaded.blocks[1].proj_a is loaded.blocks[1].proj_b  # the tie is structural, rebuilt by the module
    _assert_same_model(model, loaded, _img())


def test_roundtrip_fused_swin_exact(tmp_path):
    model = fused_swin()
    save(model, tmp_path / "swin.safetensors")
    loaded = load(tmp_path / "swin.safetensors")
    _assert_same_model(model, loaded, _img())
    blocks = read_config(tmp_path / "swin.safetensors")["blocks"]
    assert [b["path"] for b in blocks] == ["layers.0.blocks.0", "layers.0.blocks.1", "layers.1.blocks.0", "layers.1.blocks.1"]
    assert [b["stage"] for b in blocks] == [0, 0, 1, 1]
    assert blocks[1]["modules"] == {"mlp": "test_ckpt_ffn"} and blocks[0]["modules"] == {}


@pytest.mark.parametrize("case", ["repavit_pre_norm", "repavit_no_patch_bias", "deit_distilled", "vit_map_pool",
                                  "vit_layernorm_fp32", "vit_norm_without_bias", "vit_norm_without_affine"])
def test_roundtrip_plain_skeletons(tmp_path, case):
    model = _randomize(ARCH_CASES[case]())
    save(model, tmp_path / "m.safetensors")
    loaded = load(tmp_path / "m.safetensors")
    _assert_same_model(model, loaded, _img())
    assert read_config(tmp_path / "m.safetensors")["modules"] == {}


def test_file_is_one_safetensors_with_metadata(saved):
    model, path = saved
    assert os.listdir(path.parent) == [path.name]  # one file, no side files or leftover temporaries
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        keys = set(f.keys())
    assert meta["format"] == FORMAT == "vitfast.fused" and meta["version"] == str(VERSION) == "1"
    cfg = json.loads(meta["config"])
    assert cfg["format"] == FORMAT and cfg["version"] == VERSION
    assert cfg["architecture"] == json.loads(json.dumps(describe_timm(model)))
    assert cfg["modules"] == {
        "blocks.0.mlp": {"kind": "test_ckpt_ffn", "dim": 32, "hidden": 48},
        "blocks.1": {"kind": "test_ckpt_block", "dim": 32, "hidden": 40},
        "blocks.1.mlp": {"kind": "test_ckpt_ffn", "dim": 32, "hidden": 40},
    }
    assert cfg["blocks"] == [
        {"index": 0, "path": "blocks.0", "kind": "timm.Block", "modules": {"mlp": "test_ckpt_ffn"}},
        {"index": 1, "path": "blocks.1", "kind": "test_ckpt_block", "modules": {"mlp": "test_ckpt_ffn"}},
        {"index": 2, "path": "blocks.2", "kind": "timm.Block", "modules": {}},
    ]
    assert cfg["dtype"] == "float32" and cfg["vitfast_version"] == vitfast.__version__
    # The tied weight is stored once; the alias names the stored copy.
    assert cfg["aliases"] == {"blocks.1.proj_b.weight": "blocks.1.proj_a.weight", "blocks.1.proj_b.bias": "blocks.1.proj_a.bias"}
    assert keys | set(cfg["aliases"]) == set(model.state_dict())
    assert read_config(path) == cfg


def test_file_holds_nothing_but_header_and_tensor_bytes(saved):
    # Safetensors layout exactly: 8-byte length, JSON header, then the tensor bytes back to back -- no room
    # for a pickled blob anywhere in the file.
    model, path = saved
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__")
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert 8 + n + spans[-1][1] == len(raw)


def test_load_never_unpickles(saved, monkeypatch):
    model, path = saved

    def forbidden(*a, **k):
        raise AssertionError("pickle/torch.load used while loading a checkpoint")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    _assert_same_model(model, load(path), _img())


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_to_dtype_after_load(saved, dtype):
    model, path = saved
    loaded = load(path).to(dtype)
    assert all(p.dtype == dtype for p in loaded.parameters())
    x = _img()
    with torch.no_grad():
        ref = model(x)
        out = loaded(x.to(dtype)).float()
    atol, rtol = (1e-5, 1e-5) if dtype == torch.float64 else (0.1, 0.1)
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("make", [fused_vit, fused_swin])
def test_bfloat16_model_roundtrip_keeps_dtype(tmp_path, make):
    model = make().to(torch.bfloat16)
    save(model, tmp_path / "bf16.safetensors")
    assert read_config(tmp_path / "bf16.safetensors")["dtype"] == "bfloat16"
    loaded = load(tmp_path / "bf16.safetensors")
    assert {t.dtype for t in loaded.state_dict().values() if t.is_floating_point()} == {torch.bfloat16}
    _assert_same_model(model, loaded, _img().to(torch.bfloat16))


def test_mixed_dtype_roundtrip(tmp_path):
    model = fused_vit()
    model.blocks[0].mlp.scale.data = model.blocks[0].mlp.scale.data.double()  # an fp64 buffer in an fp32 model
    save(model, tmp_path / "mixed.safetensors")
    assert read_config(tmp_path / "mixed.safetensors")["dtype"] == "mixed"
    loaded = load(tmp_path / "mixed.safetensors")
    assert loaded.blocks[0].mlp.scale.dtype == torch.float64 and loaded.blocks[0].mlp.w_in.dtype == torch.float32
    _assert_same_model(model, loaded, _img())


def test_mixed_dtype_swin_keeps_its_unsaved_mask_dtype(tmp_path):
    """A bf16 Swin with fp32 LayerNorms: its attention masks (non-persistent buffers, not in the file) came back
    fp32 from a "mixed" file, and the bf16 attention refused them ("expected m1 and m2 to have the same dtype")."""
    model = tiny_swin().to(torch.bfloat16)
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            m.float()
    x = _img().to(torch.bfloat16)
    with torch.no_grad():
        model(x)  # the mixed model runs
    save(model, tmp_path / "swin_mixed.safetensors")
    config = read_config(tmp_path / "swin_mixed.safetensors")
    assert config["dtype"] == "mixed" and set(config["buffer_dtypes"].values()) == {"bfloat16"}
    loaded = load(tmp_path / "swin_mixed.safetensors")
    _assert_same_model(model, loaded, x)


def test_a_float64_default_dtype_does_not_break_load_or_export(saved, tmp_path):
    """torch.set_default_dtype(torch.float64) built float64 skeletons, which the float32 file then "did not match";
    to_onnx's random inputs were float64 against float32 weights."""
    model, path = saved
    vit = vitfast.fuse(vitfast.convert.from_timm(tiny_vit(), channel_idle=0.5).eval())  # a float32 model
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        loaded = load(path)
        assert torch.get_default_dtype() == torch.float64  # restored after the build
        assert {t.dtype for t in loaded.state_dict().values() if t.is_floating_point()} == {torch.float32}
        _assert_same_model(model, loaded, _img().float())
        from vitfast.export import to_onnx

        to_onnx(vit, tmp_path / "m.onnx")
    finally:
        torch.set_default_dtype(previous)


def test_load_leaves_a_float32_default_dtype_alone(saved, monkeypatch):
    """The default dtype is process-wide: load set it (to the float32 it already was) and back around every
    build, a window in which another thread's set_default_dtype was undone."""
    model, path = saved
    calls = []
    real = torch.set_default_dtype
    monkeypatch.setattr(torch, "set_default_dtype", lambda d: (calls.append(d), real(d)))
    assert torch.get_default_dtype() == torch.float32
    _assert_same_model(model, load(path), _img())
    assert calls == []


def test_a_timm_that_cannot_build_on_meta_still_loads(saved, monkeypatch):
    """timm <= 1.0.20 calls linspace(..).item() in its constructors, which fails on the meta device: the meta probe
    raised a ValueError and load refused every file, even one save had just written."""
    import vitfast.io.fused as ckpt

    model, path = saved
    real = ckpt.build_timm

    def no_meta(architecture, device=None):
        if device == "meta":
            raise ValueError("Tensor.item() cannot be called on meta tensors")
        return real(architecture, device=device)

    monkeypatch.setattr(ckpt, "build_timm", no_meta)
    _assert_same_model(model, load(path), _img())


def test_load_messages_for_train_time_files_a_missing_config_and_no_gpu(saved, tmp_path):
    model, path = saved
    train_time = tmp_path / "t.safetensors"
    vitfast.io.save_trainable(vitfast.convert.from_timm(tiny_vit(), channel_idle=0.5), train_time)
    with pytest.raises(ValueError, match=r"a train-time model \(vitfast.io.save_trainable / `vitfast train`\), not a fused "
                                         r"one; load it with vitfast.io.load_trainable, or fuse it first"):
        load(train_time)
    no_config = tmp_path / "nc.safetensors"
    _rewrite(path, no_config, metadata=lambda meta: meta.pop("config"))
    with pytest.raises(ValueError, match=r"metadata 'config' is missing"):
        load(no_config)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device: 'cuda' requested, but torch.cuda.is_available\(\) is False"):
            load(path, device="cuda")


def test_views_sharing_storage_are_saved_separately(tmp_path):
    model = fused_vit()
    # Two buffers that are slices of one storage: shared memory without being the same tensor.
    base = torch.randn(64)
    model.blocks[0].mlp.scale = base[:32]
    model.blocks[1].mlp.scale = base[32:]
    save(model, tmp_path / "v.safetensors")
    assert read_config(tmp_path / "v.safetensors")["aliases"].keys() == {"blocks.1.proj_b.weight", "blocks.1.proj_b.bias"}
    _assert_same_model(model, load(tmp_path / "v.safetensors"), _img())


def test_load_device_argument(saved):
    model, path = saved
    assert next(load(path, device=torch.device("cpu")).parameters()).device.type == "cpu"
    with pytest.raises(ValueError, match="device: expected a torch device"):
        load(path, device="not-a-device")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_load_then_cuda(saved):
    model, path = saved
    loaded = load(path).cuda()
    x = _img()
    with torch.no_grad():
        # TF32 may be on for CUDA matmuls: compare loosely, the exact check is the CPU round trip.
        torch.testing.assert_close(loaded(x.cuda()).cpu(), model(x), atol=1e-2, rtol=1e-2)
    assert next(load(path, device="cuda").parameters()).is_cuda


# ------------------------------------------------------------------------------------------ bad files


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="path: no such file"):
        load(tmp_path / "nope.safetensors")
    with pytest.raises(ValueError, match="path: expected a file"):
        load(tmp_path)


@pytest.mark.parametrize("keep", [0, 5, 20, "half_header", "minus_one"])
def test_truncated_file(saved, tmp_path, keep):
    _, path = saved
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    cut = {"half_header": 8 + n // 2, "minus_one": len(raw) - 1}.get(keep, keep)
    bad = tmp_path / "cut.safetensors"
    bad.write_bytes(raw[:cut])
    with pytest.raises(ValueError, match=r"cut\.safetensors.*truncated"):
        load(bad)


@pytest.mark.parametrize("where", ["json", "length"])
def test_corrupt_header(saved, tmp_path, where):
    _, path = saved
    raw = bytearray(path.read_bytes())
    if where == "json":
        raw[8:20] = b"\xff" * 12  # garbage in place of the header's opening JSON
    else:
        raw[:8] = (2**62).to_bytes(8, "little")
    bad = tmp_path / "corrupt.safetensors"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"corrupt\.safetensors: corrupt safetensors header"):
        load(bad)


@pytest.mark.parametrize("shape", [[None], ["a"], [[5]], [-5], [5.0], [True]], ids=str)
def test_corrupt_header_shape_entries(saved, tmp_path, shape):
    """Shape items must be non-negative ints: others once raised a raw TypeError while building the message."""
    _, path = saved
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["head.bias"]["shape"] = shape
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    bad = tmp_path / "shape.safetensors"
    bad.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])
    with pytest.raises(ValueError, match=r"shape\.safetensors: corrupt safetensors header \(bad entry for tensor 'head\.bias'"):
        load(bad)


def test_config_stored_as_an_object(saved, tmp_path):
    _, path = saved
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["__metadata__"]["config"] = {"format": FORMAT}
    text = json.dumps(header).encode()
    bad = tmp_path / "obj.safetensors"
    bad.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])
    with pytest.raises(ValueError, match=r"metadata 'config' expected a JSON string, got dict"):
        load(bad)


def test_float8_tensor_is_refused(saved, tmp_path):
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8")
    _, path = saved
    bad = _rewrite(path, tmp_path / "f8.safetensors", config=lambda c: c.update(dtype="mixed"),
                   tensors=lambda d: d.update({"head.bias": d["head.bias"].to(torch.float8_e4m3fn)}))
    with pytest.raises(ValueError, match=r"tensor head\.bias: unsupported dtype 'F8_E4M3'"):
        load(bad)


@pytest.mark.parametrize("kwargs, match", [
    ({"mlp_ratio": 1e5}, r"config architecture\.kwargs\.mlp_ratio: expected a finite number in \(0\.0, 64\.0\], got 100000\.0"),
    ({"num_classes": 10**7}, r"config architecture\.kwargs\.num_classes: expected 5 \(rows of the stored head\.weight\)"),
], ids=["mlp_ratio", "num_classes"])
def test_config_values_no_tensor_checks_cannot_make_the_build_huge(tmp_path, kwargs, match):
    """The real build allocates timm's skeleton before the fused blocks and head replace parts of it, so values
    only the replaced parts use are checked by no stored tensor of those parts: refused before any allocation
    (these need 1.6 and 1.2 GB; larger values once failed inside the allocator, ~10⁸-sized ones were allocated)."""
    convert, fuse = _convert_and_fuse()
    path = tmp_path / "m.safetensors"
    save(fuse(convert.from_timm(_randomize(tiny_vit()), channel_idle=0.75).eval()), path)
    bad = _rewrite(path, tmp_path / "big.safetensors", config=lambda c: c["architecture"]["kwargs"].update(kwargs))
    with pytest.raises(ValueError, match=match):
        load(bad)


def test_a_skeleton_much_larger_than_the_file_is_refused_before_allocating(tmp_path, monkeypatch):
    """The last guard, for values within their ranges that only the replaced parts use (mlp_ratio under fused
    FFNs): the skeleton's tensor bytes against the file's (slack 0 and ratio 2, so a tiny model shows it)."""
    import vitfast.io.fused as ckpt

    convert, fuse = _convert_and_fuse()
    path = tmp_path / "m.safetensors"
    save(fuse(convert.from_timm(_randomize(tiny_vit()), channel_idle=0.75).eval()), path)
    bad = _rewrite(path, tmp_path / "big.safetensors", config=lambda c: c["architecture"]["kwargs"].update(mlp_ratio=60))
    monkeypatch.setattr(ckpt, "_SKELETON_SLACK_BYTES", 0)
    monkeypatch.setattr(ckpt, "_MAX_SKELETON_RATIO", 2)
    load(path)  # the file as saved stays within the ratio
    with pytest.raises(ValueError, match=r"needs .* MiB of tensors to build, more than 2x the .* MiB the file stores"):
        load(bad)


def test_trailing_garbage(saved, tmp_path):
    _, path = saved
    bad = tmp_path / "tail.safetensors"
    bad.write_bytes(path.read_bytes() + b"\0" * 16)
    with pytest.raises(ValueError, match=r"tail\.safetensors: corrupt safetensors file"):
        load(bad)


def test_not_a_safetensors_file(tmp_path):
    bad = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(3)}, bad)  # a pickle-based file must be refused, never unpickled
    with pytest.raises(ValueError, match=r"model\.pt"):
        load(bad)


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
def test_foreign_safetensors_file(tmp_path, metadata):
    path = tmp_path / "foreign.safetensors"
    save_file(tiny_vit().state_dict(), str(path), metadata=metadata)
    with pytest.raises(ValueError, match=r"foreign\.safetensors: not a vitfast checkpoint .*expected 'vitfast\.fused'"):
        load(path)


def test_newer_version(saved, tmp_path):
    _, path = saved
    bad = _rewrite(path, tmp_path / "v2.safetensors", metadata=lambda m: m.update(version="2"))
    with pytest.raises(ValueError, match=r"version 2 is newer than this vitfast supports \(version 1\)"):
        load(bad)


@pytest.mark.parametrize(
    "metadata, config, match",
    [
        (lambda m: m.update(version="one"), None, r"'version' expected an integer string, got 'one'"),
        (lambda m: m.update(config="{not json"), None, r"'config' is not valid JSON"),
        (None, lambda c: c.update(version=2), r"disagree with the metadata"),
        (None, lambda c: c.pop("architecture"), r"config\['architecture'\] expected a JSON object"),
        (None, lambda c: c["modules"]["blocks.0.mlp"].update(kind="nope"), r"cfg\['kind'\]: expected one of .*got 'nope'"),
        (None, lambda c: c["architecture"].update({"class": "EvilNet"}), r"architecture\['class'\]"),
        (None, lambda c: c["modules"].update({"nowhere.mlp": {"kind": "test_ckpt_ffn", "dim": 32, "hidden": 4}}),
         r"parent module 'nowhere' does not exist"),
        (None, lambda c: c["modules"].update({"blocks.__class__": {"kind": "test_ckpt_ffn", "dim": 32, "hidden": 4}}),
         r"expected a dotted submodule path"),
        (None, lambda c: c["modules"].update({"blocks.0.forward": {"kind": "test_ckpt_ffn", "dim": 32, "hidden": 4}}),
         r"existing non-module attribute"),
        (None, lambda c: c["modules"].update({"blocks.0.mlp": {"kind": "test_ckpt_ffn", "dim": 32, "hidden": 7}}),
         r"tensor blocks\.0\.mlp\.w_in: expected shape \[7, 32\], got \[48, 32\]"),
        # Entries of a container come from the architecture's depth: an index past it was once appended (and
        # listed in the file's key order, blocks ran swapped).
        (None, lambda c: c["architecture"]["kwargs"].update(depth=1),
         r"modules\['blocks\.1'\]: blocks has 1 entries in the rebuilt model \(from the architecture\), got an entry for '1'"),
        (None, lambda c: c.update(version=True), r"disagree with the metadata"),
        (None, lambda c: c.update(dtype="int8"), r"config\['dtype'\] expected one of"),
        (lambda m: m.update(config="[" * 100_000), None, r"'config' is not valid JSON \(RecursionError"),
        (None, lambda c: c["aliases"].update({"bogus.x": "head.bias"}),
         r"bogus\.x: listed as an alias, but the model has no such tensor"),
    ],
)
def test_bad_metadata(saved, tmp_path, metadata, config, match):
    _, path = saved
    bad = _rewrite(path, tmp_path / "bad.safetensors", metadata=metadata, config=config)
    with pytest.raises(ValueError, match=match):
        load(bad)


def test_wrong_shape_tensor(saved, tmp_path):
    _, path = saved
    bad = _rewrite(path, tmp_path / "b.safetensors", tensors=lambda d: d.update({"head.weight": torch.zeros(7, 32)}))
    with pytest.raises(ValueError, match=r"tensor head\.weight: expected shape \[5, 32\], got \[7, 32\]"):
        load(bad)


def test_missing_and_extra_tensors_are_all_listed(saved, tmp_path):
    _, path = saved

    def change(d):
        del d["blocks.0.mlp.w_in"]
        del d["norm.bias"]
        d["blocks.9.surprise"] = torch.zeros(2)

    bad = _rewrite(path, tmp_path / "b.safetensors", tensors=change)
    with pytest.raises(ValueError, match=r"3 problems") as info:
        load(bad)
    msg = str(info.value)
    assert "missing tensor blocks.0.mlp.w_in (expected shape [48, 32])" in msg
    assert "missing tensor norm.bias" in msg and "unexpected tensor blocks.9.surprise" in msg


def test_wrong_dtype_tensor(saved, tmp_path):
    _, path = saved
    bad = _rewrite(path, tmp_path / "b.safetensors", tensors=lambda d: d.update({"cls_token": d["cls_token"].half()}))
    with pytest.raises(ValueError, match=r"tensor cls_token: expected dtype torch\.float32 .*got torch\.float16"):
        load(bad)
    bad = _rewrite(path, tmp_path / "c.safetensors", tensors=lambda d: d.update({"cls_token": d["cls_token"].long()}))
    with pytest.raises(ValueError, match=r"tensor cls_token: expected dtype torch\.float32, got torch\.int64"):
        load(bad)


def test_config_and_tensors_disagree(saved, tmp_path):
    # A config edited to a deeper model: refused before timm builds the blocks the file has no tensors for.
    _, path = saved
    bad = _rewrite(path, tmp_path / "b.safetensors", config=lambda c: c["architecture"]["kwargs"].update(depth=4))
    with pytest.raises(ValueError, match=r"config architecture\.kwargs\.depth: expected 3 \(the blocks the file "
                                         r"stores tensors for\), got 4"):
        load(bad)


def test_bad_alias(saved, tmp_path):
    _, path = saved
    bad = _rewrite(path, tmp_path / "b.safetensors",
                   config=lambda c: c["aliases"].update({"blocks.1.proj_b.weight": "head.bias"}))
    with pytest.raises(ValueError, match=r"blocks\.1\.proj_b\.weight \(alias of head\.bias\): expected shape \[32, 32\]"):
        load(bad)


# ------------------------------------------------------------------------------------------ non-finite


def test_nonfinite_refused_at_save_unless_allowed(tmp_path):
    model = fused_vit()
    with torch.no_grad():
        model.blocks[0].mlp.w_out[0, 0] = float("nan")
        model.head.bias[1] = float("inf")
    path = tmp_path / "nan.safetensors"
    with pytest.raises(ValueError, match=r"NaN/Inf in 2 tensors: blocks\.0\.mlp\.w_out \(1 of 1536\); head\.bias \(1 of 5\)"):
        save(model, path)
    assert not path.exists()
    save(model, path, allow_nonfinite=True)
    with pytest.raises(ValueError, match=r"nan\.safetensors: expected finite weights.*blocks\.0\.mlp\.w_out"):
        load(path)
    loaded = load(path, allow_nonfinite=True)
    assert torch.isnan(loaded.blocks[0].mlp.w_out[0, 0])


# ------------------------------------------------------------------------------------------ save refusals


def test_save_refuses_unregistered_module(tmp_path):
    model = fused_vit()
    model.blocks[2].mlp = _Unregistered(32)
    path = tmp_path / "x.safetensors"
    with pytest.raises(ValueError, match=r"blocks\.2\.mlp: expected timm\.layers\.mlp\.Mlp .*got .*_Unregistered"):
        save(model, path)
    assert not path.exists()


def test_save_refuses_what_the_config_cannot_express(tmp_path):
    # FusedBlock 2 pruned to one head by hand: no constructor argument says so; the file would load differently.
    model = fused_vit()
    model.blocks[2].attn.num_heads = 1
    with pytest.raises(ValueError, match=r"blocks\.2\.attn\.num_heads: the rebuilt model has 2, the model has 1"):
        save(model, tmp_path / "x.safetensors")
    model = fused_vit()
    model.blocks[2].norm1.eps = 1e-3
    with pytest.raises(ValueError, match=r"blocks\.2\.norm1\.eps"):
        save(model, tmp_path / "x.safetensors")


def test_save_refuses_incomplete_fused_config(tmp_path):
    model = fused_vit()
    model.blocks[0].mlp.hidden = 99  # config now disagrees with the module's tensors
    with pytest.raises(ValueError, match=r"blocks\.0\.mlp\.w_in: the rebuilt model has shape \[99, 32\]"):
        save(model, tmp_path / "x.safetensors")


def test_save_argument_errors(tmp_path):
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module"):
        save("model", tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match="path: expected a str or os.PathLike"):
        save(tiny_vit(), 3)
    with pytest.raises(FileNotFoundError, match="path: directory"):
        save(tiny_vit(), tmp_path / "no" / "x.safetensors")


def test_save_refuses_paths_it_would_destroy(tmp_path):
    """The write renames a new file over the path: a FIFO (as root, even /dev/null) was replaced by it."""
    model = fused_vit()
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"path: expected a regular file or a new file name, got a special file"):
        save(model, fifo)
    assert not fifo.is_file() and fifo.exists()  # still the FIFO
    with pytest.raises(IsADirectoryError, match=r"path: expected a file name, got the directory"):
        save(model, tmp_path)
    with pytest.raises(ValueError, match=r"path: expected a file name, got ''"):
        save(model, "")
    assert sorted(os.listdir(tmp_path)) == ["pipe.safetensors"]  # no temporary left behind


def test_saved_file_mode_follows_the_umask(tmp_path):
    """safetensors writes 0600 whatever the umask; a checkpoint is a file like any other (0644 under 022)."""
    old = os.umask(0o022)
    try:
        save(fused_vit(), tmp_path / "m.safetensors")
    finally:
        os.umask(old)
    assert ((tmp_path / "m.safetensors").stat().st_mode & 0o777) == 0o644


def test_save_writes_through_a_symlink_and_keeps_the_mode(tmp_path):
    model = fused_vit()
    target, link = tmp_path / "real.safetensors", tmp_path / "link.safetensors"
    target.write_bytes(b"old")
    target.chmod(0o640)
    link.symlink_to(target)
    save(model, link)
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert (target.stat().st_mode & 0o777) == 0o640
    _assert_same_model(model, load(link), _img())


def test_failing_write_is_atomic(saved, monkeypatch):
    model, path = saved
    before = path.read_bytes()
    import safetensors.torch as st

    def half_write(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(st, "save_file", half_write)
    with pytest.raises(OSError, match="disk full"):
        save(fused_vit(depth=4), path)
    assert path.read_bytes() == before  # the previous file is untouched
    assert os.listdir(path.parent) == [path.name]  # and no temporary is left behind
    monkeypatch.undo()
    _assert_same_model(model, load(path), _img())


# ------------------------------------------------------------------------------------------ real fused modules


def test_real_fused_vit_blocks_roundtrip(tmp_path):
    from vitfast.nn.block import FusedBlock

    model = _randomize(tiny_vit(init_values=1e-1, depth=2))
    model.blocks[0] = FusedBlock.from_timm(model.blocks[0])  # block 1 stays timm: mixed models must work too
    save(model, tmp_path / "m.safetensors")
    cfg = read_config(tmp_path / "m.safetensors")
    assert [b["kind"] for b in cfg["blocks"]] == ["block", "timm.Block"]
    assert cfg["blocks"][0]["modules"] == {"mlp": "channel_idle_ffn"}
    _assert_same_model(model, load(tmp_path / "m.safetensors"), _img())


def test_real_fused_swin_blocks_roundtrip(tmp_path):
    from vitfast.nn.swin import FusedSwinBlock

    model = _randomize(tiny_swin())
    for stage in model.layers:
        stage.blocks[1] = FusedSwinBlock.from_timm(stage.blocks[1])  # the shifted-window blocks
    save(model, tmp_path / "m.safetensors")
    assert [b["kind"] for b in read_config(tmp_path / "m.safetensors")["blocks"]] == [
        "timm.SwinTransformerBlock", "swin_block", "timm.SwinTransformerBlock", "swin_block"]
    _assert_same_model(model, load(tmp_path / "m.safetensors"), _img())


def _convert_and_fuse():
    import vitfast.convert as convert
    from vitfast.fusion import fuse

    return convert, fuse


CONVERT_CASES = {
    "vit": lambda: tiny_vit(init_values=1e-1),
    "deit_distilled": ARCH_CASES["deit_distilled"],
    "swin": tiny_swin,
    # The final norm stays unfused; vitfast.save used to refuse these (LayerNormFp32: "expected
    # timm.layers.norm.LayerNorm"; no bias: "tensor norm.bias: missing from the model").
    "vit_layernorm_fp32": ARCH_CASES["vit_layernorm_fp32"],
    "vit_norm_without_bias": ARCH_CASES["vit_norm_without_bias"],
}


@pytest.mark.parametrize("norm", ["batch", "layer"])
@pytest.mark.parametrize("case", sorted(CONVERT_CASES))
def test_convert_fuse_save_load(tmp_path, case, norm):
    convert, fuse = _convert_and_fuse()
    train_model = convert.from_timm(_randomize(CONVERT_CASES[case]()), channel_idle=0.75, norm=norm).eval()
    # The train-time model is not a checkpoint: its modules are not registered fused modules.
    with pytest.raises(ValueError, match=r"fuse the model first"):
        save(train_model, tmp_path / "train.safetensors")
    fused = fuse(train_model)
    save(fused, tmp_path / "fused.safetensors")
    cfg = read_config(tmp_path / "fused.safetensors")
    assert all(b["kind"] in ("block", "swin_block") for b in cfg["blocks"])
    assert all(cfg["modules"][b["path"] + ".mlp"]["kind"] == "channel_idle_ffn" for b in cfg["blocks"])
    loaded = load(tmp_path / "fused.safetensors")
    x = _img()
    _assert_same_model(fused, loaded, x)
    with torch.no_grad():  # and the file's model is still the train-time model's function
        torch.testing.assert_close(loaded(x), train_model(x), atol=1e-4, rtol=1e-4)


def test_repavit_checkpoint_roundtrip(tmp_path):
    convert, fuse = _convert_and_fuse()
    train_model = convert.from_repavit(official_repavit_state_dict(), num_heads=2)
    fused = fuse(train_model)
    desc = describe_timm(fused)
    assert desc["patch_embed_bias"] is False and desc["kwargs"]["pre_norm"] is True
    save(fused, tmp_path / "repavit.safetensors")
    loaded = load(tmp_path / "repavit.safetensors")
    assert loaded.patch_embed.proj.bias is None
    _assert_same_model(fused, loaded, _img())


def test_real_fused_model_with_nonfinite_weights_loads_when_allowed(tmp_path):
    """allow_nonfinite=True once failed inside the prepack (the CPU kernels refuse NaN weights): the model now
    loads with a warning naming the module, and runs under the reference backend."""
    convert, fuse = _convert_and_fuse()
    fused = fuse(convert.from_timm(_randomize(tiny_vit()), channel_idle=0.75).eval())
    with torch.no_grad():
        fused.blocks[1].mlp.w_out[0, 0] = float("nan")
    path = tmp_path / "nan.safetensors"
    save(fused, path, allow_nonfinite=True)
    with pytest.warns(RuntimeWarning, match=r"1 modules not packed.*blocks\.1\.mlp \(w_out: expected finite values"):
        loaded = load(path, allow_nonfinite=True)
    assert torch.isnan(loaded.blocks[1].mlp.w_out[0, 0])
    with pytest.raises(ValueError, match=r"w_out: expected finite values"):  # the kernel forward says why
        loaded(_img())


def test_real_fused_float64_model_is_refused_at_save_and_warned_at_load(tmp_path):
    """No vitfast op takes float64 (kernels and reference alike): a float64 fused model once saved fine and then
    failed inside load's prepack with a message naming neither the file nor the module."""
    convert, fuse = _convert_and_fuse()
    fused = fuse(convert.from_timm(_randomize(tiny_vit()), channel_idle=0.75).eval())
    with pytest.raises(ValueError, match=r"model\.\S+: expected float32, float16 or bfloat16 in a fused module"):
        save(fused.double(), tmp_path / "f64.safetensors")
    path = tmp_path / "f32.safetensors"
    save(fused.float(), path)
    hand_made = _rewrite(path, tmp_path / "hand.safetensors", config=lambda c: c.update(dtype="float64"),
                         tensors=lambda d: d.update({k: v.double() for k, v in d.items() if v.is_floating_point()}))
    with pytest.warns(RuntimeWarning, match=r"modules not packed.*expected dtype float32, float16 or bfloat16"):
        loaded = load(hand_made)
    with pytest.raises(ValueError, match=r"expected dtype float32, float16 or bfloat16, got torch\.float64"):
        loaded(_img().double())
