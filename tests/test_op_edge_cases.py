"""Edge cases of every op's arguments, table-driven: `vitfast.ops.<op>` accepts and refuses what
`vitfast.reference.<op>` does, with the same message; the impls behind the dispatcher (C++ CPU, fake/meta) say the
same for the values the dispatcher hands them unchanged; `gate_select`'s autograd formula; the Python impls record
no autograd of their own (opcheck with inputs that require grad).

Scalars the dispatcher converts before any impl runs (None or 2 for a `bool`, True or np.float32(2.0) for an `int`,
a one-element tensor for a `float`) reach no impl as given: only the Python entry can refuse them, and it must
(vitfast/ops/_spec.py).  Direct `torch.ops.vitfast.<op>` calls keep the dispatcher's conversion.
"""
import numpy as np
import pytest
import torch
from helpers import make_xwx_args

import vitfast
from vitfast import reference
from vitfast.ops import SCHEMAS

pytestmark = pytest.mark.usefixtures("one_thread")


def _uni(*shape, fan_in):
    return (torch.rand(*shape) * 2 - 1) / max(fan_in, 1) ** 0.5


def _ffn(c, active):
    """channel_idle_ffn weights with a linear path: w_in [A + C, C], b_in, w_out [C, A], b_out."""
    return [_uni(active + c, c, fan_in=c), _uni(active + c, fan_in=c), _uni(c, active, fan_in=active),
            _uni(c, fan_in=active)]


def _good_args(name):
    """Small valid arguments of op `name`, every optional given (each case replaces one)."""
    x = torch.randn(2, 5, 16)
    if name == "linear":
        return [x, _uni(8, 16, fan_in=16), _uni(8, fan_in=16), torch.randn(2, 5, 8)]
    if name == "layer_norm":
        return [x, torch.rand(16) + 0.5, torch.randn(16), 1e-5]
    if name in ("attention", "attention_int8", "attention_bf16"):
        return [torch.randn(2, 5, 24), 2, 0.4]
    if name == "channel_idle_ffn":
        return [x, *_ffn(16, 32), torch.randn(2, 5, 16)]
    if name == "dwconv_attention":
        return [torch.randn(2, 5, 16), _uni(8, 16, fan_in=16), _uni(8, fan_in=16), torch.randn(8, 3, 3) / 3,
                _uni(16, 8, fan_in=8), _uni(16, fan_in=8), 2, 2, torch.randn(2, 5, 16)]
    if name == "xwx_attention":
        return make_xwx_args(2, 5, 16, 2, 4, 8)
    if name == "dwconv_heads":  # one prefix token, then a 2 × 2 grid
        return [torch.randn(2, 5, 8), torch.randn(8, 3, 3) / 3, 2, 2]
    if name in ("xwx_heads", "xwx_heads_int8", "xwx_heads_bf16"):  # the full form with a key bias: per head C + 2 + D = 26 columns
        return [torch.randn(2, 5, 52), x, 2, 8]
    if name == "batch_gate":
        return [x, _uni(8, 16, fan_in=16), _uni(8, fan_in=16), _uni(2, 8, fan_in=8), _uni(2, fan_in=8), True,
                "gelu", 1e-5]
    if name == "gate_select":
        return [torch.tensor([1.0, 0.0]), 1, torch.randn(2, 5), torch.randn(2, 5)]
    if name == "gated_mhsa":
        return [torch.tensor([1.0, 0.0]), 0, x, 1e-6, _uni(48, 16, fan_in=16), _uni(48, fan_in=16), 2,
                _uni(16, 16, fan_in=16), _uni(16, fan_in=16)]
    if name == "gated_ffn":
        return [torch.tensor([0.0, 1.0]), 1, x, 1e-6, *_ffn(16, 32), True]
    if name == "vit_block":
        return [x, 1e-6, _uni(48, 16, fan_in=16), _uni(48, fan_in=16), 2, _uni(16, 16, fan_in=16),
                _uni(16, fan_in=16), 1e-5, *_ffn(16, 32), True]
    if name == "linear_int8":
        return [x, torch.randint(-127, 128, (8, 16), dtype=torch.int8), torch.rand(8) / 100, _uni(8, fan_in=16),
                torch.randn(2, 5, 8), torch.rand(16) + 0.5, 0.05]
    if name == "channel_idle_ffn_int8":
        return [x, torch.randint(-127, 128, (48, 16), dtype=torch.int8), torch.rand(48) / 100, _uni(48, fan_in=16),
                torch.randint(-127, 128, (16, 32), dtype=torch.int8), torch.rand(16) / 100, _uni(16, fan_in=32),
                torch.randn(2, 5, 16), torch.rand(16) + 0.5, torch.rand(32) + 0.5, 0.05, 0.02]
    raise KeyError(name)


