"""Parity of the Triton `xwx_attention` kernel with `vitfast.reference.xwx_attention`.

Runs natively on CUDA tensors when a GPU is present, otherwise through the Triton interpreter on CPU tensors
(conftest.py sets TRITON_INTERPRET=1 before triton is imported).  Both score forms: factored (w_q, w_k [H, C, R],
the low-rank form `vitfast.fuse` picks when R ≤ C/2, and the branch factors side by side) and full (W_h [H, C, C]).
"""

import functools

import pytest
import torch
from helpers import assert_low_precision_no_worse, make_xwx_args, triton_test_device

import vitfast.kernels.xwx_attention as xk
from vitfast.kernels.xwx_attention import xwx_attention_triton
from vitfast.reference import xwx_attention as reference

pytestmark = pytest.mark.triton

DEVICE, INTERPRET = triton_test_device()


def _low_precision_dtypes():
    if DEVICE == "cpu":
        return [torch.float16, torch.bfloat16]  # bf16 through the kernel's interpreter-only emulation
    return [torch.float16] + ([torch.bfloat16] if torch.cuda.is_bf16_supported() else [])


# (batch, tokens, C, heads, rank or None = full form, value width D)
SHAPES = [
    (1, 197, 192, 3, 128, 128),   # DeiT-Ti, 2 branches, values side by side (factored R = 2·64)
    (2, 197, 192, 3, None, 64),   # DeiT-Ti full form, values joined
    (2, 37, 48, 3, 16, 24),       # odd N and widths that break every tile
    (1, 1, 32, 2, 16, 16),        # one token
    (2, 70, 64, 4, 8, 20),        # rank below the 16-wide dot tile
]
SLOW_SHAPES = [(1, 197, 384, 6, 128, 128), (2, 197, 384, 6, None, 64)]  # DeiT-S


def _id(shape):
    b, n, c, h, r, d = shape
    return f"B{b}-N{n}-C{c}-H{h}-{'full' if r is None else f'R{r}'}-D{d}"


@pytest.mark.parametrize("shape", SHAPES + [pytest.param(s, marks=pytest.mark.slow) for s in SLOW_SHAPES], ids=_id)
def test_fp32_parity(shape, tol):
    b, n, c, h, r, d = shape
    args = make_xwx_args(b, n, c, h, r, d, device=DEVICE)
    atol, rtol = tol[torch.float32]
    out = xwx_attention_triton(*args)
    assert out.shape == (b, n, c) and out.dtype == torch.float32
    torch.testing.assert_close(out, reference(*args), atol=atol, rtol=rtol)


@pytest.mark.parametrize("key_bias", [True, False], ids=["kb", "no_kb"])
@pytest.mark.parametrize("b_o", [True, False], ids=["bo", "no_bo"])
@pytest.mark.parametrize("residual", [True, False], ids=["res", "no_res"])
def test_optional_arguments(key_bias, b_o, residual, tol):
    args = make_xwx_args(2, 19, 32, 2, 16, 16, device=DEVICE, key_bias=key_bias, b_o=b_o, residual=residual)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(xwx_attention_triton(*args), reference(*args), atol=atol, rtol=rtol)


@pytest.mark.parametrize("residual", [True, False], ids=["res", "no_res"])
def test_wide_values_run_in_slices(residual, tol, monkeypatch):
    """A value width over the kernel's cap runs as one launch per slice of D, each onto the last one's output
    (the uncapped BLOCK_D of a wide head spilled or failed to compile on a GPU).  D = 40 with a cap of 16 gives
    three launches (16 + 16 + 8), so the ping-pong of the running output is covered both ways."""
    import vitfast.kernels.xwx_attention as xk

    launches = []
    kernel = xk._xwx_attention_kernel

    class Counting:
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                launches.append(kwargs["BLOCK_D"])
                return kernel[grid](*args, **kwargs)
            return run

    monkeypatch.setattr(xk, "_MAX_BLOCK_D", 16)
    monkeypatch.setattr(xk, "_xwx_attention_kernel", Counting())
    args = make_xwx_args(2, 9, 32, 2, 16, 40, device=DEVICE, residual=residual)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(xwx_attention_triton(*args), reference(*args), atol=atol, rtol=rtol)
    assert launches == [16, 16, 16]  # the 8-wide last slice is padded to tl.dot's minimum of 16


