"""Backprop through the fused ops (vitfast/ops/_autograd.py): the functional API runs the kernel forward and the
reference's gradient, so a fused model can be fine-tuned and no fused weight gets a silent None gradient."""
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

import vitfast
from vitfast import ops, reference

from helpers import randomize

needs_ext = pytest.mark.skipif(not vitfast.ops.extension_loaded(), reason="needs the C++ extension (vitfast._C)")


def _t(*shape, seed, scale=0.3, grad=True):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale
    return t.requires_grad_(grad)


def _cases():
    x = _t(2, 10, 16, seed=1, scale=1.0)
    gate = torch.tensor([1, 0], dtype=torch.int32)
    grid = _t(2, 1 + 9, 16, seed=2, scale=1.0)  # cls + a 3 × 3 grid
    return {
        "channel_idle_ffn": (x, _t(40, 16, seed=3), _t(40, seed=4), _t(16, 24, seed=5), _t(16, seed=6), x),
        "linear": (x, _t(24, 16, seed=7), _t(24, seed=8), _t(2, 10, 24, seed=9)),
        "attention": (_t(2, 10, 48, seed=10, scale=1.0), 2, None),
        "layer_norm": (x, _t(16, seed=32), _t(16, seed=33), 1e-5),
        "xwx_attention": (x, _t(2, 16, 4, seed=11), _t(2, 16, 4, seed=12), _t(2, 16, seed=13), _t(2, 16, 8, seed=14),
                          _t(2, 8, 16, seed=15), _t(16, seed=16), x),
        "dwconv_attention": (grid, _t(8, 16, seed=17), _t(8, seed=18), _t(8, 3, 3, seed=19), _t(16, 8, seed=20),
                             _t(16, seed=21), 3, 3, grid),
        "gate_select": (gate, 0, _t(2, 10, 16, seed=22), _t(2, 10, 16, seed=23)),
        "gated_mhsa": (gate, 0, x, 1e-6, _t(48, 16, seed=24), _t(48, seed=25), 2, _t(16, 16, seed=26), _t(16, seed=27)),
        "gated_ffn": (gate, 0, x, None, _t(40, 16, seed=28), _t(40, seed=29), _t(16, 24, seed=30), _t(16, seed=31),
                      True),
    }


@needs_ext
@pytest.mark.parametrize("name", sorted(_cases()))
def test_op_gradient_is_the_reference_gradient(name):
    args = _cases()[name]
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    upstream = torch.randn(getattr(reference, name)(*args).shape, generator=torch.Generator().manual_seed(99))
    got = torch.autograd.grad(getattr(ops, name)(*args), leaves, upstream, allow_unused=True)
    want = torch.autograd.grad(getattr(reference, name)(*args), leaves, upstream, allow_unused=True)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if w is not None:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert any(g is not None for g in got)


@needs_ext
@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("name", sorted(_cases()))
def test_op_gradient_under_autocast_with_bf16_activations(name, backend):
    """Inside autocast the ops run in fp32 (their autocast rule): the backward's reference once ran on the raw
    mixed bf16/fp32 inputs and refused them.  Now every gradient is the fp32 one, in its leaf's dtype."""
    args = _cases()[name]
    activation = 2 if name in ("gate_select", "gated_mhsa", "gated_ffn") else 0  # the first input after gate, index
    mixed = [a.detach().bfloat16().requires_grad_() if i == activation else a for i, a in enumerate(args)]
    as_fp32 = [a.detach().float().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) and a.is_floating_point()
               else a for a in mixed]
    leaves = [a for a in mixed if isinstance(a, torch.Tensor) and a.requires_grad]
    fp32_leaves = [a for a in as_fp32 if isinstance(a, torch.Tensor) and a.requires_grad]
    upstream = torch.randn(getattr(reference, name)(*as_fp32).shape, generator=torch.Generator().manual_seed(99))
    previous = vitfast.get_backend()
    vitfast.set_backend(backend)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = getattr(ops, name)(*mixed)
        got = torch.autograd.grad(out, leaves, upstream, allow_unused=True)
    finally:
        vitfast.set_backend(previous)
    want = torch.autograd.grad(getattr(reference, name)(*as_fp32), fp32_leaves, upstream, allow_unused=True)
    assert mixed[activation].dtype == torch.bfloat16 and out.dtype == torch.float32
    for leaf, g, w in zip(leaves, got, want):
        assert (g is None) == (w is None)
        if w is not None:
            assert g.dtype == leaf.dtype
            torch.testing.assert_close(g.float(), w.to(leaf.dtype).float(), rtol=1e-2, atol=1e-2)


