"""The C++ CPU kernel behind `torch.ops.vitfast.channel_idle_ffn` against `vitfast.reference.channel_idle_ffn`.

Shapes are ViT widths (and odd widths that break the 6 × 16 register block) with hidden = 4C and idle ratio θ:
A = ceil(4C·(1 − θ)) activated channels, L = C linear ones (the folded idle path of RePaViT eq. 6) or L = 0
(θ = 0 / the LayerNorm variant with an explicit residual).  Every CPU code path this machine supports is
forced in turn (`vitfast._C.set_cpu_isa`), at 1 and 2 threads.  Also: fp16/bf16, argument errors, the
packed-weight cache (pack once, repack after an in-place update), opcheck and torch.compile.
"""
import gc
import math
import os
import subprocess
import sys

import pytest
import torch

import vitfast
from vitfast import reference
from helpers import assert_low_precision_no_worse, assert_thread_parity

if not vitfast.ops.extension_loaded():  # a missing build must fail loudly, not skip the kernel's tests
    raise RuntimeError("vitfast._C is not built: run scripts/setup.sh (or pip install --no-build-isolation -e .)")

from vitfast import _C  # noqa: E402

op = torch.ops.vitfast.channel_idle_ffn
ISAS = _C.supported_cpu_isas()
THETAS = [0.0, 0.25, 0.5, 0.75, 1.0]


# ---------------------------------------------------------------------------------------------- helpers
def make_args(c, theta, lead, *, linear=True, b_in=True, b_out=True, residual=True, dtype=torch.float32):
    """Op arguments at nn.Linear-like scales (weights ~ U(±1/√fan_in)), built in fp32 then cast."""
    active = math.ceil(4 * c * (1 - theta))
    n_lin = c if linear else 0

    def uni(*shape, fan_in):
        return (torch.rand(*shape) * 2 - 1) / max(fan_in, 1) ** 0.5

    args = [
        torch.randn(*lead, c),
        uni(active + n_lin, c, fan_in=c),
        uni(active + n_lin, fan_in=c) if b_in else None,
        uni(c, active, fan_in=active),
        uni(c, fan_in=active) if b_out else None,
        torch.randn(*lead, c) if residual else None,
    ]
    return [a.to(dtype) if a is not None else None for a in args]


def check_parity(args, tol, threads=(1, 2)):
    # Rows are split between threads on whole register blocks; each row's arithmetic is the same.
    assert_thread_parity(op, reference.channel_idle_ffn, args, tol, threads)

# ---------------------------------------------------------------------------------------------- fp32 parity
@pytest.mark.parametrize("linear", [True, False], ids=["L=C", "L=0"])
@pytest.mark.parametrize("theta", THETAS, ids=lambda t: f"theta{t}")
@pytest.mark.parametrize("c", [192, 384, 768])
def test_parity_vit_widths_197_tokens(c, theta, linear, isa, tol, restore_threads):
    batch = 2 if c == 192 else 1
    check_parity(make_args(c, theta, (batch, 197), linear=linear), tol)


@pytest.mark.parametrize("linear", [True, False], ids=["L=C", "L=0"])
@pytest.mark.parametrize("theta", THETAS, ids=lambda t: f"theta{t}")
@pytest.mark.parametrize("batch,tokens", [(1, 1), (2, 1), (1, 7), (2, 7), (1, 50), (2, 50), (1, 197), (2, 197)])
@pytest.mark.parametrize("c", [17, 33])
def test_parity_odd_widths(c, batch, tokens, theta, linear, isa, tol, restore_threads):
    # Odd widths are cheap: run every combination of the optional inputs here.
    for b_in in (False, True):
        for b_out in (False, True):
            for residual in (False, True):
                args = make_args(c, theta, (batch, tokens), linear=linear, b_in=b_in, b_out=b_out,
                                 residual=residual)
                check_parity(args, tol)


