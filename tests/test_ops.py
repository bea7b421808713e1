"""The op namespace itself: schemas, fake impls, backend switch, and the import contract."""
import os
import subprocess
import sys

import pytest
import torch

import vitfast
from vitfast import reference


def _ffn_args(c=16, active=24, linear=True, batch=2, tokens=5):
    x = torch.randn(batch, tokens, c)
    w_in = torch.randn(active + (c if linear else 0), c) * 0.1
    b_in = torch.randn(w_in.shape[0]) * 0.1
    w_out = torch.randn(c, active) * 0.1
    return x, w_in, b_in, w_out


def test_schema_is_registered():
    op = torch.ops.vitfast.channel_idle_ffn.default
    assert "channel_idle_ffn(Tensor x, Tensor w_in, Tensor? b_in, Tensor w_out" in str(op._schema)


def test_fake_impl_propagates_shape_and_validates():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w_in, b_in, w_out = _ffn_args()
        out = torch.ops.vitfast.channel_idle_ffn(x, w_in, b_in, w_out)
        assert out.shape == (2, 5, 16)
        with pytest.raises(ValueError, match="w_in"):
            torch.ops.vitfast.channel_idle_ffn(x, w_in[:, :8], b_in, w_out)


def test_meta_device_shapes():
    x, w_in, b_in, w_out = (t.to("meta") for t in _ffn_args())
    out = torch.ops.vitfast.channel_idle_ffn(x, w_in, b_in, w_out)
    assert out.device.type == "meta" and out.shape == (2, 5, 16)


def test_reference_backend_switch_gives_reference_result():
    args = _ffn_args()
    expected = reference.channel_idle_ffn(*args)
    previous = vitfast.get_backend()
    try:
        vitfast.set_backend("reference")
        torch.testing.assert_close(vitfast.ops.channel_idle_ffn(*args), expected, rtol=0, atol=0)
        vitfast.set_backend("auto")
        torch.testing.assert_close(vitfast.ops.channel_idle_ffn(*args), expected)
    finally:
        vitfast.set_backend(previous)
    with pytest.raises(ValueError, match="backend"):
        vitfast.set_backend("cuda-magic")


@pytest.mark.parametrize(
    "mutate, argname",
    [
        (lambda a: (a[0].double(), *a[1:]), "x"),
        (lambda a: (a[0], a[1], a[2][:-1], a[3]), "b_in"),
        (lambda a: (a[0], a[1][:-3], a[2][:-3], a[3]), "w_in"),
        (lambda a: (a[0], a[1], a[2], a[3][:, :-1]), "w_in"),
        (lambda a: (a[0], a[1].half(), a[2], a[3]), "w_in"),
    ],
)
def test_reference_errors_name_the_argument(mutate, argname):
    with pytest.raises(ValueError, match=argname):
        reference.channel_idle_ffn(*mutate(_ffn_args()))


