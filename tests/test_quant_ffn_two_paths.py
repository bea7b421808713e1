"""benchmarks/quant_ffn_two_paths.py: its error measure on a hand-built BatchNorm-variant channel-idle FFN whose
linear rows carry the shortcut I (w_lin = I + W', W' small), as a fused RePaViT FFN does (eq. 5)."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import quant_ffn_two_paths as study  # noqa: E402
from vitfast.nn.ffn import FusedChannelIdleFFN  # noqa: E402


@pytest.fixture(scope="module")
def ffn_and_x():
    g = torch.Generator().manual_seed(0)
    c, a = 32, 24
    ffn = FusedChannelIdleFFN(c, a, True)
    with torch.no_grad():
        ffn.w_in.copy_(torch.cat([0.05 * torch.randn(a, c, generator=g),
                                  torch.eye(c) + 0.02 * torch.randn(c, c, generator=g)]))
        ffn.b_in.copy_(0.01 * torch.randn(a + c, generator=g))
        ffn.w_out.copy_(0.05 * torch.randn(c, a, generator=g))
        ffn.b_out.zero_()
    return ffn, torch.randn(256, c, generator=g)


def test_scales_by_granularity():
    w = torch.tensor([[1.0, -2.0], [0.5, 0.25], [4.0, 0.0]])
    assert torch.allclose(study._scales(w, "per row", 1) * 127, torch.tensor([2.0, 0.5, 4.0]))
    assert torch.allclose(study._scales(w, "per path", 1) * 127, torch.tensor([2.0, 4.0, 4.0]))
    assert torch.allclose(study._scales(w, "per tensor", 1) * 127, torch.tensor([4.0, 4.0, 4.0]))


def test_finer_scales_and_split_identity_lower_the_error(ffn_and_x):
    ffn, x = ffn_and_x
    err = {(g, s): study.ffn_error(ffn, x, g, s) for g in study.GRANULARITIES for s in (False, True)}
    assert all(0 < e < 0.1 for e in err.values()), err
    for s in (False, True):  # each finer granularity can only shrink the steps of this FFN's rows
        assert err["per row", s] <= err["per path", s] <= err["per tensor", s], err
    # the shortcut quantized with W' (row scale set by the diagonal ≈ 1) vs added exactly: several times worse
    assert err["per row", False] > 3 * err["per row", True], err
