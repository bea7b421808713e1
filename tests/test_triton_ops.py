"""The Triton block path's registered ops (vitfast/ops/triton_ops.py): their schemas, results equal to the launchers',
fake shapes, opcheck, torch.compile around them, and — without a GPU, on fake CUDA tensors — that with
torch.library.triton_op the compiler's functional graph holds the Triton kernels themselves.

Under the Triton interpreter the ops are the custom_op form (triton_op's traced fake impl would run the interpreted
kernel on fake tensors); the triton_op form is traced in a subprocess without TRITON_INTERPRET.
"""
import os
import subprocess
import sys

import pytest
import torch

from helpers import triton_test_device
import vitfast.ops.triton_ops as triton_ops
from vitfast.kernels.ln_linear import ln_linear_triton, row_stats_triton
from vitfast.kernels.vit_block import vit_block_triton

pytestmark = pytest.mark.triton

DEVICE, INTERPRET = triton_test_device()

M, N, K = 37, 100, 72
OPS = torch.ops.vitfast


def operands():
    x = torch.randn(M, K, device=DEVICE) + 3
    w = (torch.rand(N, K, device=DEVICE) * 2 - 1) / K**0.5
    return x, w, torch.randn(N, device=DEVICE), torch.randn(M, N, device=DEVICE)


def ln_args(x, w, b, res, stats=None, emit=True, split=0):
    return (x, w, b, 1e-6, None if stats is None else stats.partials, 1 if stats is None else stats.tile, 45, None,
            None, res, emit, "auto", split)


def test_registered_with_their_schemas():
    assert triton_ops.USES_TRITON_OP == (triton_ops.HAS_TRITON_OP and not INTERPRET)
    schema = str(OPS.ln_linear_triton.default._schema)
    assert schema.startswith("vitfast::ln_linear_triton(Tensor x, Tensor weight, Tensor? bias, float? eps, Tensor? stats")
    assert schema.endswith("-> (Tensor, Tensor)")
    assert "bool ffn_residual, Tensor? stats" in str(OPS.vit_block_triton.default._schema)
    triton_ops.register()  # idempotent: defining an op twice would raise


@pytest.mark.parametrize("split", [0, 2])
def test_ln_linear_op_is_the_launcher(split):
    x, w, b, res = operands()
    stats = row_stats_triton(x)
    out, out_stats = OPS.ln_linear_triton(*ln_args(x, w, b, res, stats, split=split))
    ref, ref_stats = ln_linear_triton(x, w, b, eps=1e-6, stats=stats, gelu_cols=45, residual=res, emit_stats=True,
                                      split_k=split or None)
    assert torch.equal(out, ref) and torch.equal(out_stats, ref_stats.partials)
    out, none = OPS.ln_linear_triton(*ln_args(x, w, b, res, stats, emit=False, split=split))
    assert torch.equal(out, ref) and none.shape == (2, 0, M)


def test_vit_block_op_is_the_launcher():
    from test_vit_block_triton import FORMS, make_args

    args = make_args(FORMS[0])
    out, stats = OPS.vit_block_triton(*args, None, 1)
    ref, ref_stats = vit_block_triton(*args)
    assert torch.equal(out, ref) and torch.equal(stats, ref_stats.partials)
    # The statistics it emitted, handed back in: the next block's result as the chained launchers give it.
    out2, _ = OPS.vit_block_triton(out, *args[1:], stats, ref_stats.tile)
    torch.testing.assert_close(out2, vit_block_triton(out, *args[1:], stats=ref_stats)[0], atol=0, rtol=0)


def test_fake_shapes_and_opcheck():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, w, b, res = operands()
    with FakeTensorMode():
        fx, fw = torch.empty(2, 17, K, device=DEVICE), torch.empty(N, K, device=DEVICE)
        out, stats = OPS.ln_linear_triton(fx, fw, None, 1e-6, None, 1, 0, None, None, None, True, "auto", 0)
        assert out.shape == (2, 17, N) and stats.shape == (2, -(-N // 32), 34) and stats.dtype == torch.float32
    torch.library.opcheck(OPS.ln_linear_triton.default, ln_args(x, w, b, res),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_around_the_op():
    x, w, b, res = operands()

    def f(x):
        out, _ = OPS.ln_linear_triton(*ln_args(x, w, b, res))
        return torch.relu(out) * 2

    torch._dynamo.reset()
    # aot_eager: dynamo and AOT tracing through the op's fake impl (inductor would generate code for the device,
    # which the interpreter's CPU tensors cannot take for a Triton kernel).
    compiled = torch.compile(f, backend="aot_eager" if DEVICE == "cpu" else "inductor", fullgraph=False)
    torch.testing.assert_close(compiled(x), f(x), atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()


_TRACE = r"""
import torch
import vitfast.ops.triton_ops as t
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx

assert t.USES_TRITON_OP
with FakeTensorMode():
    x = torch.empty(2, 17, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.empty(48, 64, device="cuda", dtype=torch.bfloat16)

    def f(x, w):
        return torch.ops.vitfast.ln_linear_triton(x, w, None, 1e-6, None, 1, 0, None, None, None, True, "auto", 3)

    # What AOTDispatcher does to a triton_op under torch.compile: functionalise, decomposing it into its launches.
    graph = make_fx(dispatch_functionalize(f), tracing_mode="fake")(x, w)
code = graph.code
assert code.count("triton_kernel_wrapper_functional(") == 2, code  # row statistics + the split-K GEMM
assert "'SPLIT_K': 3" in code, code
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(not triton_ops.HAS_TRITON_OP, reason="this torch has no torch.library.triton_op")
def test_triton_op_form_is_traced_into_its_kernels():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _TRACE], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
