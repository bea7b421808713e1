"""Parity of the Triton `channel_idle_ffn` kernels with `vitfast.reference.channel_idle_ffn`.

Runs natively on CUDA tensors when a GPU is present, otherwise through the Triton interpreter on CPU tensors
(conftest.py sets TRITON_INTERPRET=1 before triton is imported).  Shapes are ViT widths with hidden = 4C and
idle ratio θ: A = (1 - θ)·4C active channels, L = C linear ones (θ > 0) or none (θ = 0, the vanilla FFN).

`python tests/test_channel_idle_ffn_triton.py` on a GPU machine prints a small benchmark (see the bottom).
"""
import importlib

import pytest
import torch

from helpers import triton_test_device
import vitfast.kernels.channel_idle_ffn as cif
from vitfast.kernels.channel_idle_ffn import channel_idle_ffn_triton
from vitfast.reference import channel_idle_ffn as reference

pytestmark = pytest.mark.triton

DEVICE, INTERPRET = triton_test_device()


def _low_precision_dtypes():
    if DEVICE == "cpu":
        # Interpreter: fp16 is native numpy; bf16 works through the kernels' interpreter-only emulation
        # (see INTERPRET_BF16 in kernels/channel_idle_ffn.py), and torch's CPU reference supports both.
        return [torch.float16, torch.bfloat16]
    dts = [torch.float16]
    if torch.cuda.is_bf16_supported():
        dts.append(torch.bfloat16)
    return dts


LOW_PRECISION = _low_precision_dtypes()


def make_args(c, theta, lead, *, dtype=torch.float32, b_in=True, b_out=True, residual=True, hidden_ratio=4):
    """Random op arguments at nn.Linear-like scales (weights ~ U(±1/√fan_in)), built in fp32 then cast."""
    hidden = hidden_ratio * c
    active = int(round((1.0 - theta) * hidden))
    linear = c if theta > 0 else 0
    n = active + linear

    def uni(*shape, fan_in):
        return (torch.rand(*shape, device=DEVICE) * 2 - 1) / max(fan_in, 1) ** 0.5

    x = torch.randn(*lead, c, device=DEVICE)
    args = [
        x,
        uni(n, c, fan_in=c),
        uni(n, fan_in=c) if b_in else None,
        uni(c, active, fan_in=active),
        uni(c, fan_in=active) if b_out else None,
        torch.randn(*lead, c, device=DEVICE) if residual else None,
    ]
    return [a.to(dtype) if a is not None else None for a in args]


def _theta_id(theta):
    return f"theta{theta}"


SHAPES = [(1, 197), (2, 197), (1, 1), (2, 7), (2, 50)]  # (batch, tokens): cls-token N, and N that break tiles
THETAS = [0.0, 0.5, 0.75, 1.0]


# ---------------------------------------------------------------------------------------------- fp32 parity
@pytest.mark.parametrize("theta", THETAS, ids=_theta_id)
@pytest.mark.parametrize("batch,tokens", SHAPES)
@pytest.mark.parametrize("c", [192, 384])
def test_fp32_parity_vit_ti_s(c, theta, batch, tokens, tol):
    args = make_args(c, theta, (batch, tokens))
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(channel_idle_ffn_triton(*args), reference(*args), atol=atol, rtol=rtol)


@pytest.mark.slow
@pytest.mark.parametrize("theta", THETAS, ids=_theta_id)
@pytest.mark.parametrize("batch,tokens", [(1, 197), (2, 7)])
def test_fp32_parity_vit_b(theta, batch, tokens, tol):
    args = make_args(768, theta, (batch, tokens))
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(channel_idle_ffn_triton(*args), reference(*args), atol=atol, rtol=rtol)


@pytest.mark.parametrize("theta", [0.0, 0.75, 1.0], ids=_theta_id)
@pytest.mark.parametrize("b_in", [True, False], ids=["b_in", "no_b_in"])
@pytest.mark.parametrize("b_out", [True, False], ids=["b_out", "no_b_out"])
@pytest.mark.parametrize("residual", [True, False], ids=["res", "no_res"])
def test_optional_bias_and_residual(theta, b_in, b_out, residual, tol):
    args = make_args(192, theta, (2, 7), b_in=b_in, b_out=b_out, residual=residual)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(channel_idle_ffn_triton(*args), reference(*args), atol=atol, rtol=rtol)


