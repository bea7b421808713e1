"""Parity of the Triton `attention` kernel (kernels/attention.py) with `vitfast.reference.attention`.

Runs natively on CUDA tensors when a GPU is present, otherwise through the Triton interpreter on CPU tensors
(conftest.py sets TRITON_INTERPRET=1 before triton is imported; the interpreter's tile is 16 × 16, so the shapes below
cross query- and key-tile edges).  The sm_90 compile test needs no GPU, only triton's NVIDIA backend.
"""
import pytest
import torch
from helpers import assert_low_precision_no_worse, triton_test_device
from sm90 import run_compile_script

import vitfast.kernels.attention as ak
from vitfast.kernels._common import forced_config
from vitfast.kernels.attention import attention_triton
from vitfast.reference import attention as reference

pytestmark = pytest.mark.triton

DEVICE, INTERPRET = triton_test_device()


def _qkv(batch, tokens, heads, head_dim, dtype=torch.float32, score_std=2.0):
    """Packed qkv whose scores q·k·D^-½ have std ≈ score_std: a softmax far from uniform and far from one-hot."""
    qkv = torch.randn(batch, tokens, 3 * heads * head_dim, device=DEVICE)
    qkv[..., : heads * head_dim] *= score_std
    return qkv.to(dtype)


def _low_precision_dtypes():
    if DEVICE == "cpu":
        return [torch.float16, torch.bfloat16]
    return [torch.float16] + ([torch.bfloat16] if torch.cuda.is_bf16_supported() else [])


# (batch, tokens, heads, head dim)
SHAPES = [
    (2, 37, 3, 16),   # ragged query and key tiles
    (1, 1, 2, 16),    # one token
    (2, 33, 2, 24),   # a head width that is not a power of two (BLOCK_D 32, columns masked)
    (1, 20, 4, 8),    # a head narrower than the 16-wide dot tile
    (3, 16, 1, 32),   # exactly one tile of each
]
SLOW_SHAPES = [(1, 197, 6, 64)]  # DeiT-S


def _id(shape):
    return "B{}-N{}-H{}-D{}".format(*shape)


@pytest.mark.parametrize("shape", SHAPES + [pytest.param(s, marks=pytest.mark.slow) for s in SLOW_SHAPES], ids=_id)
def test_fp32_parity(shape, tol):
    b, n, h, d = shape
    qkv = _qkv(b, n, h, d)
    out = attention_triton(qkv, h)
    assert out.shape == (b, n, h * d) and out.dtype == torch.float32 and out.is_contiguous()
    torch.testing.assert_close(out, reference(qkv, h), atol=tol[torch.float32][0], rtol=tol[torch.float32][1])


@pytest.mark.parametrize("dtype", _low_precision_dtypes(), ids=str)
def test_low_precision_no_worse_than_torch(dtype, tol):
    """fp16/bf16: error against the fp32 reference no worse than 2× torch's own (SDPA in that dtype)."""
    qkv = _qkv(2, 37, 3, 16, dtype)
    assert_low_precision_no_worse(attention_triton, reference, (qkv, 3), dtype, tol)


@pytest.mark.parametrize("scale", [0.5, 0.0, -1.25])
def test_given_scale(scale, tol):
    qkv = _qkv(2, 21, 2, 16)
    torch.testing.assert_close(attention_triton(qkv, 2, scale), reference(qkv, 2, scale),
                               atol=tol[torch.float32][0], rtol=tol[torch.float32][1])


def test_strided_qkv_is_read_in_place(tol):
    """Any strides: a column slice of a wider tensor (row stride ≠ width) and a batch-transposed view."""
    wide = torch.randn(19, 2, 3 * 2 * 16 + 8, device=DEVICE)
    qkv = wide[..., 4:4 + 3 * 2 * 16].transpose(0, 1)  # [2, 19, 96], strides (96 + 8, 2·104, 1)
    assert not qkv.is_contiguous()
    torch.testing.assert_close(attention_triton(qkv, 2), reference(qkv.contiguous(), 2),
                               atol=tol[torch.float32][0], rtol=tol[torch.float32][1])


def test_large_scores_do_not_overflow(tol):
    """Scores in the thousands: the running maximum is subtracted before exp2, as softmax's max-subtraction."""
    qkv = _qkv(1, 40, 2, 16, score_std=300.0)
    out, ref = attention_triton(qkv, 2), reference(qkv, 2)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_non_finite_values_propagate_as_in_the_reference():
    """A NaN in one key's value reaches every query of that head in that column (its weight is > 0), as in
    softmax(·)·V; an inf in a query gives that row NaN (inf − inf in the softmax)."""
    h, d = 2, 16
    qkv = _qkv(1, 23, h, d)
    qkv[0, 5, 2 * h * d + 3] = float("nan")  # v of key 5, head 0, column 3
    qkv[0, 9, d + 1] = float("inf")  # q of query 9, head 1
    # The reference on the CPU (SDPA's math backend): on a GPU its fused backends need not spell out inf − inf alike.
    out, ref = attention_triton(qkv, h).cpu(), reference(qkv.cpu(), h)
    assert torch.equal(out.isnan(), ref.isnan()) and out.isnan().any()
    finite = ~ref.isnan()
    torch.testing.assert_close(out[finite], ref[finite], atol=2e-5, rtol=2e-5)


