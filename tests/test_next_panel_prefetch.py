"""The GEMMs' next-panel prefetch (csrc/kernels/next_pair_prefetch.h) is a hint to the caches:
VITFAST_NEXT_PANEL_PREFETCH=0 turns it off, and the bits do not depend on it, on every kernel that has it (AVX-512
and AVX2 fp32, AVX-512 VNNI int8).  The shares themselves are tested in C++ (csrc/tests/test_gemm.cpp,
test_next_pair_share); that the compiler keeps the instruction, in tests/test_cpp_kernels.py."""
import os
import subprocess
import sys

import pytest
import torch

import vitfast  # noqa: F401  (loads the extension)
from vitfast import _C

# 197 rows (14 row tiles: the shares reach tile 8), 1152 columns (36 panel pairs).
CODE = """
import sys, torch, vitfast
from vitfast import _C
x, w, b, qw, ws = torch.load(sys.argv[1])
_C.set_cpu_isa(sys.argv[3])
y = torch.ops.vitfast.linear(x, w, b)
y8 = torch.ops.vitfast.linear_int8(x, qw, ws, b)
torch.save((y, y8, _C.cpu_isa(), _C.int8_kernel()), sys.argv[2])
"""


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_off_and_on_give_the_same_bits(tmp_path, isa):
    if isa not in _C.supported_cpu_isas():
        pytest.skip(f"no {isa} on this CPU")
    torch.manual_seed(3)
    x, w, b = torch.randn(197, 384), torch.randn(1152, 384) * 0.05, torch.randn(1152)
    qw = torch.randint(-127, 128, (1152, 384), dtype=torch.int8)
    ws = torch.rand(1152) * 1e-3 + 1e-4
    torch.save((x, w, b, qw, ws), tmp_path / "args.pt")
    # On an AMX CPU the default int8 kernel is the AMX one, which has no such prefetch: take the VNNI one.
    vnni = isa == "avx512" and "avx512_vnni" in _C.cpu_extensions()
    got = {}
    for setting in ("0", "1"):
        env = dict(os.environ, VITFAST_NEXT_PANEL_PREFETCH=setting, OMP_NUM_THREADS="1")
        if vnni:
            env["VITFAST_CPU_EXT"] = "noamx"
        out = tmp_path / f"{setting}.pt"
        proc = subprocess.run([sys.executable, "-c", CODE, str(tmp_path / "args.pt"), str(out), isa], env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        got[setting] = torch.load(out)
    (y0, y80, isa0, k0), (y1, y81, isa1, k1) = got["0"], got["1"]
    assert isa0 == isa1 == isa
    if vnni:
        assert k0 == k1 == "avx512_vnni", (k0, k1)
    assert torch.equal(y0, y1), "the fp32 GEMM's result depends on the prefetch"
    assert torch.equal(y80, y81), "the int8 GEMM's result depends on the prefetch"
    ref = x @ w.T + b
    assert (y1 - ref).abs().max() <= 1e-4 * ref.abs().max()
