"""Measurement helpers shared by the benchmark suites (imported by benchmarks/conftest.py and bench_*.py).

- `sgemm_gflops(threads)`: the machine's measured fp32 GEMM rate (torch.mm 2048³ at that thread count), the
  denominator of "% of sgemm" (DESIGN.md §5: the floor is FLOPs / measured sgemm rate).
- `op_provider(name, provider, case)`: the cpp / eager / compile providers every op suite compares.
- `record(...)`: every benchmark stores (case, provider) → median seconds and FLOPs in `RESULTS`; the
  terminal summary (conftest.py) prints GFLOP/s, % of sgemm and the ratios against the eager reference and
  torch.compile of the reference, from medians measured in the same run.
- `run_interleaved(...)`: the providers of one case called in alternation, round after round; each round's
  ratio compares calls made milliseconds apart, so it does not follow the machine's drift between two
  benchmarks (`INTERLEAVED`, printed in its own section of the summary).
"""
from __future__ import annotations

import statistics
import time
from collections import OrderedDict

import pytest
import torch

import vitfast
from vitfast import reference
from vitfast.bench import paired_speedups

RESULTS: "OrderedDict[tuple, dict]" = OrderedDict()
INTERLEAVED: "OrderedDict[tuple, dict]" = OrderedDict()
_SGEMM: dict[int, float] = {}


def sgemm_gflops(threads: int, n: int = 2048, repeats: int = 9) -> float:
    """Median GFLOP/s of torch.mm on fp32 n×n at `threads` threads (cached per thread count)."""
    if threads not in _SGEMM:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            a, b = torch.randn(n, n), torch.randn(n, n)
            for _ in range(2):
                torch.mm(a, b)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                torch.mm(a, b)
                times.append(time.perf_counter() - t0)
            _SGEMM[threads] = 2 * n**3 / statistics.median(times) / 1e9
        finally:
            torch.set_num_threads(previous)
    return _SGEMM[threads]


_COMPILED: dict = {}


def compiled(fn, case: tuple):
    """torch.compile(fn) (fullgraph, static shapes) for one benchmark case, compiled once per case: the
    previous case's graphs are dropped first (dynamo reset), so no recompile limit is ever reached."""
    key = (fn, case)
    if key not in _COMPILED:
        torch._dynamo.reset()
        _COMPILED.clear()
        _COMPILED[key] = torch.compile(fn, fullgraph=True, dynamic=False)
    return _COMPILED[key]


def op_provider(name: str, provider: str, case: tuple):
    """The providers every op suite has, for `torch.ops.vitfast.<name>`; None for any other provider.

    cpp      the op (its C++ CPU kernel; fails loudly when that kernel is not built, instead of silently
             timing the reference that stands in for it)
    eager    vitfast.reference.<name>, the composition the tests trust
    compile  torch.compile of that reference, one graph per case (`compiled`)
    """
    if provider == "cpp":
        if not vitfast.ops.extension_loaded() or name in vitfast.ops._REFERENCE_CPU_FALLBACKS:
            pytest.fail(f"the C++ {name} kernel is not built: the cpp provider would silently measure the reference")
        return getattr(torch.ops.vitfast, name)
    if provider == "eager":
        return getattr(reference, name)
    if provider == "compile":
        return compiled(getattr(reference, name), case)
    return None


def record(case: tuple, provider: str, median: float, flops: int, threads: int) -> dict:
    """Store one benchmark's median (seconds); returns extra_info for pytest-benchmark's JSON."""
    gflops = flops / median / 1e9
    info = {
        "gflops": round(gflops, 2),
        "sgemm_gflops": round(sgemm_gflops(threads), 2),
        "pct_of_sgemm": round(100 * gflops / sgemm_gflops(threads), 1),
    }
    RESULTS[(case, provider)] = {"median": median, "flops": flops, "threads": threads, **info}
    return info


