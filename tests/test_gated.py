"""The gated sub-block ops `torch.ops.vitfast.gated_mhsa` / `gated_ffn` on CPU against `vitfast.reference`, and
their contract (schema, fake impl, opcheck, errors).  The Triton kernels behind their CUDA impl are checked in
tests/test_gated_triton.py."""
import pytest
import torch

import vitfast
from vitfast import reference

pytestmark = pytest.mark.usefixtures("one_thread")


def uni(*shape, fan_in):
    return (torch.rand(*shape) * 2 - 1) / max(fan_in, 1) ** 0.5


def mhsa_args(c=32, heads=4, bias=True):
    return [1e-6, uni(3 * c, c, fan_in=c), uni(3 * c, fan_in=c) if bias else None, heads, uni(c, c, fan_in=c),
            uni(c, fan_in=c) if bias else None]


def ffn_args(c=16, active=32, linear=True, norm_eps=1e-6, residual=True):
    rows = active + (c if linear else 0)
    return [norm_eps, uni(rows, c, fan_in=c), uni(rows, fan_in=c), uni(c, active, fan_in=max(active, 1)),
            uni(c, fan_in=max(active, 1)), residual]


@pytest.mark.parametrize("gate", [[1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
def test_cpu_ops_match_reference(gate, tol):
    gate = torch.tensor(gate)
    x = torch.randn(2, 17, 32)
    atol, rtol = tol[torch.float32]
    for index in (0, 1):
        m = mhsa_args()
        torch.testing.assert_close(torch.ops.vitfast.gated_mhsa(gate, index, x, *m),
                                   reference.gated_mhsa(gate, index, x, *m), atol=atol, rtol=rtol)
        f = ffn_args(32, 64)
        torch.testing.assert_close(torch.ops.vitfast.gated_ffn(gate, index, x, *f),
                                   reference.gated_ffn(gate, index, x, *f), atol=atol, rtol=rtol)
        if gate[index] == 0:
            out = torch.ops.vitfast.gated_mhsa(gate, index, x, *m)
            assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()  # a copy: op outputs never alias


def test_reference_backend_functional_api(monkeypatch, tol):
    gate, x = torch.tensor([1.0, 0.0]), torch.randn(1, 5, 32)
    m, f = mhsa_args(), ffn_args(32, 0, norm_eps=None, residual=False)
    expect_m = torch.ops.vitfast.gated_mhsa(gate, 0, x, *m)
    from vitfast import _env

    monkeypatch.setattr(_env, "_backend", "reference")
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(vitfast.ops.gated_mhsa(gate, 0, x, *m), expect_m, atol=atol, rtol=rtol)
    assert torch.equal(vitfast.ops.gated_ffn(gate, 1, x, *f), x)


def test_opcheck():
    gate = torch.tensor([1.0, 0.0])
    x = torch.randn(2, 5, 32)
    for index in (0, 1):
        torch.library.opcheck(torch.ops.vitfast.gated_mhsa.default, (gate, index, x, *mhsa_args()))
        torch.library.opcheck(torch.ops.vitfast.gated_ffn.default, (gate, index, x, *ffn_args(32, 64)))


def test_fake_impl_shapes():
    x = torch.empty(3, 7, 32, device="meta")
    gate = torch.empty(2, device="meta")
    m = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in mhsa_args()]
    assert torch.ops.vitfast.gated_mhsa(gate, 0, x, *m).shape == (3, 7, 32)
    f = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in ffn_args(32, 64)]
    assert torch.ops.vitfast.gated_ffn(gate, 1, x, *f).shape == (3, 7, 32)


def test_argument_errors():
    gate, x = torch.tensor([1.0, 1.0]), torch.randn(2, 5, 32)
    m = mhsa_args()
    with pytest.raises(ValueError, match="num_heads"):
        torch.ops.vitfast.gated_mhsa(gate, 0, x, *m[:3], 5, *m[4:])
    with pytest.raises(ValueError, match="w_proj: expected shape"):
        torch.ops.vitfast.gated_mhsa(gate, 0, x, *m[:4], m[4][:, :16], m[5])
    with pytest.raises(ValueError, match="index"):
        torch.ops.vitfast.gated_mhsa(gate, 2, x, *m)
    with pytest.raises(ValueError, match="x: expected 3-D"):
        torch.ops.vitfast.gated_mhsa(gate, 0, x[0], *m)
    with pytest.raises(ValueError, match="norm_eps"):
        reference.gated_mhsa(gate, 0, x, -1.0, *m[1:])
    f = ffn_args(32, 64)
    with pytest.raises(ValueError, match="w_out: expected 32 output features"):
        reference.gated_ffn(gate, 1, x, f[0], f[1][:64 + 16], f[2][:64 + 16], f[3][:16], f[4][:16], False)