@pytest.mark.parametrize("linear", [True, False], ids=["L=C", "L=0"])
@pytest.mark.parametrize("theta", THETAS, ids=lambda t: f"theta{t}")
@pytest.mark.parametrize("batch,tokens", [(1, 1), (2, 7), (1, 50), (2, 50)])
@pytest.mark.parametrize("c", [192, 384, 768])
def test_parity_vit_widths_few_tokens(c, batch, tokens, theta, linear, isa, tol, restore_threads):
    check_parity(make_args(c, theta, (batch, tokens), linear=linear), tol)


@pytest.mark.parametrize("residual", [False, True], ids=["no_res", "res"])
@pytest.mark.parametrize("b_out", [False, True], ids=["no_bout", "bout"])
@pytest.mark.parametrize("b_in", [False, True], ids=["no_bin", "bin"])
@pytest.mark.parametrize("theta,linear", [(0.75, True), (0.0, False), (1.0, True), (0.5, False)])
def test_optional_inputs_vit_width(theta, linear, b_in, b_out, residual, isa, tol, restore_threads):
    args = make_args(384, theta, (2, 50), linear=linear, b_in=b_in, b_out=b_out, residual=residual)
    check_parity(args, tol)


@pytest.mark.parametrize("lead", [(), (5,), (2, 3, 7), (0,), (2, 0)], ids=str)
def test_leading_dimensions(lead, isa, tol):
    args = make_args(33, 0.5, lead)
    out = op(*args)
    assert out.shape == (*lead, 33)
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(out, reference.channel_idle_ffn(*args), atol=atol, rtol=rtol)


@pytest.mark.parametrize("c_in,active,linear,c_out", [(0, 7, 4, 4), (3, 0, 0, 4), (3, 0, 4, 4), (5, 9, 0, 2)])
def test_degenerate_sizes(c_in, active, linear, c_out, isa, tol):
    """C_in = 0 (h = b_in), A = L = 0 (out = b_out + residual), A = 0 (θ = 1, one linear), C_out < C_in."""
    x = torch.randn(2, 5, c_in)
    a = [x, torch.randn(active + linear, c_in), torch.randn(active + linear), torch.randn(c_out, active),
         torch.randn(c_out), torch.randn(2, 5, c_out)]
    atol, rtol = tol[torch.float32]
    for keep in ((True, True, True), (False, False, False)):
        args = [a[0], a[1], a[2] if keep[0] else None, a[3], a[4] if keep[1] else None, a[5] if keep[2] else None]
        torch.testing.assert_close(op(*args), reference.channel_idle_ffn(*args), atol=atol, rtol=rtol)


def test_non_contiguous_inputs(isa, tol, restore_threads):
    c, lead = 48, (3, 20)
    x, w_in, b_in, w_out, b_out, residual = make_args(c, 0.75, lead)
    nc = [
        x.transpose(0, 1).contiguous().transpose(0, 1),   # [3, 20, C] with swapped strides
        w_in.t().contiguous().t(),                         # column-major weight
        torch.stack([b_in, b_in], 1)[:, 0],                # stride 2
        w_out.t().contiguous().t(),
        torch.stack([b_out, b_out], 1)[:, 1],
        residual.transpose(0, 1).contiguous().transpose(0, 1),
    ]
    assert not any(t.is_contiguous() for t in nc)
    check_parity(nc, tol)
    # A slice of a bigger weight (storage offset) is a different weight from the whole, and is cached apart.
    big = torch.cat([w_in, torch.randn(5, c)])
    args = [x, big[: w_in.shape[0]], b_in, w_out, b_out, residual]
    check_parity(args, tol)


# ---------------------------------------------------------------------------------------------- fp16 / bf16
@pytest.mark.parametrize("theta,linear", [(0.75, True), (0.0, False), (0.5, True)])
@pytest.mark.parametrize("c", [33, 192, 384])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision(dtype, c, theta, linear, isa, tol):
    """fp16/bf16 in, same dtype out (computed in fp32 inside): no worse than 2× PyTorch's own error."""
    args = make_args(c, theta, (2, 50), linear=linear, dtype=dtype)
    assert_low_precision_no_worse(op, reference.channel_idle_ffn, args, dtype, tol)


