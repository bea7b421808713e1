"""The checksum record of fused files (vitfast.io._checksum) and the checks that bound a load by its file
(vitfast.io._bounds): corrupt data or config refused by name, config bombs refused in well under a second."""
import json
import time
import warnings
import zlib
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import vitfast
from vitfast.io import _checksum

from checkpoint_fuzz import make_base_files


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    paths = make_base_files(str(tmp_path_factory.mktemp("bases")))
    return {p.rsplit("/", 1)[1].split(".")[0]: p for p in paths}


def _read(path):
    with safe_open(path, framework="pt") as f:
        return dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__


def _write(path, meta, tensors):
    save_file(tensors, str(path), metadata=meta)
    return str(path)


def _edit_config(src, dst, change, resign):
    meta, tensors = _read(src)
    config = json.loads(meta["config"])
    change(config)
    meta["config"] = json.dumps(config)
    if resign:
        meta["checksum"] = _checksum.record(tensors, meta["config"])
    return _write(dst, meta, tensors)


def _output(model, x):
    with torch.no_grad():
        return model(x)


def test_save_records_a_crc32_of_the_config_and_of_every_tensor(bases):
    meta, tensors = _read(bases["vit"])
    record = json.loads(meta["checksum"])
    assert record["algorithm"] == "crc32" and set(record["tensors"]) == set(tensors)
    assert record["config"] == f"{zlib.crc32(meta['config'].encode()):08x}"
    for name, t in tensors.items():
        assert record["tensors"][name] == f"{zlib.crc32(t.reshape(-1).view(torch.uint8).numpy()):08x}", name


def test_a_flipped_data_bit_is_refused_by_tensor_name_and_verify_false_loads_it(bases, tmp_path):
    data = bytearray(Path(bases["vit"]).read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_len])
    start = header["head.weight"]["data_offsets"][0]
    data[8 + header_len + start + 2] ^= 0x10  # one bit of head.weight[0, 0]
    bad = tmp_path / "flip.safetensors"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"flip\.safetensors: checksum mismatch in 1 tensors: head\.weight: the file is "
                                         r"corrupt \(pass verify=False to load it anyway\)"):
        vitfast.load(bad)
    x = torch.randn(1, 3, 32, 32)
    assert not torch.equal(_output(vitfast.load(bad, verify=False), x), _output(vitfast.load(bases["vit"]), x))


def test_an_edited_config_is_refused_unless_re_signed(bases, tmp_path):
    def more_eps(config):
        block = next(c for c in config["modules"].values() if "norm_eps" in c)
        block["norm_eps"] = 1e-3

    stale = _edit_config(bases["vit"], tmp_path / "stale.safetensors", more_eps, resign=False)
    with pytest.raises(ValueError, match=r"stale\.safetensors: checksum mismatch in the config"):
        vitfast.load(stale)
    with pytest.raises(ValueError, match=r"checksum mismatch in the config"):
        vitfast.io.read_config(stale)
    vitfast.load(stale, verify=False)  # a user who edits on purpose can opt out
    signed = _edit_config(bases["vit"], tmp_path / "signed.safetensors", more_eps, resign=True)
    vitfast.load(signed)


def test_files_without_a_record_load_with_one_warning(bases, tmp_path):
    meta, tensors = _read(bases["swin"])
    del meta["checksum"]
    old = _write(tmp_path / "old.safetensors", meta, tensors)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = vitfast.load(old)
    messages = [str(w.message) for w in caught if "checksum" in str(w.message)]
    assert len(messages) == 1 and "old.safetensors: written without checksums" in messages[0], messages
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(_output(model, x), _output(vitfast.load(bases["swin"]), x))


@pytest.mark.parametrize("record, match", [
    ("{not json", r"metadata 'checksum' is not valid JSON"),
    (json.dumps({"algorithm": "md5", "config": "00000000", "tensors": {}}), r"metadata 'checksum' expected"),
    (json.dumps({"algorithm": "crc32", "config": "0000000g", "tensors": {}}), r"metadata 'checksum' expected"),
    (json.dumps({"algorithm": "crc32", "config": "00000000", "tensors": {}}), r"metadata 'checksum' lists other tensors than the file stores"),
])
def test_a_corrupt_record_is_refused(bases, tmp_path, record, match):
    meta, tensors = _read(bases["vit"])
    meta["checksum"] = record
    bad = _write(tmp_path / "rec.safetensors", meta, tensors)
    with pytest.raises(ValueError, match=r"rec\.safetensors: " + match):
        vitfast.load(bad)


