"""Benchmark of `channel_idle_ffn_int8` against the fp32 `channel_idle_ffn` it replaces in an int8 model
(`vitfast.quantize`): RePa-DeiT-S/B FFNs (θ = 0.75), × batch × threads.  Providers and the summary's columns as in
benchmarks/bench_linear_int8.py (cpp = the int8 op; "vs eager" = vs the fp32 C++ op).

    .venv/bin/python -m pytest benchmarks/bench_channel_idle_ffn_int8.py -k "deit_small and b1 and t1"
"""
from __future__ import annotations

import pytest

from bench_linear_int8 import PROVIDERS, run_int8_case


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("shape_name", ["deit_small", "deit_base"])
def test_channel_idle_ffn_int8(benchmark, shape_name, batch, threads, provider):
    run_int8_case(benchmark, shape_name, "ffn", batch, threads, provider)
