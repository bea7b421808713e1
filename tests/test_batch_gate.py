"""The CPU side of the USDC gate ops: `torch.ops.vitfast.batch_gate` (C++) and `gate_select` (reference on CPU)
against `vitfast.reference`, plus the op contract (schema, fake impl, opcheck, torch.compile, errors).

The decision is a threshold: the logits are pushed at least `margin` away from 0 before comparing decisions
(a tie within rounding may go either way); the C++ logits themselves are checked by csrc/tests/test_batch_gate.cpp.
"""
import pytest
import torch

import vitfast
from vitfast import reference

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

op = torch.ops.vitfast.batch_gate
pytestmark = pytest.mark.usefixtures("one_thread")


def make_args(batch, tokens, channels, hidden, *, two_layers=True, layer_norm=False, act="none", bias=True,
              dtype=torch.float32, margin=0.05):
    x = torch.randn(batch, tokens, channels) + torch.randn(channels)
    hidden = hidden if two_layers else 2
    w1 = torch.randn(hidden, channels) / channels**0.5
    b1 = torch.randn(hidden) * 0.1 if bias else None
    w2 = torch.randn(2, hidden) / hidden**0.5 if two_layers else None
    b2 = torch.randn(2) * 0.1 if two_layers and bias else None
    args = [x, w1, b1, w2, b2, layer_norm, act, 1e-5]
    d = reference.batch_gate_logits(*args)
    target = torch.where(d >= 0, torch.full_like(d, margin), torch.full_like(d, -margin))
    shift = torch.where(d.abs() < margin, target - d, torch.zeros_like(d))
    slot = 4 if two_layers else 2
    args[slot] = (args[slot] if args[slot] is not None else torch.zeros(2)) + shift
    return [a.to(dtype) if isinstance(a, torch.Tensor) else a for a in args]


CASES = [  # (batch, tokens, C, H, two_layers, layer_norm, act)
    (1, 197, 192, 96, True, True, "relu"),
    (2, 197, 384, 192, True, False, "relu"),
    (3, 50, 384, 192, True, True, "gelu"),
    (2, 17, 384, 2, False, False, "none"),
    (5, 7, 33, 17, True, True, "gelu"),
    (1, 1, 8, 4, True, False, "none"),
    (8, 197, 768, 384, True, True, "relu"),
]


@pytest.mark.parametrize("batch,tokens,c,h,two,ln,act", CASES)
def test_cpp_decision_parity(batch, tokens, c, h, two, ln, act):
    for seed in range(4):  # several draws: both decisions 0 and 1 occur
        torch.manual_seed(seed)
        args = make_args(batch, tokens, c, h, two_layers=two, layer_norm=ln, act=act)
        out = op(*args)
        assert out.shape == (2,) and out.dtype == torch.float32
        torch.testing.assert_close(out, reference.batch_gate(*args), atol=0, rtol=0)


def test_decisions_cover_both_values():
    seen = set()
    for seed in range(8):
        torch.manual_seed(seed)
        seen.update(op(*make_args(2, 9, 16, 8, act="relu")).tolist())
    assert seen == {0.0, 1.0}


