"""The C++ CPU kernel behind `torch.ops.vitfast.layer_norm` against `vitfast.reference.layer_norm`
(= F.layer_norm over the last dimension).

The fused blocks' pre-norms (no affine: folded into the next linear layer) and the affine ones that stay
(Swin's norm1, a model's final norm), at ViT widths and odd widths around every vector width; every CPU code
path this machine supports, at 1 and 2 threads (rows split, same bits); rows whose mean dwarfs their spread
(a one-pass variance would lose every digit); fp16/bf16; argument errors; opcheck; and the fused model using it.
"""
import pytest
import torch
import torch.nn as nn

import vitfast
from vitfast import reference
from vitfast.nn._base import apply_norm
from helpers import assert_low_precision_no_worse, assert_thread_parity

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

op = torch.ops.vitfast.layer_norm


def make_args(c, lead, *, affine=False, offset=0.0, dtype=torch.float32, eps=1e-6):
    x = torch.randn(*lead, c) * 2.0 + offset
    w = torch.randn(c) if affine else None
    b = torch.randn(c) if affine else None
    return [t.to(dtype) if t is not None else None for t in (x, w, b)] + [eps]


@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
@pytest.mark.parametrize("c", [192, 384, 768])
@pytest.mark.parametrize("batch", [1, 3])
def test_parity_vit_widths(c, batch, affine, isa, tol, restore_threads):
    assert_thread_parity(op, reference.layer_norm, make_args(c, (batch, 197), affine=affine), tol)


@pytest.mark.parametrize("rows", [1, 2, 3, 7])
@pytest.mark.parametrize("c", [1, 2, 5, 8, 15, 16, 17, 31, 33, 100])
def test_parity_odd_widths(c, rows, isa, tol, restore_threads):
    for affine in (False, True):
        assert_thread_parity(op, reference.layer_norm, make_args(c, (rows,), affine=affine), tol)


def test_large_mean_keeps_its_digits(isa):
    """Mean 1000× the spread: the two-pass variance loses nothing beyond fp32's hold on x itself (~6e-5 of |x|
    here, i.e. ~3e-5 in y), where E[x²] − mean² would be off by O(1)."""
    x, w, b, eps = make_args(384, (4, 50), offset=1000.0)
    truth = torch.nn.functional.layer_norm(x.double(), (384,), None, None, eps)
    err = (op(x, w, b, eps).double() - truth).abs().max().item()
    assert err < 1e-4, err


@pytest.mark.parametrize("lead", [(), (5,), (2, 3, 7), (0,), (2, 0)], ids=str)
def test_leading_dimensions(lead, tol):
    args = make_args(24, lead, affine=True)
    out = op(*args)
    assert out.shape == (*lead, 24)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(out, reference.layer_norm(*args), atol=atol, rtol=rtol)


def test_non_contiguous_input(tol):
    x = torch.randn(197, 2, 64).transpose(0, 1)
    assert not x.is_contiguous()
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(op(x, None, None, 1e-5), reference.layer_norm(x, None, None, 1e-5), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision(dtype, tol):
    assert_low_precision_no_worse(op, reference.layer_norm, make_args(192, (2, 50), affine=True, dtype=dtype), dtype,
                                  tol)


BAD = [
    ("x 0-d", lambda a: [torch.tensor(1.0), None, None, 1e-5], "x"),
    ("x int", lambda a: [a[0].to(torch.int32), a[1], a[2], a[3]], "x"),
    ("weight dtype", lambda a: [a[0], a[1].double(), a[2], a[3]], "weight"),
    ("bias device", lambda a: [a[0], a[1], a[2].to("meta"), a[3]], "bias"),
    ("weight shape", lambda a: [a[0], a[1][:-1], a[2], a[3]], "weight"),
    ("bias 2-D", lambda a: [a[0], a[1], a[2][None], a[3]], "bias"),
    ("eps negative", lambda a: [a[0], a[1], a[2], -1e-5], "eps"),
    ("eps nan", lambda a: [a[0], a[1], a[2], float("nan")], "eps"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c[0])
def test_bad_arguments_name_the_argument(case):
    _, mutate, argname = case
    args = mutate(make_args(16, (2, 5), affine=True))
    with pytest.raises(ValueError, match=rf"^{argname}: expected"):
        op(*args)
    with pytest.raises(ValueError, match=rf"^{argname}: expected"):
        reference.layer_norm(*args)


@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
def test_opcheck(affine):
    torch.library.opcheck(op.default, tuple(make_args(24, (2, 7), affine=affine)))


@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
def test_fused_blocks_norm_runs_the_kernel(affine, monkeypatch, tol):
    """`apply_norm` (every fused block's pre-norm) calls the op on CPU, with or without an affine, and gives
    nn.LayerNorm's result; a norm it does not handle (RMSNorm here) still runs as itself."""
    norm = nn.LayerNorm(96, eps=1e-6, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            norm.weight.normal_()
            norm.bias.normal_()
    x = torch.randn(2, 197, 96)
    calls = []
    real = vitfast.ops.layer_norm
    monkeypatch.setattr(vitfast.ops, "layer_norm", lambda *a: calls.append(a) or real(*a))
    atol, rtol = tol[torch.float32]
    with torch.no_grad():
        torch.testing.assert_close(apply_norm(norm, x), norm(x), atol=atol, rtol=rtol)
    assert len(calls) == 1
    rms = nn.RMSNorm(96) if hasattr(nn, "RMSNorm") else nn.GroupNorm(1, 197)
    with torch.no_grad():
        torch.testing.assert_close(apply_norm(rms, x), rms(x))
    assert len(calls) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
def test_cuda_dispatch_is_torchs_layer_norm(affine, dtype, monkeypatch):
    """On a GPU the op (and so a fused block's pre-norm, which keeps the module call there) is torch's own fused
    CUDA LayerNorm, bit for bit; the CPU kernel is never reached."""
    x, w, b, eps = [t.cuda() if isinstance(t, torch.Tensor) else t for t in make_args(384, (2, 197), affine=affine,
                                                                                      dtype=dtype)]
    want = torch.nn.functional.layer_norm(x, (384,), w, b, eps)
    got = op(x, w, b, eps)
    assert got.device == x.device and got.dtype == dtype
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    norm = nn.LayerNorm(384, eps=eps, elementwise_affine=affine, device="cuda", dtype=dtype)
    calls = []
    monkeypatch.setattr(vitfast.ops, "layer_norm", lambda *a: calls.append(a))
    with torch.no_grad():
        torch.testing.assert_close(apply_norm(norm, x), norm(x), atol=0, rtol=0)
    assert calls == []
