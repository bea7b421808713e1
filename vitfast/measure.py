"""What a model costs, as `vitfast bench` and the demos report it: parameters, FLOPs per image (matmuls,
convolutions and attention, counted by torch's FlopCounterMode with vitfast's ops on their reference), latency
quantiles, and the plain-text table they are printed in."""
from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Dict, List, Mapping, Sequence

import torch
import torch.nn as nn


# ---------------------------------------------------------------------------------------------- measuring
def count_parameters(model: nn.Module) -> int:
    """Number of parameters (shared tensors once).  Buffers (BatchNorm running statistics) are not counted."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def _prod(shape) -> int:
    return int(math.prod(shape))


def _flop_formulas() -> Dict[Any, Any]:
    """FLOP formulas FlopCounterMode lacks: the CPU flash-attention kernel behind SDPA (shapes in, count out)."""

    def sdpa(q, k, v, *args, out_shape=None, **kwargs):
        batch_heads, n_q, n_k = _prod(q[:-2]), q[-2], k[-2]
        return 2 * batch_heads * n_q * n_k * q[-1] + 2 * batch_heads * n_q * n_k * v[-1]

    formulas = {}
    for name in ("_scaled_dot_product_flash_attention_for_cpu",):
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            formulas[op] = sdpa
    return formulas


@torch.no_grad()
def flops_per_image(model: nn.Module, input_shape: Sequence[int]) -> int:
    """FLOPs of one forward pass on one image of `input_shape` (C, H, W): matmuls, convolutions, attention.

    Elementwise work (norms, GELU, softmax) is not counted, in either model of a comparison.  Fused modules are
    counted on `vitfast.reference` (the same products, as aten ops FlopCounterMode knows), so every vitfast op —
    present or future — is counted without a formula of its own.
    """
    return flops_of_input(model, torch.zeros(1, *input_shape, device=next(model.parameters()).device))


@torch.no_grad()
def flops_of_input(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward pass on the batch `x` (all of it), counted as `flops_per_image` does.  For a model whose
    work depends on its input (USDC gates decide from the batch) this is the count for that batch."""
    from torch.utils.flop_counter import FlopCounterMode

    from .export import reference_backend

    was_training = model.training
    model.eval()
    try:
        counter = FlopCounterMode(display=False, custom_mapping=_flop_formulas())
        with counter, reference_backend():
            model(x)
    finally:
        model.train(was_training)
    return int(counter.get_total_flops())


def argmax_flips(logits: torch.Tensor, ref: torch.Tensor) -> Dict[str, Any]:
    """The images [N] whose argmax moved away from `ref`'s (the fp32 model's logits [N, classes]), each with ref's
    top-1 − top-2 margin and that margin's rank among all N images (0 = the smallest), and the median and three
    smallest margins: a flip on a near-tie is a rounding coin toss, one on a clear margin a real loss."""
    ref = ref.detach().float()
    if ref.shape[-1] < 2:  # one class: nothing can flip
        margin = torch.full(ref.shape[:1], float("inf"))
    else:
        top2 = ref.topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
    flipped = (logits.argmax(-1) != ref.argmax(-1)).nonzero().flatten().tolist()
    return {"flipped": [{"image": i, "fp32_margin": round(float(margin[i]), 4),
                         "margin_rank": int((margin < margin[i]).sum())} for i in flipped],
            "fp32_median_margin": float(margin.median()) if margin.numel() else float("nan"),
            "fp32_smallest_margins": [round(float(v), 4) for v in margin.sort().values[:3]]}


def flips_text(flips: Dict[str, Any], n: int, limit: int = 5) -> str:
    """One line for `argmax_flips`' result: each flipped image with its fp32 margin and rank, then the median."""
    if not flips["flipped"]:
        return "no argmax flips"
    shown = ", ".join(f"#{f['image']} (fp32 margin {f['fp32_margin']:.3f}, rank {f['margin_rank']} of {n})"
                      for f in flips["flipped"][:limit])
    more = f" and {len(flips['flipped']) - limit} more" if len(flips["flipped"]) > limit else ""
    return (f"argmax flips: {shown}{more}; fp32 median margin {flips['fp32_median_margin']:.3f} "
            f"(margin: top-1 − top-2 logit; rank 0 = the smallest)")


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Plain-text table with aligned columns (first column left, the rest right)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


def time_turn(call: Callable[[], Any], burst: int, sync: Callable[[], None]) -> float:
    """Seconds of one model's turn in a round of interleaved timing: `call()` run `burst` times back to back, each
    between two `sync()`s; the time of the one call (burst 1), else the median of calls 2..burst (the first runs on
    caches the other models of the round just used)."""
    calls = []
    for _ in range(burst):
        sync()
        start = time.perf_counter()
        call()
        sync()
        calls.append(time.perf_counter() - start)
    return statistics.median(calls[1:]) if burst > 1 else calls[0]


@torch.inference_mode()
def measure_latency(
    models: Mapping[str, nn.Module], x: torch.Tensor, *, repeats: int = 20, warmup: int = 3, burst: int = 1
) -> Dict[str, Dict[str, float]]:
    """Latency of each model on `x` -> {name: {median_ms, p10_ms, p90_ms, images_per_s, repeats}}.

    Rounds are interleaved (model A, model B, A, B, ...) so that load from other processes slows every
    model alike instead of biasing whichever ran during a busy moment.  Each round runs a model `burst` times
    back to back; with burst > 1 the round's time is the median of calls 2..burst, the model's steady state as a
    server running it sees it.  The first call of a round runs on caches the other models just used: for a model
    that fits in the caches that call is the slower one (the demo's fused digits model at batch 1: 0.28 ms
    right after the train-time model, 0.15 ms back to back), so burst = 1 measures the cold call.
    """
    if repeats < 1:
        raise ValueError(f"repeats: expected >= 1, got {repeats}")
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise ValueError(f"burst: expected an int >= 1, got {burst!r}")
    for model in models.values():
        model.eval()
        for _ in range(max(0, warmup)):
            model(x)
    times: Dict[str, List[float]] = {name: [] for name in models}
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    for _ in range(repeats):
        for name, model in models.items():
            times[name].append(time_turn(lambda: model(x), burst, sync))
    out = {}
    for name, ts in times.items():
        ts = sorted(ts)
        q = statistics.quantiles(ts, n=10, method="inclusive") if len(ts) > 1 else [ts[0]] * 9
        median = statistics.median(ts)
        out[name] = {
            "median_ms": median * 1e3,
            "p10_ms": q[0] * 1e3,
            "p90_ms": q[-1] * 1e3,
            "images_per_s": x.shape[0] / median,
            "repeats": len(ts),
        }
    return out
