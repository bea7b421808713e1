"""The Triton block path (`kernels/vit_block.py`, opted into with VITFAST_CUDA_KERNELS=blocks): parity with the
block's formula, launches per block, and the row statistics handed from block to block.

fp32 against the formula in fp64 within 1e-5 relative (the fused-vs-train-time budget of the GPU path); fp16 / bf16
no worse than twice the composition's own error in that dtype.  Natively on CUDA when a GPU is present, else
through the Triton interpreter (conftest.py): small dims (B = 2, N = 17, C = 64, H = 2).
"""
import importlib
import os

import pytest
import torch

from helpers import triton_test_device
import vitfast
import vitfast.kernels.ln_linear as lnl
from vitfast import reference
from vitfast.kernels.vit_block import vit_block_triton

pytestmark = pytest.mark.triton
# The module (vitfast.ops.vit_block is also the name of the op's entry function there).
vit_block_ops = importlib.import_module("vitfast.ops.vit_block")

DEVICE, INTERPRET = triton_test_device()

# (name, active A as a multiple of C, linear path, FFN norm, FFN residual): the FFN forms of vitfast/nn/ffn.py.
FORMS = [
    ("ln_variant", 2.0, True, True, True),      # RePa-DeiT (θ 0.5 of 4C), LN variant: own norm, explicit shortcut
    ("bn_variant", 1.0, True, False, False),    # BN variant: norm and shortcut folded into the linear rows
    ("theta0", 4.0, False, True, True),         # θ = 0: a vanilla FFN
    ("linear_only", 0.0, True, False, True),    # θ = 1: no active channel
]


def make_args(form, c=64, heads=2, tokens=17, batch=2, offset=0.0):
    _, active_mult, linear, norm, residual = form

    def w(*s, fan_in):
        return ((torch.rand(*s) * 2 - 1) / max(fan_in, 1) ** 0.5).to(DEVICE)

    active = int(active_mult * c)
    rows_in = active + (c if linear else 0)
    x = (torch.randn(batch, tokens, c) + offset).to(DEVICE)
    return (x, 1e-6, w(3 * c, c, fan_in=c), w(3 * c, fan_in=c), heads, w(c, c, fan_in=c), w(c, fan_in=c),
            1e-6 if norm else None, w(rows_in, c, fan_in=c), w(rows_in, fan_in=c), w(c, active, fan_in=active),
            w(c, fan_in=active), residual)


def cast(args, dtype):
    return tuple(a.to(dtype) if isinstance(a, torch.Tensor) else a for a in args)


FNS = (reference.layer_norm_unchecked, reference.linear_unchecked, reference.attention_unchecked,
       reference.channel_idle_ffn_unchecked)


def formula(args, dtype=None):
    """The block's formula (reference.compose_vit_block) on the reference functions, in `dtype` (fp64: the truth)."""
    return reference.compose_vit_block(FNS, *(cast(args, dtype) if dtype else args))


def rel_err(y, truth):
    return ((y.double() - truth).abs().max() / truth.abs().max()).item()


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f[0])
def test_fp32_within_1e5_relative(form):
    args = make_args(form)
    out, _ = vit_block_triton(*args)
    assert out.shape == args[0].shape and out.dtype == torch.float32
    assert rel_err(out, formula(args, torch.float64)) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("form", FORMS[:2], ids=lambda f: f[0])
def test_low_precision_no_worse_than_twice_the_composition(form, dtype, tol):
    args = cast(make_args(form), dtype)
    truth = formula(args, torch.float64)  # from the same rounded weights and input
    out, _ = vit_block_triton(*args)
    assert out.dtype == dtype
    own = formula(args)
    assert rel_err(out, truth) <= 2 * rel_err(own, truth)
    atol, rtol = tol[dtype]
    torch.testing.assert_close(out, own, atol=atol, rtol=rtol)


