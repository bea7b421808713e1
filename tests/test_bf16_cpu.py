"""bf16 compute on CPUs with a bf16 extension (AVX512_BF16, ARM BF16): csrc/kernels/gemm_bf16.h.

A bf16 fused model (`.to(torch.bfloat16)`) runs its GEMMs on bf16 operands with fp32 accumulation: each block as one
`vit_block` call, linear / channel_idle_ffn / attention alone too.  What is checked:

- the numerics are exactly the documented ones: the C++ result against an fp64 emulation that rounds the same
  operands to bf16 (GEMM inputs, weights, attention's Q, K, V and P) and keeps the rest in high precision.  The only
  differences left are the fp32 accumulation (~1e-6 relative) and the final rounding to bf16 (half an ulp, 2^-9
  relative, an ulp where the two values sit on either side of a tie), so the bound is 2^-8 of each value's magnitude;
- the bf16 path is really taken when `_C.bf16_kernel()` names one (its results differ from today's fp32-compute
  path, whose bits are known) and the block runs as one op;
- with the extension off (VITFAST_CPU_EXT=none, in a subprocess) every bf16 op gives today's bits (fp32 compute of
  the fp32 conversions, rounded once) and a bf16 block runs its six ops, as before;
- a model's error against fp32 stays within twice today's bf16 path's (which rounds between ops);
- argument errors are unchanged.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import timm
import torch
import torch.nn.functional as F

import vitfast
from vitfast import reference
from vitfast.nn.block import whole_block_args
from vitfast.reference.attention_bf16 import exp_for_bf16
from vitfast.reference.gelu_bf16 import gelu_for_bf16

if not vitfast.ops.extension_loaded():
    pytest.skip("needs the C++ extension (vitfast._C)", allow_module_level=True)
from vitfast import _C  # noqa: E402

HAS_BF16 = _C.bf16_kernel() != "none"
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no bf16 extension (AVX512_BF16 / ARM BF16): the "
                                "bf16 GEMMs do not run here")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("one_thread")


def _bf16(t):
    return t.to(torch.bfloat16).double()


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


# ------------------------------------------------------------------------------------ emulation (fp64, bf16 operands)
def emu_layer_norm(x, w, b, eps):
    return F.layer_norm(x.double(), (x.shape[-1],), None, None, eps)


def emu_linear(x, w, b=None, residual=None):
    y = _bf16(x) @ _bf16(w).T
    if b is not None:
        y = y + b.double()
    if residual is not None:
        y = y + residual.double()
    return y


def emu_attention(qkv, heads, scale=None):
    bsz, n, width = qkv.shape
    d = width // 3 // heads
    q, k, v = _bf16(qkv).reshape(bsz, n, 3, heads, d).permute(2, 0, 3, 1, 4)
    s = (q @ k.transpose(-1, -2)) * (d ** -0.5 if scale is None else scale)
    e = exp_for_bf16(s - s.amax(-1, keepdim=True)).double()  # the kernels' exp for P (reference.attention_bf16)
    o = (_bf16(e) @ v) / e.sum(-1, keepdim=True)  # P rounded for P·V, the sum from the unrounded exponentials
    return o.transpose(1, 2).reshape(bsz, n, heads * d)


def emu_channel_idle_ffn(x, w_in, b_in, w_out, b_out=None, residual=None):
    active = w_out.shape[1]
    h = _bf16(x) @ _bf16(w_in).T
    if b_in is not None:
        h = h + b_in.double()
    act = gelu_for_bf16(h[..., :active]).double()  # the kernels' GELU (reference.gelu_bf16) of the fp32 sums
    y = _bf16(act) @ _bf16(w_out).T  # h_act rounded once for the second GEMM
    if w_in.shape[0] > active:
        y = y + h[..., active:]
    if b_out is not None:
        y = y + b_out.double()
    if residual is not None:
        y = y + residual.double()
    return y


def emu_vit_block(*args):
    return reference.compose_vit_block((emu_layer_norm, emu_linear, emu_attention, emu_channel_idle_ffn), *args)


def assert_bf16_of(got, exact, what):
    """got (bf16) is exact rounded to bf16 up to fp32 accumulation: |got − exact| <= 2^-8·|exact| + a floor."""
    assert got.dtype == torch.bfloat16, what
    g, e = got.double(), exact.double()
    floor = 1e-5 * e.abs().max().item()  # fp32 accumulation on values that cancel to near zero
    excess = (g - e).abs() - (2.0 ** -8 * e.abs() + floor)
    assert excess.max().item() <= 0, f"{what}: worst excess {excess.max().item():.3g} at {excess.argmax().item()}"


# ------------------------------------------------------------------------------------------------------- models
def _fused(name="deit_tiny_patch16_224", depth=2, img_size=32, norm="batch"):
    m = timm.create_model(name, pretrained=False, img_size=img_size, depth=depth).eval()
    return vitfast.fuse(vitfast.convert.from_timm(m, channel_idle=0.75, norm=norm)).eval()


def _block_op_calls(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
    return out, sum(e.count for e in prof.key_averages() if e.key == "vitfast::vit_block")


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# ------------------------------------------------------------------------------------------------------------ tests
def test_bf16_kernel_names_the_hardware():
    flags = _cpu_flags()
    kernel = _C.bf16_kernel()
    assert kernel in ("amx_bf16", "avx512_bf16", "neon_bf16", "none")
    env = os.environ.get("VITFAST_CPU_EXT")
    if _C.cpu_isa() == "avx512" and "avx512_bf16" in flags and env != "none":
        amx = {"amx_tile", "amx_bf16"} <= set(flags.split()) and env != "noamx"
        assert kernel == ("amx_bf16" if amx else "avx512_bf16")


def test_amx_can_be_switched_off_by_name():
    """set_cpu_ext_enabled(False, names) turns off only the named extensions: the AVX-512 kernels then run."""
    if "amx_bf16" not in _C.cpu_extensions():
        pytest.skip("no AMX-BF16 on this CPU")
    try:
        _C.set_cpu_ext_enabled(False, ["amx_bf16", "amx_int8"])
        assert _C.bf16_kernel() == "avx512_bf16" and _C.int8_kernel() == "avx512_vnni"
        assert "avx512_bf16" in _C.cpu_extensions() and "amx_bf16" not in _C.cpu_extensions()
    finally:
        _C.set_cpu_ext_enabled(True)
    assert _C.bf16_kernel() == "amx_bf16"


def test_amx_kernels_interleave_with_torchs_own_bf16_matmuls():
    """The AMX kernels configure the tile unit on every call and release it after; torch's bf16 matmul (oneDNN, on
    the same tiles) configures its own.  Alternating the two on one thread must give each one's own bits every time:
    neither may run on the other's tile configuration."""
    if "amx_bf16" not in _C.cpu_extensions():
        pytest.skip("no AMX-BF16 on this CPU")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(197, 384, generator=g).bfloat16()
    w = torch.randn(1152, 384, generator=g).bfloat16()
    b = torch.randn(1152, generator=g).bfloat16()
    first_ours = torch.ops.vitfast.linear(x, w, b)
    first_torch = torch.nn.functional.linear(x, w, b)
    for _ in range(3):
        assert torch.equal(torch.nn.functional.linear(x, w, b), first_torch)
        assert torch.equal(torch.ops.vitfast.linear(x, w, b), first_ours)
    # And both are the bf16 product of the same operands (different summation orders).
    assert _rel(first_ours.float(), first_torch.float()) < 1e-2