def _position(name, arg):
    return [a.name for a in getattr(torch.ops.vitfast, name).default._schema.arguments].index(arg)


def _schema_type(name, arg):
    return str(getattr(torch.ops.vitfast, name).default._schema.arguments[_position(name, arg)].type)


def _with(name, arg, value):
    args = _good_args(name)
    args[_position(name, arg)] = value
    return args


# (op, argument, bad value): every Optional and scalar argument of every op, with the values a caller gets wrong.
_BOOLS = [None, 0, 1, 2, 0.5, "yes", np.bool_(True), torch.tensor(True)]
_INTS = [None, True, 2.0, "2", np.float32(2.0), torch.tensor(2)]
_FLOATS = [None, True, "small", torch.tensor(1e-5), 10**400]
BAD = [
    *[("linear", a, v) for a in ("bias", "residual") for v in (1.0, [1.0], True)],
    ("linear", "weight", None),
    ("layer_norm", "weight", 1.0), ("layer_norm", "bias", [0.0]),
    *[("layer_norm", "eps", v) for v in (*_FLOATS, -1.0, float("nan"), float("inf"))],
    *[(op, "num_heads", v) for op in ("attention", "attention_int8", "attention_bf16")
      for v in (*_INTS, 0, -1, 5, 2**70)],
    *[(op, "scale", v) for op in ("attention", "attention_int8", "attention_bf16")
      for v in (True, "a", torch.tensor(0.5), float("inf"), float("nan"))],
    *[("channel_idle_ffn", a, v) for a in ("b_in", "b_out", "residual") for v in (1.0, True)],
    *[("dwconv_attention", a, v) for a in ("grid_h", "grid_w") for v in (*_INTS, 0, 3)],
    *[("dwconv_attention", a, v) for a in ("b_v", "b_o", "residual") for v in (0.0, "a")],
    *[("xwx_attention", a, v) for a in ("w_k", "key_bias", "b_o", "residual") for v in (1.0, [0.0])],
    *[(op, "x", v) for op in ("xwx_heads", "xwx_heads_int8", "xwx_heads_bf16") for v in (1.0, [0.0])],
    *[("dwconv_heads", a, v) for a in ("grid_h", "grid_w") for v in (*_INTS, 0, 3)],
    ("dwconv_heads", "kernel", None),
    *[(op, a, v) for op in ("xwx_heads", "xwx_heads_int8", "xwx_heads_bf16") for a in ("num_heads", "value_dim")
      for v in (*_INTS, 0, -1, 2**70)],
    *[("batch_gate", a, v) for a in ("b1", "w2", "b2") for v in (1.0, [[1.0]])],
    *[("batch_gate", "layer_norm", v) for v in _BOOLS],
    *[("batch_gate", "act", v) for v in (None, "tanh", 1)],
    *[("batch_gate", "eps", v) for v in (*_FLOATS, 0.0, -1.0, float("nan"))],
    ("gate_select", "gate", None), ("gate_select", "gate", torch.ones(2, 2)), ("gate_select", "taken", 1.0),
    *[("gate_select", "index", v) for v in (*_INTS, 2, -1, 2**70)],
    *[("gated_mhsa", "index", v) for v in (True, 2.0, 2)],
    *[("gated_mhsa", "norm_eps", v) for v in (True, "x", torch.tensor(1e-6), -1.0, float("inf"), float("nan"))],
    *[("gated_mhsa", "num_heads", v) for v in (True, 2.0, 0, 5)],
    *[("gated_mhsa", a, v) for a in ("b_qkv", "b_proj") for v in (1.0, [0.0])],
    *[("gated_ffn", "residual", v) for v in _BOOLS],
    *[("gated_ffn", "norm_eps", v) for v in (True, "x", -1.0, float("inf"))],
    *[("gated_ffn", a, v) for a in ("b_in", "b_out") for v in (1.0, [0.0])],
    *[("vit_block", "ffn_residual", v) for v in _BOOLS],
    *[("vit_block", a, v) for a in ("norm1_eps", "ffn_norm_eps") for v in (True, "a", -1.0, float("inf"))],
    ("vit_block", "norm1_eps", None),
    *[("vit_block", "num_heads", v) for v in (True, 2.0, 0, 5)],
    *[("vit_block", a, v) for a in ("b_qkv", "b_proj", "b_in", "b_out") for v in (1.0, [0.0])],
    *[("linear_int8", a, v) for a in ("bias", "residual", "smooth") for v in (1.0, [1.0], True)],
    *[("linear_int8", "act_scale", v) for v in (*_FLOATS, -1.0, float("nan"), float("inf"))],
    ("linear_int8", "qweight", None), ("linear_int8", "w_scale", torch.ones(8, dtype=torch.float64)),
    *[("channel_idle_ffn_int8", a, v) for a in ("b_in", "b_out", "residual", "smooth_in", "smooth_out")
      for v in (1.0, True)],
    *[("channel_idle_ffn_int8", a, v) for a in ("act_scale_in", "act_scale_out") for v in (None, True, -1.0)],
    ("channel_idle_ffn_int8", "qw_out", torch.zeros(16, 32)),
]

