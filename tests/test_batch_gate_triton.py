"""Parity of the Triton USDC gate kernels (`kernels/batch_gate.py`) with `vitfast.reference`.

Natively on CUDA when a GPU is present, otherwise through the Triton interpreter (conftest.py).  The decision
is a threshold, so parity is checked on the fp32 logits before it (`batch_gate_logits_triton`) and on the
decisions with the logits pushed away from 0 (a tie within rounding may go either way).
"""

import pytest
import torch

from helpers import triton_test_device
from vitfast.kernels.batch_gate import batch_gate_logits_triton, batch_gate_triton, gate_select_triton
from vitfast.reference import batch_gate, batch_gate_logits, gate_select

pytestmark = pytest.mark.triton

DEVICE, INTERPRET = triton_test_device()


def make_args(batch, tokens, channels, hidden, *, two_layers=True, layer_norm=False, act="none", bias=True,
              dtype=torch.float32, margin=0.25):
    """Random gate-network arguments (nn.Linear scales); b2 (or b1 for one layer) shifted so that both logits
    are at least `margin` away from the threshold."""
    def uni(*shape, fan_in):
        return (torch.rand(*shape, device=DEVICE) * 2 - 1) / max(fan_in, 1) ** 0.5

    x = torch.randn(batch, tokens, channels, device=DEVICE) + torch.randn(channels, device=DEVICE)
    hidden = hidden if two_layers else 2
    w1, b1 = uni(hidden, channels, fan_in=channels), uni(hidden, fan_in=channels) if bias else None
    w2 = uni(2, hidden, fan_in=hidden) if two_layers else None
    b2 = uni(2, fan_in=hidden) if two_layers and bias else None
    args = [x, w1, b1, w2, b2, layer_norm, act, 1e-5]
    d = batch_gate_logits(*args)
    target = torch.where(d >= 0, torch.full_like(d, margin), torch.full_like(d, -margin))
    shift = torch.where(d.abs() < margin, target - d, torch.zeros_like(d)).to(DEVICE)
    if two_layers:
        args[4] = (b2 if b2 is not None else torch.zeros(2, device=DEVICE)) + shift
    else:
        args[2] = (b1 if b1 is not None else torch.zeros(2, device=DEVICE)) + shift
    return [a.to(dtype) if isinstance(a, torch.Tensor) else a for a in args]


CASES = [  # (batch, tokens, C, H, two_layers, layer_norm, act)
    (1, 197, 192, 96, True, True, "relu"),   # G0 at ViT-Ti width, batch 1 with the cls token
    (2, 197, 384, 192, True, False, "relu"),  # G1 folded (BN into fc1) at DeiT-S width
    (3, 50, 384, 192, True, True, "gelu"),   # G2
    (2, 17, 384, 2, False, False, "none"),   # G3 / G6: one layer
    (5, 7, 33, 17, True, True, "gelu"),      # odd sizes that break every tile
    (1, 1, 8, 4, True, False, "relu"),       # one token
]


@pytest.mark.parametrize("batch,tokens,c,h,two,ln,act", CASES)
def test_logits_and_decision_parity(batch, tokens, c, h, two, ln, act):
    args = make_args(batch, tokens, c, h, two_layers=two, layer_norm=ln, act=act)
    torch.testing.assert_close(batch_gate_logits_triton(*args), batch_gate_logits(*args), atol=1e-4, rtol=1e-4)
    out = batch_gate_triton(*args)
    assert out.shape == (2,) and out.dtype == torch.float32 and out.device == args[0].device
    torch.testing.assert_close(out, batch_gate(*args), atol=0, rtol=0)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_optional_biases(bias):
    args = make_args(2, 9, 24, 12, layer_norm=True, act="gelu", bias=bias)
    torch.testing.assert_close(batch_gate_logits_triton(*args), batch_gate_logits(*args), atol=1e-4, rtol=1e-4)