def test_other_paths_turn_bf16_off():
    previous = _C.cpu_isa()
    try:
        _C.set_cpu_isa("scalar")
        assert _C.bf16_kernel() == "none"
    finally:
        _C.set_cpu_isa(previous)


@needs_bf16
@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_block_op_is_the_bf16_emulation(norm):
    model = _fused(norm=norm).to(torch.bfloat16)
    block = model.blocks[0]
    x = torch.randn(2, 17, 192).to(torch.bfloat16)
    with torch.no_grad():
        args = whole_block_args(block, x)
        assert args is not None, "a bf16 CPU block on bf16 hardware must run as the one vit_block call"
        got = torch.ops.vitfast.vit_block(*args)
        assert_bf16_of(got, emu_vit_block(*args), f"vit_block ({norm})")
        out, calls = _block_op_calls(lambda: block(x))
    assert calls == 1 and torch.equal(out, got)


@needs_bf16
@pytest.mark.parametrize("width", [21, 22])
@pytest.mark.parametrize("ffn", ["layer norm, residual", "folded, no linear path", "folded, linear path"])
@pytest.mark.parametrize("d", [8, 7])
def test_block_op_widens_and_rounds_in_its_steps(width, ffn, d):
    """A bf16 block's input is widened by its first LayerNorm step by step and its output rounded by the FFN's last
    GEMM epilogue (an even width) or after it (an odd one: no whole bf16 pairs per row): the emulation bound either
    way.  An even head dim keeps qkv only as bf16 (the qkv GEMM's rounding, read by attention as it is), an odd one
    as fp32 (attention rounds Q, K and V itself): the same emulation both ways.  With both FFN paths the FFN input
    (the LayerNorm's rows, or x1 rounded by the proj GEMM when folded) sits beside h_act for the FFN's second GEMM
    (kernels/channel_idle_ffn.h), an odd width with its pad element between them."""
    g = torch.Generator().manual_seed(width)

    def r(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(torch.bfloat16)

    heads, active = 3, 10
    attn_dim = heads * d
    linear = 0 if ffn.endswith("no linear path") else width
    x = r(2, 13, width)
    args = (x, 1e-6, r(3 * attn_dim, width, s=0.2), r(3 * attn_dim), heads, r(width, attn_dim, s=0.2), r(width),
            1e-6 if ffn.startswith("layer") else None, r(active + linear, width, s=0.2), r(active + linear),
            r(width, active, s=0.2), r(width), ffn.startswith("layer"))
    got = torch.ops.vitfast.vit_block(*args)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    assert_bf16_of(got, emu_vit_block(*args), f"vit_block, width {width}, {ffn}")


@needs_bf16
def test_ops_are_the_bf16_emulation():
    g = torch.Generator().manual_seed(1)

    def r(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(torch.bfloat16)

    x, res = r(2, 29, 72), r(2, 29, 40)
    w, b = r(40, 72, s=0.1), r(40)
    assert_bf16_of(torch.ops.vitfast.linear(x, w, b, res), emu_linear(x, w, b, res), "linear")
    xo, wo = r(3, 33), r(17, 33, s=0.2)  # odd K: the pad element
    assert_bf16_of(torch.ops.vitfast.linear(xo, wo), emu_linear(xo, wo), "linear, odd K")
    cls = r(4, 9, 72)[:, 0]  # a strided view (row stride 9·72, even: read in place)
    assert_bf16_of(torch.ops.vitfast.linear(cls, w, b), emu_linear(cls, w, b), "linear, strided rows")
    w_in, b_in, w_out, b_out = r(18 + 40, 72, s=0.1), r(58), r(40, 18, s=0.2), r(40)
    assert_bf16_of(torch.ops.vitfast.channel_idle_ffn(x, w_in, b_in, w_out, b_out, res),
                   emu_channel_idle_ffn(x, w_in, b_in, w_out, b_out, res), "channel_idle_ffn")
    # An odd C_out has no whole bf16 pairs per row for the epilogue's bf16 store: the fp32 result rounded after.
    wi_o, wo_o, bo_o = r(5, 33, s=0.2), r(17, 5, s=0.2), r(17)
    assert_bf16_of(torch.ops.vitfast.channel_idle_ffn(xo, wi_o, None, wo_o, bo_o),
                   emu_channel_idle_ffn(xo, wi_o, None, wo_o, bo_o), "channel_idle_ffn, odd C_out")
    qkv = r(2, 23, 3 * 4 * 16)
    assert_bf16_of(torch.ops.vitfast.attention(qkv, 4), emu_attention(qkv, 4), "attention")


def test_gelu_for_bf16_accuracy_and_specials():
    # The reference's GELU of the bf16 GEMMs (the kernels' bits: csrc/tests/test_gemm_bf16.cpp) against the exact
    # GELU in float64: the bounds erf_poly.h documents (relative 2.2e-6 for x >= 0, absolute 1.2e-6·|x|), its bf16
    # rounding the exact one's but at a few values (never more than one ulp away), and the special values.
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.linspace(-9, 9, 400001), 2.0 * torch.randn(400000, generator=g)])
    got, xd = gelu_for_bf16(x).double(), x.double()
    exact = 0.5 * xd * (1.0 + torch.erf(xd / 2.0 ** 0.5))
    err = (got - exact).abs()
    assert float((err / exact)[xd > 0].max()) <= 2.2e-6
    assert float((err / xd.abs())[xd != 0].max()) <= 1.2e-6
    ulps = (got.float().to(torch.bfloat16).view(torch.int16).int()
            - exact.float().to(torch.bfloat16).view(torch.int16).int()).abs()[xd >= -1]
    assert int(ulps.max()) <= 1 and float((ulps != 0).double().mean()) < 1e-3
    inf = float("inf")
    specials = gelu_for_bf16(torch.tensor([0.0, 6.0, -6.0, 1e30, -1e30, inf, -inf, float("nan")]))
    assert torch.equal(specials[:6], torch.tensor([0.0, 6.0, 0.0, 1e30, 0.0, inf])) and specials[6:].isnan().all()