def test_decision_is_the_batch_mean_gate():
    # The batch decision depends on the mean over all samples: permuting the samples or tokens changes nothing,
    # and one sample repeated B times decides like that sample alone.
    args = make_args(4, 11, 24, 12, layer_norm=True, act="gelu")
    x = args[0]
    perm = x[torch.randperm(4)][:, torch.randperm(11)]
    torch.testing.assert_close(op(perm, *args[1:]), op(x, *args[1:]), atol=0, rtol=0)
    one = x[:1]
    torch.testing.assert_close(op(one.expand(5, -1, -1).contiguous(), *args[1:]), op(one, *args[1:]), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_low_precision(dtype):
    args = make_args(2, 50, 192, 96, layer_norm=True, act="relu", dtype=dtype, margin=0.3)
    out = op(*args)
    assert out.dtype == dtype
    torch.testing.assert_close(out, reference.batch_gate(*args), atol=0, rtol=0)


def test_non_contiguous_input():
    args = make_args(2, 20, 32, 16, act="relu")
    wide = torch.randn(2, 20, 64)
    wide[..., ::2] = args[0]
    x = wide[..., ::2]
    assert not x.is_contiguous()
    torch.testing.assert_close(op(x, *args[1:]), reference.batch_gate(x, *args[1:]), atol=0, rtol=0)


@pytest.mark.parametrize("mutate, argname", [
    (lambda a: a.__setitem__(0, a[0][0]), "x"),
    (lambda a: a.__setitem__(0, a[0].int()), "x"),
    (lambda a: a.__setitem__(1, a[1][:, :5]), "w1"),
    (lambda a: a.__setitem__(2, a[2][:3]), "b1"),
    (lambda a: a.__setitem__(3, a[3][:1]), "w2"),
    (lambda a: a.__setitem__(4, a[4][:1]), "b2"),
    (lambda a: a.__setitem__(6, "tanh"), "act"),
    (lambda a: a.__setitem__(1, a[1].double()), "w1"),
])
def test_errors_name_the_argument_in_cpp_and_reference(mutate, argname):
    args = make_args(2, 5, 8, 4, act="relu")
    mutate(args)
    for fn in (op, reference.batch_gate):
        with pytest.raises((ValueError, TypeError), match=rf"{argname}"):
            fn(*args)


def test_one_layer_network_refuses_norm_and_act():
    x = torch.randn(2, 3, 8)
    for fn in (op, reference.batch_gate):
        # an empty hidden layer: the C++ kernel read its empty w2 as "no second layer" and returned garbage
        with pytest.raises(ValueError, match=r"w1: expected at least one hidden unit, shape \[H >= 1, 8\], got \[0, 8\]"):
            fn(x, torch.randn(0, 8), None, torch.randn(2, 0), torch.tensor([1.0, -1.0]))
        with pytest.raises(ValueError, match="w1: expected shape \\[2, 8\\]"):
            fn(x, torch.randn(3, 8), None)
        with pytest.raises(ValueError, match="layer_norm, act"):
            fn(x, torch.randn(2, 8), None, None, None, True)


def test_schema_fake_and_meta():
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert "batch_gate(Tensor x, Tensor w1, Tensor? b1" in str(op.default._schema)
    with FakeTensorMode():
        args = [torch.randn(2, 5, 8), torch.randn(4, 8), None, torch.randn(2, 4), None, False, "relu", 1e-5]
        out = op(*args)
        assert out.shape == (2,)
        with pytest.raises(ValueError, match="w2"):
            op(args[0], args[1], None, torch.randn(2, 3))
    out = torch.ops.vitfast.gate_select(torch.ones(2, device="meta"), 1, torch.randn(2, 3, device="meta"),
                                        torch.randn(2, 3, device="meta"))
    assert out.shape == (2, 3) and out.device.type == "meta"


def test_opcheck():
    args = tuple(make_args(2, 7, 16, 8, layer_norm=True, act="gelu"))
    torch.library.opcheck(op.default, args)
    gate = torch.tensor([1.0, 0.0])
    torch.library.opcheck(torch.ops.vitfast.gate_select.default, (gate, 1, torch.randn(2, 5), torch.randn(2, 5)))


def test_gate_select_cpu():
    taken, skipped = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    gate = torch.tensor([1.0, 0.0])
    assert torch.equal(torch.ops.vitfast.gate_select(gate, 0, taken, skipped), taken)
    assert torch.equal(torch.ops.vitfast.gate_select(gate, 1, taken, skipped), skipped)
    with pytest.raises(ValueError, match="skipped: expected shape"):
        torch.ops.vitfast.gate_select(gate, 0, taken, skipped[:1])


def test_reference_backend_switch():
    args = make_args(2, 7, 16, 8, act="relu")
    previous = vitfast.get_backend()
    try:
        vitfast.set_backend("reference")
        ref = vitfast.ops.batch_gate(*args)
    finally:
        vitfast.set_backend(previous)
    torch.testing.assert_close(vitfast.ops.batch_gate(*args), ref, atol=0, rtol=0)


@pytest.mark.slow
def test_torch_compile_fullgraph():
    torch._dynamo.reset()
    args = make_args(2, 9, 16, 8, layer_norm=True, act="relu")

    def gated(x):
        d = torch.ops.vitfast.batch_gate(x, *args[1:])
        return torch.ops.vitfast.gate_select(d, 0, x * 2, x) + d[1]

    compiled = torch.compile(gated, fullgraph=True, backend="inductor")
    for x in (args[0], -args[0]):
        torch.testing.assert_close(compiled(x), gated(x), atol=0, rtol=0)
