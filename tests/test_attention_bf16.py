"""`torch.ops.vitfast.attention_bf16` (csrc/ops/attention.cpp on kernels/attention.h's attention_head_bf16) against its
reference (vitfast/reference/attention_bf16.py: the products of the bf16-rounded Q, K, P, V in fp64): every CPU
path this machine runs, with its bf16 extension on and off (off: the portable bf16 kernel, the same products), at 1
and 2 threads (the same bits); odd N and D; strided qkv; fp16/bf16 input; NaN; argument errors; opcheck; and the
int8 models that take it (`vitfast.quantize(..., attention="bf16")`).

Tolerance.  The reference makes P with the kernels' exp (exp_for_bf16), so the kernel's only other roundings are its
fp32 sums: S and the row sums differ from the fp64 reference in their last fp32 bits, and such a difference can move
an exp lying that close to a bf16 rounding midpoint across it, which changes an output by at most
2^-8 · E_j / Σ E · |V_j| <= 2^-8 · max |V|.  So: every element within 2^-8 · max |V| of the reference, and the
relative error (norm) beyond those exps' allowance under 2e-6 (helpers.assert_bf16_heads_close, bf16_flip_allowance).
"""
import pytest
import torch

import vitfast
from helpers import assert_attention_variant_contract, assert_bf16_heads_close, at_1_and_2_threads, bf16_flip_allowance
from vitfast import reference
from vitfast.reference.attention_bf16 import exp_for_bf16

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

from vitfast import _C  # noqa: E402