@needs_bf16
def test_gelu_for_bf16_is_the_kernels():
    # Identity weights make the channel-idle FFN's output exactly bf16(GELU(x)) (x·I exact, one nonzero exact product
    # per output): the kernel's GELU bit for bit, over values reaching past ±5.09 where its polynomial is clamped.
    x = (3.0 * torch.randn(3, 41, 64, generator=torch.Generator().manual_seed(2))).to(torch.bfloat16)
    eye = torch.eye(64, dtype=torch.bfloat16)
    got = torch.ops.vitfast.channel_idle_ffn(x, eye, None, eye, None, None)
    want = gelu_for_bf16(x.float()).to(torch.bfloat16)
    assert got.dtype == torch.bfloat16 and bool((x.float().abs() > 5.1).any())
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@needs_bf16
@pytest.mark.parametrize("threads", [1, 2])
def test_attention_chunks_and_thread_splits(threads, restore_threads):
    """Several query chunks (kAttentionChunk = 42 rows) and, at 2 threads with one image of 3 heads, query rows split
    between threads: the same emulation bound, and the same bits at 1 and 2 threads."""
    qkv = torch.randn(1, 101, 3 * 3 * 32).to(torch.bfloat16)
    torch.set_num_threads(threads)
    got = torch.ops.vitfast.attention(qkv, 3)
    assert_bf16_of(got, emu_attention(qkv, 3), f"attention, {threads} threads")
    torch.set_num_threads(1)
    assert torch.equal(got, torch.ops.vitfast.attention(qkv, 3))