def test_output_width_differs_from_input(tol):
    # w_o maps to C_out != C (the op allows it); the residual then has C_out columns.
    x, w_q, w_k, kb, w_v, _, _, _ = make_xwx_args(2, 9, 32, 2, 16, 16, device=DEVICE)
    w_o = torch.randn(2, 16, 40, device=DEVICE) / 32**0.5
    b_o, res = torch.randn(40, device=DEVICE), torch.randn(2, 9, 40, device=DEVICE)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(xwx_attention_triton(x, w_q, w_k, kb, w_v, w_o, b_o, res),
                               reference(x, w_q, w_k, kb, w_v, w_o, b_o, res), atol=atol, rtol=rtol)


def test_large_scores_are_stable(tol):
    # Scores of hundreds: the online softmax must rescale with the running max, never exponentiate raw scores.
    args = make_xwx_args(1, 80, 32, 2, 16, 16, device=DEVICE, score_std=200.0)
    out = xwx_attention_triton(*args)
    assert torch.isfinite(out).all()
    atol, rtol = tol[torch.float32]
    expected = reference(*args)
    torch.testing.assert_close(out, expected, atol=atol * float(expected.abs().max()), rtol=rtol)


def test_a_first_key_tile_of_overflowed_scores_stays_finite(tol):
    """Every score of the first key tile -inf (a key bias term that overflowed): exp(-inf - -inf) = NaN poisoned the
    online softmax's running sum for good, where the reference gives those keys weight 0."""
    x, w_q, w_k, kb, w_v, w_o, b_o, res = make_xwx_args(1, 40, 32, 2, 16, 16, device=DEVICE)
    x = x.clone()
    x[0, :32, 0] = 300.0
    kb = torch.zeros_like(kb)
    kb[0, 0] = -1e37  # x_j · key_bias = -3e39 (-inf in fp32) for keys 0..31, the first tile at any BLOCK_N <= 32
    args = (x, w_q, w_k, kb, w_v, w_o, b_o, res)
    expected = reference(*args)
    assert torch.isfinite(expected).all()
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(xwx_attention_triton(*args), expected, atol=atol, rtol=rtol)


def test_non_contiguous_inputs(tol):
    args = make_xwx_args(2, 21, 32, 2, 16, 16, device=DEVICE)
    x, w_q, w_k, kb, w_v, w_o, b_o, res = args
    nc = [x.transpose(0, 1).contiguous().transpose(0, 1), w_q.transpose(1, 2).contiguous().transpose(1, 2), w_k,
          kb.t().contiguous().t(), w_v, w_o.transpose(1, 2).contiguous().transpose(1, 2), b_o,
          torch.cat([res, res], dim=-1)[..., 32:]]
    assert not nc[0].is_contiguous() and not nc[-1].is_contiguous()
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(xwx_attention_triton(*nc), reference(*args), atol=atol, rtol=rtol)


def test_empty_batch():
    args = make_xwx_args(0, 5, 32, 2, 16, 16, device=DEVICE)
    assert xwx_attention_triton(*args).shape == (0, 5, 32)


def test_bad_arguments_name_the_argument():
    x, w_q, w_k, kb, w_v, w_o, b_o, res = make_xwx_args(1, 5, 32, 2, 16, 16, device=DEVICE)
    with pytest.raises(ValueError, match="w_k: expected the same shape"):
        xwx_attention_triton(x, w_q, w_k[:, :, :8], kb, w_v, w_o, b_o, res)
    with pytest.raises(ValueError, match="w_o: expected"):
        xwx_attention_triton(x, w_q, w_k, kb, w_v, w_o[:, :8], b_o, res)
    with pytest.raises(ValueError, match="residual: expected"):
        xwx_attention_triton(x, w_q, w_k, kb, w_v, w_o, b_o, res[:, :4])