@needs_ext
@pytest.mark.parametrize("name", sorted(_cases()))
def test_op_second_order_gradient_is_the_reference_one(name):
    """backward(create_graph=True) through an op: a gradient penalty ‖∂L/∂x‖² differentiated again.  The op's
    terms once vanished from the second derivative (its backward detached the saved inputs), silently where
    another term kept the graph alive."""
    args = _cases()[name]
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    upstream = torch.randn(getattr(reference, name)(*args).shape, generator=torch.Generator().manual_seed(98))

    def penalty_grads(fn):
        first = torch.autograd.grad((fn(*args) * upstream).sum(), leaves, create_graph=True, allow_unused=True)
        penalty = sum((g**2).sum() for g in first if g is not None and g.requires_grad)
        if not torch.is_tensor(penalty):  # the op is linear in every leaf: no second-order term at all
            return None
        return torch.autograd.grad(penalty, leaves, allow_unused=True)

    try:
        want = penalty_grads(getattr(reference, name))
    except RuntimeError as exc:  # e.g. CPU SDPA has no double backward: the op must fail as its reference does
        with pytest.raises(RuntimeError, match="not implemented"):
            penalty_grads(getattr(ops, name))
        assert "not implemented" in str(exc)
        return
    got = penalty_grads(getattr(ops, name))
    assert (got is None) == (want is None)
    if want is None:
        return
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if w is not None:
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert any(g is not None for g in got)


@needs_ext
def test_closed_gate_passes_the_gradient_through():
    gate = torch.tensor([0], dtype=torch.int32)
    x = _t(1, 4, 16, seed=40, scale=1.0)
    w_in, w_out = _t(40, 16, seed=41), _t(16, 24, seed=42)
    out = ops.gated_ffn(gate, 0, x, None, w_in, None, w_out, None, True)
    gx, gw = torch.autograd.grad(out.sum(), [x, w_in], allow_unused=True)
    torch.testing.assert_close(gx, torch.ones_like(x))  # the identity
    assert gw is None or not gw.any()


@needs_ext
def test_inference_does_not_record():
    x, w = torch.randn(1, 4, 16), _t(8, 16, seed=50)
    with torch.no_grad():
        assert not ops.linear(x, w).requires_grad
    with torch.inference_mode():
        assert not ops.linear(x, w).requires_grad
    assert not ops.linear(x, w.detach()).requires_grad
    # batch_gate's output is a 0/1 decision: never differentiable, even with grad-requiring weights.
    decision = ops.batch_gate(_t(2, 5, 16, seed=51), _t(2, 16, seed=52), None)
    assert not decision.requires_grad


@needs_ext
@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))])
def test_fused_model_fine_tunes_with_reference_gradients(device, monkeypatch):
    """Backprop through a whole fused RePaViT: every parameter gets the gradient of the reference backend."""
    if device == "cuda":
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
        monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    vit = randomize(VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                                      num_classes=10, qkv_bias=True)).eval()
    fused = vitfast.fuse(vitfast.convert.from_timm(vit, channel_idle=0.75).eval()).to(device)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3)).to(device)

    def gradients():
        fused.zero_grad(set_to_none=True)
        fused(images).logsumexp(-1).sum().backward()
        return {n: p.grad for n, p in fused.named_parameters()}

    fast = gradients()
    vitfast.set_backend("reference")
    try:
        slow = gradients()
    finally:
        vitfast.set_backend("auto")
    missing = sorted(n for n, g in fast.items() if g is None)
    assert missing == [], f"no gradient for {missing}"
    for n in fast:
        torch.testing.assert_close(fast[n], slow[n], rtol=1e-3, atol=1e-4, msg=n)


@needs_ext
@pytest.mark.slow
def test_compiled_fused_model_trains():
    """torch.compile traces the gradient path too (grad mode, weights requiring grad): same output, gradients."""
    vit = randomize(VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                                      num_classes=10)).eval()
    fused = vitfast.fuse(vitfast.convert.from_timm(vit, channel_idle=0.75).eval())
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = fused(images)
    torch._dynamo.reset()
    out = torch.compile(fused)(images)
    torch.testing.assert_close(out.detach(), expected, rtol=1e-4, atol=1e-4)
    out.sum().backward()
    assert all(p.grad is not None for p in fused.parameters())
