"""What the Triton kernel modules share: the interpreter flag, the autotune candidate list, the device check, and the
tile helpers of more than one kernel (GEMM tile and its grouped ordering, the epilogue's one cast, the matmul
precision that mirrors torch's TF32 switch).

`tuned_configs(candidates, interpreter=...)` returns what `@triton.autotune(configs=...)` gets:
- under the Triton interpreter (CPU): the one `interpreter` config — autotuning would only time numpy;
- with `VITFAST_TRITON_AUTOTUNE=0`: the first candidate alone.  Autotuning compiles every candidate for every
  new key; the native GPU parity suites run hundreds of shapes, and with ~9 candidates each they spent minutes
  compiling configs whose speed they never look at (measured: 7% of the channel-idle suite in 300 s).
  Tests set it; a deployment leaves it on;
- otherwise every candidate.
Read once at import, like TRITON_INTERPRET (which must be set before triton is imported).
"""
from __future__ import annotations

import contextlib
import inspect
import os
import re

import torch
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
# 1/√2 for the erf GELU; a constexpr because @jit code may only read constexpr globals.
SQRT1_2 = tl.constexpr(0.7071067811865476)
# log₂e: softmax in base 2 (`online_softmax_step`) takes its scores multiplied by it.  LOG2E for host code (a
# launcher folds it into the scale it passes), LOG2E_JIT inside @jit code: a plain float global compiles under the
# interpreter only (tests/sm90_launches.py caught that).
LOG2E = 1.4426950408889634
LOG2E_JIT = tl.constexpr(LOG2E)