def test_large_residual_offset_fp32():
    # A residual stream with |μ| ≈ 300σ: the LayerNorm GEMMs fall back to explicit normalisation (fp32 κ_max ≈ 2).
    args = make_args(FORMS[0], offset=300.0)
    out, _ = vit_block_triton(*args)
    assert rel_err(out, formula(args, torch.float64)) <= 1e-5


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f[0])
def test_five_launches_and_chained_stats(form):
    # Block 1 computes x's statistics (6 launches, attention one of them), block 2 reads the ones block 1's last
    # epilogue emitted (5); θ = 1 has no fc2 (one fewer).  Chained statistics give the same result as fresh ones.
    args = make_args(form)
    fc2 = 0 if form[1] == 0 else 1
    before = lnl.launch_count()
    out1, stats1 = vit_block_triton(*args)
    assert lnl.launch_count() - before == 5 + fc2
    mean, var = stats1.mean_var()
    torch.testing.assert_close(mean, out1.double().mean(-1).flatten(), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(var, out1.double().var(-1, unbiased=False).flatten(), atol=1e-5, rtol=1e-5)
    args2 = (out1,) + args[1:]
    before = lnl.launch_count()
    chained, _ = vit_block_triton(*args2, stats=stats1)
    assert lnl.launch_count() - before == 4 + fc2
    fresh, _ = vit_block_triton(*args2)
    torch.testing.assert_close(chained, fresh, atol=1e-6, rtol=1e-6)
    assert rel_err(chained, formula(args2, torch.float64)) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_triton_attention_and_sdpa_give_the_same_block(dtype, tol):
    # The block path's attention (b): the Triton kernel (default) and SDPA on views of qkv, one launch each by the
    # counter; both within the block's budget against the fp64 formula.
    args = cast(make_args(FORMS[0]), dtype)
    truth = formula(args, torch.float64)
    before = lnl.launch_count()
    own, _ = vit_block_triton(*args)
    assert lnl.launch_count() - before == 6
    sdpa, _ = vit_block_triton(*args, attention="sdpa")
    assert lnl.launch_count() - before == 12
    atol, rtol = tol[dtype]
    torch.testing.assert_close(own, sdpa, atol=atol, rtol=rtol)
    if dtype == torch.float32:
        assert max(rel_err(own, truth), rel_err(sdpa, truth)) <= 1e-5
    with pytest.raises(ValueError, match=r"attention: expected one of 'triton', 'sdpa', got 'flash'"):
        vit_block_triton(*args, attention="flash")


@pytest.mark.parametrize("form", FORMS[:2], ids=lambda f: f[0])
def test_split_k_block_keeps_five_launches(form, monkeypatch):
    # Every GEMM of the block split in 3 (what split_k_factor picks for few rows on a many-SM GPU): the last
    # program of each tile reduces the slices inside the same launch, so the block stays at 5 (+1 statistics).
    asked = []
    monkeypatch.setattr(lnl, "split_k_factor", lambda m, n, k, sms: asked.append(k) or 3)
    args = make_args(form, c=96)  # K = 96: 3 K-tiles of the interpreter's 32, one per slice
    before = lnl.launch_count()
    out, _ = vit_block_triton(*args)
    assert lnl.launch_count() - before == 6
    assert len(asked) == 4  # qkv, proj, fc1, fc2 all split
    assert rel_err(out, formula(args, torch.float64)) <= 1e-5


def test_policy_routes_whole_blocks_and_chains(monkeypatch):
    # VITFAST_CUDA_KERNELS=blocks: the eager whole-block entry runs the Triton path, and a second block fed the first
    # one's output reuses its statistics (no row_stats launch) unless that output was written to in place.
    # (On CPU the entry is reached directly: FusedBlock calls it for CUDA tensors only.)
    monkeypatch.setattr(vitfast._env, "_cuda_kernels", "blocks")
    monkeypatch.setattr(vit_block_ops, "_chained", None)
    args = make_args(FORMS[0])
    before = lnl.launch_count()
    out1 = vitfast.ops.vit_block_cuda_eager(*args)
    out2 = vitfast.ops.vit_block_cuda_eager(out1, *args[1:])
    assert lnl.launch_count() - before == 6 + 5
    assert rel_err(out2, formula((out1,) + args[1:], torch.float64)) <= 1e-5
    out2.add_(1.0)  # modified since it was emitted: its statistics no longer describe it
    before = lnl.launch_count()
    out3 = vitfast.ops.vit_block_cuda_eager(out2, *args[1:])
    assert lnl.launch_count() - before == 6
    assert rel_err(out3, formula((out2,) + args[1:], torch.float64)) <= 1e-5
    # Inference tensors have no version counter: never chained, so an in-place write cannot go unnoticed.
    with torch.inference_mode():
        before = lnl.launch_count()
        y1 = vitfast.ops.vit_block_cuda_eager(*args)
        y1.add_(1.0)
        y2 = vitfast.ops.vit_block_cuda_eager(y1, *args[1:])
        assert lnl.launch_count() - before == 6 + 6
    assert rel_err(y2, formula((y1,) + args[1:], torch.float64)) <= 1e-5


@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_fused_model_blocks_chain(norm, monkeypatch):
    # A fused RePa-DeiT's blocks, fed one after the other as nn.Sequential does, on the block path: 6 launches for the
    # first block, 5 for each next one (their statistics come from the block before), and the model's blocks' result.
    # (FusedBlock takes this path for CUDA tensors; the arguments are taken here as it takes them, on CPU tensors too,
    # where whole_block_args wants the C++ extension.)
    import timm

    from vitfast.nn.block import whole_block_args

    if DEVICE == "cpu" and not vitfast.ops.extension_loaded():
        pytest.skip("whole_block_args takes CPU blocks only with the C++ extension built")
    base = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=32, depth=3).eval()
    model = vitfast.fuse(vitfast.convert.from_timm(base, channel_idle=0.75, norm=norm)).eval().to(DEVICE)
    x = torch.randn(2, 5, model.embed_dim, device=DEVICE)
    monkeypatch.setattr(vit_block_ops, "_chained", None)
    with torch.no_grad():
        monkeypatch.setattr(vitfast._env, "_cuda_kernels", "torch")
        expected = model.blocks(x)  # the CPU op, or on CUDA the composition
        monkeypatch.setattr(vitfast._env, "_cuda_kernels", "blocks")
        before = lnl.launch_count()
        y = x
        for block in model.blocks:
            args = whole_block_args(block, y)
            assert args is not None
            y = vitfast.ops.vit_block_cuda_eager(*args)
    assert lnl.launch_count() - before == 6 + 5 * (len(model.blocks) - 1)
    assert rel_err(y, expected.double()) <= 1e-5