# (op, argument, value) the reference accepts although not of the schema's plain type: the entry must accept them
# too, with the reference's result.
GOOD = [
    ("layer_norm", "eps", 1), ("layer_norm", "eps", np.float32(1e-5)), ("layer_norm", "eps", 0.0),
    ("attention", "num_heads", np.int64(2)), ("attention", "scale", None), ("attention", "scale", 1),
    ("attention", "scale", np.float32(0.5)),
    ("attention_int8", "num_heads", np.int64(2)), ("attention_int8", "scale", None), ("attention_int8", "scale", 1),
    ("attention_int8", "scale", np.float32(0.5)),
    ("attention_bf16", "num_heads", np.int64(2)), ("attention_bf16", "scale", None), ("attention_bf16", "scale", 1),
    ("attention_bf16", "scale", np.float32(0.5)),
    ("dwconv_attention", "grid_h", np.int64(2)), ("dwconv_attention", "residual", None),
    ("batch_gate", "eps", np.float32(1e-5)), ("batch_gate", "eps", 1), ("batch_gate", "layer_norm", False),
    ("gate_select", "index", np.int64(0)),
    ("dwconv_heads", "grid_h", np.int64(2)),
    *[(op, a, v) for op in ("xwx_heads", "xwx_heads_int8", "xwx_heads_bf16")
      for a, v in (("x", None), ("num_heads", np.int64(2)), ("value_dim", np.int64(8)))],
    ("gated_mhsa", "norm_eps", None), ("gated_mhsa", "norm_eps", 0.0), ("gated_mhsa", "norm_eps", np.float32(1e-6)),
    ("gated_mhsa", "num_heads", np.int64(2)), ("gated_mhsa", "index", np.int64(1)),
    ("gated_ffn", "residual", False), ("gated_ffn", "norm_eps", None), ("gated_ffn", "norm_eps", 0.0),
    ("vit_block", "ffn_residual", False), ("vit_block", "ffn_norm_eps", None), ("vit_block", "norm1_eps", 0),
    ("vit_block", "norm1_eps", np.float32(1e-6)), ("vit_block", "num_heads", np.int64(2)),
    ("linear_int8", "act_scale", 0), ("linear_int8", "act_scale", np.float32(0.05)), ("linear_int8", "smooth", None),
    ("channel_idle_ffn_int8", "act_scale_in", 1), ("channel_idle_ffn_int8", "act_scale_out", np.float32(0.0)),
]

# The Python type the dispatcher hands an impl unchanged, per schema type (anything else it converts or refuses).
_PLAIN = {"bool": (bool,), "int": (int,), "float": (float,), "Optional[float]": (float, type(None)), "str": (str,),
          "Tensor": (torch.Tensor, type(None)), "Optional[Tensor]": (torch.Tensor, type(None))}


