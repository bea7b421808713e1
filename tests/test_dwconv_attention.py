"""`torch.ops.vitfast.dwconv_attention` on CPU (the C++ kernel) against `vitfast.reference.dwconv_attention`.

Value projection + k×k depthwise convolution over the token grid + output projection (dropin-depthwise-conv-
attention eq. 11; the ensembled eq. 13 is the same op with D = d_h).  Every CPU code path this machine supports
is forced in turn (`isa` fixture), at 1 and 2 threads (the thread split must not change a bit); ViT widths at a
24×24 grid, odd and non-square grids (21×28, 1×n, n×1), cls / register prefix tokens, k = 1/3/5/7, batch 1
and 2, optional inputs, fp16/bf16 against 2× torch's own error, argument errors, the weight cache, opcheck and
torch.compile(fullgraph=True).
"""
import pytest
import torch
from helpers import assert_low_precision_no_worse, assert_thread_parity

import vitfast
from vitfast import reference

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

from vitfast import _C  # noqa: E402,F401  (the extension: the C++ kernel must be registered)

op = torch.ops.vitfast.dwconv_attention


def make_args(batch, prefix, gh, gw, c, d, c_out, k=3, *, dtype=torch.float32, b_v=True, b_o=True, residual=True):
    """Op arguments at nn.Linear-like scales; kernels ~ N(0, 1/k²) (the modules' Gaussian init)."""
    n = prefix + gh * gw

    def uni(*shape, fan_in):
        return (torch.rand(*shape) * 2 - 1) / max(fan_in, 1) ** 0.5

    args = [
        torch.randn(batch, n, c),
        uni(d, c, fan_in=c),
        uni(d, fan_in=c) if b_v else None,
        torch.randn(d, k, k) / k,
        uni(c_out, d, fan_in=d),
        uni(c_out, fan_in=d) if b_o else None,
        gh,
        gw,
        torch.randn(batch, n, c_out) if residual else None,
    ]
    return [a.to(dtype) if isinstance(a, torch.Tensor) else a for a in args]


def check_parity(args, tol, threads=(1, 2)):
    # Threads split the grid rows; each split recomputes its halo rows of V with the same code.
    assert_thread_parity(op, reference.dwconv_attention, args, tol, threads)

def test_the_cpu_kernel_is_the_cpp_one():
    assert "dwconv_attention" not in vitfast.ops._REFERENCE_CPU_FALLBACKS
    assert torch._C._dispatch_has_kernel_for_dispatch_key("vitfast::dwconv_attention", "CPU")


# ---------------------------------------------------------------------------------------------- fp32 parity
@pytest.mark.parametrize("prefix", [0, 1], ids=["no_cls", "cls"])
@pytest.mark.parametrize("c", [192, 384, 768])
def test_parity_vit_widths_24x24(c, prefix, isa, tol, restore_threads):
    # Every head of a block replaced (D = C), batch 1: the shape of the speed target.
    check_parity(make_args(1, prefix, 24, 24, c, c, c), tol)


@pytest.mark.parametrize("batch,prefix,gh,gw", [(2, 1, 14, 14), (1, 0, 21, 28), (2, 0, 1, 9), (1, 1, 9, 1),
                                                 (2, 4, 5, 7), (1, 1, 1, 1), (2, 1, 13, 3)])
@pytest.mark.parametrize("c,d,c_out", [(17, 33, 15), (48, 16, 48), (64, 64, 31)])
def test_parity_odd_grids_and_widths(batch, prefix, gh, gw, c, d, c_out, isa, tol, restore_threads):
    check_parity(make_args(batch, prefix, gh, gw, c, d, c_out), tol)


@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_parity_kernel_sizes(k, isa, tol, restore_threads):
    check_parity(make_args(2, 1, 6, 9, 40, 24, 40, k), tol)


