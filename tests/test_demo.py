"""`vitfast demo`: the whole path end to end on the digits (quick mode: a tiny model, seconds)."""
import re

import pytest
import torch

import vitfast
from vitfast.cli import main
from vitfast.cli.verify import meets_accuracy_targets
from vitfast.demos.demo import run_demo


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    yield
    torch.set_num_threads(old)


def test_quick_demo_report(tmp_path):
    lines = []
    report = run_demo(quick=True, threads=1, out_dir=str(tmp_path), progress=False, log=lines.append)
    assert report["accuracy_equal"] and report["correct_train"] == report["correct_fused"]
    assert report["accuracy_train"] > 0.4  # it really learned (chance is 0.1)
    assert report["max_abs_diff"] < 1e-4 and report["argmax_agreement"] == 1.0
    assert report["params"]["fused"] < report["params"]["train"]
    assert report["flops"]["fused"] < report["flops"]["train"]
    for batch in (1, 64):
        for model in ("train", "fused"):
            lat = report["latency"][batch][model]
            assert 0 < lat["p10_ms"] <= lat["median_ms"] <= lat["p90_ms"]
    # the file on disk is what was compared: loading it again gives the same predictions
    fused = vitfast.load(report["fused_path"])
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), vitfast.load(report["fused_path"])(x))
    text = "\n".join(lines)
    assert "val accuracy" in text and "equal" in text and "MFLOPs / image" in text


def test_demo_command_quick(tmp_path, capsys):
    assert main(["demo", "--quick", "--threads", "1", "--out", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("val accuracy"))
    accs = re.findall(r"(\d\.\d{4}) \((\d+)/(\d+)\)", row)
    assert len(accs) == 2 and accs[0] == accs[1] and row.rstrip().endswith("equal")
    assert (tmp_path / "fused.safetensors").exists() and (tmp_path / "train.safetensors").exists()
    # the int8 copy beside them: loaded back from its file, its accuracy and agreement with fp32 printed
    assert (tmp_path / "int8.safetensors").exists() and "argmax agreement with fp32" in out
    assert re.search(r"int8 \(.*int8\.safetensors: vitfast\.quantize", out)
    # and the verdict on the accuracy targets, computed from the printed figures (met or MISSED, never silent)
    verdict = next(line for line in out.splitlines() if line.startswith("int8 accuracy targets"))
    agreement = float(re.search(r"argmax agreement with fp32 .*?(\d+\.\d+)%", out).group(1)) / 100
    points = float(re.search(r"val accuracy .* ([+-]\d+\.\d+) pt", out).group(1))
    met = meets_accuracy_targets(-points, agreement)
    assert verdict.endswith(": met") if met else "MISSED on this model" in verdict
    # then the flipped images with their fp32 margins (near-ties or not), as many as the agreement says
    flips = out.splitlines()[out.splitlines().index(verdict) + 1]
    n_val = int(accs[0][2])
    n_flips = n_val - round(agreement * n_val)
    assert flips == "no argmax flips" if n_flips == 0 else flips.count("fp32 margin") == min(5, n_flips)


def test_demo_exit_status_when_accuracy_differs(monkeypatch, tmp_path, capsys):
    import vitfast.cli.demo

    fake = {"accuracy_equal": False, "accuracy_train": 0.9, "accuracy_fused": 0.8}
    monkeypatch.setattr(vitfast.cli.demo, "run_demo", lambda **kw: fake)  # where `vitfast demo` looks it up
    assert main(["demo", "--quick", "--out", str(tmp_path)]) == 1
    assert "FAILED" in capsys.readouterr().out


def test_fused_flops_count_every_vitfast_op():
    # θ = 0 with the LayerNorm FFN is timm's function with the same products, so a fused model must count the
    # same FLOPs as its timm source: the qkv/proj linears, attention and the FFN all run on vitfast ops, and an
    # op FlopCounterMode cannot see would make the fused count smaller.
    from timm.models.vision_transformer import VisionTransformer

    from vitfast.measure import flops_per_image

    timm_model = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10).eval()
    fused = vitfast.fuse(vitfast.convert.from_timm(timm_model, channel_idle=0.0, norm="layer").eval())
    assert flops_per_image(fused, (3, 32, 32)) == flops_per_image(timm_model, (3, 32, 32))


def test_measure_latency_burst_times_the_calls_after_the_first(monkeypatch):
    # A fake clock (no real timing): a model's call takes 20 s when the other model ran last (a cold cache) and
    # 2 s otherwise.  One call per round times every call cold; four per round, the median of calls 2-4.
    import types

    import vitfast.measure
    from vitfast.measure import measure_latency

    clock = {"now": 0.0, "last": None, "calls": 0}

    class Model(torch.nn.Module):
        def forward(self, x):
            clock["now"] += 2.0 if clock["last"] is self else 20.0
            clock["last"] = self
            clock["calls"] += 1
            return x

    monkeypatch.setattr(vitfast.measure, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))
    x = torch.zeros(2, 3)
    models = {"a": Model(), "b": Model()}
    cold = measure_latency(models, x, repeats=3, warmup=1)
    assert all(r["median_ms"] == r["p10_ms"] == r["p90_ms"] == 20e3 and r["repeats"] == 3 for r in cold.values())
    clock["calls"] = 0
    hot = measure_latency(models, x, repeats=3, warmup=0, burst=4)
    assert clock["calls"] == 2 * 3 * 4
    assert all(r["median_ms"] == r["p90_ms"] == 2e3 and r["images_per_s"] == 1.0 for r in hot.values())


@pytest.mark.parametrize("burst", [0, -1, 1.5, True, "2"])
def test_measure_latency_rejects_a_bad_burst(burst):
    from vitfast.measure import measure_latency

    with pytest.raises(ValueError, match=r"^burst: expected an int >= 1, got "):
        measure_latency({"m": torch.nn.Identity()}, torch.zeros(1), repeats=1, burst=burst)