# ---------------------------------------------------------------------------------------------- bad inputs
def _args():
    return make_args(16, 0.75, (2, 5))  # C = 16, A = 16, L = 16


def _replace(i, value):
    def mutate(a):
        a = list(a)
        a[i] = value(a) if callable(value) else value
        return a

    return mutate


BAD_SHAPES = [
    ("x 0-d", _replace(0, torch.tensor(1.0)), "x"),
    ("x int", _replace(0, lambda a: a[0].to(torch.int32)), "x"),
    ("x float64", lambda a: [t.double() if t is not None else None for t in a], "x"),
    ("w_in 1-D", _replace(1, lambda a: a[1][0]), "w_in"),
    ("w_in C_in", _replace(1, lambda a: a[1][:, :-1]), "w_in"),
    ("w_in rows", _replace(1, lambda a: a[1][:-3]), "w_in"),
    ("w_out 1-D", _replace(3, lambda a: a[3][0]), "w_out"),
    ("w_out A > rows", _replace(3, lambda a: torch.randn(16, 40)), "w_out"),
    ("b_in shape", _replace(2, lambda a: a[2][:-1]), "b_in"),
    ("b_in 2-D", _replace(2, lambda a: a[2][None]), "b_in"),
    ("b_out shape", _replace(4, lambda a: a[4][:-1]), "b_out"),
    ("residual shape", _replace(5, lambda a: a[5][:, :-1]), "residual"),
]
DTYPE_MISMATCH = [(name, _replace(i, (lambda i: lambda a: a[i].double())(i)), name)
                  for i, name in [(1, "w_in"), (2, "b_in"), (3, "w_out"), (4, "b_out"), (5, "residual")]]
DEVICE_MISMATCH = [(name, _replace(i, (lambda i: lambda a: a[i].to("meta"))(i)), name)
                   for i, name in [(1, "w_in"), (2, "b_in"), (3, "w_out"), (4, "b_out"), (5, "residual")]]


@pytest.mark.parametrize("case", BAD_SHAPES + DTYPE_MISMATCH + DEVICE_MISMATCH, ids=lambda c: c[0])
def test_bad_arguments_name_the_argument(case):
    _, mutate, argname = case
    with pytest.raises(ValueError, match=rf"^{argname}: expected"):
        op(*mutate(_args()))


def test_device_mismatch_with_meta_x():
    a = _args()
    a[0] = a[0].to("meta")
    with pytest.raises(ValueError, match=r"^w_in: expected device meta \(same as x\), got cpu"):
        op(*a)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("index,name", [(1, "w_in"), (2, "b_in"), (3, "w_out"), (4, "b_out")])
def test_non_finite_weights_are_refused(index, name, bad):
    a = _args()
    a[index].view(-1)[3] = bad
    with pytest.raises(ValueError, match=rf"^{name}: expected finite values, got 1 non-finite of"):
        op(*a)
    # Fixed in place (a new version): accepted, and the result is right.
    with torch.no_grad():
        a[index].view(-1)[3] = 0.25
    torch.testing.assert_close(op(*a), reference.channel_idle_ffn(*a))


def test_non_finite_activations_propagate_like_torch():
    """Only weights are validated; NaN in x behaves as in the reference (a NaN row, others untouched)."""
    a = _args()
    a[0][0, 1, 3] = float("nan")
    out, ref = op(*a), reference.channel_idle_ffn(*a)
    assert torch.isnan(out[0, 1]).all() and torch.isnan(ref[0, 1]).all()
    torch.testing.assert_close(out[1], ref[1])


# ---------------------------------------------------------------------------------------------- packed-weight cache
def _stats():
    return _C._weight_cache_stats()


def test_weights_are_packed_once_and_reused():
    _C._weight_cache_clear()
    a = make_args(64, 0.75, (1, 9))
    op(*a)
    s1 = _stats()
    for _ in range(3):
        op(*a)
    s2 = _stats()
    assert (s1["misses"], s1["entries"]) == (1, 1) and s1["bytes"] > 0
    assert s2["misses"] == 1 and s2["hits"] == s1["hits"] + 3
    # New activations / residual never repack: only weights are keyed.
    a2 = list(a)
    a2[0], a2[5] = torch.randn_like(a[0]), torch.randn_like(a[5])
    op(*a2)
    assert _stats()["misses"] == 1