def cdiv(a, b) -> int:
    """⌈a / b⌉ for host code (grids, tile counts).  `triton.cdiv` is a constexpr function: a host call goes through
    its wrapper, ~1.5 µs against ~0.02 µs here, and a block-path GEMM launch made five to seven of them."""
    a, b = int(a), int(b)
    return -(-a // b)


def next_pow2(n) -> int:
    """The least power of two ≥ n (0 for 0, as triton's), for host code: `triton.next_power_of_2` without its
    wrapper."""
    n = int(n)
    return 0 if n == 0 else 1 << (n - 1).bit_length()


def triton_version() -> tuple:
    """(major, minor) of the installed triton (3.0 ships with torch 2.4, 3.6 with 2.11, 3.8 with 2.14)."""
    # The leading digits of each piece: '3.1rc1' is (3, 1), '3.8.0+git12ab' is (3, 8).
    return tuple(int(re.match(r"\d*", piece).group() or 0) for piece in triton.__version__.split(".")[:2])


def _autotune_enabled() -> bool:
    value = os.environ.get("VITFAST_TRITON_AUTOTUNE", "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"VITFAST_TRITON_AUTOTUNE: expected 0 or 1, got {value!r}")
    return value == "1"


AUTOTUNE = _autotune_enabled()


def tuned_configs(candidates, interpreter):
    """The autotune list: [interpreter] under the interpreter, candidates[:1] if autotuning is off, else all."""
    if INTERPRET:
        return [interpreter]
    if not candidates:
        raise ValueError("candidates: expected at least one triton.Config, got none")
    return list(candidates) if AUTOTUNE else list(candidates[:1])


# Autotune timings cached on disk (triton >= 3.2; ignored under the interpreter): the first call after a process
# start re-reads each key's choice instead of timing every config again.
_CACHE_RESULTS = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}


def autotune(configs, key):
    """`triton.autotune(configs=..., key=...)` with the on-disk cache of the choices where triton has it."""
    return triton.autotune(configs=configs, key=key, **_CACHE_RESULTS)


_PROPERTIES: dict = {}


def cuda_properties(device: torch.device):
    """`torch.cuda.get_device_properties` of a CUDA device, cached per index (launchers read it on every call); None
    for a CPU device, or for fake CUDA tensors on a machine without a GPU (tracing)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = _PROPERTIES.get(index)
    if props is None:
        props = _PROPERTIES[index] = torch.cuda.get_device_properties(index)
    return props


def traced(x: torch.Tensor) -> bool:
    """A fake or functional tensor: the op is being traced (torch.compile, export), nothing launches now."""
    return isinstance(x, (FakeTensor, FunctionalTensor))


def real_cuda(x: torch.Tensor) -> bool:
    """A CUDA tensor with memory behind it: not a fake or functional tensor of a traced op (nothing launches then)."""
    return x.device.type == "cuda" and not traced(x)


class forced_config:
    """A launch wrapper (the `_wrap` argument of the launchers) that runs an autotuned kernel at one given config
    instead of the autotuner's choice: A/B timing of configs (benchmarks/gpu_profile_blocks.py) and parity tests of
    candidates the interpreter's single config never reaches.  A kernel that is not autotuned is launched as it is.
    (A launcher treats any `_wrap` as a traced op's: ln_linear then allocates its split-K counters per call.)"""

    def __init__(self, config):
        self.config = config

    def __call__(self, kernel):
        if not hasattr(kernel, "configs"):
            return kernel
        fn, cfg = kernel.fn, self.config
        # A register cap travels as a launch option like the warps and stages (triton.Config(maxnreg=...)).
        options = {"maxnreg": cfg.maxnreg} if getattr(cfg, "maxnreg", None) is not None else {}

        class _Grid:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    return fn[grid](*args, **kwargs, **cfg.kwargs, num_warps=cfg.num_warps,
                                    num_stages=cfg.num_stages, **options)
                return launch
        return _Grid()


def launcher(kernel, wrap):
    """The kernel to launch: itself, or `wrap(kernel)` inside a registered triton_op (`torch.library.wrap_triton`),
    so that torch.compile traces the launch as a Triton kernel."""
    return kernel if wrap is None else wrap(kernel)


def on_device(t: torch.Tensor):
    """Triton launches on the *current* CUDA device (t on cuda:1 while cuda:0 is current ran on the wrong GPU):
    make t's device current around a launch; nothing while an op is traced (fake or functional tensors, possibly no
    GPU at all) or on the CPU (the interpreter)."""
    return torch.cuda.device(t.device) if real_cuda(t) else contextlib.nullcontext()


def check_device(x: torch.Tensor) -> None:
    """The launchers take CUDA tensors, or CPU tensors under the interpreter (tests on machines without a GPU)."""
    if INTERPRET:
        return
    if x.device.type != "cuda":
        raise ValueError(
            f"x: expected a CUDA tensor for the Triton kernel (or TRITON_INTERPRET=1 set before importing "
            f"triton), got device {x.device}"
        )


def rows(t: torch.Tensor, width: int) -> torch.Tensor:
    """[..., width] -> [M, width]: a view when the strides allow it (the kernels take any 2-D strides), a copy
    otherwise.  M is spelled out: `reshape(-1, 0)` cannot infer it, so a zero-width input (K = 0, C = 0) once
    raised from here instead of giving the reference's result."""
    m = 1
    for size in t.shape[:-1]:
        m *= size
    return t.reshape(m, width)


def input_precision(dtype: torch.dtype) -> str:
    # Mirror torch: an fp32 matmul may use TF32 only when torch.backends.cuda.matmul.allow_tf32 is on
    # (torch.set_float32_matmul_precision("high") turns it on).  For fp16/bf16 operands the setting is moot.
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


# ---------------------------------------------------------------------------------------------- GEMM tile code
@triton.jit
def tile_ids(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped ordering: GROUP_M row-tiles share each weight column-tile while it is in L2."""
    return tile_ids_of(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)


@triton.jit
def tile_ids_of(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of output tile `pid` in the grouped ordering (`tile_ids`; a persistent program's tiles)."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    group_size = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_size
    pid_n = (pid % in_group) // group_size
    return pid_m, pid_n


@triton.jit
def matmul_tile(
    a_ptr, w_ptr, M, N, K,
    stride_am, stride_ak, stride_wn, stride_wk,
    pid_m, pid_n,
    INPUT_PRECISION: tl.constexpr, INTERPRET_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """fp32 tile [BLOCK_M, BLOCK_N] of a[M, K] · w[N, K]ᵀ (w in nn.Linear layout, any strides)."""
    # int64 before multiplying by strides: M·stride overflows int32 for large batches (ViT-L, B·N·4C).
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    # Wrap out-of-range rows/cols onto valid ones so the loads in the K loop need only a K mask; the
    # wrapped rows/cols are discarded by the store mask.
    rows = rows % M
    cols = cols % N
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + rk[None, :] * stride_ak
    w_ptrs = w_ptr + rk[:, None] * stride_wk + cols[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
        w = tl.load(w_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(operand(a, INTERPRET_BF16), operand(w, INTERPRET_BF16), acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    return acc


@triton.jit
def to_dtype(acc, dtype: tl.constexpr, INTERPRET_BF16: tl.constexpr):
    """The one cast at the end of an epilogue: fp32 -> storage dtype, round to nearest even."""
    if INTERPRET_BF16:
        # The interpreter's fp32 -> bf16 cast truncates (its fp_trunc path ignores the RTNE mode that the GPU
        # cvt.rn.bf16.f32 applies), doubling the rounding error.  Round to nearest even on the bits first so
        # the truncating cast is exact; NaN is left alone (the carry would turn it into a denormal).
        bits = acc.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        acc = tl.where(acc != acc, acc, bits.to(tl.float32, bitcast=True))
    return acc.to(dtype)


@triton.jit
def load_tile_f32(ptr, rows, cols, stride_m, stride_n, mask):
    return tl.load(ptr + rows[:, None] * stride_m + cols[None, :] * stride_n, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def operand(t, INTERPRET_BF16: tl.constexpr):
    """A tl.dot operand as loaded: under the interpreter with bf16 only, widened to fp32 (its tl.dot would multiply
    the uint16 bit patterns, triton issue #11584; bf16 products are exact in fp32, so this is the GPU computation up
    to summation order)."""
    if INTERPRET_BF16:
        return t.to(tl.float32)
    return t


@triton.jit
def online_softmax_step(s, m_i, l_i):
    """One key tile of the online softmax (FlashAttention, Dao et al. 2022): s [BLOCK_M, BLOCK_N] scores in base 2
    (the natural scores times log₂e; −∞ for keys past N), m_i / l_i the running row maximum and sum →
    (p = 2^(s − m_new), α = 2^(m_i − m_new), m_new, l_new = α·l_i + Σ p); the caller rescales its accumulator by α.
    2^(s − max) / Σ 2^(…) is the same function as e^(t − max t) / Σ e^(…) for s = t·log₂e, and exp2 is the GPU's
    native instruction.  A row whose every score so far is −∞ (overflowed scores) would get 2^(−∞ − −∞) = NaN and
    poison l and the accumulator for good: subtracting 0 there gives those keys their zero weights exactly."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_sub)
    p = tl.math.exp2(s - m_sub[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def split_gelu_epilogue(
    acc, rows, cols, col_ok, mask, pid_n, b_ptr, b2_ptr, add_ptr, res_ptr, GELU_COLS,
    stride_am, stride_an, stride_rm, stride_rn,
    HAS_BIAS: tl.constexpr, HAS_GELU: tl.constexpr, HAS_BIAS2: tl.constexpr, HAS_ADD: tl.constexpr,
    HAS_RES: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The channel-idle FFN's GEMM epilogue on an fp32 tile: + b, exact GELU on the columns < GELU_COLS (the active
    columns come first; only tiles reaching them pay for erf), + b2 + add + res.  Each term optional (the HAS_*
    flags remove its code)."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_GELU:  # noqa: SIM102 (a constexpr test, then a run-time one: the flag removes the code)
        if pid_n * BLOCK_N < GELU_COLS:
            gelu = 0.5 * acc * (1.0 + tl.math.erf(acc * SQRT1_2))
            acc = tl.where(cols[None, :] < GELU_COLS, gelu, acc)
    if HAS_BIAS2:
        acc += tl.load(b2_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_ADD:
        acc += load_tile_f32(add_ptr, rows, cols, stride_am, stride_an, mask)
    if HAS_RES:
        acc += load_tile_f32(res_ptr, rows, cols, stride_rm, stride_rn, mask)
    return acc