def test_empty_inputs():
    for shape in ((0, 5, 96), (2, 0, 96)):
        out = attention_triton(torch.randn(shape, device=DEVICE), 2)
        assert out.shape == shape[:2] + (32,)


def test_bad_arguments_name_what_was_expected():
    with pytest.raises(ValueError, match=r"qkv: expected last dimension a positive multiple of 3·num_heads = 6"):
        attention_triton(torch.randn(1, 4, 10, device=DEVICE), 2)
    with pytest.raises(ValueError, match=r"scale: expected a finite number"):
        attention_triton(torch.randn(1, 4, 12, device=DEVICE), 2, float("nan"))


def test_one_launch(monkeypatch):
    launches = []
    kernel = ak._attention_kernel

    class Counting:
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                launches.append(grid)
                return kernel[grid](*args, **kwargs)
            return run

    monkeypatch.setattr(ak, "_attention_kernel", Counting())
    attention_triton(_qkv(2, 37, 3, 16), 3)
    assert len(launches) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_every_candidate_gives_the_reference(dtype, tol):
    """Every autotune candidate, not only the first one the parity tests reach with autotuning off, at a DeiT-S
    shape (197 tokens: ragged tiles at every candidate): natively at 3 images of 6 heads, under the interpreter at
    one image of 2 heads (each candidate's index and mask logic, in CI)."""
    batch, heads = (3, 6) if DEVICE == "cuda" else (1, 2)
    qkv = _qkv(batch, 197, heads, 64, dtype)
    truth = reference(qkv.float(), heads)
    own = (reference(qkv, heads).float() - truth).abs().max().item()
    for cfg in ak.candidates():
        out = attention_triton(qkv, heads, _wrap=forced_config(cfg))
        err = (out.float() - truth).abs().max().item()
        if dtype == torch.float32:
            torch.testing.assert_close(out, truth, atol=tol[dtype][0] * 10, rtol=tol[dtype][1] * 10)
        else:
            assert err <= 2 * own, (cfg, err, own)


# ---------------------------------------------------------------------------------------------- GPU legality
_SM90_COMPILE = r"""
import os
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import vitfast.kernels.attention as A
from sm90 import ptxas_report

fn = A._attention_kernel.fn
ALIGNED = ("s_qb", "s_qn", "s_ob", "s_on")  # row strides of a DeiT qkv / output (multiples of 16 elements)

def build(dt, prec, bm, bn, warps, stages, block_d=64):
    consts = dict(BLOCK_D=block_d, INPUT_PRECISION=prec, INTERPRET_BF16=False, BLOCK_M=bm, BLOCK_N=bn, s_qc=1, s_oc=1)
    missing = [n for i, n in enumerate(fn.arg_names) if i in fn.constexprs and n not in consts]
    assert not missing, missing
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in consts:
            sig[n] = "constexpr"
            continue
        sig[n] = "*" + dt if n.endswith("_ptr") else "fp32" if n == "qk_scale" else "i32"
        if n.endswith("_ptr") or n in ALIGNED:
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    assert k.metadata.shared <= 227 * 1024, (dt, bm, bn, k.metadata.shared)
    return k

# Every candidate in 16-bit: both products on Hopper's wgmma, kept asynchronous (no C7515), nothing spilled.
for dt in ("bf16", "fp16"):
    for cfg in A.candidates():
        bm, bn, w, s = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages
        k = build(dt, "tf32", bm, bn, w, s)
        assert k.asm["ttgir"].count("warp_group_dot") >= 2, (dt, bm, bn)
        report = ptxas_report(k)
        if report is not None:
            assert "C7515" not in report and " 0 bytes spill stores" in report, (dt, bm, bn, w, report)
for prec in ("ieee", "tf32"):
    build("fp32", prec, 128, 64, 8, 3)
# The widest head the kernel takes (MAX_HEAD_DIM): compiles at every candidate (spills allowed: not a ViT shape).
for cfg in A.candidates():
    build("bf16", "tf32", cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages, A.MAX_HEAD_DIM)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.gpu_compile
def test_kernel_compiles_for_sm90():
    """The interpreter accepts constructs a GPU compile rejects: compile every candidate for an H100 (sm_90) with
    the specialisation the JIT applies at ViT shapes, and ask ptxas whether the wgmma stay asynchronous."""
    run_compile_script(_SM90_COMPILE)


def test_cuda_policy_keeps_sdpa_unless_triton_is_forced():
    """`torch.ops.vitfast.attention` on CUDA: SDPA by default (the kernel is untimed against it), the Triton kernel
    only under VITFAST_CUDA_KERNELS=triton; the block path ("blocks") has its own choice (kernels/vit_block.py)."""
    from vitfast.ops.attention import use_triton_attention

    assert [use_triton_attention(p) for p in ("auto", "torch", "blocks", "triton")] == [False, False, False, True]


def test_wide_heads_run_on_the_reference(tol, monkeypatch):
    """Heads wider than MAX_HEAD_DIM (q and acc BLOCK_D wide in registers would spill): SDPA, same layout, no
    kernel launch."""
    monkeypatch.setattr(ak, "MAX_HEAD_DIM", 16)
    monkeypatch.setattr(ak, "_attention_kernel", None)  # launching it would raise
    qkv = _qkv(2, 9, 2, 32)
    out = attention_triton(qkv, 2)
    assert out.is_contiguous()
    torch.testing.assert_close(out, reference(qkv, 2), atol=tol[torch.float32][0], rtol=tol[torch.float32][1])
