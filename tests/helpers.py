"""Helpers shared by the test modules (`from helpers import ...`: pytest puts tests/ on sys.path).

Fixtures live in conftest.py; this file holds plain values and functions: the θ × norm sweep, scale-aware
parity, non-trivial weights, and an official-layout RePaViT state dict.
"""
import math

import torch
import torch.nn as nn
from timm.layers import LayerScale

# The channel-idle sweep: idle ratios θ from all-GELU to all-linear, and the two FFN norm variants.
THETAS = [0.0, 0.25, 0.5, 0.75, 1.0]
NORMS = ["batch", "layer"]


def assert_close_scaled(actual, expected, tol=2e-5):
    """fp32 parity relative to the output's scale (tolerance fixed; never loosened to pass)."""
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual, expected, atol=tol * max(scale, 1.0), rtol=tol)


def _randomize_norm(module: nn.Module, g: torch.Generator) -> bool:
    """A trained model's norm: BatchNorm1d statistics and affine, LayerNorm affine.  False if not a norm."""
    if isinstance(module, nn.BatchNorm1d):
        module.running_mean.copy_(torch.randn(module.num_features, generator=g) * 0.5)
        module.running_var.copy_(torch.rand(module.num_features, generator=g) * 1.5 + 0.5)
        module.weight.copy_(torch.rand(module.num_features, generator=g) + 0.5)
        module.bias.copy_(torch.randn(module.num_features, generator=g) * 0.2)
        module.num_batches_tracked.fill_(100)
        return True
    if isinstance(module, nn.LayerNorm) and module.elementwise_affine:
        module.weight.copy_(torch.rand(module.weight.shape, generator=g) + 0.5)
        if module.bias is not None:  # LayerNorm(bias=False)
            module.bias.copy_(torch.randn(module.bias.shape, generator=g) * 0.2)
        return True
    return False


def randomize_norms(module: nn.Module, seed: int = 0) -> nn.Module:
    """Only the norms (see `_randomize_norm`); every other weight and the train/eval mode are left as they were."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            _randomize_norm(m, g)
    return module


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Weights, norms (BatchNorm statistics included), LayerScale and embeddings far from their init, so that a
    folding mistake cannot hide in small numbers (a trained model's values, not an init's).  Returns the model in
    eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if _randomize_norm(module, g):
                continue
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) / math.sqrt(module.weight[0].numel()))
                if module.bias is not None:
                    module.bias.copy_(torch.randn(module.bias.shape, generator=g) * 0.1)
            elif isinstance(module, LayerScale):
                module.gamma.copy_(torch.rand(module.gamma.shape, generator=g) + 0.5)
        for name, param in model.named_parameters():
            if name in ("cls_token", "dist_token", "pos_embed") or "relative_position_bias_table" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.5)
    return model.eval()


def official_repavit_state_dict(dim=32, depth=2, hidden=128, patch=8, grid=4, classes=5):
    """The official RePaViT ViT layout: no patch-embedding bias, norm_pre, BatchNorms named norm1/norm2 inside
    the FFN."""
    g = torch.Generator().manual_seed(3)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    def bn(prefix, n):
        return {f"{prefix}.weight": 1 + r(n), f"{prefix}.bias": r(n), f"{prefix}.running_mean": r(n),
                f"{prefix}.running_var": 1 + r(n).abs(), f"{prefix}.num_batches_tracked": torch.tensor(10)}

    sd = {"cls_token": r(1, 1, dim), "pos_embed": r(1, 1 + grid * grid, dim), "patch_embed.proj.weight": r(dim, 3, patch, patch),
          "norm_pre.weight": 1 + r(dim), "norm_pre.bias": r(dim), "norm.weight": 1 + r(dim), "norm.bias": r(dim),
          "head.weight": r(classes, dim), "head.bias": r(classes)}
    for i in range(depth):
        p = f"blocks.{i}."
        sd.update({p + "attn.norm.weight": 1 + r(dim), p + "attn.norm.bias": r(dim),
                   p + "attn.qkv.weight": r(3 * dim, dim), p + "attn.qkv.bias": r(3 * dim),
                   p + "attn.proj.weight": r(dim, dim), p + "attn.proj.bias": r(dim),
                   p + "mlp.fc1.weight": r(hidden, dim), p + "mlp.fc1.bias": r(hidden),
                   p + "mlp.fc2.weight": r(dim, hidden), p + "mlp.fc2.bias": r(dim)})
        sd.update(bn(p + "mlp.norm1", dim))
        sd.update(bn(p + "mlp.norm2", hidden))
    return sd


def assert_thread_parity(kernel, reference_fn, args, tol, threads=(1, 2), contiguous=False):
    """fp32 kernel vs reference at each thread count, and the thread split must not change a single bit (every
    CPU kernel splits rows/heads between threads without changing any row's order of arithmetic)."""
    atol, rtol = tol[torch.float32]
    expected = reference_fn(*args)
    outs = []
    for t in threads:
        torch.set_num_threads(t)
        outs.append(kernel(*args))
    for out in outs:
        assert out.shape == expected.shape and out.dtype == expected.dtype
        assert out.is_contiguous() or not contiguous
        torch.testing.assert_close(out, expected, atol=atol, rtol=rtol)
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=0, rtol=0)