def _first(config, kind):
    return next(c for c in config["modules"].values() if c["kind"] == kind)


BOMBS = {
    # name: (base, change, expected message) — each from the reliability report's list
    "depth 10^9": ("vit", lambda c: c["architecture"]["kwargs"].update(depth=10**9),
                   r"config architecture\.kwargs\.depth: expected 3 \(the blocks the file stores tensors for\), got 1000000000"),
    "depth 10^5": ("vit", lambda c: c["architecture"]["kwargs"].update(depth=10**5), r"kwargs\.depth: expected 3"),
    "swin depths": ("swin", lambda c: c["architecture"]["kwargs"].update(depths=[10**4, 10**4]),
                    r"kwargs\.depths\[0\]: expected 2 \(the blocks of stage 0 in the file\), got 10000"),
    "embed_dim 2^40": ("vit", lambda c: c["architecture"]["kwargs"].update(embed_dim=2**40),
                       r"kwargs\.embed_dim: expected an int of magnitude <= 2147483647"),
    "num_heads 0": ("vit", lambda c: c["architecture"]["kwargs"].update(num_heads=0),
                    r"kwargs\.num_heads: expected an int in \[1, 32\], got 0"),
    "num_heads not a divisor": ("vit", lambda c: c["architecture"]["kwargs"].update(num_heads=5),
                                r"kwargs\.num_heads: expected a divisor of embed_dim 32, got 5"),
    "patch_size 0": ("vit", lambda c: c["architecture"]["kwargs"].update(patch_size=[0, 0]),
                     r"kwargs\.patch_size: expected an int or \[h, w\] with values in \[1, 32768\]"),
    "patch_size vs tensor": ("vit", lambda c: c["architecture"]["kwargs"].update(patch_size=[4, 4], img_size=[16, 16]),
                             (r"kwargs \(embed_dim, in_chans, patch_size\): expected the stored "
                              r"patch_embed\.proj\.weight shape \[32, 3, 8, 8\]")),
    "swin shift 10^9": ("swin", lambda c: next(m for m in c["modules"].values() if m["kind"] == "swin_block"
                                               and any(m["shift_size"]))["shift_size"].__setitem__(0, 10**9),
                        r"expected an int of magnitude|shift_size'\]: expected values below the window size"),
    "swin shift 4": ("swin", lambda c: next(m for m in c["modules"].values() if m["kind"] == "swin_block"
                                            and any(m["shift_size"]))["shift_size"].__setitem__(0, 4),
                     r"cfg\['shift_size'\]: expected values below the window size \[4, 4\], got \[4, 2\]"),
    "norm eps 10": ("vit", lambda c: next(m for m in c["modules"].values() if "norm_eps" in m).update(norm_eps=10),
                    r"\['norm_eps'\]: expected a finite number in \[0\.0, 1\.0\], got 10"),
    "arch eps 1e6": ("vit", lambda c: c["architecture"]["norm_layer"].update(eps=1e6),
                     r"architecture\.norm_layer\.eps: expected a finite number in \[0\.0, 1\.0\]"),
    "dwconv grid 2^63": ("dwconv", lambda c: _first(c, "dwconv_block").update(grid_size=[2**63, 4]),
                         r"grid_size\[0\]: expected an int of magnitude"),
    "dwconv grid vs image": ("dwconv", lambda c: _first(c, "dwconv_block").update(grid_size=[8, 8]),
                             r"\['grid_size'\]: expected \[4, 4\] \(img_size / patch_size of the architecture\)"),
    "5000 digits": ("vit", lambda c: c["architecture"]["kwargs"].update(depth=10**5000 - 1),
                    r"metadata 'config' is not valid JSON \(ValueError: Exceeds the limit"),
    "num_classes vs head": ("vit", lambda c: c["architecture"]["kwargs"].update(num_classes=10**7),
                            r"kwargs\.num_classes: expected 5 \(rows of the stored head\.weight\)"),
    "mlp_ratio": ("vit", lambda c: c["architecture"]["kwargs"].update(mlp_ratio=1e5),
                  r"kwargs\.mlp_ratio: expected a finite number in \(0\.0, 64\.0\]"),
    "reg_tokens": ("vit", lambda c: c["architecture"]["kwargs"].update(reg_tokens=1000),
                   r"missing tensor reg_token \(expected shape \[1, 1000, 32\]\)"),  # the meta-device comparison
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_config_bombs_are_refused_by_field_before_building(bases, tmp_path, name):
    import sys

    base, change, match = BOMBS[name]
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else None
    if limit:
        sys.set_int_max_str_digits(0)  # to *write* the 5000-digit case
    try:
        path = _edit_config(bases[base], tmp_path / "bomb.safetensors", change, resign=True)
    finally:
        if limit:
            sys.set_int_max_str_digits(limit)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"bomb\.safetensors: .*(" + match + ")"):
        vitfast.load(path)
    # The depth-10^5 file once ran 280+ s at 5.5 GB: now the checks come before any module is built.
    assert time.perf_counter() - t0 < 2.0


