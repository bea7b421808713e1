"""benchmarks/fp32_vs_openvino_parts.py: the block's GEMM shapes at θ = 0.75, the paired timing (a function's own
time wins over the wall clock; the order alternates) and the argument check.  Its ratios are
vitfast.bench.paired_speedups, tested with the bench."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import fp32_vs_openvino_parts as parts


def test_block_shapes_follow_the_fused_channel_idle_block():
    # DeiT-S: 1536 FFN channels, a quarter activated (384) and the idle ones merged into one 384 -> 384 linear.
    assert parts.block_shapes(384) == [("qkv", 384, 1152), ("proj", 384, 384), ("ffn in", 384, 768),
                                       ("ffn out", 384, 384)]
    assert parts.block_shapes(768)[2] == ("ffn in", 768, 1536)


def test_paired_uses_a_returned_time_and_alternates_the_order():
    calls = []

    def own():
        calls.append("own")
        return 0.25  # seconds, as OpenVINO's profile would report

    def wall():
        calls.append("wall")

    times = parts.paired({"own": own, "wall": wall}, rounds=3, calls=2)
    assert times["own"] == [0.25, 0.25, 0.25]  # the returned time, per call
    assert all(0 <= t < 0.25 for t in times["wall"])
    timed = calls[4:]  # after two warm-up calls each
    assert timed == ["own"] * 2 + ["wall"] * 2 + ["wall"] * 2 + ["own"] * 2 + ["own"] * 2 + ["wall"] * 2


def test_rounds_must_be_positive(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fp32_vs_openvino_parts.py", "--rounds", "0"])
    with pytest.raises(SystemExit):
        parts.main()
    assert "--rounds: expected a positive count, got 0" in capsys.readouterr().err
