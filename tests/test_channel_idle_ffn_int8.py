"""The C++ int8 kernel behind `torch.ops.vitfast.channel_idle_ffn_int8` against `vitfast.reference.channel_idle_ffn_int8`
(definitions in vitfast/reference/_int8.py; the dense layer: tests/test_linear_int8.py).

Every CPU path this machine runs is forced in turn, with its low-precision extension on and off (the `ext` fixture,
conftest.py), at 1 and 2 threads (same bits).  The integer sums are exact in every kernel and the epilogue's order is
the reference's; the FFN's GELU is a polynomial in the kernel and torch's erf in the reference, whose last-bit
differences can move a GELU output across a rounding boundary of the second quantization: there the kernel's
distance to the reference is bounded by a small fraction of the int8 error itself (see `assert_ffn_close`).
"""
import pytest
import torch

import vitfast
from helpers import at_1_and_2_threads
from vitfast import reference
from vitfast.reference._int8 import quantize_weight

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

ffn_op = torch.ops.vitfast.channel_idle_ffn_int8
TOL = dict(atol=1e-6, rtol=1e-6)  # ~8 units in the last place of fp32: the emulated fma of the reference


def _ffn_args(c, hidden, active, lead, *, linear_path=True, residual=True, smooth=False, static=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, c, generator=g)
    rows = active + (c if linear_path else 0)
    w_in = torch.randn(rows, c, generator=g) / c ** 0.5
    w_out = torch.randn(c, active, generator=g) / max(active, 1) ** 0.5
    qi, si = quantize_weight(w_in)
    qo, so = quantize_weight(w_out)
    return [x, qi, si, torch.randn(rows, generator=g) * 0.1, qo, so, torch.randn(c, generator=g) * 0.1,
            torch.randn(*lead, c, generator=g) if residual else None,
            torch.rand(c, generator=g) + 0.5 if smooth else None,
            torch.rand(active, generator=g) + 0.5 if smooth and active else None,
            0.03 if static else 0.0, 0.01 if static else 0.0], (w_in, w_out)


def assert_ffn_close(out, args, weights):
    """kernel vs reference: within the fp32 tolerance, except where the GELU's last bit moved a second-stage code by
    one (then the outputs differ by one quantum · |qw| ≈ the int8 error of one product term): those rows must stay a
    small fraction (≤ 2%) of the int8 model's own error against the exact fp32 FFN."""
    ref = reference.channel_idle_ffn_int8(*args)
    diff = (out - ref).abs()
    if diff.max() <= TOL["atol"] + TOL["rtol"] * ref.abs().max():
        return
    w_in, w_out = weights
    x, b_in, b_out, residual = args[0], args[3], args[6], args[7]
    fp32 = reference.channel_idle_ffn(x, w_in, b_in, w_out, b_out, residual)
    assert (out - ref).norm() <= 0.02 * (ref - fp32).norm()


@pytest.mark.parametrize("c, hidden, active, lead", [(384, 1536, 384, (1, 197)), (64, 256, 64, (2, 9)),
                                                     (24, 96, 5, (3,)), (16, 64, 0, (4,)), (40, 160, 160, (2, 5))])
@pytest.mark.parametrize("variant", ["linear path", "no linear path", "smooth", "static"])
def test_channel_idle_ffn_int8_parity(isa, ext, restore_threads, c, hidden, active, lead, variant):
    if variant == "no linear path" and active == 0:
        pytest.skip("A = L = 0 has no GEMM (tested in test_degenerate_ffn)")
    args, weights = _ffn_args(c, hidden, active, lead, linear_path=variant != "no linear path",
                              smooth=variant == "smooth", static=variant == "static")
    out = at_1_and_2_threads(ffn_op, args)
    assert_ffn_close(out, args, weights)


def test_degenerate_ffn():
    args, _ = _ffn_args(8, 32, 0, (3,), linear_path=False)
    torch.testing.assert_close(ffn_op(*args), reference.channel_idle_ffn_int8(*args))


def test_opcheck():
    args, _ = _ffn_args(16, 64, 16, (2, 3), smooth=True)
    torch.library.opcheck(ffn_op.default, tuple(args))