def test_input_precision_follows_torch_tf32_flag():
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert xk.input_precision(torch.float32) == "ieee"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert xk.input_precision(torch.float32) == "tf32"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("dtype", _low_precision_dtypes(), ids=str)
@pytest.mark.parametrize("shape", [(2, 37, 48, 3, 16, 24), (1, 197, 192, 3, 128, 128), (1, 50, 64, 2, None, 32)],
                         ids=_id)
def test_low_precision(dtype, shape, tol):
    b, n, c, h, r, d = shape
    args = make_xwx_args(b, n, c, h, r, d, device=DEVICE, dtype=dtype)
    assert_low_precision_no_worse(xwx_attention_triton, reference, args, dtype, tol)


@pytest.mark.parametrize("shape", [(1, 197, 192, 3, 128, 128), (1, 197, 192, 3, None, 64)], ids=_id)
def test_every_candidate_gives_the_reference(shape, tol):
    """Each autotune candidate forced (the tests above reach the first one only, or the interpreter's), in the last
    low-precision dtype at DeiT-Ti shapes (197 tokens: ragged query and key tiles at every candidate), both score
    forms; under the interpreter this checks each candidate's index and mask logic in CI."""
    from vitfast.kernels._common import forced_config

    dtype = _low_precision_dtypes()[-1]
    b, n, c, h, r, d = shape
    args = make_xwx_args(b, n, c, h, r, d, device=DEVICE, dtype=dtype)
    for cfg in xk.candidates():
        kernel = functools.partial(xwx_attention_triton, _wrap=forced_config(cfg))
        try:
            assert_low_precision_no_worse(kernel, reference, args, dtype, tol)
        except AssertionError as exc:
            raise AssertionError(f"candidate {cfg}: {exc}") from exc


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device (the op's CUDA impl is the Triton launcher)")
def test_op_and_fused_block_use_triton_on_cuda(tol, monkeypatch):
    """torch.ops.vitfast.xwx_attention on CUDA tensors with VITFAST_CUDA_KERNELS=triton is the Triton kernel, and
    a fused non-deep model moved to the GPU runs it (parity with the same model on CPU, which runs the C++
    kernel).  ("auto" would take the eager composition in fp32: see use_triton_xwx_attention.)"""
    import vitfast
    from timm.models.vision_transformer import VisionTransformer
    from vitfast import _env

    monkeypatch.setattr(_env, "_cuda_kernels", "triton")

    args = make_xwx_args(2, 37, 48, 3, 16, 24, device=DEVICE)
    torch.testing.assert_close(torch.ops.vitfast.xwx_attention(*args), xwx_attention_triton(*args), atol=0, rtol=0)
    timm_model = VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=4, num_heads=3, num_classes=10)
    nondeep = vitfast.convert.from_timm(timm_model, branches=2)
    for block in nondeep.blocks:
        block.set_lambda(1.0)
    fused = vitfast.fuse(nondeep)
    images = torch.randn(2, 3, 32, 32)
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False  # fp32 everywhere (patch conv)
    try:
        with torch.no_grad():
            expected = fused(images)
            out = fused.cuda()(images.cuda()).cpu()
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
    scale = float(expected.abs().max())
    torch.testing.assert_close(out, expected, atol=2e-4 * max(scale, 1.0), rtol=2e-4)


def test_cuda_path_policy():
    from vitfast.ops import TRITON_XWX_MAX_WIDTH, use_triton_xwx_attention

    # The measured policy (docstring of use_triton_xwx_attention): Triton only in half precision at small widths.
    assert not use_triton_xwx_attention(torch.float32, 192)
    assert use_triton_xwx_attention(torch.float16, 192)
    assert use_triton_xwx_attention(torch.bfloat16, TRITON_XWX_MAX_WIDTH)
    assert not use_triton_xwx_attention(torch.float16, 384)
    assert use_triton_xwx_attention(torch.float32, 384, "triton")
    assert not use_triton_xwx_attention(torch.float16, 192, "torch")