def median_seconds_of(benchmark, fn, args=()) -> float:
    """pytest-benchmark's median of the rounds just run; under --benchmark-disable (a smoke run: there are no
    stats) one timed call instead, so the rest of the test still runs (reading the missing stats crashed)."""
    if benchmark.stats is not None:
        return benchmark.stats.stats.median
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def run_case(benchmark, fn, args, case: tuple, provider: str, flops: int, threads: int, evict=None) -> None:
    """Time fn(*args) at `threads` threads under pytest-benchmark (medians) and record it.

    Two untimed calls first (packing the weights for cpp, compiling for compile), then ~1.5 s of rounds:
    enough for a stable median on a shared 2-core machine.  `evict` (optional, untimed) runs before every round:
    e.g. a pass over a buffer larger than the L3, so that the weights come from DRAM as they do inside a model.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            fn(*args)
            fn(*args)
            t_est = max(flops / 50e9 / threads, 1e-5)
            rounds = int(min(200, max(7, 1.5 / t_est)))
            if evict is None:
                benchmark.pedantic(fn, args=args, rounds=rounds, iterations=1, warmup_rounds=1)
            else:
                def setup():
                    evict()
                    return args, {}

                benchmark.pedantic(fn, setup=setup, rounds=rounds, iterations=1, warmup_rounds=1)
            median = median_seconds_of(benchmark, fn, args)
    finally:
        torch.set_num_threads(previous)
    benchmark.extra_info.update(record(case, provider, median, flops, threads))


def interleaved_rounds(flops: int, threads: int, providers: int, seconds: float = 3.0,
                       gflops_per_thread: float = 50.0) -> int:
    """Rounds for run_interleaved: about `seconds` in all at `gflops_per_thread` per thread, 15 to 300."""
    per_call = max(flops / (gflops_per_thread * 1e9) / threads, 1e-4)
    return int(min(300, max(15, seconds / (providers * per_call))))


def run_interleaved(benchmark, fns: "dict[str, object]", args, case: tuple, threads: int, flops: int,
                    rounds: int = 60) -> dict:
    """Call each provider of `fns` (name → callable, the first is the baseline of the ratios) once per round,
    the order rotating every round, for `rounds` rounds at `threads` threads, under pytest-benchmark (its stats
    are those of whole rounds).  Records, per provider, the median of its calls and the median and p10-p90 of
    the per-round ratio baseline / provider in `INTERLEAVED`; returns that record.

    Why: on a shared machine the clock and the neighbours' load drift over seconds.  Two benchmarks run one
    after the other (the parametrised tests above) see different machines, and their ratio moved 1.05-1.56x
    between runs of the same build (channel_idle_ffn, DeiT-B, one AVX2 machine); calls made milliseconds apart see the
    same one.
    """
    names = list(fns)
    if len(names) < 2:
        raise ValueError(f"fns: expected at least two providers to interleave, got {names}")
    if rounds < 3:
        raise ValueError(f"rounds: expected >= 3, got {rounds}")
    times: "dict[str, list[float]]" = {n: [] for n in names}
    state = {"round": 0}

    def one_round():
        r = state["round"]
        state["round"] += 1
        for name in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            fns[name](*args)
            times[name].append(time.perf_counter() - t0)

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            for name in names:  # untimed: packs the weights (cpp), compiles (compile)
                fns[name](*args)
                fns[name](*args)
            if benchmark.disabled:  # --benchmark-disable (a smoke run): pedantic would call once
                for _ in range(3):
                    one_round()
            else:
                benchmark.pedantic(one_round, rounds=rounds, iterations=1, warmup_rounds=0)
    finally:
        torch.set_num_threads(previous)
    base = times[names[0]]
    entry = {"rounds": len(base), "threads": threads, "flops": flops, "providers": {}}
    for name in names:
        ratio, ratio_p10, ratio_p90 = paired_speedups(base, times[name])
        median = statistics.median(times[name])
        entry["providers"][name] = {
            "median": median,
            "gflops": round(flops / median / 1e9, 2),
            "ratio_median": round(ratio, 4),
            "ratio_p10": round(ratio_p10, 4),
            "ratio_p90": round(ratio_p90, 4),
        }
    INTERLEAVED[case] = entry
    return entry
