"""Parity of the gated Triton kernels (`kernels/gated.py`) with `vitfast.reference`, open and closed.

Open (gate != 0): every kernel equals its ungated reference (F.layer_norm, reference.linear / channel_idle_ffn,
reference.attention) and the sub-blocks equal `reference.gated_mhsa` / `gated_ffn`.  Closed (gate == 0): the
intermediate kernels do no work — an output buffer filled with NaN comes back bit-for-bit unchanged — and the last
kernel of a sub-block writes exactly x.  Natively on CUDA when a GPU is present, else through the Triton
interpreter (conftest.py); shapes are small for the interpreter.
"""

import pytest
import torch
import torch.nn.functional as F

from helpers import triton_test_device
import vitfast
from vitfast import reference
from vitfast.kernels.gated import (gated_attention_triton, gated_ffn_triton, gated_layernorm_triton,
                                   gated_linear_triton, gated_mhsa_triton)

pytestmark = pytest.mark.triton

DEVICE, INTERPRET = triton_test_device()

OPEN = torch.tensor([1.0, 1.0], device=DEVICE)
CLOSED = torch.tensor([0.0, 0.0], device=DEVICE)
MIXED = torch.tensor([0.0, 1.0], device=DEVICE)  # MHSA skipped, FFN executed


def uni(*shape, fan_in, dtype=torch.float32):
    return ((torch.rand(*shape, device=DEVICE) * 2 - 1) / max(fan_in, 1) ** 0.5).to(dtype)


def poisoned(shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), device=DEVICE, dtype=dtype)


def untouched(buf):
    return bool(torch.isnan(buf).all())


def close(actual, expected, tol, dtype=torch.float32):
    atol, rtol = tol[dtype]
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------------- LayerNorm
@pytest.mark.parametrize("rows,c", [(1, 8), (34, 32), (5, 33), (3, 192)])
@pytest.mark.parametrize("affine", [False, True])
def test_layernorm_open_and_closed(rows, c, affine, tol):
    x = torch.randn(rows, c, device=DEVICE) * 2 + 0.5
    w = torch.randn(c, device=DEVICE) if affine else None
    b = torch.randn(c, device=DEVICE) if affine else None
    close(gated_layernorm_triton(OPEN, 0, x, 1e-6, w, b), F.layer_norm(x, (c,), w, b, 1e-6), tol)
    buf = poisoned((rows, c))
    assert gated_layernorm_triton(CLOSED, 0, x, 1e-6, w, b, out=buf) is buf and untouched(buf)
    # The flag is read at its index: [0, 1] runs index 1 and skips index 0.
    close(gated_layernorm_triton(MIXED, 1, x, 1e-6, w, b), F.layer_norm(x, (c,), w, b, 1e-6), tol)
    assert untouched(gated_layernorm_triton(MIXED, 0, x, 1e-6, w, b, out=poisoned((rows, c))))


# ---------------------------------------------------------------------------------------------- linear
LINEAR_SHAPES = [(1, 1, 8, 16), (2, 17, 32, 96), (3, 7, 33, 65)]  # (B, N, K, N_out): tiles broken everywhere


@pytest.mark.parametrize("batch,tokens,k,n", LINEAR_SHAPES)
def test_linear_open_equals_reference(batch, tokens, k, n, tol):
    x = torch.randn(batch, tokens, k, device=DEVICE)
    w, b = uni(n, k, fan_in=k), uni(n, fan_in=k)
    res = torch.randn(batch, tokens, n, device=DEVICE)
    close(gated_linear_triton(OPEN, 0, x, w, b), reference.linear(x, w, b), tol)
    close(gated_linear_triton(OPEN, 0, x, w), reference.linear(x, w), tol)
    close(gated_linear_triton(OPEN, 0, x, w, b, residual=res),
          reference.linear(x, w, b, res), tol)
    # Strided weight (a transposed view): the kernel takes any strides.
    wt = w.t().contiguous().t()
    close(gated_linear_triton(OPEN, 0, x, wt, b), reference.linear(x, w, b), tol)