def test_bad_backend_environment_is_a_clear_error():
    env = dict(os.environ, VITFAST_BACKEND="fastest")
    proc = subprocess.run([sys.executable, "-c", "import vitfast"], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "VITFAST_BACKEND" in proc.stderr and "fastest" in proc.stderr


def test_import_does_not_touch_cuda_triton_or_compilers():
    code = (
        "import sys, vitfast\n"
        "assert 'triton' not in sys.modules, 'import vitfast imported triton'\n"
        "assert 'torch.utils.cpp_extension' not in sys.modules, 'import vitfast loaded the JIT compiler'\n"
        "import torch; assert not torch.cuda.is_initialized()\n"
        "print(vitfast.ops.extension_loaded(), vitfast.ops.cpu_isa())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    loaded, isa = proc.stdout.split()
    assert loaded == "True", "the C++ extension is not built: run scripts/setup.sh"
    assert isa in ("avx512", "avx2", "neon", "scalar")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF shared objects (Linux)")
@pytest.mark.skipif(not vitfast.ops.extension_loaded(), reason="needs the C++ extension (vitfast._C)")
def test_extension_shares_torchs_cxx_runtime():
    """vitfast._C must use the shared libstdc++.so.6 that libtorch uses, not carry a copy of its own: with a second
    copy (a toolchain that links libstdc++ statically by default, as the GPU machine's /opt/gcc g++ does), every
    error message holding a number segfaulted instead of raising ValueError (see setup.py)."""
    so = vitfast.ops._C.__file__
    needed = subprocess.run(["readelf", "-d", "-W", so], capture_output=True, text=True, check=True).stdout
    assert "[libstdc++.so.6]" in needed, f"{so} does not link libstdc++.so.6:\n{needed}"
    symbols = subprocess.run(["readelf", "--dyn-syms", "-W", so], capture_output=True, text=True, check=True).stdout
    own_runtime = [line.split()[-1] for line in symbols.splitlines()
                   if "_ZNSt6locale" in line and " UND " not in line]
    assert not own_runtime, f"{so} defines libstdc++'s own locale symbols: {own_runtime[:5]}"


@pytest.mark.skipif(not vitfast.ops.extension_loaded(), reason="needs the C++ extension (vitfast._C)")
def test_error_messages_with_numbers_raise():
    """The C++ checks format shapes and floats into their messages (the path that crashed with two C++ runtimes)."""
    x = torch.randn(2, 16)
    with pytest.raises(ValueError, match=r"^weight: expected shape \[16\], got \[15\]"):
        torch.ops.vitfast.layer_norm(x, torch.ones(15), None, 1e-5)
    with pytest.raises(ValueError, match=r"^eps: expected a finite number >= 0, got -0.5"):
        torch.ops.vitfast.layer_norm(x, None, None, -0.5)


def _none_cases():
    x3 = torch.randn(2, 5, 8)
    w = torch.randn(8, 8)
    return [
        ("linear", lambda: vitfast.ops.linear(x3, None), "weight"),
        ("linear", lambda: vitfast.ops.linear(None, w), "x"),
        ("channel_idle_ffn", lambda: vitfast.ops.channel_idle_ffn(x3, torch.randn(8, 8), None, None), "w_out"),
        ("dwconv_attention", lambda: vitfast.ops.dwconv_attention(torch.randn(1, 4, 8), torch.randn(8, 8), None, None,
                                                                  torch.randn(8, 8), None, 2, 2), "kernel"),
        ("xwx_attention", lambda: vitfast.ops.xwx_attention(x3, torch.randn(2, 8, 8), None, torch.randn(2, 8), None,
                                                            torch.randn(2, 4, 8)), "w_v"),
        ("batch_gate", lambda: vitfast.ops.batch_gate(x3, None, None), "w1"),
        ("attention", lambda: vitfast.ops.attention(None, 2), "qkv"),
    ]


@pytest.mark.parametrize("backend", ["auto", "reference"])
def test_a_required_tensor_given_as_none_is_named(backend):
    # The C++ ops saw an undefined tensor: "weight: expected 2-D [N, K], got shape [0]" or "x: ... got
    # torch.UNKNOWN_SCALAR"; the reference path crashed with AttributeError ('NoneType' object has no attribute 'dim').
    previous = vitfast.get_backend()
    vitfast.set_backend(backend)
    try:
        for op, call, name in _none_cases():
            with pytest.raises(TypeError, match=f"^{name}: expected a Tensor, got None$"):
                call()
    finally:
        vitfast.set_backend(previous)


def test_float_arguments_are_checked_before_conversion():
    # the entry says what the reference says (float('small') or the dispatcher's "Expected a value of type" before)
    x = torch.randn(2, 5, 8)
    for bad in (None, "small"):
        with pytest.raises(ValueError, match=r"^eps: expected a number > 0, got"):
            vitfast.ops.batch_gate(x, torch.randn(2, 8), None, eps=bad)
    gate = torch.ones(2)
    with pytest.raises(ValueError, match=r"^norm_eps: expected None \(no LayerNorm\) or a finite number >= 0, got 'x'"):
        vitfast.ops.gated_mhsa(gate, 0, x, "x", torch.randn(24, 8), None, 2, torch.randn(8, 8), None)


def test_optional_tensors_of_another_type_are_named():
    """A list or a float for an optional tensor failed with an AttributeError naming nothing."""
    x = torch.randn(1, 5, 8)
    with pytest.raises(ValueError, match=r"^residual: expected a Tensor or None, got float"):
        reference.channel_idle_ffn(x, torch.randn(40, 8), None, torch.randn(8, 32), None, 1.0)
    with pytest.raises(ValueError, match=r"^b_o: expected a Tensor or None, got float"):
        reference.dwconv_attention(x, torch.randn(8, 8), None, torch.randn(8, 3, 3), torch.randn(8, 8), 0.0, 2, 2)
    with pytest.raises(TypeError, match=r"^w2: expected a Tensor, got list"):
        reference.batch_gate(x, torch.randn(4, 8), None, [[1.0] * 4] * 2)


def test_xwx_cuda_dispatch_validates_before_reading_the_shape():
    # it read x.shape[-1] of a 0-d x first: IndexError instead of the reference's ValueError
    with pytest.raises(ValueError, match=r"^x: expected a \[B, N, C\] tensor"):
        vitfast.ops._xwx_attention_cuda(torch.tensor(1.0), torch.randn(2, 8, 4), None, None, torch.randn(2, 8, 4),
                                        torch.randn(2, 4, 8))


def test_autocast_keeps_the_gate_dtype():
    """The autocast rule (fp32 inputs) cast the gate too: a float64 1e-300 decision became 0, closed, where the ops
    compare a gate in its own dtype."""
    gate = torch.tensor([1e-300, 0.0], dtype=torch.float64)
    x = torch.randn(1, 5, 8)
    taken, skipped = torch.randn(3), torch.randn(3)
    for backend in ("auto", "reference"):
        previous = vitfast.get_backend()
        vitfast.set_backend(backend)
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                assert torch.equal(vitfast.ops.gate_select(gate, 0, taken, skipped), taken)
                out = vitfast.ops.gated_ffn(gate, 0, x, None, torch.randn(40, 8), None, torch.randn(8, 32), None,
                                            True)
            assert not torch.equal(out, x)  # open: the FFN ran
        finally:
            vitfast.set_backend(previous)


def test_integer_arguments_accept_numpy_integers_on_both_paths():
    import numpy as np

    args = (torch.randn(1, 5, 8), torch.randn(8, 8), None, torch.randn(8, 3, 3), torch.randn(8, 8), None)
    expected = vitfast.ops.dwconv_attention(*args, 2, 2)
    # the C++ op took np.int64 grids; the reference said "grid_h: expected an int >= 1, got np.int64(2)"
    torch.testing.assert_close(reference.dwconv_attention(*args, np.int64(2), np.int64(2)), expected)
    qkv = torch.randn(2, 5, 24)
    torch.testing.assert_close(reference.attention(qkv, np.int64(2)), vitfast.ops.attention(qkv, 2))
    with pytest.raises(ValueError, match=r"^num_heads: expected an int >= 1, got 2.0"):
        reference.attention(qkv, 2.0)
    with pytest.raises(ValueError, match=r"^num_heads: expected an int >= 1, got True"):
        reference.attention(qkv, True)
    # the gate index and gated_mhsa's head count ("index: expected an int in [0, 2), got np.int64(1)")
    gate, x = torch.tensor([1.0, 0.0]), torch.randn(2, 5, 8)
    taken, skipped = torch.randn(3), torch.randn(3)
    for index in (np.int64(0), np.int64(1)):
        torch.testing.assert_close(reference.gate_select(gate, index, taken, skipped),
                                   vitfast.ops.gate_select(gate, int(index), taken, skipped))
    mhsa = (torch.randn(24, 8), torch.randn(24), np.int64(2), torch.randn(8, 8), torch.randn(8))
    torch.testing.assert_close(reference.gated_mhsa(gate, np.int64(0), x, 1e-6, *mhsa),
                               torch.ops.vitfast.gated_mhsa(gate, 0, x, 1e-6, *mhsa[:2], 2, *mhsa[3:]))
    ffn = (torch.randn(40, 8), torch.randn(40), torch.randn(8, 32), torch.randn(8), True)
    torch.testing.assert_close(reference.gated_ffn(gate, np.int64(1), x, None, *ffn), x)
