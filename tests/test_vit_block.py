"""`torch.ops.vitfast.vit_block`: the fused ViT block as one op (csrc/ops/vit_block.cpp), and `vitfast.nn.FusedBlock`
taking it at inference.

The op must compute exactly what the six-op path computes (same kernels on the same thread split: the same bits),
at ViT and odd shapes, for every FFN form (BN variant with folded shortcut, LN variant with explicit shortcut,
θ = 0 without a linear path, a linear path only), on every CPU code path this machine has, at 1 and 2 threads;
match the reference; refuse bad arguments naming them, with the same words in C++ and Python; and the block must
take it only where nothing differs (no grad, fp32, CPU, no mask, default attention, no hooks, not tracing).
"""
import copy

import pytest
import timm
import torch
import torch.nn as nn

import vitfast
from vitfast import reference
from vitfast.nn import block as fused
from vitfast.nn.block import whole_block_args
from helpers import assert_thread_parity

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

op = torch.ops.vitfast.vit_block

# (name, active A, linear path, FFN norm, FFN residual): the forms a fused FFN takes (vitfast/nn/ffn.py).
FFN_FORMS = [
    ("bn_variant", 1.0, True, False, False),   # θ > 0, BN variant: norms and shortcut folded into the linear rows
    ("ln_variant", 1.0, True, True, True),     # LN variant: its own non-affine norm, explicit shortcut
    ("theta0", 4.0, False, True, True),        # θ = 0: a vanilla FFN, no linear path
    ("linear_only", 0.0, True, False, True),   # θ = 1: no active channel at all
]


def make_args(c, heads, tokens, batch, form, *, qkv_bias=True, proj_bias=True, head_dim=None):
    """Arguments of vit_block.  The two norms get different eps (a swap must show), and head_dim may make the
    attention width H·D differ from C (timm's explicit head_dim)."""
    _, active_mult, linear, norm, residual = form
    g = torch.Generator().manual_seed(c * 1000 + tokens)

    def w(*s, fan_in):
        return (torch.rand(*s, generator=g) * 2 - 1) / max(fan_in, 1) ** 0.5

    a = heads * head_dim if head_dim else c
    active = int(active_mult * c)
    x = torch.randn(batch, tokens, c, generator=g)
    rows_in = active + (c if linear else 0)
    return (x, 1e-5, w(3 * a, c, fan_in=c), w(3 * a, fan_in=c) if qkv_bias else None, heads, w(c, a, fan_in=a),
            w(c, fan_in=a) if proj_bias else None, 0.05 if norm else None, w(rows_in, c, fan_in=c),
            w(rows_in, fan_in=c), w(c, active, fan_in=active), w(c, fan_in=active), residual)


def six_ops(*args):
    """The op-by-op path the block took before (vitfast/ops/vit_block.py `_vit_block_composed`)."""
    return vitfast.ops._vit_block_composed(*args)


@pytest.mark.parametrize("form", FFN_FORMS, ids=lambda f: f[0])
@pytest.mark.parametrize("c, heads, head_dim, tokens",
                         [(192, 3, None, 197), (96, 2, None, 50), (40, 5, 12, 7), (24, 1, None, 1)], ids=str)
@pytest.mark.parametrize("batch", [1, 2])
def test_same_bits_as_the_six_ops(c, heads, head_dim, tokens, batch, form, isa, tol, restore_threads):
    args = make_args(c, heads, tokens, batch, form, head_dim=head_dim)
    assert_thread_parity(op, reference.vit_block, args, tol)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        torch.testing.assert_close(op(*args), six_ops(*args), atol=0, rtol=0)


def test_without_biases(tol):
    args = make_args(48, 4, 9, 2, FFN_FORMS[1], qkv_bias=False, proj_bias=False)
    torch.testing.assert_close(op(*args), six_ops(*args), atol=0, rtol=0)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(op(*args), reference.vit_block(*args), atol=atol, rtol=rtol)