def test_gelu_only_on_active_columns(tol):
    # A boundary that is not a multiple of any tile width (A = 40, L = 24): a tile straddles it, so a wrong
    # column test in the split-GELU epilogue would apply GELU to linear columns or skip active ones.
    c, active = 24, 40
    x = torch.randn(3, 5, c, device=DEVICE)
    w_in = torch.randn(active + c, c, device=DEVICE) / c**0.5
    b_in = torch.randn(active + c, device=DEVICE)
    w_out = torch.randn(c, active, device=DEVICE) / active**0.5
    atol, rtol = tol[torch.float32]
    out = channel_idle_ffn_triton(x, w_in, b_in, w_out)
    torch.testing.assert_close(out, reference(x, w_in, b_in, w_out), atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------------- edge cases
def test_theta1_is_one_linear_and_skips_kernel_2(monkeypatch, tol):
    # A = 0: the output kernel (a GEMM with K = A = 0) must not run at all; kernel 1 writes the output.
    class _Forbidden:
        def __getitem__(self, grid):
            raise AssertionError("kernel 2 launched for A = 0")

    monkeypatch.setattr(cif, "_channel_idle_ffn_out_kernel", _Forbidden())
    args = make_args(192, 1.0, (2, 50))
    assert args[3].shape == (192, 0)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(channel_idle_ffn_triton(*args), reference(*args), atol=atol, rtol=rtol)


def test_no_weights_at_all(tol):
    # A = 0 and L = 0 (w_in has no rows): the op is b_out + residual (or zeros).
    c = 16
    x = torch.randn(2, 3, c, device=DEVICE)
    w_in = torch.empty(0, c, device=DEVICE)
    w_out = torch.empty(c, 0, device=DEVICE)
    b_out = torch.randn(c, device=DEVICE)
    res = torch.randn(2, 3, c, device=DEVICE)
    atol, rtol = tol[torch.float32]
    for bo, r in ((b_out, res), (None, None)):
        torch.testing.assert_close(
            channel_idle_ffn_triton(x, w_in, None, w_out, bo, r), reference(x, w_in, None, w_out, bo, r),
            atol=atol, rtol=rtol,
        )


@pytest.mark.parametrize("lead", [(), (5,), (2, 3, 4), (0,), (3, 0)], ids=str)
def test_leading_dims(lead, tol):
    args = make_args(32, 0.5, lead)
    out = channel_idle_ffn_triton(*args)
    assert out.shape == lead + (32,)
    assert out.dtype == args[0].dtype
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(out, reference(*args), atol=atol, rtol=rtol)


def test_non_contiguous_inputs(tol):
    c, theta = 64, 0.5
    x, w_in, b_in, w_out, b_out, res = make_args(c, theta, (2, 9))
    # Views with non-unit inner strides / transposed storage, same values as the contiguous originals.
    x_nc = x.transpose(0, 1).contiguous().transpose(0, 1)  # [2, 9, C] with token-major storage
    w_in_nc = w_in.t().contiguous().t()  # column-major weight
    w_out_nc = w_out.t().contiguous().t()
    b_in_nc = torch.stack([b_in, b_in], dim=1)[:, 0]  # stride 2
    b_out_nc = torch.stack([b_out, b_out], dim=1)[:, 1]
    res_nc = torch.cat([res, res], dim=-1)[..., c:]  # row stride 2C
    x_sliced = torch.cat([x, x], dim=-1)[..., :c]  # row stride 2C, reshape stays a view
    assert not any(t.is_contiguous() for t in (x_nc, w_in_nc, w_out_nc, b_in_nc, b_out_nc, res_nc, x_sliced))
    expected = reference(x, w_in, b_in, w_out, b_out, res)
    atol, rtol = tol[torch.float32]
    for xx in (x_nc, x_sliced):
        out = channel_idle_ffn_triton(xx, w_in_nc, b_in_nc, w_out_nc, b_out_nc, res_nc)
        torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)


def test_nan_stays_in_its_row():
    # Out-of-range rows of the last tile are wrapped onto valid rows for the loads; a NaN must still reach
    # exactly the rows it belongs to.
    args = make_args(64, 0.5, (1, 70))
    args[0][0, 3, 5] = float("nan")
    out = channel_idle_ffn_triton(*args)
    bad_rows = torch.isnan(out).any(dim=-1)[0]
    assert bad_rows[3] and int(bad_rows.sum()) == 1


def test_input_precision_follows_torch_tf32_flag():
    # allow_tf32 is a property of torch's cuBLAS module (monkeypatch cannot restore it): set and restore by hand.
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert cif.input_precision(torch.float32) == "ieee"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert cif.input_precision(torch.float32) == "tf32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