@needs_bf16
def test_bf16_path_is_taken_and_differs_from_fp32_compute():
    """With the extension the ops do not compute the fp32 conversions (today's path): the FFN rounds h_act to bf16,
    so its bits differ from today's, and the packed bf16 weights are cache entries of their own."""
    x = torch.randn(2, 50, 96).to(torch.bfloat16)
    w_in = (torch.randn(48 + 96, 96) * 0.1).to(torch.bfloat16)
    w_out = (torch.randn(96, 48) * 0.1).to(torch.bfloat16)
    today = torch.ops.vitfast.channel_idle_ffn(x.float(), w_in.float(), None, w_out.float()).to(torch.bfloat16)
    vitfast.ops.clear_weight_cache()
    assert not torch.equal(torch.ops.vitfast.channel_idle_ffn(x, w_in, None, w_out), today)
    assert _C._weight_cache_stats()["entries"] == 1
    previous = _C.cpu_isa()
    try:
        _C.set_cpu_isa("avx2" if "avx2" in _C.supported_cpu_isas() else "scalar")
        assert _C.bf16_kernel() == "none"
        assert torch.equal(torch.ops.vitfast.channel_idle_ffn(x, w_in, None, w_out), today)
        assert _C._weight_cache_stats()["entries"] == 2  # the fp32 pack of the same tensors: a separate entry
    finally:
        _C.set_cpu_isa(previous)


@needs_bf16
def test_model_error_within_twice_todays_bf16_path():
    """End to end against the fp32 model: the bf16 GEMMs round the same tensors today's bf16 path rounds (every op's
    input, plus Q, K, V, P and h_act) but keep fp32 between ops inside a block, so the error may not exceed twice
    today's (measured ~equal)."""
    model = _fused(depth=4, img_size=64)
    x = torch.randn(2, 3, 64, 64)
    half = copy.deepcopy(model).to(torch.bfloat16)
    with torch.no_grad():
        want = model(x)
        got, calls = _block_op_calls(lambda: half(x.to(torch.bfloat16)))
        assert calls == 4
        previous = _C.cpu_isa()
        try:
            _C.set_cpu_isa("avx2" if "avx2" in _C.supported_cpu_isas() else "scalar")
            today, calls_today = _block_op_calls(lambda: half(x.to(torch.bfloat16)))
        finally:
            _C.set_cpu_isa(previous)
    assert calls_today == 0  # without bf16 hardware the bf16 block keeps its six ops
    err, err_today = _rel(got, want), _rel(today, want)
    assert err <= 2 * err_today, (err, err_today)
    assert err < 0.05, err