@pytest.mark.parametrize("b_v", [False, True])
@pytest.mark.parametrize("b_o", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_optional_inputs(b_v, b_o, residual, isa, tol, restore_threads):
    check_parity(make_args(2, 1, 5, 6, 32, 32, 32, b_v=b_v, b_o=b_o, residual=residual), tol)


def test_ensembled_form_is_one_head(isa, tol, restore_threads):
    # Eq. 13: the whole block collapsed into one head of width d_h = 64 (ViT-B), C = 768.
    check_parity(make_args(1, 1, 14, 14, 768, 64, 768), tol)


def test_non_contiguous_inputs(isa, tol, restore_threads):
    args = make_args(2, 1, 4, 5, 24, 16, 20)
    args[0] = torch.randn(2, 24, 21).transpose(1, 2)
    args[4] = (torch.randn(16, 20) / 4).t()
    args[3] = torch.randn(3, 3, 16).permute(2, 0, 1)
    check_parity(args, tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("batch,prefix,gh,gw", [(1, 0, 8, 8), (2, 1, 7, 5)])
def test_low_precision(dtype, batch, prefix, gh, gw, isa, tol):
    args = make_args(batch, prefix, gh, gw, 64, 64, 64, dtype=dtype)
    assert_low_precision_no_worse(op, reference.dwconv_attention, args, dtype, tol)


def test_empty_batch_and_zero_width():
    args = make_args(1, 1, 3, 3, 8, 8, 8)
    args[0], args[8] = args[0][:0], args[8][:0]
    assert op(*args).shape == (0, 10, 8)
    a = make_args(2, 1, 3, 3, 8, 0, 8)
    torch.testing.assert_close(op(*a), reference.dwconv_attention(*a))


# ---------------------------------------------------------------------------------------------- bad inputs
def _replace(i, value):
    def mutate(a):
        a = list(a)
        a[i] = value(a) if callable(value) else value
        return a

    return mutate


BAD = [
    ("x 2-D", _replace(0, lambda a: a[0][0]), "x"),
    ("x int", _replace(0, lambda a: a[0].to(torch.int32)), "x"),
    ("x too few tokens", _replace(6, 5), "x"),
    ("grid_h 0", _replace(6, 0), "grid_h"),
    ("grid_w 0", _replace(7, 0), "grid_w"),
    # grid_h·grid_w wraps in int64 (2⁶²·4 = 0, 2³²·2³² = 0): once accepted, then a crash or std::bad_alloc.
    ("grid int64 wrap", lambda a: _replace(7, 4)(_replace(6, 2**62)(a)), "x"),
    ("grid 2^32 squared", lambda a: _replace(7, 2**32)(_replace(6, 2**32)(a)), "x"),
    ("w_v C", _replace(1, lambda a: a[1][:, :-1]), "w_v"),
    ("kernel even", _replace(3, lambda a: torch.randn(8, 2, 2)), "kernel"),
    ("kernel not square", _replace(3, lambda a: torch.randn(8, 3, 5)), "kernel"),
    ("kernel D", _replace(3, lambda a: torch.randn(7, 3, 3)), "kernel"),
    ("w_o D", _replace(4, lambda a: a[4][:, :-1]), "w_o"),
    ("b_v shape", _replace(2, lambda a: a[2][:-1]), "b_v"),
    ("b_o shape", _replace(5, lambda a: a[5][:-1]), "b_o"),
    ("residual shape", _replace(8, lambda a: a[8][:, :-1]), "residual"),
    ("w_v dtype", _replace(1, lambda a: a[1].double()), "w_v"),
    ("kernel device", _replace(3, lambda a: a[3].to("meta")), "kernel"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c[0])
def test_bad_arguments_name_the_argument(case):
    _, mutate, name = case
    args = mutate(make_args(2, 1, 3, 3, 8, 8, 8))
    with pytest.raises(ValueError, match=rf"^{name}: expected"):
        op(*args)
    with pytest.raises(ValueError, match=rf"^{name}: expected"):
        reference.dwconv_attention(*args)


@pytest.mark.parametrize("index,name", [(1, "w_v"), (2, "b_v"), (3, "kernel"), (4, "w_o"), (5, "b_o")])
def test_non_finite_weights_are_refused(index, name):
    a = make_args(1, 1, 3, 3, 8, 8, 8)
    a[index].view(-1)[2] = float("nan")
    with pytest.raises(ValueError, match=rf"^{name}: expected finite values, got 1 non-finite of"):
        op(*a)
    with torch.no_grad():
        a[index].view(-1)[2] = 0.5
    torch.testing.assert_close(op(*a), reference.dwconv_attention(*a))


def test_in_place_kernel_update_is_picked_up(tol):
    a = make_args(1, 1, 4, 4, 16, 16, 16)
    op(*a)
    with torch.no_grad():
        a[3].mul_(-2.0)  # a finetuning step on the kernels: a new version, repacked
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(op(*a), reference.dwconv_attention(*a), atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------------- torch integration
@pytest.mark.parametrize("optional", [True, False], ids=["with_optionals", "without_optionals"])
def test_opcheck(optional):
    a = make_args(2, 1, 3, 4, 16, 8, 12, b_v=optional, b_o=optional, residual=optional)
    torch.library.opcheck(op.default, tuple(a))


@pytest.mark.slow
def test_torch_compile_fullgraph(tol):
    torch._dynamo.reset()
    x, w_v, b_v, kernel, w_o, b_o, gh, gw, _ = make_args(2, 1, 4, 5, 32, 16, 32)

    def block(t):
        # The op inside ordinary PyTorch code, as the fused block uses it (residual = the block input).
        return op(t * 0.5, w_v, b_v, kernel, w_o, b_o, gh, gw, t).relu()

    compiled = torch.compile(block, fullgraph=True, backend="inductor")
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(compiled(x), block(x), atol=atol, rtol=rtol)
    x2 = torch.randn(2, 21, 32)
    torch.testing.assert_close(compiled(x2), block(x2), atol=atol, rtol=rtol)


def test_fake_impl_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = make_args(3, 2, 4, 6, 16, 8, 10)
        out = op(*a)
        assert out.shape == (3, 26, 10)


@pytest.mark.parametrize("prefix", [0, 1])
def test_bf16_gemms_keep_the_bits_across_threads(prefix, tol, restore_threads):
    """bf16 on a CPU with a bf16 extension: value and output GEMMs on the bf16 kernels around the fp32 convolution
    (linear → dwconv_heads → linear): the same bits at 1 and 2 threads, within bf16 tolerance of the reference."""
    if vitfast.ops.bf16_kernel() == "none":
        pytest.skip("no bf16 CPU extension: bf16 computes in fp32 (test_low_precision)")
    args = make_args(3, prefix, 14, 14, 64, 64, 64, dtype=torch.bfloat16)
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        outs.append(op(*args))
    assert outs[0].dtype == torch.bfloat16 and torch.equal(outs[0], outs[1])
    truth = reference.dwconv_attention(*[a.float() if isinstance(a, torch.Tensor) else a for a in args])
    atol, rtol = tol[torch.bfloat16]
    torch.testing.assert_close(outs[0].float(), truth, atol=atol, rtol=rtol)