# ---------------------------------------------------------------------------------------------- fp16 / bf16
@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("theta", THETAS, ids=_theta_id)
@pytest.mark.parametrize(
    "c,batch,tokens", [(192, 2, 197), (384, 1, 50), pytest.param(768, 1, 50, marks=pytest.mark.slow)]
)
def test_low_precision(dtype, theta, c, batch, tokens, tol):
    args = make_args(c, theta, (batch, tokens), dtype=dtype)
    out = channel_idle_ffn_triton(*args)
    assert out.dtype == dtype
    expected = reference(*args)  # PyTorch in the same low precision
    atol, rtol = tol[dtype]
    torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    # Against the exact answer for these (already rounded) inputs, the kernel may be at most 2x as far off
    # as PyTorch's own low-precision computation.
    exact = reference(*[a.float() if a is not None else None for a in args])
    err_kernel = (out.float() - exact).abs().max().item()
    err_torch = (expected.float() - exact).abs().max().item()
    assert err_torch > 0  # otherwise the comparison below would say nothing
    assert err_kernel <= 2 * err_torch, f"kernel error {err_kernel:.3g} > 2 x torch error {err_torch:.3g}"


@pytest.mark.parametrize("theta", [0.0, 0.75], ids=_theta_id)
def test_every_candidate_gives_the_reference(theta, tol):
    """Each autotune candidate of both kernels forced (the tests above reach the first one only, or the
    interpreter's), in bf16 at 197 token rows (a ragged last row tile at every BLOCK_M): natively at DeiT-S width,
    under the interpreter at 192 (each candidate's index and mask logic, in CI)."""
    from vitfast.kernels._common import forced_config

    dtype = LOW_PRECISION[-1]
    c = 384 if DEVICE == "cuda" else 192
    args = make_args(c, theta, (1, 197), dtype=dtype)
    exact = reference(*[a.float() if a is not None else None for a in args])
    own = (reference(*args).float() - exact).abs().max().item()
    wrong = []
    for cfg in cif.candidates():
        out = channel_idle_ffn_triton(*args, _wrap=forced_config(cfg))
        err = (out.float() - exact).abs().max().item()
        if not err <= 2 * own:
            wrong.append((str(cfg), err, own))
    assert not wrong, wrong


# ---------------------------------------------------------------------------------------------- bad inputs
def _bad(c=16, theta=0.5):
    return make_args(c, theta, (2, 3))


@pytest.mark.parametrize(
    "mutate,name",
    [
        (lambda a: a.__setitem__(1, a[1][:, :-1]), "w_in"),  # C_in mismatch
        (lambda a: a.__setitem__(1, a[1][:-1]), "w_in"),  # rows neither A nor A + C_out
        (lambda a: a.__setitem__(3, torch.zeros(16, 200, device=DEVICE)), "w_out"),  # more active cols than rows
        (lambda a: a.__setitem__(3, a[3][0]), "w_out"),  # 1-D
        (lambda a: a.__setitem__(2, a[2][:-1]), "b_in"),
        (lambda a: a.__setitem__(4, a[4][:-1]), "b_out"),
        (lambda a: a.__setitem__(5, a[5][:, :-1]), "residual"),
        (lambda a: a.__setitem__(1, a[1].double()), "w_in"),  # dtype differs from x
        (lambda a: a.__setitem__(4, a[4].half()), "b_out"),
        (lambda a: a.__setitem__(0, a[0].to(torch.int32)), "x"),  # not a float dtype
    ],
)
def test_bad_inputs_name_the_argument(mutate, name):
    args = _bad()
    mutate(args)
    with pytest.raises(ValueError, match=rf"^{name}: expected"):
        channel_idle_ffn_triton(*args)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device (native Triton)")
def test_cpu_tensors_rejected_natively():
    args = [a.cpu() if a is not None else None for a in _bad()]
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor"):
        channel_idle_ffn_triton(*args)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device (native Triton)")
def test_device_mismatch_rejected():
    args = _bad()
    args[3] = args[3].cpu()
    with pytest.raises(ValueError, match=r"^w_out: expected device"):
        channel_idle_ffn_triton(*args)


@pytest.mark.skipif(DEVICE != "cuda", reason="the CUDA impl of the op is the Triton launcher")
@pytest.mark.parametrize("policy", ["triton", "torch", "auto"])
def test_torch_op_on_cuda_matches_reference_on_every_path(tol, policy, monkeypatch):
    import vitfast.ops  # noqa: F401  (registers torch.ops.vitfast.*)
    from vitfast import _env

    monkeypatch.setattr(_env, "_cuda_kernels", policy)
    args = make_args(192, 0.75, (2, 197))
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(torch.ops.vitfast.channel_idle_ffn(*args), reference(*args), atol=atol, rtol=rtol)