@pytest.mark.parametrize("index", [1, 2, 3, 4], ids=["w_in", "b_in", "w_out", "b_out"])
@pytest.mark.parametrize("how", ["no_grad", "inference_mode", "copy_"])
def test_in_place_weight_update_is_picked_up(index, how, tol):
    a = make_args(40, 0.5, (2, 11))
    first = op(*a)
    torch.testing.assert_close(first, reference.channel_idle_ffn(*a))
    misses = _stats()["misses"]
    if how == "no_grad":
        with torch.no_grad():
            a[index].mul_(-1.5)
    elif how == "inference_mode":
        with torch.inference_mode():
            a[index].add_(0.3)
    else:  # what load_state_dict does
        with torch.no_grad():
            a[index].copy_(torch.randn_like(a[index]))
    second = op(*a)
    assert _stats()["misses"] == misses + 1, "an in-place update did not invalidate the packed weights"
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(second, reference.channel_idle_ffn(*a), atol=atol, rtol=rtol)
    assert not torch.allclose(first, second)


def test_freed_and_reallocated_weights_are_not_confused(tol):
    """A new weight storage at a freed one's address, with the same version (0), must not hit the old entry.

    The memory is pinned in numpy arrays, so every round really gets new storages over the *same* addresses
    (what an allocator does by chance): a cache keyed on data pointer + version would serve round 1's
    packing in round 2.
    """
    import numpy as np

    atol, rtol = tol[torch.float32]
    template = make_args(32, 0.75, (1, 13))
    buffers = [np.empty(tuple(t.shape), dtype=np.float32) for t in template[1:5]]
    pointers = set()
    for round_ in range(4):
        for buf in buffers:
            buf[...] = np.random.default_rng(round_).uniform(-0.2, 0.2, buf.shape)
        weights = [torch.from_numpy(buf) for buf in buffers]  # new storages, same memory every round
        pointers.add(tuple(w.data_ptr() for w in weights))
        a = [template[0], *weights, template[5]]
        torch.testing.assert_close(op(*a), reference.channel_idle_ffn(*a), atol=atol, rtol=rtol)
        del a, weights
        gc.collect()
    assert len(pointers) == 1  # the scenario under test did happen
    # Entries of freed storages are dropped at the next miss: the cache does not grow with dead weights.
    assert _stats()["entries"] <= 2


