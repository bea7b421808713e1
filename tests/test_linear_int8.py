"""The C++ int8 kernel behind `torch.ops.vitfast.linear_int8` against `vitfast.reference.linear_int8` (definitions in
vitfast/reference/_int8.py; the FFN op: tests/test_channel_idle_ffn_int8.py).

Every CPU path this machine runs is forced in turn, with its low-precision extension on and off (AVX-512 with VNNI
runs the `vpdpbusd` kernel, without it the AVX2 sign-trick kernel; the `ext` fixture, conftest.py), at 1 and 2
threads (same bits).  The integer sums are exact in every kernel and the epilogue's order is the reference's, so the
kernel matches the reference to the last unit or two.
"""
import pytest
import torch

import vitfast
from helpers import at_1_and_2_threads
from vitfast import reference
from vitfast.reference._int8 import quantize_weight

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

from vitfast import _C  # noqa: E402

linear_op = torch.ops.vitfast.linear_int8
TOL = dict(atol=1e-6, rtol=1e-6)  # ~8 units in the last place of fp32: the emulated fma of the reference


def _linear_args(n, k, lead, *, bias=True, residual=False, smooth=False, act_scale=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, k, generator=g)
    w = torch.randn(n, k, generator=g) / k ** 0.5
    qw, sw = quantize_weight(w)
    return [x, qw, sw, torch.randn(n, generator=g) if bias else None,
            torch.randn(*lead, n, generator=g) if residual else None,
            torch.rand(k, generator=g) + 0.5 if smooth else None, act_scale]


@pytest.mark.parametrize("n, k, lead", [(1152, 384, (1, 197)), (384, 384, (2, 197)), (37, 50, (3, 7)), (16, 4, (1,)),
                                        (5, 3, (13,)), (33, 1, (2, 2))])
@pytest.mark.parametrize("extras", ["plain", "residual", "smooth", "static", "no bias"])
def test_linear_int8_parity(isa, ext, restore_threads, n, k, lead, extras):
    args = _linear_args(n, k, lead, bias=extras != "no bias", residual=extras == "residual",
                        smooth=extras == "smooth", act_scale=0.02 if extras == "static" else 0.0)
    out = at_1_and_2_threads(linear_op, args)
    torch.testing.assert_close(out, reference.linear_int8(*args), **TOL)


@pytest.mark.parametrize("code", [127, 64])
def test_linear_int8_extremes_do_not_saturate(isa, ext, code):
    """qa = ±127 against qw = ±127 at K = 4096: each sum is ±4096·127² (the AVX2 kernel's 16-bit pair sums reach
    2·127² = 32258 < 2¹⁵, vpdpbusd's u8 operand 127 + 127 = 254); against qw = ±64 (7-bit weights: the AVX2
    kernel's narrow form, u8 255 and 1, pair sums up to 2·255·64 = 32640 < 2¹⁵): exact, in every kernel."""
    k = 4096
    for sign in (1, -1):
        x = torch.full((3, k), 5.0)
        x[1] *= -1
        x[2, ::2] *= -1
        qw = torch.full((40, k), code, dtype=torch.int8) * sign
        qw[7] = -qw[7]
        qw[9, ::3] = 0
        out = linear_op(x, qw, torch.ones(40))
        expected = (torch.sign(x).double() * 127) @ qw.double().t() / 127 * 5  # q = ±127, s = 5 / 127
        torch.testing.assert_close(out.double(), expected, atol=0, rtol=1e-6)


@pytest.mark.parametrize("n, k, lead", [(1152, 384, (1, 197)), (37, 50, (3, 7)), (33, 1, (2, 2))])
@pytest.mark.parametrize("extras", ["plain", "residual", "smooth", "static"])
def test_linear_int8_parity_7bit_weights(isa, ext, n, k, lead, extras):
    """Weights in [−64, 64] (quantize(weight_bits=7)): the AVX2 kernel's narrow form (u8 = qw + 64 against qa, the
    row sums' 64·rowsum removed in the epilogue), the usual form elsewhere; the same reference either way."""
    args = _linear_args(n, k, lead, residual=extras == "residual", smooth=extras == "smooth",
                        act_scale=0.02 if extras == "static" else 0.0)
    g = torch.Generator().manual_seed(3)
    args[1], args[2] = quantize_weight(torch.randn(n, k, generator=g) / k ** 0.5, 64.0)
    assert args[1].abs().max() == 64
    out = at_1_and_2_threads(linear_op, args)
    torch.testing.assert_close(out, reference.linear_int8(*args), **TOL)


def test_nonfinite_rows_give_nan_rows(isa, ext):
    args = _linear_args(20, 24, (4,))
    args[0][1, 3] = float("nan")
    args[0][2, 0] = float("inf")
    out = linear_op(*args)
    assert out[1].isnan().all() and out[2].isnan().all() and out[[0, 3]].isfinite().all()
    torch.testing.assert_close(out, reference.linear_int8(*args), **TOL, equal_nan=True)


def test_minus_128_weights_are_refused():
    args = _linear_args(8, 16, (2,))
    args[1][3, 5] = -128
    with pytest.raises(ValueError, match=r"qweight: expected values in \[-127, 127\]"):
        linear_op(*args)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs(dtype):
    args = _linear_args(40, 64, (3, 5), residual=True)
    args[0], args[3], args[4] = (a.to(dtype) for a in args[0:1] + args[3:5])
    out = linear_op(*args)
    assert out.dtype == dtype
    torch.testing.assert_close(out, reference.linear_int8(*args), atol=0, rtol=0)  # both: fp32, one final rounding


def test_opcheck():
    args = _linear_args(24, 32, (2, 3), residual=True, smooth=True)
    torch.library.opcheck(linear_op.default, tuple(args))


def test_packed_int8_weights_are_cached_and_follow_in_place_updates():
    args = _linear_args(32, 48, (4,))
    linear_op(*args)
    before = vitfast.ops._C._weight_cache_stats()["misses"] if hasattr(vitfast.ops._C, "_weight_cache_stats") else None
    out1 = linear_op(*args)
    if before is not None:
        assert vitfast.ops._C._weight_cache_stats()["misses"] == before  # second call: no repack
    args[1].mul_(-1)  # in place: the version counter changes, the next call repacks
    out2 = linear_op(*args)
    torch.testing.assert_close(out2 - args[3], -(out1 - args[3]), atol=1e-5, rtol=1e-5)


def test_the_int8_kernel_is_reported():
    assert _C.int8_kernel() in ("scalar", "avx2", "avx_vnni", "avx512_vnni", "amx_int8", "neon_dot")


def test_the_extensions_reported_are_the_current_paths():
    """cpu_extensions() names what the current path's kernels use: on the avx2 path at most AVX-VNNI (the int8 kernel
    then is avx_vnni), never an AVX-512 extension the CPU has but the path cannot run."""
    previous = _C.cpu_isa()
    try:
        for isa in _C.supported_cpu_isas():
            _C.set_cpu_isa(isa)
            ext = set(_C.cpu_extensions())
            if isa == "avx2":
                assert ext <= {"avx_vnni"}, ext
                assert ("avx_vnni" in ext) == (_C.int8_kernel() == "avx_vnni")
            elif isa == "scalar":
                assert not ext, ext
            elif isa == "avx512":
                assert ("avx512_vnni" in ext) == (_C.int8_kernel() in ("avx512_vnni", "amx_int8"))
    finally:
        _C.set_cpu_isa(previous)