def test_when_timm_cannot_build_on_meta_the_fused_modules_are_still_checked_before_the_real_build(
        bases, tmp_path, monkeypatch):
    """A fused Swin block declaring dim 16000 in a file storing 16 was built for real (minutes, GBs) once the meta
    probe failed; the fused modules are vitfast's, so they are built and compared on meta even then."""
    import vitfast.io.fused as ckpt

    real = ckpt.build_timm

    def no_meta(architecture, device=None):  # what timm <= 1.0.20 did on the meta device
        if device == "meta":
            raise ValueError("Tensor.item() cannot be called on meta tensors")
        return real(architecture, device=device)

    monkeypatch.setattr(ckpt, "build_timm", no_meta)
    monkeypatch.setattr("vitfast.io._rebuild.build_timm", no_meta)
    x = torch.randn(1, 3, 32, 32)
    monkeypatch.undo()
    expected = _output(vitfast.load(bases["swin"]), x)
    monkeypatch.setattr(ckpt, "build_timm", no_meta)
    monkeypatch.setattr("vitfast.io._rebuild.build_timm", no_meta)
    assert torch.equal(_output(vitfast.load(bases["swin"]), x), expected)  # an intact file loads through the fallback

    def wide(config):
        block = next(c for c in config["modules"].values() if c["kind"] == "swin_block")
        block["mlp"]["features"] = block["dim"] = 16000

    bad = _edit_config(bases["swin"], tmp_path / "wide.safetensors", wide, resign=True)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"wide\.safetensors: tensors do not match the config .*expected shape \[16000"):
        vitfast.load(bad)
    assert time.perf_counter() - t0 < 2.0


def test_train_time_files_are_bounded_by_the_file_too(tmp_path):
    """`load_trainable` builds the train-time model from its description: a depth or a width the file's tensors do not
    bear out is refused before the real build, naming the file and the field."""
    import timm

    from vitfast.io.trainable import load_trainable, save_trainable

    torch.manual_seed(0)
    vit = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5).eval()
    path = tmp_path / "train.safetensors"
    save_trainable(vitfast.convert.from_timm(vit, channel_idle=0.75), path)
    model, _ = load_trainable(path)  # intact: loads as before
    meta, tensors = _read(str(path))

    def edited(name, change):
        desc = json.loads(meta["config"])
        change(desc)
        return _write(tmp_path / name, dict(meta, config=json.dumps(desc)), tensors)

    deep = edited("deep.safetensors", lambda d: d["architecture"]["kwargs"].update(depth=10**6))
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"deep\.safetensors: config architecture\.kwargs\.depth: expected 3 \(the "
                                         r"blocks the file stores tensors for\), got 1000000"):
        load_trainable(deep)
    wide = edited("wide.safetensors", lambda d: d["architecture"]["kwargs"].update(embed_dim=4096, num_heads=1))
    with pytest.raises(ValueError, match=r"wide\.safetensors'? do not match the model it describes .*expected shape "
                                         r"\[4096, 4096\], got \[32, 32\]"):
        load_trainable(wide)
    assert time.perf_counter() - t0 < 3.0
