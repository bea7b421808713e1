"""Benchmark of collapsed non-deep attention `xwx_attention`: providers × DeiT shapes × score form × batch × threads.

The shapes are what `vitfast.fuse` produces from a 2-branch non-deep DeiT (values side by side, D = 2·64 = 128):
  factored  w_q, w_k [H, C, 128]  (the branch factors stacked; `fuse` picks it when 2·64 ≤ C/2, i.e. DeiT-S)
  full      W_h [H, C, C]         (`fuse` picks it for DeiT-Ti, where 128 > 192/2)
N = 197, key bias, output bias and the block's residual on (what the fused block passes).

Providers (baselines imported from vitfast.reference, so they are the code the tests trust):
  cpp          torch.ops.vitfast.xwx_attention on CPU (C++ on the GEMM core, online softmax over key tiles)
  eager        vitfast.reference.xwx_attention on CPU (einsum projections, [B, H, N, N] scores, softmax, einsum)
  compile      torch.compile(vitfast.reference.xwx_attention) on CPU
  triton       the Triton kernel on CUDA (skipped without a GPU), synchronised inside the timed call
  eager_cuda   vitfast.reference.xwx_attention on CUDA (cuBLAS), synchronised — the baseline for `triton`

FLOPs = 2·B·N·C·H·(R_left + R_right + D) (projections; R_right = 0 for the full form) + 2·B·H·N²·(R + D)
(scores and P·V) + 2·B·N·H·D·C (output).  The terminal summary prints GFLOP/s, % of sgemm and ratios vs
eager / compile (on CUDA compare triton with eager_cuda in the printed ms column).

    .venv/bin/python -m pytest benchmarks/bench_xwx_attention.py -k "t1"
"""
from __future__ import annotations

import pytest
import torch

from harness import op_provider, run_case
from shapes import VIT_SHAPES
from vitfast import reference

PROVIDERS = ["cpp", "eager", "compile", "triton", "eager_cuda"]
RANK, VALUE_DIM = 128, 128  # 2 branches × head dim 64


def xwx_flops(batch: int, tokens: int, channels: int, heads: int, rank: int, value_dim: int, full: bool) -> int:
    proj = 2 * batch * tokens * channels * heads * ((rank if full else 2 * rank) + value_dim)
    attn = 2 * batch * heads * tokens * tokens * (rank + value_dim)
    out = 2 * batch * tokens * heads * value_dim * channels
    return proj + attn + out


def make_args(batch, shape, form, device):
    g = torch.Generator().manual_seed(0)
    c, h = shape.width, shape.heads
    r = c if form == "full" else RANK

    def rnd(*s, scale=1.0):
        return (torch.randn(*s, generator=g) * scale).to(device)

    x = rnd(batch, shape.tokens, c)
    w_q = rnd(h, c, r, scale=c**-0.5 * r**-0.25)
    w_k = None if form == "full" else rnd(h, c, r, scale=c**-0.5 * r**-0.25)
    return (x, w_q, w_k, rnd(h, c, scale=c**-0.5), rnd(h, c, VALUE_DIM, scale=c**-0.5),
            rnd(h, VALUE_DIM, c, scale=(h * VALUE_DIM) ** -0.5), rnd(c, scale=0.1), rnd(batch, shape.tokens, c))


def _synchronised(fn):
    def call(*args):
        out = fn(*args)
        torch.cuda.synchronize()
        return out
    return call


def provider_fn(provider, case):
    fn = op_provider("xwx_attention", provider, case)
    if fn is not None:
        return fn
    if provider == "triton":
        from vitfast.kernels.xwx_attention import xwx_attention_triton

        return _synchronised(xwx_attention_triton)
    if provider == "eager_cuda":
        return _synchronised(reference.xwx_attention)
    raise ValueError(provider)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("threads", [1, 2], ids=lambda t: f"t{t}")
@pytest.mark.parametrize("batch", [1, 8], ids=lambda b: f"b{b}")
@pytest.mark.parametrize("form", ["factored", "full"])
@pytest.mark.parametrize("shape_name", ["deit_tiny", "deit_small"])
def test_xwx_attention(benchmark, shape_name, form, batch, threads, provider):
    cuda = provider in ("triton", "eager_cuda")
    if cuda and not torch.cuda.is_available():
        pytest.skip("CUDA provider without a GPU")
    if cuda and threads != 1:
        pytest.skip("CPU thread count does not apply to CUDA providers")
    shape = VIT_SHAPES[shape_name]
    args = make_args(batch, shape, form, "cuda" if cuda else "cpu")
    case = (shape.name, form, f"b{batch}", f"t{threads}")
    flops = xwx_flops(batch, shape.tokens, shape.width, shape.heads, shape.width if form == "full" else RANK,
                      VALUE_DIM, form == "full")
    run_case(benchmark, provider_fn(provider, case), args, case, provider, flops, threads)


def _cuda_table(batches=(1, 8, 64), repeats=50) -> None:
    """`python benchmarks/bench_xwx_attention.py` on a GPU machine (no pytest-benchmark needed): triton vs the
    eager reference on CUDA, CUDA-event medians, same run, every shape × form × batch; parity checked first."""
    import statistics

    from vitfast.kernels.xwx_attention import xwx_attention_triton

    def timed(fn, args):
        for _ in range(3):
            fn(*args)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    print(f"{torch.cuda.get_device_name()}  (fp32: TF32 {'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'})")
    print(f"{'case':<30} {'dtype':<9} {'triton ms':>10} {'eager ms':>10} {'speed-up':>9} {'max |Δ|/scale':>14}")
    for shape_name in ("deit_tiny", "deit_small"):
        shape = VIT_SHAPES[shape_name]
        for form in ("factored", "full"):
            for batch in batches:
                for dtype in (torch.float32, torch.float16):
                    args = [a.to(dtype) if a is not None else None for a in make_args(batch, shape, form, "cuda")]
                    out = xwx_attention_triton(*args)
                    ref = reference.xwx_attention(*args)
                    err = float((out.float() - ref.float()).abs().max() / ref.float().abs().max())
                    t_tri, t_ref = timed(xwx_attention_triton, args), timed(reference.xwx_attention, args)
                    case = f"{shape.name}/{form}/b{batch}"
                    print(f"{case:<30} {str(dtype)[6:]:<9} {t_tri:>10.3f} {t_ref:>10.3f} {t_ref / t_tri:>8.2f}x {err:>14.2e}",
                          flush=True)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run the CPU providers with pytest (see the module doc)")
    _cuda_table()