def test_empty_batch_and_tokens():
    for batch, tokens in ((0, 5), (2, 0)):
        args = make_args(16, 2, max(tokens, 1), 1, FFN_FORMS[0])
        x = torch.randn(batch, tokens, 16)
        out = op(x, *args[1:])
        assert out.shape == (batch, tokens, 16)


def test_non_contiguous_input_gives_the_contiguous_result():
    args = make_args(32, 2, 11, 2, FFN_FORMS[0])
    x = args[0].transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    assert not x.is_contiguous()
    torch.testing.assert_close(op(x, *args[1:]), op(*args), atol=0, rtol=0)


def test_sees_in_place_weight_updates():
    """The packed-weight cache is shared with the single ops and keyed on the tensors' versions."""
    args = list(make_args(32, 2, 5, 1, FFN_FORMS[0]))
    before = op(*args)
    with torch.no_grad():
        args[2].mul_(2.0)  # w_qkv
        args[8].add_(0.1)  # w_in
    after = op(*args)
    assert not torch.equal(before, after)
    torch.testing.assert_close(after, six_ops(*args), atol=0, rtol=0)


def test_opcheck():
    torch.library.opcheck(op.default, make_args(24, 2, 5, 2, FFN_FORMS[1]))


def test_fake_impl_gives_the_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        args = make_args(24, 2, 5, 2, FFN_FORMS[0])
        assert op(*args).shape == (2, 5, 24)


# (mutation of the argument list, the argument the error must name)
BAD = [
    (lambda a: a.__setitem__(0, a[0][0]), "x"),                      # 2-D
    (lambda a: a.__setitem__(0, a[0].half()), "x"),                  # fp16: the op runs fp32 only
    (lambda a: a.__setitem__(1, -1.0), "norm1_eps"),
    (lambda a: a.__setitem__(7, float("nan")), "ffn_norm_eps"),
    (lambda a: a.__setitem__(4, 0), "num_heads"),
    (lambda a: a.__setitem__(4, 5), "w_qkv"),                        # 3·5 does not divide 72
    (lambda a: a.__setitem__(2, a[2][:, :-1]), "w_qkv"),
    (lambda a: a.__setitem__(3, a[3][:-3]), "b_qkv"),
    (lambda a: a.__setitem__(5, a[5][:, :-1]), "w_proj"),
    (lambda a: a.__setitem__(6, a[6].double()), "b_proj"),
    (lambda a: a.__setitem__(8, a[8][:, :-1]), "w_in"),
    (lambda a: a.__setitem__(10, a[10][:, :-1]), "w_in"),           # A of w_out against w_in's rows
    (lambda a: a.__setitem__(11, a[11][:-1]), "b_out"),
]