@pytest.mark.parametrize("batch,tokens,k,n", LINEAR_SHAPES)
def test_linear_epilogues_gelu_split_bias2_add(batch, tokens, k, n, tol):
    x = torch.randn(batch, tokens, k, device=DEVICE)
    w, b, b2 = uni(n, k, fan_in=k), uni(n, fan_in=k), uni(n, fan_in=k)
    add, res = torch.randn(batch, tokens, n, device=DEVICE), torch.randn(batch, tokens, n, device=DEVICE)
    for gelu_n in (0, n // 3, n):
        h = reference.linear(x, w, b)
        h = torch.cat([F.gelu(h[..., :gelu_n]), h[..., gelu_n:]], dim=-1)
        expect = h + b2 + add + res
        got = gated_linear_triton(OPEN, 0, x, w, b, gelu_features=gelu_n, bias2=b2, add=add, residual=res)
        close(got, expect, tol)


@pytest.mark.parametrize("batch,tokens,k,n", LINEAR_SHAPES)
def test_linear_closed_does_nothing_or_writes_skip(batch, tokens, k, n):
    x = torch.randn(batch, tokens, k, device=DEVICE)
    w, b = uni(n, k, fan_in=k), uni(n, fan_in=k)
    buf = poisoned((batch, tokens, n))
    out = gated_linear_triton(CLOSED, 0, x, w, b, gelu_features=n, residual=torch.randn_like(buf), out=buf)
    assert out is buf and untouched(buf)
    skip = torch.randn(batch, tokens, n, device=DEVICE)
    out = gated_linear_triton(CLOSED, 1, x, w, b, residual=torch.randn_like(skip), skip=skip, out=poisoned(skip.shape))
    assert torch.equal(out, skip)


def test_linear_argument_errors():
    x = torch.randn(2, 8, device=DEVICE)
    w = torch.randn(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="weight: expected shape"):
        gated_linear_triton(OPEN, 0, x, w[:, :4])
    with pytest.raises(ValueError, match="gelu_features"):
        gated_linear_triton(OPEN, 0, x, w, gelu_features=5)
    with pytest.raises(ValueError, match="skip: expected shape"):
        gated_linear_triton(OPEN, 0, x, w, skip=x)
    with pytest.raises(ValueError, match="index"):
        gated_linear_triton(OPEN, 2, x, w)
    with pytest.raises(ValueError, match="out: expected"):
        gated_linear_triton(OPEN, 0, x, w, out=torch.empty(2, 5, device=DEVICE))


def test_linear_and_layernorm_refuse_bad_x():
    w = torch.randn(4, 8, device=DEVICE)
    for bad, match in ((torch.randn(2, 8, device=DEVICE).double(), "x: expected dtype float32, float16 or bfloat16"),
                       (torch.ones(2, 8, device=DEVICE, dtype=torch.int32), "x: expected dtype float32"),
                       (torch.tensor(1.0, device=DEVICE), "x: expected at least 1 dimension")):
        with pytest.raises(ValueError, match=match):
            gated_linear_triton(OPEN, 0, bad, w)
        with pytest.raises(ValueError, match=match):
            gated_layernorm_triton(OPEN, 0, bad, 1e-6)


def test_gate_read_at_its_index_in_a_strided_view(tol):
    """The kernels read gate_ptr + index: a strided decision view (decisions[::2]) once had its wrong element
    read — [0, 1] behaved as [0, 0] and the sub-block was skipped."""
    decisions = torch.tensor([0.0, 0.0, 1.0, 1.0], device=DEVICE)
    _check_index_1_open_index_0_closed(decisions[::2], tol)  # [0, 1], stride 2


def _check_index_1_open_index_0_closed(gate, tol):
    """Every gated kernel runs at gate index 1 (the reference result) and the FFN sub-block is x at index 0."""
    x = torch.randn(1, 3, 8, device=DEVICE)
    fargs = ffn_args(8, 0.5, norm_eps=1e-6, residual=True)
    close(gated_ffn_triton(gate, 1, x, *fargs), reference.gated_ffn(gate, 1, x, *fargs), tol)
    margs = mhsa_args(8, 2)
    close(gated_mhsa_triton(gate, 1, x, *margs), reference.gated_mhsa(gate, 1, x, *margs), tol)
    w = uni(6, 8, fan_in=8)
    close(gated_linear_triton(gate, 1, x, w), reference.linear(x, w), tol)
    close(gated_layernorm_triton(gate, 1, x, 1e-6), F.layer_norm(x, (8,), eps=1e-6), tol)
    assert torch.equal(gated_ffn_triton(gate, 0, x, *fargs), x)


def test_gate_compared_in_its_own_dtype(tol):
    """A float64 gate of 1e-300 is open for the reference (`gate != 0`); the kernels once cast it to fp32 first,
    where it is 0, and skipped the sub-block."""
    for value in (1e-300, float("nan")):
        _check_index_1_open_index_0_closed(torch.tensor([0.0, value], device=DEVICE, dtype=torch.float64), tol)


def test_layernorm_strided_affine(tol):
    x = torch.randn(2, 8, device=DEVICE)
    w, b = torch.randn(16, device=DEVICE)[::2], torch.randn(16, device=DEVICE)[::2]
    close(gated_layernorm_triton(OPEN, 0, x, 1e-5, w, b), F.layer_norm(x, (8,), w, b, 1e-5), tol)


def test_zero_width_inputs_give_the_reference_result(tol):
    """K = 0 / C = 0: reshape(-1, 0) cannot infer the rows, so these once raised instead of computing."""
    x0 = torch.randn(2, 5, 0, device=DEVICE)
    w, b = torch.randn(6, 0, device=DEVICE), torch.randn(6, device=DEVICE)
    close(gated_linear_triton(OPEN, 0, x0, w, b), reference.linear(x0, w, b), tol)
    assert gated_layernorm_triton(OPEN, 0, x0, 1e-6).shape == (2, 5, 0)


# ---------------------------------------------------------------------------------------------- attention
ATTN_SHAPES = [(1, 17, 4, 8), (2, 50, 2, 16), (1, 1, 3, 8), (2, 33, 1, 24), (1, 17, 2, 64)]  # (B, N, H, D)


@pytest.mark.parametrize("batch,tokens,heads,d", ATTN_SHAPES)
def test_attention_open_equals_reference_and_closed_does_nothing(batch, tokens, heads, d, tol):
    qkv = torch.randn(batch, tokens, 3 * heads * d, device=DEVICE)
    close(gated_attention_triton(OPEN, 0, qkv, heads), reference.attention(qkv, heads), tol)
    close(gated_attention_triton(OPEN, 0, qkv, heads, 0.3), reference.attention(qkv, heads, 0.3), tol)
    buf = poisoned((batch, tokens, heads * d))
    assert gated_attention_triton(CLOSED, 0, qkv, heads, out=buf) is buf and untouched(buf)


def test_attention_reads_strided_qkv(tol):
    # qkv as a column slice of a wider buffer: the kernel follows the strides.
    wide = torch.randn(2, 17, 3 * 2 * 8 + 5, device=DEVICE)
    qkv = wide[..., :48]
    close(gated_attention_triton(OPEN, 0, qkv, 2), reference.attention(qkv.contiguous(), 2), tol)


# ---------------------------------------------------------------------------------------------- sub-blocks
def test_attention_first_key_tile_of_overflowed_scores_stays_finite(tol):
    """q·k overflowing to -inf for every key of the first tile: the online softmax turned NaN (reference: finite)."""
    q = torch.full((1, 40, 16), 1e20, device=DEVICE)
    k = torch.zeros(1, 40, 16, device=DEVICE)
    k[:, :32] = -1e20  # keys 0..31 (a whole key tile): q·k = -1.6e41, -inf in fp32
    qkv = torch.cat([q, k, torch.randn(1, 40, 16, device=DEVICE)], -1)
    expected = reference.attention(qkv, 1)
    assert torch.isfinite(expected).all()
    close(gated_attention_triton(OPEN, 0, qkv, 1), expected, tol)


def test_wide_heads_take_the_reference_and_the_gate_still_picks(tol, monkeypatch):
    """Heads wider than the kernel's cap (BLOCK_D uncapped spilled or failed to compile): SDPA, selected on the
    device; a closed gate still leaves `out` unwritten."""
    import vitfast.kernels.gated as gk

    monkeypatch.setattr(gk, "MAX_HEAD_DIM", 16)
    qkv = torch.randn(2, 9, 3 * 2 * 32, device=DEVICE)  # head_dim 32 > 16
    close(gated_attention_triton(OPEN, 0, qkv, 2), reference.attention(qkv, 2), tol)
    buf = poisoned((2, 9, 64))
    assert gated_attention_triton(CLOSED, 0, qkv, 2, out=buf) is buf and untouched(buf)


def test_launchers_take_numpy_integers_as_the_reference_does(tol):
    import numpy as np

    x = torch.randn(1, 5, 8, device=DEVICE)
    fargs, margs = ffn_args(8, 0.5), mhsa_args(8, 2)
    close(gated_ffn_triton(MIXED, np.int64(1), x, *fargs), reference.gated_ffn(MIXED, 1, x, *fargs), tol)
    expected = reference.gated_mhsa(MIXED, 1, x, *margs)
    margs[3] = np.int64(2)
    close(gated_mhsa_triton(MIXED, np.int64(1), x, *margs), expected, tol)  # MIXED = [0, 1]: index 1 is open
    assert torch.equal(gated_mhsa_triton(MIXED, np.int64(0), x, *margs), x)


def mhsa_args(c, heads, dtype=torch.float32, bias=True, norm_eps=1e-6):
    width = c  # H·D = C, as in timm
    return [norm_eps, uni(3 * width, c, fan_in=c, dtype=dtype), uni(3 * width, fan_in=c, dtype=dtype) if bias else None,
            heads, uni(c, width, fan_in=width, dtype=dtype), uni(c, fan_in=width, dtype=dtype) if bias else None]


def ffn_args(c, theta, dtype=torch.float32, norm_eps=1e-6, residual=True, hidden_ratio=4):
    hidden = hidden_ratio * c
    active = int(round((1 - theta) * hidden))
    linear = c if theta > 0 else 0
    return [norm_eps, uni(active + linear, c, fan_in=c, dtype=dtype), uni(active + linear, fan_in=c, dtype=dtype),
            uni(c, active, fan_in=max(active, 1), dtype=dtype), uni(c, fan_in=max(active, 1), dtype=dtype), residual]


@pytest.mark.parametrize("batch,tokens,c,heads", [(2, 17, 32, 4), (1, 1, 16, 2), (3, 10, 48, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_mhsa_sub_block_open_and_closed(batch, tokens, c, heads, bias, tol):
    x = torch.randn(batch, tokens, c, device=DEVICE)
    args = mhsa_args(c, heads, bias=bias)
    close(gated_mhsa_triton(OPEN, 0, x, *args), reference.gated_mhsa(OPEN, 0, x, *args), tol)
    assert torch.equal(gated_mhsa_triton(CLOSED, 0, x, *args), x)
    assert torch.equal(gated_mhsa_triton(MIXED, 0, x, *args), x)
    close(gated_mhsa_triton(MIXED, 1, x, *args), reference.gated_mhsa(OPEN, 0, x, *args), tol)


@pytest.mark.parametrize("theta", [0.0, 0.5, 0.75, 1.0], ids=lambda t: f"theta{t}")
@pytest.mark.parametrize("norm_eps,residual", [(1e-6, True), (None, False), (None, True)],
                         ids=["layernorm", "folded-bn", "no-norm+residual"])
def test_ffn_sub_block_open_and_closed(theta, norm_eps, residual, tol):
    x = torch.randn(2, 17, 16, device=DEVICE)
    args = ffn_args(16, theta, norm_eps=norm_eps, residual=residual)
    close(gated_ffn_triton(OPEN, 1, x, *args), reference.gated_ffn(OPEN, 1, x, *args), tol)
    assert torch.equal(gated_ffn_triton(CLOSED, 1, x, *args), x)
    assert torch.equal(gated_ffn_triton(MIXED, 0, x, *args), x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_sub_blocks_low_precision(dtype, tol):
    if DEVICE == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("no bf16 on this GPU")
    x = torch.randn(2, 17, 32, device=DEVICE).to(dtype)
    margs = mhsa_args(32, 2, dtype=dtype)
    fargs = ffn_args(32, 0.5, dtype=dtype)
    # Against the fp32 oracle on the same (rounded) inputs.
    up = lambda args: [a.float() if isinstance(a, torch.Tensor) else a for a in args]  # noqa: E731
    close(gated_mhsa_triton(OPEN, 0, x, *margs).float(), reference.gated_mhsa(OPEN, 0, x.float(), *up(margs)), tol,
          dtype)
    close(gated_ffn_triton(OPEN, 1, x, *fargs).float(), reference.gated_ffn(OPEN, 1, x.float(), *up(fargs)), tol,
          dtype)
    assert torch.equal(gated_mhsa_triton(CLOSED, 0, x, *margs), x)
    assert torch.equal(gated_ffn_triton(CLOSED, 1, x, *fargs), x)


# ---------------------------------------------------------------------------------------------- the fused block
def _fused_gated_model(depth=2):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    timm_model = VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=depth, num_heads=4,
                                   num_classes=10).eval()
    return vitfast.fuse(vitfast.convert.from_timm(timm_model, gates=True, gate_search=False, gate_kind="G1"))


@pytest.mark.parametrize("force", ["open", "closed", ("closed", "open"), ("open", "closed")], ids=str)
def test_gated_block_device_path_runs_the_gated_kernels(force, monkeypatch, tol):
    """FusedGatedBlock's device path (taken on CUDA and under torch.compile) with the ops routed to the Triton
    launchers: equals the CPU branch path for every decision, and calls only the gated sub-block ops."""
    import vitfast.nn.gated as usdc_mod

    model = _fused_gated_model()
    vitfast.nn.set_gate_force(model, force)
    x = torch.randn(2, 17, 32)
    expected = [blk(x) for blk in model.blocks]  # CPU: the branch path
    calls = []

    def route(name, launcher):
        def run(*args):
            calls.append(name)
            return launcher(*[a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args])
        return run

    monkeypatch.setattr(usdc_mod.ops, "gated_mhsa", route("mhsa", gated_mhsa_triton))
    monkeypatch.setattr(usdc_mod.ops, "gated_ffn", route("ffn", gated_ffn_triton))
    monkeypatch.setattr(usdc_mod.ops, "gate_select", lambda *a: pytest.fail("gate_select path taken"))
    monkeypatch.setattr(usdc_mod, "tracing", lambda: True)  # what torch.compile / a CUDA decision selects
    for blk, expect in zip(model.blocks, expected):
        got = blk(x)
        close(got.cpu(), expect, tol)
    assert calls == ["mhsa", "ffn"] * len(model.blocks)


# ---------------------------------------------------------------------------------------------- GPU legality
_SM90_COMPILE = r"""
import inspect
import os
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import vitfast.kernels.gated as g

def build(fn, consts, floats=(), gate="*fp32", **opts):
    sig = {n: "constexpr" if n in consts else ("*" + DT if n.endswith("_ptr") else ("fp32" if n in floats else "i32"))
           for n in fn.arg_names}
    sig["gate_ptr"] = gate  # compared in its own dtype, float64 included
    if "constexprs" in inspect.signature(ASTSource).parameters:
        src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    else:  # triton <= 3.1 (torch 2.4/2.5): constexprs are left out of the signature and passed as constants
        src = ASTSource(fn=fn, signature={n: t for n, t in sig.items() if n not in consts}, constants=consts)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    assert "cond_br" in k.asm["ttir"], fn  # the early return on the gate survived as a branch
    assert k.metadata.shared <= 227 * 1024, (fn, consts, k.metadata.shared)

for DT in ("fp32", "fp16", "bf16"):
    prec = "ieee" if DT == "fp32" else "tf32"
    for gate in ("*fp32", "*fp64", "*bf16"):
        build(g._gated_layernorm_kernel, dict(HAS_W=False, HAS_B=False, INTERPRET_BF16=False, BLOCK_M=4,
              BLOCK_C=1024), floats=("eps",), gate=gate, num_warps=4)
    for m, n in ((197, 384), (64 * 197, 3 * 768)):
        bm, bn, bk, warps, stages = g._gemm_config(m, n)
        for skip in (False, True):
            build(g._gated_linear_kernel, dict(HAS_BIAS=True, HAS_BIAS2=True, HAS_ADD=True, HAS_RES=True,
                  HAS_SKIP=skip, INPUT_PRECISION=prec, INTERPRET_BF16=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                  GROUP_M=8), num_warps=warps, num_stages=stages)
    for d in (32, 64, 128):
        bm, bn, bd, warps = g._attention_config(d)
        build(g._gated_attention_kernel, dict(INPUT_PRECISION=prec, INTERPRET_BF16=False, BLOCK_M=bm, BLOCK_N=bn,
              BLOCK_D=bd), floats=("qk_scale",), num_warps=warps, num_stages=2)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.gpu_compile
def test_kernels_compile_for_sm90_with_the_launch_configs():
    """The interpreter accepts constructs a GPU compile rejects: compile every gated kernel, at the tiles the
    launchers pick, to PTX for an H100 (sm_90) — no GPU needed, only triton's NVIDIA backend."""
    from sm90 import run_compile_script

    run_compile_script(_SM90_COMPILE)
