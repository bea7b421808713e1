"""The packed-weight cache (csrc/ops/weight_cache.cpp) under the sequences and the threads that once broke it.

Each scenario runs in a subprocess: a memory error there is a failed test with its output, not a crashed suite.
They check results and survival through the real extension; the cache's index, LRU order, sweep and locking (the
torch-free csrc/cache/pack_cache.h) are also unit-tested under ASan+UBSan and TSan in the CTest tree
(csrc/tests/test_pack_cache.cpp, run by tests/test_sanitizers.py), where the old index keys' heap-use-after-free
is reported when reintroduced.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import vitfast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(not vitfast.ops.extension_loaded(), reason="the cache is part of the C++ extension")


def _run(code: str, timeout: float = 120.0) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_an_erased_entry_leaves_no_dangling_key():
    # Two entries under one index key (same op, same first weight), the first made stale by an update and erased
    # at the next miss while the second stays: the key once pointed into the erased entry's own string.
    out = _run("""
        import torch, vitfast
        from vitfast import reference
        op = torch.ops.vitfast.linear
        torch.manual_seed(0)
        W, x = torch.randn(16, 8), torch.randn(2, 8)
        biases = [torch.randn(16) for _ in range(3)]
        for step in range(200):
            for b in biases:
                torch.testing.assert_close(op(x, W, b), reference.linear(x, W, b), rtol=1e-5, atol=1e-5)
            biases[step % 3].add_(1.0)
        print("ok")
    """)
    assert out.strip() == "ok"


def test_concurrent_in_place_updates_are_never_served_stale():
    # Readers call the ops while a writer updates the weights in place; once the writer has stopped, every call
    # must see the final weights (a pack that raced with a write was once kept with the new version).
    out = _run("""
        import threading, torch, vitfast
        from vitfast import reference
        torch.manual_seed(0)
        stale = 0
        errors = []
        trials = 40
        for trial in range(trials):
            w = torch.randn(64, 32)
            w_in, w_out = torch.randn(96, 32), torch.randn(32, 64)
            x = torch.randn(4, 32)
            stop = threading.Event()
            def reader():
                # No refusal either: the NaN/Inf scan reads each element once (at::isfinite's x == x read a weight
                # being overwritten twice and refused finite values as NaN, 1 call in ~25).
                try:
                    while not stop.is_set():
                        torch.ops.vitfast.linear(x, w, None)
                        torch.ops.vitfast.channel_idle_ffn(x, w_in, None, w_out)
                except Exception as exc:
                    errors.append(repr(exc)[:200])
            threads = [threading.Thread(target=reader) for _ in range(2)]
            for t in threads:
                t.start()
            for _ in range(20):
                w.add_(0.5)
                w_in.mul_(1.01)
            stop.set()
            for t in threads:
                t.join()
            got = torch.ops.vitfast.linear(x, w, None)
            ffn = torch.ops.vitfast.channel_idle_ffn(x, w_in, None, w_out)
            if not (torch.allclose(got, reference.linear(x, w), rtol=1e-4, atol=1e-4)
                    and torch.allclose(ffn, reference.channel_idle_ffn(x, w_in, None, w_out), rtol=1e-4, atol=1e-4)):
                stale += 1
        print("stale", stale, "of", trials, "errors", errors[:3])
    """)
    assert out.strip() == "stale 0 of 40 errors []"


def test_serving_threads_survive_load_state_dict():
    # A fused model answering from two threads while the main thread loads new weights into it five times: no
    # crash, and afterwards its outputs are those of the last weights (checked against the reference backend).
    out = _run("""
        import threading, timm, torch, vitfast
        torch.manual_seed(0)
        base = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10).eval()
        fused = vitfast.fuse(vitfast.convert.from_timm(base, channel_idle=0.5).eval())
        states = [{k: v + 0.01 * i for k, v in fused.state_dict().items()} for i in range(5)]
        x = torch.randn(2, 3, 32, 32)
        stop = threading.Event()
        errors = []
        def serve():
            try:
                with torch.no_grad():
                    while not stop.is_set():
                        fused(x)
            except Exception as exc:
                errors.append(repr(exc))
        threads = [threading.Thread(target=serve) for _ in range(2)]
        for t in threads:
            t.start()
        for state in states:
            fused.load_state_dict(state)
        stop.set()
        for t in threads:
            t.join()
        with torch.no_grad():
            fast = fused(x)
            vitfast.set_backend("reference")
            slow = fused(x)
        print("errors", errors, "equal", torch.allclose(fast, slow, rtol=1e-4, atol=1e-4))
    """)
    assert out.strip() == "errors [] equal True"