def test_cuda_path_policy():
    from vitfast.ops import TRITON_FFN_MIN_ROWS, TRITON_FFN_MIN_WIDTH, use_triton_channel_idle_ffn

    # The measured policy (docstring of use_triton_channel_idle_ffn): fp32 and small batches stay on cuBLAS.
    assert not use_triton_channel_idle_ffn(torch.float32, 10**6)
    assert not use_triton_channel_idle_ffn(torch.bfloat16, TRITON_FFN_MIN_ROWS - 1)
    assert use_triton_channel_idle_ffn(torch.bfloat16, TRITON_FFN_MIN_ROWS)
    assert use_triton_channel_idle_ffn(torch.float16, 64 * 197)
    # ... and narrow models stay on cuBLAS even then (DeiT-S lost 4 of 6 runs; DeiT-B won all six)
    assert use_triton_channel_idle_ffn(torch.bfloat16, 64 * 197, width=768)
    assert not use_triton_channel_idle_ffn(torch.bfloat16, 64 * 197, width=384)
    assert not use_triton_channel_idle_ffn(torch.bfloat16, 64 * 197, width=TRITON_FFN_MIN_WIDTH - 1)
    assert use_triton_channel_idle_ffn(torch.bfloat16, 64 * 197, "triton", width=384)
    assert use_triton_channel_idle_ffn(torch.float32, 1, "triton")
    assert not use_triton_channel_idle_ffn(torch.bfloat16, 10**6, "torch")


def test_cuda_dispatch_asks_the_policy_with_the_models_width(monkeypatch):
    """The CUDA impl passes x's rows and channels to the policy (run here on CPU tensors: the policy's answer is
    forced to "composition", torch code that runs on any device)."""
    ops = importlib.import_module("vitfast.ops.channel_idle_ffn")  # the op's module (vitfast.ops.<op> is its entry)

    asked = []
    monkeypatch.setattr(ops, "use_triton_channel_idle_ffn",
                        lambda dtype, rows, policy="auto", *, width=None: asked.append((dtype, rows, width)) and False)
    args = [a.cpu() if isinstance(a, torch.Tensor) else a for a in make_args(40, 0.75, (3, 5))]
    out = ops._channel_idle_ffn_cuda(*args)
    assert asked == [(torch.float32, 15, 40)]
    torch.testing.assert_close(out, reference(*args))


def test_cuda_kernels_setting_rejects_unknown_names():
    from vitfast import _env

    with pytest.raises(ValueError, match=r"^cuda_kernels: expected one of"):
        _env.set_cuda_kernels("cutlass")


# ---------------------------------------------------------------------------------------------- GPU benchmark
def _bench():  # pragma: no cover - manual, GPU only
    """Median ms and TFLOP/s: triton vs eager reference vs torch.compile(reference), fp16 and fp32."""
    import triton.testing

    assert torch.cuda.is_available(), "the benchmark needs a GPU"
    compiled = torch.compile(reference, dynamic=False)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    print(
        f"{'dtype':9} {'C':>4} {'θ':>5} {'M':>6} | {'triton ms':>9} {'TF/s':>6} | "
        f"{'eager ms':>8} {'compile ms':>10} | max|Δ|"
    )
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for c in (384, 768):
            for theta in (0.0, 0.5, 0.75, 1.0):
                for batch in (1, 8, 64):
                    args = make_args(c, theta, (batch, 197), dtype=dtype)
                    m, n_in, active = batch * 197, args[1].shape[0], args[3].shape[1]
                    flops = 2 * m * c * n_in + 2 * m * active * c
                    t_tri = triton.testing.do_bench(lambda: channel_idle_ffn_triton(*args))
                    t_ref = triton.testing.do_bench(lambda: reference(*args))
                    t_cmp = triton.testing.do_bench(lambda: compiled(*args))
                    err = (channel_idle_ffn_triton(*args).float() - reference(*args).float()).abs().max().item()
                    print(
                        f"{str(dtype)[6:]:9} {c:4d} {theta:5.2f} {m:6d} | {t_tri:9.4f} {flops / t_tri / 1e9:6.1f} | "
                        f"{t_ref:8.4f} {t_cmp:10.4f} | {err:.2e}"
                    )


if __name__ == "__main__":  # pragma: no cover
    _bench()
