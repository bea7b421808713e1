"""The CPU ops' output cache (csrc/ops/output_pool.h): a freed output of 1 MiB or more is handed to the next output of
its size instead of going back to malloc (which returned such blocks to the kernel and page-faulted them back in on
every forward); smaller outputs, and everything under VITFAST_OUTPUT_POOL=0, come from the CPU allocator."""
import os
import subprocess
import sys

import pytest
import torch

import vitfast

pytestmark = pytest.mark.skipif(not vitfast.ops.extension_loaded(), reason="needs the C++ extension")


def _stats():
    return vitfast.ops._C._output_pool_stats()


def test_a_freed_output_serves_the_next_one_of_its_size():
    vitfast.ops.clear_output_cache()
    assert _stats()["cached_bytes"] == 0 and _stats()["enabled"]
    x, w = torch.randn(4, 197, 384), torch.randn(1152, 384)  # output 3.5 MB
    y = vitfast.ops.linear(x, w)
    ptr, ref = y.data_ptr(), y.clone()
    del y
    cached, reused = _stats()["cached_bytes"], _stats()["reused"]
    assert cached >= 4 * 197 * 1152 * 4
    y = vitfast.ops.linear(x, w)
    assert y.data_ptr() == ptr and _stats()["reused"] == reused + 1 and _stats()["cached_bytes"] < cached
    assert torch.equal(y, ref)  # every element written: the recycled block's old contents never show through


def test_pooled_outputs_are_ordinary_tensors():
    x, w = torch.randn(2, 197, 768), torch.randn(768, 768)
    y = vitfast.ops.linear(x, w)
    assert y.is_contiguous() and y.dtype == torch.float32 and y.device.type == "cpu" and not y.requires_grad
    torch.testing.assert_close(y, x @ w.t(), rtol=1e-4, atol=1e-4)
    y.resize_(4, 197, 768)  # a resizable storage (it grows through the same allocator)
    y.add_(1.0)
    assert y.shape == (4, 197, 768) and torch.isfinite(y[:2]).all()
    with torch.inference_mode():
        z = vitfast.ops.linear(x, w)
    assert z.is_inference() and not y.is_inference()


def test_small_outputs_and_clear():
    before = _stats()["reused"]
    for _ in range(3):
        vitfast.ops.linear(torch.randn(2, 8), torch.randn(4, 8))  # 32 bytes: never cached
    assert _stats()["reused"] == before
    vitfast.ops.linear(torch.randn(4, 197, 384), torch.randn(1152, 384))
    assert _stats()["cached_bytes"] > 0
    vitfast.ops.clear_output_cache()
    assert _stats()["cached_bytes"] == 0


def test_the_cache_is_bounded():
    """At most 4 blocks of one size wait in the cache: the rest go back to malloc when freed."""
    vitfast.ops.clear_output_cache()
    x, w = torch.randn(1, 1024, 256), torch.randn(512, 256)  # 2 MiB outputs
    outs = [vitfast.ops.linear(x, w) for _ in range(6)]
    del outs
    assert _stats()["cached_bytes"] == 4 * 1024 * 512 * 4
    vitfast.ops.clear_output_cache()


def test_env_turns_it_off():
    code = ("import torch, vitfast\n"
            "y = vitfast.ops.linear(torch.randn(4, 197, 384), torch.randn(1152, 384)); del y\n"
            "s = vitfast.ops._C._output_pool_stats(); print(s['enabled'], s['cached_bytes'])\n")
    env = dict(os.environ, VITFAST_OUTPUT_POOL="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "0"]


def _child_forward(queue):
    torch.set_num_threads(1)  # as DataLoader workers do: libgomp's team does not survive a fork
    y = vitfast.ops.linear(torch.randn(4, 197, 384), torch.randn(1152, 384))
    del y  # frees into the child's copy of the cache
    y = vitfast.ops.linear(torch.randn(4, 197, 384), torch.randn(1152, 384))
    queue.put(float(y.abs().sum()) > 0)


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_a_forked_child_uses_its_copy_of_the_cache():
    import multiprocessing as mp
    import threading

    stop, running = threading.Event(), threading.Event()
    # The inputs are made here, not in the thread: torch.randn holds the default generator's mutex (GIL released),
    # and a fork at that instant leaves the child's copy locked for ever -- torch's lock, not the cache's.
    x, w = torch.randn(4, 197, 384), torch.randn(1152, 384)

    def churn():  # another thread allocating and freeing outputs while the process forks
        while not stop.is_set():
            vitfast.ops.linear(x, w)
            running.set()

    t = threading.Thread(target=churn)
    t.start()
    children = []
    try:
        assert running.wait(timeout=60)
        ctx = mp.get_context("fork")
        for _ in range(3):
            q = ctx.Queue()
            p = ctx.Process(target=_child_forward, args=(q,))
            children.append(p)
            p.start()
            assert q.get(timeout=60) is True
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        stop.set()
        t.join()
        for p in children:  # a hung child would outlive the run and hold its output pipe open
            if p.is_alive():
                p.kill()
                p.join()
