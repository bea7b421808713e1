"""`vitfast.ops.warmup`: its argument errors (CPU), and under the Triton interpreter (or natively on a GPU) that it
runs the block path once per batch size, counted with the block path's launch counter."""
import importlib

import pytest
import torch

from helpers import triton_test_device
import vitfast

warmup_mod = importlib.import_module("vitfast.ops.warmup")
DEVICE, INTERPRET = triton_test_device(skip=False)


def tiny_fused(depth=2):
    import timm

    base = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=32, depth=depth).eval()
    return vitfast.fuse(vitfast.convert.from_timm(base, channel_idle=0.75)).eval()


def test_cpu_model_is_refused_in_one_line():
    model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match=r"^model: expected a model on a CUDA device .* got device cpu$"):
        vitfast.ops.warmup(model, batch_sizes=(1,), progress=False)


@pytest.mark.parametrize("sizes", [(), [0], (1, -2), (True,), (1.5,), 8], ids=repr)
def test_batch_sizes_are_checked(sizes):
    with pytest.raises(ValueError, match="batch_sizes: expected a non-empty list of positive ints"):
        vitfast.ops.warmup(torch.nn.Linear(4, 4), batch_sizes=sizes, progress=False)


def test_other_argument_errors():
    with pytest.raises(TypeError, match="model: expected a torch.nn.Module"):
        vitfast.ops.warmup(lambda x: x)
    with pytest.raises(ValueError, match="dtype: expected torch.float32"):
        vitfast.ops.warmup(torch.nn.Linear(4, 4), dtype=torch.float64)
    with pytest.raises(ValueError, match="model: expected a module with parameters"):
        vitfast.ops.warmup(torch.nn.ReLU())


def test_input_shape_is_read_from_the_patch_embedding(monkeypatch):
    # Past the CUDA check (lifted: no GPU here), a model without a timm patch embedding needs input_shape.
    monkeypatch.setattr(warmup_mod, "_require_cuda", lambda device: None)
    with pytest.raises(ValueError, match=r"input_shape: could not read the input size from Linear"):
        vitfast.ops.warmup(torch.nn.Linear(4, 4), progress=False)
    model = tiny_fused(1)
    assert warmup_mod._input_shape(model) == (3, 32, 32)
    # Through torch.compile's wrapper (nothing compiles: it is not called) and a `.module` wrapper such as
    # vitfast.cuda_graph's (which needs a GPU to build).
    assert warmup_mod._input_shape(torch.compile(model)) == (3, 32, 32)
    wrapper = torch.nn.Module()
    wrapper.module = model
    assert warmup_mod._input_shape(wrapper) == (3, 32, 32)
    seen = []
    model = torch.nn.Linear(4, 2)
    model.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    assert list(vitfast.ops.warmup(model, batch_sizes=[2, 5], input_shape=(4,), progress=False)) == [2, 5]
    assert seen == [(2, 4), (5, 4)]


@pytest.mark.triton
def test_runs_the_block_path_once_per_batch_size(monkeypatch):
    # The model's forward with VITFAST_CUDA_KERNELS=blocks: per batch size one statistics launch for the first block
    # and five launches per block (kernels/vit_block.py).  On CPU (interpreter) the CUDA check is lifted and the
    # fused blocks are routed to the block path the way FusedBlock routes CUDA tensors.
    import vitfast.kernels.ln_linear as lnl

    from vitfast.nn.block import FusedBlock, whole_block_args

    if DEVICE == "cpu":
        if not INTERPRET:
            pytest.skip("no CUDA device and TRITON_INTERPRET is off")
        if not vitfast.ops.extension_loaded():
            pytest.skip("whole_block_args takes CPU blocks only with the C++ extension built")
        monkeypatch.setattr(warmup_mod, "_require_cuda", lambda device: None)
        monkeypatch.setattr(FusedBlock, "forward",
                            lambda self, x: vitfast.ops.vit_block_cuda_eager(*whole_block_args(self, x)))
    monkeypatch.setattr(vitfast._env, "_cuda_kernels", "blocks")
    depth = 2
    model = tiny_fused(depth).to(DEVICE)
    before = lnl.launch_count()
    seconds = vitfast.ops.warmup(model, batch_sizes=(1, 3), progress=False)
    assert list(seconds) == [1, 3] and all(s > 0 for s in seconds.values())
    assert lnl.launch_count() - before == 2 * (1 + 5 * depth)
    with pytest.raises(ValueError, match=r"dtype: expected the model's parameter dtype torch.float32"):
        vitfast.ops.warmup(model, dtype=torch.bfloat16, progress=False)


def test_every_autotuned_kernel_keeps_its_choices_on_disk():
    """What warmup's tuning leaves behind outlives the process: every autotuned Triton kernel of vitfast.kernels is
    built with triton's on-disk cache of the choices (`cache_results`, triton >= 3.2; the interpreter ignores it,
    so this imports the kernels in a process without it)."""
    import inspect
    import os
    import subprocess
    import sys

    import triton

    if "cache_results" not in inspect.signature(triton.autotune).parameters:
        pytest.skip("this triton has no on-disk autotune cache")
    script = (
        "import importlib, pkgutil, triton, vitfast.kernels as K\n"
        "from triton.runtime.autotuner import Autotuner\n"
        "tuners = []\n"
        "for info in pkgutil.iter_modules(K.__path__):\n"
        "    module = importlib.import_module('vitfast.kernels.' + info.name)\n"
        "    tuners += [(info.name, n, t) for n, t in vars(module).items() if isinstance(t, Autotuner)]\n"
        "assert len(tuners) >= 6, tuners\n"
        "bad = [(m, n) for m, n, t in tuners if not t.cache_results]\n"
        "assert not bad, bad\n"
        "print('ok', len(tuners))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-2000:]