def test_inference_tensor_weights_are_correct_and_never_stale(tol):
    """Inference tensors have no version counter: the kernel packs them per call rather than risk staleness."""
    with torch.inference_mode():
        a = make_args(24, 0.75, (1, 7))
        torch.testing.assert_close(op(*a), reference.channel_idle_ffn(*a))
        a[1].mul_(2.0)  # in-place update of an inference tensor: invisible to version counters
        atol, rtol = tol[torch.float32]
        torch.testing.assert_close(op(*a), reference.channel_idle_ffn(*a), atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------------- torch integration
@pytest.mark.parametrize("optional", [True, False], ids=["with_optionals", "without_optionals"])
@pytest.mark.parametrize("theta,linear", [(0.75, True), (0.0, False)])
def test_opcheck(theta, linear, optional):
    a = make_args(24, theta, (2, 7), linear=linear, b_in=optional, b_out=optional, residual=optional)
    torch.library.opcheck(op.default, tuple(a))


@pytest.mark.slow
def test_torch_compile_fullgraph(tol):
    torch._dynamo.reset()
    x, w_in, b_in, w_out, b_out, _ = make_args(48, 0.75, (2, 13))

    def block(t):
        # The op inside ordinary PyTorch code, as a fused block uses it (residual = the block input).
        return op(t * 0.5, w_in, b_in, w_out, b_out, t).relu()

    compiled = torch.compile(block, fullgraph=True, backend="inductor")
    atol, rtol = tol[torch.float32]
    torch.testing.assert_close(compiled(x), block(x), atol=atol, rtol=rtol)
    x2 = torch.randn(2, 13, 48)
    torch.testing.assert_close(compiled(x2), block(x2), atol=atol, rtol=rtol)


# ---------------------------------------------------------------------------------------------- ISA selection
def test_isa_selection_api():
    assert "scalar" in ISAS
    assert _C.cpu_isa() in ISAS
    previous = _C.set_cpu_isa("scalar")
    try:
        assert _C.cpu_isa() == "scalar"
    finally:
        _C.set_cpu_isa(previous)
    assert _C.cpu_isa() == previous
    with pytest.raises(ValueError, match=r"^isa: expected one of 'scalar', 'avx2', 'avx512', 'neon', got 'sse9'"):
        _C.set_cpu_isa("sse9")
    unsupported = [i for i in ("avx2", "neon") if i not in ISAS]
    for name in unsupported:
        with pytest.raises(RuntimeError, match=rf"isa: '{name}' is not supported on this CPU/build"):
            _C.set_cpu_isa(name)


def test_simd_path_is_available_where_the_cpu_has_it():
    """A SIMD-capable CPU must get its SIMD path by default (else every benchmark measures the fallback)."""
    import platform

    machine = platform.machine().lower()
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if machine in ("x86_64", "amd64") and " avx2 " in flags and " fma " in flags:
        assert "avx2" in ISAS
    if machine in ("aarch64", "arm64"):
        assert "neon" in ISAS


def _run_python(code, **env):
    full = {k: v for k, v in os.environ.items() if k != "VITFAST_CPU_ISA"}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True)


def test_isa_environment_override():
    proc = _run_python("import vitfast; print(vitfast.ops.cpu_isa())", VITFAST_CPU_ISA="scalar")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "scalar"
    proc = _run_python("import vitfast; print(vitfast.ops.cpu_isa())", VITFAST_CPU_ISA="avx512-magic")
    assert proc.returncode == 0, proc.stderr
    assert "VITFAST_CPU_ISA" in proc.stderr and "avx512-magic" in proc.stderr
    assert proc.stdout.strip() in ISAS


# ---------------------------------------------------------------------------------------------- the CUDA composition
@pytest.mark.parametrize("linear,b_out,residual", [(True, True, True), (True, False, True), (True, True, False),
                                                   (False, True, True), (False, True, False), (False, False, False)])
@pytest.mark.parametrize("theta", [0.0, 0.75, 1.0])
def test_the_cuda_composition_is_the_reference_in_fewer_kernels(linear, b_out, residual, theta):
    # ops.channel_idle_ffn_composed (the CUDA path below the Triton kernel's threshold) is device-agnostic torch:
    # checked here on CPU tensors, fp32 against the reference, and the aten calls it makes (each one a CUDA kernel
    # there) counted against the reference's.
    from torch.utils._python_dispatch import TorchDispatchMode

    from vitfast.ops.channel_idle_ffn import channel_idle_ffn_composed

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket not in (torch.ops.aten.view, torch.ops.aten.slice, torch.ops.aten.t,
                                           torch.ops.aten._unsafe_view, torch.ops.aten.reshape, torch.ops.aten.empty,
                                           torch.ops.aten.transpose):
                self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    args = make_args(64, theta, (2, 5), linear=linear, b_out=b_out, residual=residual)
    with Calls() as ref_calls:
        want = reference.channel_idle_ffn(*args)
    with Calls() as calls:
        got = channel_idle_ffn_composed(*args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.shape == want.shape and got.is_contiguous()
    # One launch fewer where the reference adds two terms to the product (the sum goes first, the product into it)
    # or a bias alone (it rides in the product's epilogue); as many otherwise.
    # (θ = 1 has no activated channel: no second product at all, where the reference runs an empty one.)
    has_linear = args[1].shape[0] > args[3].shape[1]
    saved = 1 if (has_linear and residual) or b_out else 0
    if args[3].shape[1] > 0:
        assert len(calls.names) == len(ref_calls.names) - saved, (calls.names, ref_calls.names)