def _passed_unchanged(name, arg, value):
    plain = _PLAIN[_schema_type(name, arg)]
    if type(value) is int and not -2**63 <= value < 2**63:
        return False  # no int64: the dispatcher refuses it
    return type(value) in plain or (torch.Tensor in plain and isinstance(value, torch.Tensor))


def _raised(call):
    try:
        call()
    except (TypeError, ValueError, RuntimeError) as e:
        return e
    return None


def _gist(error):
    """Exception type and message up to its ", got ...": the C++ checks print a float as C++ does (-1 for -1.0)."""
    return type(error), str(error).split(", got")[0]


def _ids(cases):
    return [f"{op}-{arg}-{type(v).__name__}:{str(v)[:12]}" for op, arg, v in cases]


def test_the_tables_cover_every_op():
    assert {c[0] for c in BAD} == set(SCHEMAS) == {c[0] for c in GOOD} | {"linear", "channel_idle_ffn", "xwx_attention"}


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("name, arg, value", BAD, ids=_ids(BAD))
def test_a_bad_argument_is_refused_by_the_entry_as_by_the_reference(name, arg, value, backend):
    args = _with(name, arg, value)
    expected = _raised(lambda: getattr(reference, name)(*args))
    assert isinstance(expected, (TypeError, ValueError)), f"the reference took {arg}={value!r}"
    kwargs = dict(zip([a.name for a in getattr(torch.ops.vitfast, name).default._schema.arguments], args))
    previous = vitfast.get_backend()
    vitfast.set_backend(backend)
    try:
        got = _raised(lambda: getattr(vitfast.ops, name)(*args))
        by_keyword = _raised(lambda: getattr(vitfast.ops, name)(**kwargs))
    finally:
        vitfast.set_backend(previous)
    assert got is not None, f"vitfast.ops.{name} took {arg}={value!r}; the reference says {expected}"
    assert _gist(got) == _gist(expected), f"{got!r} != {expected!r}"
    assert by_keyword is not None and _gist(by_keyword) == _gist(expected)


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("name, arg, value", [c for c in BAD if _passed_unchanged(*c)],
                         ids=_ids([c for c in BAD if _passed_unchanged(*c)]))
def test_the_impls_refuse_what_reaches_them_alike(name, arg, value, device):
    """C++ CPU kernels (the reference for gate_select, Python for the gated ops) and the fake impl."""
    args = _with(name, arg, value)
    expected = _raised(lambda: getattr(reference, name)(*args))
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    got = _raised(lambda: getattr(torch.ops.vitfast, name)(*args))
    assert got is not None and _gist(got) == _gist(expected), f"{got!r} != {expected!r}"


@pytest.mark.parametrize("name, arg, value", GOOD, ids=_ids(GOOD))
def test_a_value_the_reference_takes_the_entry_takes(name, arg, value, tol):
    args = _with(name, arg, value)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(getattr(vitfast.ops, name)(*args), getattr(reference, name)(*args), atol=atol,
                               rtol=rtol)


@pytest.mark.parametrize("name", ["gated_ffn", "vit_block"])
def test_a_bool_flag_takes_only_a_bool(name):
    """vit_block took an int for ffn_residual where gated_ffn refused one for residual: both refuse it now, and
    the entries refuse None and 2, which the dispatcher turned into False and True."""
    arg = "residual" if name == "gated_ffn" else "ffn_residual"
    for value in (None, 1, 2):
        with pytest.raises(ValueError, match=rf"^{arg}: expected a bool, got {value!r}$"):
            getattr(vitfast.ops, name)(*_with(name, arg, value))


def test_gated_norm_eps_follows_the_layer_norm_rule():
    """inf passed the gated check (> 0) and reached the LayerNorm op, refused there as "eps"; 0 was refused where
    the ungated block's norms take it."""
    for name in ("gated_mhsa", "gated_ffn"):
        with pytest.raises(ValueError, match=r"^norm_eps: expected None \(no LayerNorm\) or a finite number >= 0, "
                                             r"got inf$"):
            getattr(vitfast.ops, name)(*_with(name, "norm_eps", float("inf")))


