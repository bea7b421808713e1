"""Packed weights on huge pages (csrc/kernels/huge_arena.h): a packed weight is carved from the arena and given back
when the weight cache drops it, VITFAST_HUGE_PAGES=0 turns the arena off, and the bits do not depend on it.
The arena itself (best fit, coalescing, zeroing, threads, its fallback) is tested in C++: csrc/tests/test_huge_arena.cpp.
"""
import os
import subprocess
import sys

import pytest
import torch

import vitfast  # noqa: F401  (loads the extension)
from vitfast import _C

pytestmark = pytest.mark.skipif(not _C._huge_arena_stats()["enabled"],
                                reason="the huge-page arena is off here (VITFAST_HUGE_PAGES=0 or not Linux)")


def _linear(x, w, b):
    return torch.ops.vitfast.linear(x, w, b)


def test_a_packed_weight_lives_in_the_arena_until_the_cache_drops_it():
    x = torch.randn(197, 384)
    _linear(x, torch.randn(1152, 384), torch.randn(1152))  # any scratch the op keeps per thread exists from here on
    _C._weight_cache_clear()
    before = _C._huge_arena_stats()
    w, b = torch.randn(1152, 384), torch.randn(1152)
    _linear(x, w, b)
    after = _C._huge_arena_stats()
    # 72 panels of 16 columns × 384 floats; the 4.5 KiB bias is below the arena's 64 KiB minimum.
    assert after["live_bytes"] - before["live_bytes"] == 1152 * 384 * 4
    assert after["live_blocks"] - before["live_blocks"] == 1
    assert after["chunks"] >= 1 and after["mapped_bytes"] >= after["live_bytes"]
    _C._weight_cache_clear()
    cleared = _C._huge_arena_stats()
    assert (cleared["live_bytes"], cleared["live_blocks"]) == (before["live_bytes"], before["live_blocks"])


def test_a_model_packs_densely():
    """Twelve blocks' weights share a few 32 MiB chunks instead of one 2 MiB-rounded allocation each."""
    import timm
    from vitfast import convert
    torch.manual_seed(0)
    model = vitfast.fuse(convert.from_timm(timm.create_model("deit_tiny_patch16_224", pretrained=False),
                                           channel_idle=0.75)).eval()
    _C._weight_cache_clear()
    before = _C._huge_arena_stats()
    with torch.inference_mode():
        model(torch.randn(1, 3, 224, 224))
    after = _C._huge_arena_stats()
    grown = after["live_bytes"] - before["live_bytes"]
    assert grown > 3 * 2**20, f"DeiT-Ti's packed weights should be in the arena, it grew by {grown} bytes"
    assert after["mapped_bytes"] - before["mapped_bytes"] <= grown + 32 * 2**20
    _C._weight_cache_clear()


def test_off_switch_and_same_bits(tmp_path):
    torch.manual_seed(1)
    x, w, b = torch.randn(37, 384), torch.randn(1152, 384), torch.randn(1152)
    torch.save((x, w, b), tmp_path / "args.pt")
    on = _linear(x, w, b)
    code = ("import sys, torch, vitfast; from vitfast import _C\n"
            "x, w, b = torch.load(sys.argv[1])\n"
            "y = torch.ops.vitfast.linear(x, w, b)\n"
            "s = _C._huge_arena_stats()\n"
            "assert not s['enabled'] and s['live_blocks'] == 0, s\n"
            "torch.save(y, sys.argv[2])\n")
    env = dict(os.environ, VITFAST_HUGE_PAGES="0", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "args.pt"), str(tmp_path / "off.pt")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert torch.equal(torch.load(tmp_path / "off.pt"), on)


def test_a_forked_child_frees_and_allocates_in_its_copy():
    """A DataLoader-style fork: the child inherits the parent's arena (its chunks copy-on-write), drops and repacks
    weights in it, and computes the same bits; the parent's arena is untouched by the child."""
    import multiprocessing as mp

    x, w, b = torch.randn(37, 384), torch.randn(1152, 384), torch.randn(1152)
    expected = _linear(x, w, b)
    parent_before = _C._huge_arena_stats()

    def child(q):
        torch.set_num_threads(1)  # as DataLoader workers do: libgomp's team does not survive a fork
        _C._weight_cache_clear()  # frees the inherited blocks into the child's copy of the arena
        y = _linear(x, w, b)      # and packs again from it
        q.put((torch.equal(y, expected), _C._huge_arena_stats()["live_blocks"]))

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    try:
        same, live = q.get(timeout=60)
        p.join(timeout=60)
        assert p.exitcode == 0
    finally:
        if p.is_alive():  # a hung child would outlive the run and hold its output pipe open
            p.kill()
            p.join()
    assert same and live >= 1
    assert _C._huge_arena_stats()["live_blocks"] == parent_before["live_blocks"]
