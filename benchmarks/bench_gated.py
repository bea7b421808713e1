"""Benchmark of the USDC gated sub-block ops `gated_mhsa` / `gated_ffn` (kernels/gated.py on CUDA, the C++ ops on
CPU): providers × sub-block × gate open/closed × batch, at the DeiT-S block shape.

Providers (the baseline is imported from vitfast.reference, the code the tests trust):
  op       torch.ops.vitfast.gated_mhsa / gated_ffn: on CPU the impl reads the flag, then runs the C++ ops or copies
           x; on CUDA the Triton kernels read the device flag and return early (the last one writes out = x)
  eager    vitfast.reference.gated_mhsa / gated_ffn on the same device (computes, then selects on the device)
  triton   the op on CUDA tensors (skipped without a GPU), synchronised inside the timed call
  eager_cuda  the reference on CUDA, synchronised

FLOPs are the open sub-block's (MHSA: qkv + scores + P·V + proj; FFN: channel-idle θ = 0.75), so a closed gate's
"GFLOP/s" reads as the speed-up a skip buys.  The DeiT-S block and model tables (eager and CUDA-graph replays,
gated vs ungated vs compute + gate_select) are in bench_batch_gate.py.

    .venv/bin/python -m pytest benchmarks/bench_gated.py -k "t1"
"""
from __future__ import annotations

import pytest
import torch

import vitfast
from harness import run_case
from shapes import VIT_SHAPES, attention_flops, channel_idle_dims, channel_idle_ffn_flops, linear_flops
from vitfast import reference

SHAPE = VIT_SHAPES["deit_small"]
THETA = 0.75
PROVIDERS = ["op", "eager", "triton", "eager_cuda"]


def make_args(sub_block, gate_open, batch, device):
    g = torch.Generator().manual_seed(0)
    c, rows = SHAPE.width, batch * SHAPE.tokens

    def rand(*size):
        return ((torch.rand(*size, generator=g) * 2 - 1) / c**0.5).to(device)

    x = torch.randn(batch, SHAPE.tokens, c, generator=g).to(device)
    gate = torch.tensor([1.0 if gate_open else 0.0] * 2, device=device)
    if sub_block == "mhsa":
        args = (gate, 0, x, 1e-6, rand(3 * c, c), rand(3 * c), SHAPE.heads, rand(c, c), rand(c))
        flops = linear_flops(c, 3 * c, rows) + attention_flops(SHAPE, batch) + linear_flops(c, c, rows)
    else:
        active, linear = channel_idle_dims(SHAPE, THETA)
        args = (gate, 1, x, 1e-6, rand(active + linear, c), rand(active + linear), rand(c, active), rand(c), True)
        flops = channel_idle_ffn_flops(SHAPE, THETA, batch)
    return args, flops


def provider_fn(provider, sub_block):
    if provider in ("op", "triton"):
        if provider == "op" and not vitfast.ops.extension_loaded():
            pytest.fail("vitfast._C is not built: the op provider would silently measure the reference")
        fn = getattr(torch.ops.vitfast, f"gated_{sub_block}")
    else:
        fn = getattr(reference, f"gated_{sub_block}")
    if provider in ("triton", "eager_cuda"):
        def synced(*args):
            out = fn(*args)
            torch.cuda.synchronize()
            return out
        return synced
    return fn


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("gate_open", [True, False], ids=["open", "closed"])
@pytest.mark.parametrize("sub_block", ["mhsa", "ffn"])
def test_gated(benchmark, sub_block, gate_open, batch, threads, provider):
    cuda = provider in ("triton", "eager_cuda")
    if cuda and not torch.cuda.is_available():
        pytest.skip("CUDA provider without a GPU")
    if cuda and threads != 1:
        pytest.skip("host thread count does not apply to the CUDA providers")
    args, flops = make_args(sub_block, gate_open, batch, "cuda" if cuda else "cpu")
    case = (SHAPE.name, sub_block, "open" if gate_open else "closed", f"b{batch}", f"t{threads}")
    run_case(benchmark, provider_fn(provider, sub_block), args, case, provider, flops, threads)