def assert_low_precision_no_worse(kernel, reference_fn, args, dtype, tol):
    """fp16/bf16 in, same dtype out: the kernel's error against the fp32 reference must be no worse than 2× the
    reference's own error in `dtype` (STYLE.md), and the two low-precision results must agree within `tol`."""
    truth = reference_fn(*[a.float() if isinstance(a, torch.Tensor) else a for a in args])
    out = kernel(*args)
    assert out.dtype == dtype
    torch_lp = reference_fn(*args)
    kernel_err = (out.float() - truth).abs().max().item()
    torch_err = (torch_lp.float() - truth).abs().max().item()
    assert kernel_err <= 2 * torch_err, f"{dtype}: kernel error {kernel_err:.3g} > 2 × torch's {torch_err:.3g}"
    atol, rtol = tol[dtype]
    torch.testing.assert_close(out, torch_lp, atol=atol, rtol=rtol)


def make_xwx_args(batch, tokens, channels, heads, rank=None, value_dim=None, *, device="cpu", dtype=torch.float32,
                  key_bias=True, b_o=True, residual=True, score_std=2.0):
    """Random `xwx_attention` arguments (factored form with `rank`, or the full form when rank is None), scaled
    so the scores have std ≈ `score_std` (a softmax far from uniform and far from one-hot) and the output is
    O(1).  Built in fp32, then cast to `dtype`."""
    value_dim = value_dim or max(1, channels // heads)
    full = rank is None
    r = channels if full else rank
    x = torch.randn(batch, tokens, channels, device=device)
    w_q = torch.randn(heads, channels, r, device=device) / channels**0.5
    if full:
        # W_h = A Bᵀ of rank C / 2 stored densely (what the full form holds), same score scale as factored.
        b = torch.randn(heads, channels, r, device=device) / channels**0.5
        w_q = w_q @ b.transpose(1, 2) * (score_std / r**0.5)
        w_k = None
    else:
        w_q = w_q * (score_std / r**0.5)
        w_k = torch.randn(heads, channels, r, device=device) / channels**0.5
    args = [
        x,
        w_q,
        w_k,
        torch.randn(heads, channels, device=device) / channels**0.5 if key_bias else None,
        torch.randn(heads, channels, value_dim, device=device) / channels**0.5,
        torch.randn(heads, value_dim, channels, device=device) / (heads * value_dim) ** 0.5,
        torch.randn(channels, device=device) * 0.1 if b_o else None,
        torch.randn(batch, tokens, channels, device=device) if residual else None,
    ]
    return [a.to(dtype) if a is not None else None for a in args]


def count_linear_calls(monkeypatch) -> list:
    """Record the input shape of every `vitfast.ops.linear` call from now on (the packed-GEMM path ran)."""
    import vitfast

    calls = []
    real = vitfast.ops.linear

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(vitfast.ops, "linear", counting)
    return calls


def spy_returned_something(monkeypatch, owner, name: str) -> list:
    """Wraps `owner.<name>` (a function that returns None where it declines) for the test: the list gets, per call,
    whether it returned something."""
    original, taken = getattr(owner, name), []

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(owner, name, spy)
    return taken


def at_1_and_2_threads(op, args):
    """op(*args) at 1 and at 2 threads, which must give the same bits (NaN in the same places); returns the first.
    The int8 kernels split token rows (or heads) between threads without changing any row's arithmetic."""
    outs = []
    for t in (1, 2):
        torch.set_num_threads(t)
        outs.append(op(*args))
    torch.testing.assert_close(outs[1], outs[0], atol=0, rtol=0, equal_nan=True)
    return outs[0]


def triton_test_device(skip: bool = True):
    """(device, interpreted) for the Triton kernel tests: "cuda" on a GPU, else "cpu" under the Triton interpreter
    (conftest.py sets TRITON_INTERPRET=1 before triton is imported).  With neither (an NVIDIA device node but no
    usable CUDA, or the interpreter switched off) nothing can run the kernels: the calling module is skipped unless
    skip=False."""
    import os

    import pytest

    device = "cuda" if torch.cuda.is_available() else "cpu"
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if skip and device == "cpu" and not interpreted:
        pytest.skip("no CUDA device and TRITON_INTERPRET is off", allow_module_level=True)
    return device, interpreted


def layerscale_vit(img_size=(32, 40), patch=8, dim=32, depth=3, heads=4, seed=0, **kw):
    """A small timm VisionTransformer with LayerScale (init 0.5) and randomised norms (the DW-conv tests' model)."""
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    cfg = dict(img_size=img_size, patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads, num_classes=5,
               qkv_bias=True, init_values=0.5)
    cfg.update(kw)
    return randomize(VisionTransformer(**cfg), seed=seed)


def model_images(model, batch=2, seed=1):
    """A seeded batch of images of the model's input size."""
    return torch.randn(batch, 3, *model.patch_embed.img_size, generator=torch.Generator().manual_seed(seed))


def recipe_tiny_vit(seed=0, **kw):
    """The recipe tests' timm ViT: 16×16 input, patch 4, width 32, 2 blocks, 2 heads, 10 classes."""
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    cfg = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    cfg.update(kw)
    return VisionTransformer(**cfg)


def run_cli(argv, capsys):
    """`vitfast ARGV` in this process: (exit status, stdout, stderr)."""
    from vitfast.cli import main

    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_attention_variant_contract(op_entry, op):
    """What an attention variant (attention_int8, attention_bf16) shares with `attention`: empty batches and sequences,
    fp16 / bf16 input computed as its fp32 conversion and rounded once, the same ValueError messages for bad
    arguments, and torch.library.opcheck (schema, fake, autograd registration)."""
    import pytest
    import torch

    from vitfast import reference

    assert op(torch.randn(0, 5, 24), 2).shape == (0, 5, 8)
    assert op(torch.randn(2, 0, 24), 2).shape == (2, 0, 8)
    for dtype in (torch.float16, torch.bfloat16):
        qkv = torch.randn(2, 21, 3 * 2 * 32).to(dtype)
        out = op(qkv, 2)
        assert out.dtype == dtype
        torch.testing.assert_close(out, op(qkv.float(), 2).to(dtype), atol=0, rtol=0)
    for args in ([torch.randn(2, 5), 2], [torch.randn(2, 5, 24), 5], [torch.randn(2, 5, 24), 0],
                 [torch.randn(2, 5, 24, dtype=torch.float64), 2], [torch.randn(2, 5, 24), 2, float("inf")]):
        with pytest.raises(ValueError) as ours:
            op_entry(*args)
        with pytest.raises(ValueError) as theirs:
            reference.attention(*args)
        assert str(ours.value) == str(theirs.value)
    for scale in (None, 0.2):
        torch.library.opcheck(op.default, (torch.randn(2, 7, 3 * 2 * 8), 2, scale))


def assert_refused_alike(op_name, make, argname):
    """`torch.ops.vitfast.<op_name>` (the C++ check) and `vitfast.reference.<op_name>` refuse make()'s arguments with a
    ValueError naming `argname`, in the same words up to the ", got ..." part (C++ prints values its own way)."""
    import pytest
    from vitfast import reference

    with pytest.raises(ValueError, match=rf"^{argname}: expected") as cpp:
        getattr(torch.ops.vitfast, op_name)(*make())
    with pytest.raises(ValueError, match=rf"^{argname}: expected") as ref:
        getattr(reference, op_name)(*make())
    assert str(cpp.value).split(", got")[0] == str(ref.value).split(", got")[0]


def assert_backend_reaches_reference(monkeypatch, op_name, args):
    """VITFAST_BACKEND=reference (set_backend) routes vitfast.ops.<op_name> to vitfast.reference.<op_name>, once."""
    import vitfast
    from vitfast import reference

    calls = []
    original = getattr(reference, op_name)
    monkeypatch.setattr(vitfast.ops.reference, op_name, lambda *a: calls.append(1) or original(*a))
    vitfast._env.set_backend("reference")
    try:
        getattr(vitfast.ops, op_name)(*args)
    finally:
        vitfast._env.set_backend("auto")
    assert calls == [1]


def assert_int8_heads_close(out, ref, values, tol):
    """An int8 attention kernel's output against its reference (attention_int8, xwx_heads_int8).  The int8 sums are
    exact and the epilogues round as the reference does, and both make E with the same exp (exp_for_bf16), but the
    scores can differ in their last bit: that moves E, and can move a P code across a rounding boundary.  One flip
    changes an output by at most 2 · max_t |V[t, d]| / 127 (numerator by one code times a quantized value,
    denominator by one): every element must be within `tol` (atol, rtol) or two flips' bound, and at most 1% beyond
    `tol`.
    values [B, N, H·D]: the V channels in the output's column order (non-finite ones are read as 0)."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    o, r = out.float(), ref.float()
    nan = r.isnan()
    assert torch.equal(o.isnan(), nan), "NaN positions differ from the reference's"
    o, r = o.masked_fill(nan, 0), r.masked_fill(nan, 0)
    diff = (o - r).abs()
    close = diff <= tol["atol"] + tol["rtol"] * r.abs()
    v = values.float().masked_fill(~values.isfinite(), 0)
    bound = (4.0 * v.abs().amax(dim=1, keepdim=True) / 127.0).expand_as(r)
    assert (close | (diff <= bound)).all(), f"max |diff| {diff.max():.3g} beyond the code-flip bound"
    assert (~close).float().mean() <= 0.01, f"{(~close).float().mean():.2%} of the outputs beyond the fp32 tolerance"


def bf16_flip_allowance(q, k, v, scale, ulps=2):
    """How far a correct kernel's output may be from `bf16_heads(q, k, v, scale)` (vitfast/reference/attention_bf16.py)
    through the rounding of its exps to bf16 alone, per output [..., N, dv] (float64).  The kernels' fp32 score sums
    end within a few ulps of the exact sum (`ulps`; the worst-case bound, γ_K · Σ_k |q_k · k_k|, is hundreds of ulps
    wide where the products cancel: it gave every output an allowance, and a reference with another exp passed);
    t − max then moves by a score's ulps plus its row maximum's, and its exp by that relatively (plus two ulps of each
    side's own exp evaluation).  An exp that
    close to a bf16 rounding midpoint may round either way: it adds one bf16 spacing · |V_j| / Σ E to the outputs of
    its row.  Zero in the rows where no exp is that close (~90% of them at DeiT shapes)."""
    from vitfast.reference.attention_bf16 import exp_for_bf16

    u = 2.0 ** -24
    qb, kb, vb = (t.to(torch.bfloat16).double() for t in (q, k, v))
    s = (qb @ kb.transpose(-1, -2)).float() * torch.tensor(float(scale), dtype=torch.float32)
    ulp = torch.ldexp(torch.ones_like(s), torch.frexp(s)[1] - 24).double()  # fp32 ulp of each score
    moved = ulps * (ulp + ulp.gather(-1, s.argmax(dim=-1, keepdim=True)))
    x = s - s.amax(dim=-1, keepdim=True)
    e = exp_for_bf16(x)
    trunc = (e.view(torch.int32) & ~0xFFFF).view(torch.float32)  # e >= 0: its bf16 truncation, the bf16 below
    spacing = (trunc.view(torch.int32) + 0x10000).view(torch.float32).double() - trunc.double()
    near = (e.double() - (trunc.double() + spacing / 2)).abs() <= e.double() * (moved + 4 * u)
    add = torch.where(near, spacing, torch.zeros_like(spacing)) / e.double().sum(dim=-1, keepdim=True)
    return torch.nan_to_num(add @ vb.abs().nan_to_num(0.0, 0.0, 0.0), 0.0, 0.0, 0.0)


def assert_bf16_heads_close(out, ref, values, allowance=None):
    """A bf16-operand attention kernel's output against its reference (attention_bf16, xwx_heads_bf16: products of the
    bf16-rounded operands in fp64, the kernels' exp for P).  The kernel's other roundings are its fp32 sums: S and the
    row sums differ in their last fp32 bits, which can move one exp across a bf16 rounding boundary and change an
    output by at most 2^-8 · E_j / Σ E · |V_j| <= 2^-8 · max |V|.  So: every element within 2^-8 · max |V| (values:
    the V channels; non-finite ones are read as 0), and the relative error (norm) under 2e-6 once each element's
    `allowance` is taken off (bf16_flip_allowance: what exps within the sums' error of a rounding midpoint can move it;
    a flip of any other exp still counts in full).  What is left is the fp32 sums' rounding: at most 5.4e-7 over the
    attention_bf16 and xwx_heads_bf16 suites; a reference with another exp than the kernels' (torch.exp) leaves
    4e-6-1e-5 at DeiT shapes, which this bound catches (the flip-blind norm, 1e-4 before, did not; one flip of an exp
    near 0.87 in a peaked row alone took it to 1.7e-4).  NaN where the reference has it."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    nan = ref.isnan()
    assert torch.equal(out.isnan(), nan), "NaN positions differ from the reference's"
    o, r = out.double().masked_fill(nan, 0), ref.double().masked_fill(nan, 0)
    if r.numel() == 0 or not r.abs().max() > 0:
        return
    diff = (o - r).abs()
    beyond = diff if allowance is None else (diff - allowance.double().reshape(diff.shape)).clamp(min=0)
    rel = float(beyond.norm() / r.norm())
    assert rel < 2e-6, f"relative error {rel:.3g} against the bf16-operand reference (beyond the flip allowance)"
    v = values.float()
    bound = 2.0 ** -8 * v.masked_fill(~v.isfinite(), 0).abs().max()
    assert diff.max() <= bound, f"max |diff| {diff.max():.3g} beyond one bf16 flip's bound"
