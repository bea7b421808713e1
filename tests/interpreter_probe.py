"""A trivially correct Triton kernel the test set-up runs under the interpreter before the Triton tests
(conftest.py, `_interpreter_broken_reason`): if it does not copy its input, the interpreter is what is broken."""
import torch
import triton
import triton.language as tl


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    for start in range(0, n, BLOCK):  # a strided loop over a runtime bound, as every tiled kernel has
        offs = start + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n, other=0.0), mask=offs < n)


def copy_probe() -> bool:
    """Whether the kernel copies 40 values in tiles of 16 (a ragged last tile)."""
    src = torch.arange(1, 41, dtype=torch.float32)
    dst = torch.zeros_like(src)
    _copy_kernel[(1,)](src, dst, src.numel(), BLOCK=16)
    return torch.equal(src, dst)