_SUBPROCESS = r"""
import json, sys, torch, timm, vitfast
from vitfast import _C
torch.manual_seed(0)
out = {"kernel": _C.bf16_kernel()}
x = torch.randn(2, 29, 72).to(torch.bfloat16)
w = (torch.randn(40, 72) * 0.1).to(torch.bfloat16); b = torch.randn(40).to(torch.bfloat16)
res = torch.randn(2, 29, 40).to(torch.bfloat16)
f = lambda t: t.float()
out["linear"] = torch.equal(torch.ops.vitfast.linear(x, w, b, res),
                            torch.ops.vitfast.linear(f(x), f(w), f(b), f(res)).to(torch.bfloat16))
w_in = (torch.randn(58, 72) * 0.1).to(torch.bfloat16); w_out = (torch.randn(40, 18) * 0.2).to(torch.bfloat16)
today = torch.ops.vitfast.channel_idle_ffn(f(x), f(w_in), None, f(w_out), None, f(res)).to(torch.bfloat16)
out["ffn"] = torch.equal(torch.ops.vitfast.channel_idle_ffn(x, w_in, None, w_out, None, res), today)
qkv = torch.randn(2, 23, 192).to(torch.bfloat16)
today = torch.ops.vitfast.attention(f(qkv), 4).to(torch.bfloat16)
out["attention"] = torch.equal(torch.ops.vitfast.attention(qkv, 4), today)
m = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=32, depth=2).eval()
model = vitfast.fuse(vitfast.convert.from_timm(m, channel_idle=0.75)).eval().to(torch.bfloat16)
xi = torch.randn(1, 3, 32, 32).to(torch.bfloat16)
with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    model(xi)
out["block_calls"] = sum(e.count for e in prof.key_averages() if e.key == "vitfast::vit_block")
print("RESULT " + json.dumps(out))
"""


def test_extension_off_keeps_todays_bits():
    env = dict(os.environ, VITFAST_CPU_EXT="none", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _SUBPROCESS], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    assert out == {"kernel": "none", "linear": True, "ffn": True, "attention": True, "block_calls": 0}, out


@pytest.mark.parametrize("case", ["fp16 block", "mixed dtype", "non-finite weight"])
def test_errors_unchanged(case):
    model = _fused().to(torch.bfloat16)
    block = model.blocks[0]
    x = torch.randn(1, 5, 192).to(torch.bfloat16)
    with torch.no_grad():
        args = list(whole_block_args(block, x) or ())
    if not args:  # no bf16 hardware: the fp32 block's arguments, converted
        with torch.no_grad():
            fp32_args = whole_block_args(_fused().blocks[0], x.float())
        args = [a.to(torch.bfloat16) if isinstance(a, torch.Tensor) else a for a in fp32_args]
    if case == "fp16 block":
        args[0] = args[0].half()
        message = r"^x: expected dtype torch.float32 or torch.bfloat16 \(the block op's dtypes\), got torch.float16"
        with pytest.raises(ValueError, match=message):
            torch.ops.vitfast.vit_block(*args)
        with pytest.raises(ValueError, match=message):  # the reference (and so the fake impl) says the same
            vitfast.reference.vit_block(*args)
    elif case == "mixed dtype":
        message = r"^weight: expected dtype torch.bfloat16 \(same as x\), got torch.float32"
        with pytest.raises(ValueError, match=message):
            torch.ops.vitfast.linear(x, args[2].float())
    else:
        w = args[2].clone()
        w[0, 0] = float("nan")
        with pytest.raises(ValueError, match=r"^weight: expected finite values, got 1 non-finite of"):
            torch.ops.vitfast.linear(x, w)


@needs_bf16
def test_thread_splits_give_the_same_bits(restore_threads):
    """Row shares (many rows) and panel shares (fewer row blocks than threads: a head on cls tokens) compute each
    output with the same reduction order, so 1 and 2 threads agree to the bit, op by op and for the whole block."""
    model = _fused(norm="layer").to(torch.bfloat16)
    x = torch.randn(3, 33, 192).to(torch.bfloat16)
    w = (torch.randn(100, 192) * 0.1).to(torch.bfloat16)
    image = torch.randn(2, 3, 32, 32).to(torch.bfloat16)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with torch.no_grad():
            results.append((torch.ops.vitfast.linear(x, w), torch.ops.vitfast.linear(x[:2, 0], w),
                            model.blocks[0](x), model(image)))
    for a, b in zip(*results):
        assert torch.equal(a, b)