op = torch.ops.vitfast.attention_bf16


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def assert_attention_bf16_close(out, qkv, heads, scale=None):
    batch, tokens, _ = qkv.shape
    h, d = reference.check_attention_bf16_args(qkv, heads, scale)
    q, k, v = qkv.float().reshape(batch, tokens, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
    allowance = bf16_flip_allowance(q, k, v, d ** -0.5 if scale is None else scale).transpose(1, 2)
    assert_bf16_heads_close(out, reference.attention_bf16(qkv, heads, scale), qkv[..., 2 * (qkv.shape[-1] // 3):],
                            allowance.reshape(batch, tokens, h * d))


def test_exp_for_bf16_accuracy_and_specials():
    # The reference's exp for P (the kernels' bits: csrc/tests/test_gemm_bf16.cpp) against float64 exp: relative error
    # <= 4.2e-6 over [−87, 0] (the bound documented in exp_poly.h), exp(0) = 1, below −87 zero, NaN kept; and its
    # bf16 rounding the exact exp's rounding but at a few values, never more than one ulp away.
    g = torch.Generator().manual_seed(0)
    x = torch.cat([-torch.rand(200000, generator=g), -87.0 * torch.rand(200000, generator=g)])
    e = exp_for_bf16(x)
    exact = torch.exp(x.double())
    assert float(((e.double() - exact).abs() / exact).max()) <= 4.2e-6
    ulps = (e.to(torch.bfloat16).view(torch.int16).int() - exact.float().to(torch.bfloat16).view(torch.int16).int()).abs()
    assert int(ulps.max()) <= 1 and float((ulps != 0).double().mean()) < 1e-3
    specials = exp_for_bf16(torch.tensor([0.0, -87.5, -float("inf"), float("nan")]))
    assert specials[0] == 1.0 and specials[1] == 0.0 and specials[2] == 0.0 and torch.isnan(specials[3])


SHAPES = [(1, 197, 6, 64), (2, 197, 12, 64), (2, 5, 12, 32), (3, 1, 1, 16), (1, 50, 2, 32), (2, 17, 5, 20),
          (1, 33, 4, 3)]


@pytest.mark.parametrize("batch, tokens, heads, d", SHAPES)
def test_parity(isa, restore_threads, batch, tokens, heads, d):
    g = torch.Generator().manual_seed(tokens * 131 + heads * 7 + d)
    qkv = torch.randn(batch, tokens, 3 * heads * d, generator=g)
    out = at_1_and_2_threads(op, [qkv, heads, None])
    assert_attention_bf16_close(out, qkv, heads)


@pytest.mark.parametrize("batch, tokens, heads, d", [(2, 197, 6, 64), (1, 17, 5, 20)])
def test_without_bf16_hardware_the_same_products(isa, batch, tokens, heads, d):
    """With the extensions off the portable bf16 kernel runs: the same definition (not fp32 attention)."""
    qkv = torch.randn(batch, tokens, 3 * heads * d, generator=torch.Generator().manual_seed(5))
    _C.set_cpu_ext_enabled(False)
    try:
        off = op(qkv, heads)
    finally:
        _C.set_cpu_ext_enabled(True)
    assert_attention_bf16_close(off, qkv, heads)


def test_scale_and_strided_qkv(isa):
    wide = torch.randn(2, 37, 3 * 4 * 16 + 40)
    qkv = wide[..., 8:8 + 3 * 4 * 16]
    assert not qkv.is_contiguous()
    out = op(qkv, 4, 0.3)
    torch.testing.assert_close(out, op(qkv.contiguous(), 4, 0.3), atol=0, rtol=0)
    assert_attention_bf16_close(out, qkv, 4, 0.3)


def test_between_fp32_and_int8_attention():
    """The point of the op: bf16 operands' error (~0.3% on random activations), several times under int8's."""
    qkv = torch.randn(2, 197, 3 * 6 * 64, generator=torch.Generator().manual_seed(3))
    ref = reference.attention(qkv, 6)
    e16, e8 = _rel(op(qkv, 6), ref), _rel(torch.ops.vitfast.attention_int8(qkv, 6), ref)
    assert e16 < 0.01 and e16 * 3 < e8, (e16, e8)
    assert _rel(op(qkv, 6), reference.attention_bf16(qkv, 6)) * 30 < e16  # its definition, not fp32 attention


def test_nan_positions():
    heads, d, n = 3, 16, 9
    qkv = torch.randn(2, n, 3 * heads * d)
    qkv[0, 4, 1 * d + 2] = float("nan")                    # image 0, query 4 of head 1
    qkv[0, 7, 2 * heads * d + 0 * d + 3] = float("nan")    # image 0, V[7, 3] of head 0
    assert_attention_bf16_close(op(qkv, heads), qkv, heads)


def test_empty_low_precision_bad_arguments_and_opcheck_as_attention():
    assert_attention_variant_contract(vitfast.ops.attention_bf16, op)


# ------------------------------------------------------------------------------------------- in int8 models
def _digits_sized_model():
    import timm

    m = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=32, depth=2).eval()
    return vitfast.fuse(vitfast.convert.from_timm(m, channel_idle=0.75)).eval()


def test_quantize_attention_bf16_runs_the_op_and_survives_save_load(tmp_path):
    model = _digits_sized_model()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    q = vitfast.quantize(model, attention="bf16")
    assert all(b.attn.__dict__.get("bf16_attention") and not b.attn.__dict__.get("int8_attention") for b in q.blocks)
    assert "bf16: 2 attentions' score/value products" in vitfast.quant.describe(q)
    with torch.no_grad(), torch.profiler.profile() as prof:
        y = q(x)
    names = [e.name for e in prof.events()]
    assert names.count("vitfast::attention_bf16") == 2 and "vitfast::attention_int8" not in names
    path = tmp_path / "q.safetensors"
    vitfast.save(q, path)
    r = vitfast.load(path)
    assert all(b.attn.__dict__.get("bf16_attention") for b in r.blocks)
    with torch.no_grad():
        torch.testing.assert_close(r(x), y, atol=0, rtol=0)
        ref = model(x)
        y8 = vitfast.quantize(model)(x)
    assert _rel(y, ref) < _rel(y8, ref) * 1.5  # no worse than int8 attention (the linears' int8 error dominates)


def test_quantize_refuses_other_attention_names():
    with pytest.raises(ValueError, match="attention: expected 'auto', 'int8', 'bf16' or 'fp32'"):
        vitfast.quantize(_digits_sized_model(), attention="fp16")


def test_onnx_export_refuses_bf16_attention(tmp_path):
    from vitfast.export import to_onnx

    q = vitfast.quantize(_digits_sized_model(), torch.randn(4, 3, 32, 32), activations="static", attention="bf16")
    with pytest.raises(ValueError, match="attentions compute on bf16 operands"):
        to_onnx(q, tmp_path / "q.onnx", input_shape=(3, 32, 32))
    assert not (tmp_path / "q.onnx").exists()