def test_default_policy_keeps_the_composition(monkeypatch):
    monkeypatch.setattr(vitfast._env, "_cuda_kernels", "auto")
    args = make_args(FORMS[0])
    before = lnl.launch_count()
    vitfast.ops.vit_block_cuda_eager(*args)
    assert lnl.launch_count() == before


# ---------------------------------------------------------------------------------------------- CUDA only
cuda = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device (real kernels, CUDA graphs)")


def _cuda_kernels(fn):
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    return out, [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@cuda
def test_cuda_at_most_five_kernels_per_block(monkeypatch):
    # The real kernels, the Triton attention kernel's included (one launch reading the packed qkv; SDPA's cuDNN
    # backend launched a memset before its kernel: six on an H200).
    monkeypatch.setattr(vitfast._env, "_cuda_kernels", "blocks")
    args = cast(make_args(FORMS[0], c=128, tokens=197), torch.bfloat16)
    with torch.no_grad():
        out1 = vitfast.ops.vit_block_cuda_eager(*args)
        _, kernels = _cuda_kernels(lambda: vitfast.ops.vit_block_cuda_eager(out1, *args[1:]))
    assert len(kernels) <= 5, kernels  # the names: which launch is the extra one


@cuda
@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_cuda_fused_model_eager_and_graph(norm, monkeypatch):
    import timm

    monkeypatch.setattr(vitfast._env, "_cuda_kernels", "blocks")
    base = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=32, depth=3).eval()
    model = vitfast.fuse(vitfast.convert.from_timm(base, channel_idle=0.75, norm=norm)).eval().cuda()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    with torch.no_grad():
        eager = model(x)
        with monkeypatch.context() as m:
            m.setattr(vitfast._env, "_cuda_kernels", "torch")
            composed = model(x)
        graphed = vitfast.cuda_graph(model)
        graphed(x)
        replay = graphed(x)
    assert rel_err(eager, composed.double()) <= 1e-5
    torch.testing.assert_close(replay, eager, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------- the GPU table script
def test_gpu_blocks_dry_run(capsys):
    # benchmarks/gpu_blocks.py up to where it needs CUDA: builds the model, finds every block on the block path.
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import gpu_blocks

    assert gpu_blocks.main(["--dry-run", "--models", "deit_tiny_patch16_224", "--batches", "64"]) == 0
    out = capsys.readouterr().out
    assert "12/12 blocks take the block path" in out
    assert out.count("planned:") == len(gpu_blocks.ROWS)