def test_many_rows_use_several_chunks():
    # B·N large enough that the token pass is split into many row chunks (the partial-sum reduction).
    args = make_args(8, 197, 64, 32, act="relu")
    torch.testing.assert_close(batch_gate_logits_triton(*args), batch_gate_logits(*args), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_low_precision_inputs(dtype):
    if DEVICE == "cpu" and dtype == torch.bfloat16:
        pytest.skip("the Triton interpreter has no bf16 (numpy)")
    args = make_args(2, 50, 192, 96, layer_norm=True, act="relu", dtype=dtype, margin=0.5)
    # Both pool in fp32 from the same low-precision inputs: only summation order differs.
    torch.testing.assert_close(batch_gate_logits_triton(*args), batch_gate_logits(*args), atol=2e-3, rtol=2e-3)
    out = batch_gate_triton(*args)
    assert out.dtype == dtype
    torch.testing.assert_close(out, batch_gate(*args), atol=0, rtol=0)


@pytest.mark.parametrize("shape", [(2, 197, 384), (1, 5, 7), (3,)])
def test_gate_select(shape):
    taken, skipped = torch.randn(*shape, device=DEVICE), torch.randn(*shape, device=DEVICE)
    for flags in ([1.0, 0.0], [0.0, 1.0]):
        gate = torch.tensor(flags, device=DEVICE)
        for index in (0, 1):
            out = gate_select_triton(gate, index, taken, skipped)
            torch.testing.assert_close(out, gate_select(gate, index, taken, skipped), atol=0, rtol=0)
            assert torch.equal(out, taken if flags[index] else skipped)
    # numpy integer index (the reference takes it) and a dtype the kernel does not copy (torch.where instead)
    import numpy as np

    gate = torch.tensor([1.0, 0.0], device=DEVICE)
    assert torch.equal(gate_select_triton(gate, np.int64(1), taken, skipped), skipped)
    ct, cs = torch.randn(*shape, device=DEVICE, dtype=torch.complex64), torch.randn(*shape, device=DEVICE, dtype=torch.complex64)
    assert torch.equal(gate_select_triton(gate, 0, ct, cs), gate_select(gate, 0, ct, cs))
    # compared in the gate's dtype, as the reference: a float64 1e-300 (0 in fp32) and a NaN are open
    for value in (1e-300, float("nan")):
        gate = torch.tensor([value, 0.0], device=DEVICE, dtype=torch.float64)
        assert torch.equal(gate_select_triton(gate, 0, taken, skipped), gate_select(gate, 0, taken, skipped))
        assert torch.equal(gate_select_triton(gate, 0, taken, skipped), taken)


def test_zero_channels_decide_from_the_biases():
    """C = 0 pools nothing: the head's biases decide, as in the reference (the launcher once divided by zero)."""
    args = [torch.randn(2, 5, 0, device=DEVICE), torch.randn(4, 0, device=DEVICE), torch.randn(4, device=DEVICE),
            torch.randn(2, 4, device=DEVICE), torch.randn(2, device=DEVICE)]
    torch.testing.assert_close(batch_gate_logits_triton(*args), batch_gate_logits(*args))
    assert torch.equal(batch_gate_triton(*args), batch_gate(*args))


def test_bad_arguments_are_refused_like_the_reference():
    x = torch.randn(2, 5, 8, device=DEVICE)
    w1 = torch.randn(4, 8, device=DEVICE)
    for fn in (batch_gate_triton, batch_gate):
        with pytest.raises(ValueError, match=r"w1: expected shape \[H, 8\]"):
            fn(x, torch.randn(4, 7, device=DEVICE), None, torch.randn(2, 4, device=DEVICE))
        with pytest.raises(ValueError, match=r"w2: expected shape \[2, 4\]"):
            fn(x, w1, None, torch.randn(3, 4, device=DEVICE))
        with pytest.raises(ValueError, match="act: expected one of"):
            fn(x, w1, None, torch.randn(2, 4, device=DEVICE), None, False, "tanh")
        with pytest.raises(ValueError, match=r"x: expected 3-D"):
            fn(x[0], w1, None, torch.randn(2, 4, device=DEVICE))
    with pytest.raises(ValueError, match="index: expected an int in"):
        gate_select_triton(torch.ones(2, device=DEVICE), 2, x, x)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU")
def test_cuda_graph_replays_follow_the_device_decision():
    # The decision is never read on the host: one captured graph gives each input's own decision.
    args = make_args(2, 50, 64, 32, act="relu")
    x_static = args[0].clone()
    other = -x_static * 3 + 1
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            batch_gate_triton(x_static, *args[1:])
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decision = batch_gate_triton(x_static, *args[1:])
        selected = gate_select_triton(decision, 0, x_static, x_static * 0)
    for inp in (args[0], other):
        x_static.copy_(inp)
        graph.replay()
        torch.cuda.synchronize()
        expect = batch_gate(inp, *args[1:])
        torch.testing.assert_close(decision, expect, atol=0, rtol=0)
        torch.testing.assert_close(selected, inp if expect[0] else inp * 0, atol=0, rtol=0)