@pytest.mark.parametrize("mutate, name", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_bad_arguments_are_named_alike_in_cpp_and_python(mutate, name):
    args = list(make_args(24, 2, 5, 2, FFN_FORMS[1]))
    mutate(args)
    with pytest.raises(ValueError) as cpp:
        op(*args)
    with pytest.raises(ValueError) as py:
        reference.vit_block(*args)
    assert str(cpp.value).startswith(name + ":"), str(cpp.value)
    # Same words up to the numbers' spelling (C++ prints -1 where Python prints -1.0).
    assert str(cpp.value).split(", got")[0] == str(py.value).split(", got")[0]


def test_numpy_float_eps_is_taken_by_both_paths():
    """The C++ schema's float takes a numpy float32 (not a Python float subclass); the Python check must too."""
    import numpy as np

    args = list(make_args(24, 2, 5, 2, FFN_FORMS[1]))
    args[1], args[7] = np.float32(0.25), np.float32(0.5)  # exact in float32, so the same eps as the floats
    plain = list(args)
    plain[1], plain[7] = 0.25, 0.5
    assert torch.equal(op(*args), op(*plain))
    torch.testing.assert_close(reference.vit_block(*args), reference.vit_block(*plain), atol=0, rtol=0)


def test_an_ffn_that_changes_the_width_is_refused():
    """θ = 0 (no linear path): any C_out passes the FFN's own check, but the block must keep its width C."""
    args = list(make_args(24, 2, 5, 2, FFN_FORMS[2]))
    args[10], args[11] = args[10][:-1], args[11][:-1]
    for fn in (op, reference.vit_block):
        with pytest.raises(ValueError, match=r"w_out: expected shape \[24, A\] \(C = x.shape\[-1\] = 24: the block keeps"):
            fn(*args)


@pytest.mark.parametrize("index, name", [(2, "w_qkv"), (3, "b_qkv"), (5, "w_proj"), (6, "b_proj"), (8, "w_in"),
                                         (11, "b_out")])
def test_non_finite_weights_are_named(index, name):
    args = list(make_args(24, 2, 5, 2, FFN_FORMS[1]))
    bad = args[index].clone()
    bad.view(-1)[0] = float("nan")
    args[index] = bad
    with pytest.raises(ValueError, match=f"^{name}: expected finite values, got 1 non-finite"):
        op(*args)


def test_wrapper_checks_the_block_when_recording_gradients():
    """With a gradient to record the wrapper runs the six ops, which alone would accept an FFN that changes the
    width; the block's own check must still refuse it."""
    args = list(make_args(24, 2, 5, 2, FFN_FORMS[2]))
    args[10], args[11] = args[10][:-1], args[11][:-1]
    args[0] = args[0].requires_grad_()
    with pytest.raises(ValueError, match="w_out: expected shape"):
        vitfast.ops.vit_block(*args)


def test_a_missing_weight_is_named():
    args = list(make_args(24, 2, 5, 2, FFN_FORMS[1]))
    args[5] = None
    with pytest.raises(TypeError, match="w_proj: expected a Tensor, got None"):
        op(*args)


def test_wrapper_follows_the_backend_and_autograd(tol):
    """vitfast.ops.vit_block: the reference under VITFAST_BACKEND=reference; with a gradient to record, the six
    ops with their reference gradients (the op itself has no autograd formula)."""
    args = make_args(24, 2, 5, 2, FFN_FORMS[1])
    previous = vitfast.get_backend()
    try:
        vitfast.set_backend("reference")
        torch.testing.assert_close(vitfast.ops.vit_block(*args), reference.vit_block(*args), atol=0, rtol=0)
    finally:
        vitfast.set_backend(previous)
    leaves = [a.clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    vitfast.ops.vit_block(*leaves).square().sum().backward()
    ref_leaves = [a.clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    reference.vit_block(*ref_leaves).square().sum().backward()
    atol, rtol = tol[torch.float32]
    for got, want in zip(leaves, ref_leaves):
        if isinstance(got, torch.Tensor):
            torch.testing.assert_close(got.grad, want.grad, atol=10 * atol, rtol=10 * rtol)


# ------------------------------------------------------------------------------------------ the module taking it
def _fused_model(norm="batch", **kw):
    m = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, **kw).eval()
    return vitfast.fuse(vitfast.convert.from_timm(m, channel_idle=0.75, norm=norm)).eval()


def _block_op_calls(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
    return out, sum(e.count for e in prof.key_averages() if e.key == "vitfast::vit_block")


@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_fused_model_takes_the_block_op_with_the_same_bits(norm, restore_threads):
    model = _fused_model(norm)
    x = torch.randn(2, 3, 32, 32)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with torch.no_grad():
            fast, calls = _block_op_calls(lambda: model(x))
        assert calls == 2  # one per block
        slow, calls = _block_op_calls(lambda: model(x))  # grad mode on: the six ops (autograd records them)
        assert calls == 0
        torch.testing.assert_close(fast, slow.detach(), atol=0, rtol=0)
        with torch.inference_mode():
            torch.testing.assert_close(model(x), fast, atol=0, rtol=0)


def test_block_keeps_the_six_ops_where_they_differ():
    model = _fused_model()
    block = model.blocks[0]
    x = torch.randn(2, 5, block.dim)
    with torch.no_grad():
        expected = block(x)

        def calls(fn):
            return _block_op_calls(fn)[1]

        assert calls(lambda: block(x)) == 1
        half = copy.deepcopy(block).half()  # fp16: the op-by-op path rounds between ops
        assert calls(lambda: half(x.half())) == 0
        assert calls(lambda: block(x, attn_mask=torch.zeros(5, 5))) == 0
        # A forward hook on attn or mlp must still fire: the block runs them as modules.
        seen = []
        handle = block.mlp.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
        try:
            assert calls(lambda: block(x)) == 0 and seen == [x.shape]
            torch.testing.assert_close(block(x), expected, atol=0, rtol=0)
        finally:
            handle.remove()
        handle = nn.modules.module.register_module_forward_pre_hook(lambda mod, inp: seen.append("global"))
        try:
            assert calls(lambda: block(x)) == 0 and "global" in seen
        finally:
            handle.remove()
        assert calls(lambda: block(x)) == 1
        previous = vitfast.get_backend()
        try:
            vitfast.set_backend("reference")
            assert calls(lambda: block(x)) == 0
        finally:
            vitfast.set_backend(previous)
        traced = torch.jit.trace(block, (x,), check_trace=False)
        assert "vit_block" not in str(traced.graph)  # exported graphs keep the per-op calls
        torch.testing.assert_close(traced(x), expected)  # (traced LayerNorms run F.layer_norm: ulps apart)


class _Double(nn.Module):
    def forward(self, w):
        return 2 * w


def test_parametrized_weight_keeps_the_six_ops():
    """A parametrized weight lives outside the module's parameter dict: the block must read it through its
    property (the six-op path), not run without it."""
    block = _fused_model().blocks[0]
    x = torch.randn(2, 5, block.dim)
    with torch.no_grad():
        before = block(x)
        nn.utils.parametrize.register_parametrization(block.attn.qkv, "weight", _Double())
        out, calls = _block_op_calls(lambda: block(x))
    assert calls == 0 and not torch.equal(out, before)
    with torch.no_grad():
        nn.utils.parametrize.remove_parametrizations(block.attn.qkv, "weight", leave_parametrized=True)
        assert _block_op_calls(lambda: block(x))[1] == 1
        torch.testing.assert_close(block(x), out, atol=0, rtol=0)


def test_patched_forward_keeps_the_six_ops():
    """A forward patched on the instance (e.g. accelerate's hooks) or on the class must run."""
    block = _fused_model().blocks[0]
    x = torch.randn(2, 5, block.dim)
    with torch.no_grad():
        expected = block(x)
        block.mlp.forward = lambda y: torch.zeros_like(y)
        out, calls = _block_op_calls(lambda: block(x))
        assert calls == 0 and torch.equal(out, torch.zeros_like(x))
        del block.mlp.forward
        assert _block_op_calls(lambda: block(x))[1] == 1
        original = fused.FusedAttention.forward
        fused.FusedAttention.forward = lambda self, y, attn_mask=None, is_causal=False, residual=None: residual
        try:
            out, calls = _block_op_calls(lambda: block(x))
        finally:
            fused.FusedAttention.forward = original
        assert calls == 0 and torch.equal(out, block.mlp(x))
        torch.testing.assert_close(block(x), expected, atol=0, rtol=0)


@pytest.mark.parametrize("norm", ["batch", "layer"])
def test_norm_eps_reach_the_op(norm):
    """Each norm's own eps (large ones, so that a swap or a default would show) reaches the op: same bits as the
    six-op path."""
    block = _fused_model(norm).blocks[0]
    block.norm1.eps = 0.25
    if block.mlp.norm is not None:
        block.mlp.norm.eps = 0.5
    x = torch.randn(2, 5, block.dim)
    with torch.no_grad():
        fast, calls = _block_op_calls(lambda: block(x))
    assert calls == 1
    torch.testing.assert_close(fast, block(x).detach(), atol=0, rtol=0)  # grad mode: the six ops


def test_qk_norm_block_keeps_the_six_ops():
    block = vitfast.nn.FusedBlock(48, num_heads=2, qk_norm=True, idle_ratio=0.75).eval()
    x = torch.randn(1, 5, 48)
    with torch.no_grad():
        out, calls = _block_op_calls(lambda: block(x))
    assert calls == 0 and out.shape == x.shape


@pytest.mark.parametrize("form", FFN_FORMS, ids=lambda f: f[0])
def test_cuda_eager_block_is_the_six_ops_formula_with_one_check(form):
    """ops.vit_block_cuda_eager (what vitfast.nn.FusedBlock runs on CUDA at eager inference) calls the same torch
    functions as the six ops' CUDA impls (the FFN's below the Triton threshold: `channel_idle_ffn_composed`): on any
    device it gives their bits, within fp32 rounding of the reference, and it checks its arguments as vit_block
    does."""
    from vitfast.ops.channel_idle_ffn import channel_idle_ffn_composed

    fns = (reference.layer_norm, reference.linear, reference.attention, channel_idle_ffn_composed)
    args = make_args(48, 2, 7, 2, form)
    eager = vitfast.ops.vit_block_cuda_eager(*args)
    torch.testing.assert_close(eager, reference.compose_vit_block(fns, *args), atol=0, rtol=0)
    torch.testing.assert_close(eager, reference.vit_block(*args), atol=1e-5, rtol=1e-5)
    # (vit_block itself is fp32; this block also runs CUDA's bf16/fp16 models: the per-op impls' bits there)
    half = tuple(a.to(torch.bfloat16) if isinstance(a, torch.Tensor) else a for a in args)
    torch.testing.assert_close(vitfast.ops.vit_block_cuda_eager(*half), reference.compose_vit_block(fns, *half),
                               atol=0, rtol=0)
    with pytest.raises(ValueError, match="x: expected dtype float32, float16 or bfloat16, got torch.float64"):
        vitfast.ops.vit_block_cuda_eager(*(a.double() if isinstance(a, torch.Tensor) else a for a in args))
    bad = list(args)
    bad[2] = bad[2][:, :-1]  # w_qkv one input column short
    with pytest.raises(ValueError, match="w_qkv: expected shape"):
        vitfast.ops.vit_block_cuda_eager(*bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the op's CUDA impl is the six CUDA ops)")
def test_cuda_impl_is_the_six_cuda_ops(tol, monkeypatch):
    """On a GPU the op is its six CUDA ops composed (each is one or two launches either way): the reference's and
    the CPU op's result.  The fused block runs the same calls without the per-op dispatch
    (ops.vit_block_cuda_eager) at eager inference, with the bits of its six module calls; not under autocast
    (the ops compute in fp32 there)."""
    args = make_args(96, 2, 50, 2, FFN_FORMS[1])
    cuda = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)
    out = op(*cuda)
    assert out.device == cuda[0].device
    torch.testing.assert_close(out.cpu(), reference.vit_block(*args), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.cpu(), op(*args), atol=1e-4, rtol=1e-4)
    eager = vitfast.ops.vit_block_cuda_eager
    calls = []
    monkeypatch.setattr(vitfast.ops, "vit_block_cuda_eager", lambda *a: calls.append(1) or eager(*a))
    for norm in ("batch", "layer"):
        for dtype in (torch.float32, torch.bfloat16):
            block = _fused_model(norm).blocks[0].cuda().to(dtype)
            x = torch.randn(2, 5, block.dim, device="cuda", dtype=dtype)
            calls.clear()
            with torch.no_grad():
                fast = block(x)
                assert calls == [1]
                with monkeypatch.context() as m:
                    m.setattr(fused, "whole_block_args", lambda b, inp: None)
                    slow = block(x)
                assert torch.equal(fast, slow), (norm, dtype)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    assert whole_block_args(block, x) is None
            assert whole_block_args(block, x) is None  # grad mode on