# --------------------------------------------------------------------------------------------- gate_select grad
def _select_inputs(dtype=torch.float32):
    return (torch.randn(2, 5, dtype=dtype, requires_grad=True), torch.randn(2, 5, dtype=dtype, requires_grad=True))


@pytest.mark.parametrize("index", [0, 1], ids=["open", "closed"])
def test_gate_select_opcheck_with_grad_inputs(index):
    gate = torch.tensor([1.0, 0.0])
    torch.library.opcheck(torch.ops.vitfast.gate_select.default, (gate, index, *_select_inputs()))


@pytest.mark.parametrize("index", [0, 1], ids=["open", "closed"])
def test_gate_select_gradcheck_float64(index):
    gate = torch.tensor([1.0, 0.0], dtype=torch.float64)

    def select(taken, skipped):
        return torch.ops.vitfast.gate_select(gate, index, taken, skipped)

    inputs = _select_inputs(torch.float64)
    assert torch.autograd.gradcheck(select, inputs)
    assert torch.autograd.gradgradcheck(select, inputs)


@pytest.mark.parametrize("index", [0, 1], ids=["open", "closed"])
@pytest.mark.parametrize("entry", ["op", "functional"])
def test_gate_select_gradient_is_the_references(index, entry):
    gate = torch.tensor([1.0, 0.0], requires_grad=True)  # a decision: no gradient, as through the comparison
    taken, skipped = _select_inputs()
    grad_out = torch.randn(2, 5)
    select = torch.ops.vitfast.gate_select if entry == "op" else vitfast.ops.gate_select
    got = torch.autograd.grad(select(gate, index, taken, skipped), [gate, taken, skipped], grad_out,
                              allow_unused=True)
    expected = torch.autograd.grad(reference.gate_select(gate, index, taken, skipped), [gate, taken, skipped],
                                   grad_out, allow_unused=True)
    assert got[0] is None and expected[0] is None
    for g, e in zip(got[1:], expected[1:]):
        torch.testing.assert_close(g, e, atol=0, rtol=0)


def test_gate_select_gradient_under_autocast_reaches_low_precision_leaves():
    """The autocast rule casts taken/skipped to fp32 before the op (the gate keeps its dtype): the gradient flows
    back through that cast to bf16 leaves."""
    gate = torch.tensor([0.0, 1.0], dtype=torch.float64)
    taken, skipped = (t.detach().bfloat16().requires_grad_() for t in _select_inputs())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = vitfast.ops.gate_select(gate, 0, taken, skipped)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert taken.grad.dtype == torch.bfloat16
    assert torch.equal(taken.grad.float(), torch.zeros(2, 5)) and torch.equal(skipped.grad.float(), torch.ones(2, 5))


def test_gate_select_gradient_keeps_the_forward_decision():
    """The decision read at the forward routes the gradient, even when the gate buffer is refilled in place before
    the backward (a replayed CUDA graph refills it every batch)."""
    gate = torch.tensor([1.0, 0.0])
    taken, skipped = _select_inputs()
    out = torch.ops.vitfast.gate_select(gate, 0, taken, skipped)
    gate.zero_()
    out.sum().backward()
    assert torch.equal(taken.grad, torch.ones(2, 5)) and torch.equal(skipped.grad, torch.zeros(2, 5))


# ------------------------------------------------------------------------------- the Python impls and autograd
@pytest.mark.filterwarnings("ignore:.*an autograd kernel was not registered")  # opcheck backprops through the op
@pytest.mark.parametrize("index", [0, 1], ids=["open", "closed"])
@pytest.mark.parametrize("name", ["gated_mhsa", "gated_ffn"])
def test_gated_ops_opcheck_with_grad_inputs(name, index):
    """A closed gate's copy of x recorded CloneBackward inside the CPU impl (an open one recorded nothing): opcheck's
    autograd-registration test failed.  The Python impls now run below autograd, as the C++ ones do."""
    args = _good_args(name)
    args[0] = torch.tensor([1.0, 0.0])
    args[1] = index
    args = [a.requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point() and i > 0 else a
            for i, a in enumerate(args)]
    torch.library.opcheck(getattr(torch.ops.vitfast, name).default, tuple(args))
