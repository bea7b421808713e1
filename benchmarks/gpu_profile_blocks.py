"""Where the Triton block path (VITFAST_CUDA_KERNELS=blocks) loses to inductor on the same fused graph: the GPU
diagnostics that `gpu_blocks.py`'s totals cannot give.

    python benchmarks/gpu_profile_blocks.py [--model deit_small_patch16_224] [--batch 256] [--dtype bfloat16]
                                            [--sections host,sdpa,gemm,kernels] [--json PATH]

Sections (each independent; a failing one is reported and the next runs):

    host     the eager forward's host time (perf_counter around an unsynchronised call) against its GPU time (CUDA
             events), the synchronising calls torch reports in it (`torch.cuda.set_sync_debug_mode`), and the host
             µs of one `ln_linear_triton` call split into our launcher and triton's autotuner + JIT launch
    sdpa     attention on the packed-qkv views at the model's shape, per SDPA backend (flash, efficient, cuDNN,
             and torch's own choice): µs, kernels launched with their names, and whether the output reshape is a
             view; beside them vitfast's Triton attention (kernels/attention.py, the block path's default),
             autotuned and at every candidate forced
    gemm     the first block's four GEMMs exactly as the block path calls them (shapes, epilogues, statistics):
             the autotuned kernel, every autotune config forced, and cuBLAS `F.linear` (GEMM + bias only: a lower
             bound for the composition), as GPU µs (profiler: `_bench_us`) and TFLOP/s
    kernels  per-kernel GPU time of one forward, block path against inductor max-autotune-no-cudagraphs on the
             same fused graph (VITFAST_BACKEND=reference), grouped by kernel name; the block path's GEMMs by
             their place in the block, and the config each autotuner chose
    blocks   the block path's half of `kernels` alone (no inductor compile)

Prints tables and writes every figure to `--json`.  `--record DIR` records the gemm section (with the kernels
section's forward totals when it ran) as table `gpu_block_gemms` of DIR/<date>-<gpu>.json: each block-path GEMM's
GPU time against cuBLAS, the kernel benchmark of kernels/ln_linear.py on a GPU; `--from-json REPORT --env ENV
--record DIR` records an earlier run's report without a GPU.  The forward-level figures a user compares are
gpu_blocks.py's.  `forced_config` (kernels/_common.py) and `record_block_gemms` are
tested on the CPU under the Triton interpreter (tests/test_gpu_profile_blocks.py).
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from vitfast.kernels._common import forced_config

SECTIONS = ("host", "sdpa", "gemm", "kernels", "blocks")


def record_block_gemms(model, x, blocks: int = 1) -> list:
    """(args, kwargs) of the `ln_linear_triton` calls that the first `blocks` blocks of `model(x)` make on the block
    path (the caller has set VITFAST_CUDA_KERNELS=blocks): the GEMMs to replay one by one."""
    import vitfast.kernels.vit_block as vb

    calls, original = [], vb.ln_linear_triton

    def recorder(*args, **kwargs):
        out = original(*args, **kwargs)
        if len(calls) < 4 * blocks:
            calls.append((args, dict(kwargs)))
        return out

    vb.ln_linear_triton = recorder
    try:
        with torch.no_grad():
            model(x)
    finally:
        vb.ln_linear_triton = original
    return calls


def _bench_us(fn, reps: int = 20) -> float:
    """GPU time of one `fn()` in µs: the summed durations of the kernels it launches (profiler), averaged over `reps`
    calls, each after a 256 MB fill that evicts L2 (as triton's do_bench).  Not events around the call: on a host
    slower than the kernel (a block-path GEMM launch took 163 µs of host time on the H200 machine against a 48 µs
    cuBLAS call) the events measure the launch instead, and every config looked alike."""
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(256 * 2 ** 20, dtype=torch.int8, device="cuda")
    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                flush.fill_(1)
                fn()
            torch.cuda.synchronize()
    total = sum(e.time_range.elapsed_us() for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA and "FillFunctor" not in e.name)
    return total / reps


def _kernel_names(fn) -> list:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def _short(name: str, width: int = 70) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


# ---------------------------------------------------------------------------------------------- sections
def section_host(model, x, gemms) -> dict:
    import vitfast.kernels.ln_linear as L

    out = {}
    with torch.no_grad():
        for _ in range(3):
            model(x)
        torch.cuda.synchronize()
        host, gpu = [], []
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            model(x)
            end.record()
            host.append(1e3 * (time.perf_counter() - t0))
            end.synchronize()
            gpu.append(start.elapsed_time(end))
        out["forward_host_ms"] = sorted(host)[len(host) // 2]
        out["forward_event_ms"] = sorted(gpu)[len(gpu) // 2]
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model(x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        out["syncs"] = sorted({str(w.message).splitlines()[0][:160] for w in caught})
    args, kwargs = gemms[0]
    best = L._ln_linear_kernel_tma.best_config if hasattr(L._ln_linear_kernel_tma, "best_config") else None
    cfg = best or L._ln_linear_kernel_tma.configs[0]

    def per_call_us(call, n=200):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        elapsed = time.perf_counter() - t0
        torch.cuda.synchronize()
        return 1e6 * elapsed / n

    out["ln_linear_host_us"] = per_call_us(lambda: L.ln_linear_triton(*args, **kwargs))
    out["ln_linear_forced_config_host_us"] = per_call_us(
        lambda: L.ln_linear_triton(*args, **dict(kwargs, _wrap=forced_config(cfg))))
    out["f_linear_host_us"] = per_call_us(lambda: F.linear(args[0], args[1], args[2]))
    print(f"host: forward {out['forward_host_ms']:.2f} ms host vs {out['forward_event_ms']:.2f} ms events; "
          f"syncs reported: {out['syncs'] or 'none'}")
    print(f"host: one qkv call: ln_linear_triton {out['ln_linear_host_us']:.1f} µs, at a forced config "
          f"{out['ln_linear_forced_config_host_us']:.1f} µs, F.linear {out['f_linear_host_us']:.1f} µs")
    return out


def section_sdpa(qkv, heads: int) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, n, three_c = qkv.shape
    d = three_c // 3 // heads
    q, k, v = qkv.view(b, n, 3, heads, d).permute(2, 0, 3, 1, 4).unbind(0)
    rows = {}
    backends = {"default": None}
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
        if hasattr(SDPBackend, name):
            backends[name.lower()] = getattr(SDPBackend, name)
    for name, backend in backends.items():
        def call(backend=backend):
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v)
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v)
        try:
            with torch.no_grad():
                o = call()
                view = o.transpose(1, 2).is_contiguous()
                rows[name] = {"us": _bench_us(call), "kernels": _kernel_names(call), "reshape_is_view": view}
        except Exception as exc:  # noqa: BLE001 - an unsupported backend is a finding, not a failure
            rows[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
    rows.update(_triton_attention_rows(qkv, heads))
    for name, r in rows.items():
        if "error" in r:
            print(f"sdpa {name:<20} {r['error']}")
        else:
            print(f"sdpa {name:<20} {r['us']:8.1f} µs  view={r['reshape_is_view']}  kernels: "
                  + "; ".join(_short(k, 60) for k in r["kernels"]))
    return rows


def _triton_attention_rows(qkv, heads: int) -> dict:
    """vitfast's Triton attention on the same qkv: autotuned ("vitfast triton") and at each candidate forced."""
    import vitfast.kernels.attention as A

    calls = {"vitfast triton": lambda: A.attention_triton(qkv, heads)}
    for cfg in A.candidates():
        label = f"triton {cfg.kwargs['BLOCK_M']}x{cfg.kwargs['BLOCK_N']} w{cfg.num_warps} s{cfg.num_stages}"
        calls[label] = lambda cfg=cfg: A.attention_triton(qkv, heads, _wrap=forced_config(cfg))
    rows = {}
    for name, call in calls.items():
        try:
            with torch.no_grad():
                call()
                rows[name] = {"us": _bench_us(call), "kernels": _kernel_names(call), "reshape_is_view": True}
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory at one config
            rows[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
    return rows


# Tiles the sweep times beside the autotune candidates, offered to no autotuner: at K = 384 (DeiT-S) a 64-deep K step
# leaves six steps per tile, so fewer, deeper steps (BLOCK_K = 128, two tile shapes) and a wide, short tile are the
# cheapest variations to look at next.  Each compiles for sm_90 without spills, every epilogue on (ptxas: 152-222,
# 173-184, 166-255 registers); a 256 × 128 tile at 8 warps and 128 × 128 at 4 warps spilled 108-168 bytes.
EXPLORE = ((128, 128, 128, 8, 3), (64, 256, 64, 8, 3), (128, 64, 128, 4, 3))


def _sweep(L) -> list:
    """(config, exploratory?) in sweep order: the autotune candidates (pointer loads, TMA where offered), the
    persistent candidates (offered only on request: `persistent_configs`), then EXPLORE."""
    import triton

    offered = L.candidates(tma=True)
    seen = {str(c) for c in offered}
    out = [(c, False) for c in offered] + [(c, False) for c in L.persistent_configs() if str(c) not in seen]
    out += [(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "USE_TMA": False,
                            "PERSISTENT": False}, num_warps=w, num_stages=st), True) for bm, bn, bk, w, st in EXPLORE]
    return out


def _gemm_row(name: str, args, kwargs) -> dict:
    """One recorded GEMM: autotuned, at every config, and cuBLAS F.linear (µs, do_bench medians)."""
    import vitfast.kernels.ln_linear as L

    x, w, bias = args[0], args[1], args[2] if len(args) > 2 else kwargs.get("bias")
    m, k = x.reshape(-1, x.shape[-1]).shape
    n = w.shape[0]
    row = {"gemm": name, "m": m, "n": n, "k": k,
           "epilogue": sorted(key for key, value in kwargs.items()
                              if value is not None and value is not False and key not in ("_wrap", "norm"))}
    with torch.no_grad():
        row["autotuned_us"] = _bench_us(lambda: L.ln_linear_triton(*args, **kwargs))
        row["configs"] = {}
        for cfg, explore in _sweep(L):
            label = (f"{cfg.kwargs['BLOCK_M']}x{cfg.kwargs['BLOCK_N']}x{cfg.kwargs['BLOCK_K']}"
                     f"{' tma' if cfg.kwargs.get('USE_TMA') else ''}"
                     f"{' persistent' if cfg.kwargs.get('PERSISTENT') else ''}"
                     f" w{cfg.num_warps} s{cfg.num_stages}"
                     f"{f' r{cfg.maxnreg}' if getattr(cfg, 'maxnreg', None) else ''}{' (explore)' if explore else ''}")
            try:
                row["configs"][label] = _bench_us(
                    lambda cfg=cfg: L.ln_linear_triton(*args, **dict(kwargs, _wrap=forced_config(cfg))))
            except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory at one config
                row["configs"][label] = f"{type(exc).__name__}"
        x2 = x.reshape(m, k)
        row["cublas_us"] = _bench_us(lambda: F.linear(x2, w, bias))
    return row


def section_gemm(gemms) -> list:
    rows = []
    for name, (args, kwargs) in zip(("qkv", "proj", "fc1", "fc2"), gemms):
        row = _gemm_row(name, args, kwargs)
        flops = 2.0 * row["m"] * row["n"] * row["k"]
        best = min((v for v in row["configs"].values() if isinstance(v, float)), default=float("nan"))
        print(f"gemm {name:<5} {row['m']}x{row['n']}x{row['k']}: autotuned {row['autotuned_us']:.1f} µs "
              f"({flops / row['autotuned_us'] / 1e6:.0f} TFLOP/s), best forced {best:.1f}, cuBLAS F.linear "
              f"{row['cublas_us']:.1f} µs ({flops / row['cublas_us'] / 1e6:.0f} TFLOP/s); epilogue {row['epilogue']}")
        print("      configs: " + ", ".join(f"{lab} {v:.1f}" if isinstance(v, float) else f"{lab} {v}"
                                            for lab, v in row["configs"].items()))
        rows.append(row)
    return rows


def _profile(fn, reps: int = 3):
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(events, key=lambda e: e.time_range.start)


def _per_kernel(events, reps: int = 3) -> dict:
    table = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        entry = table[e.name]
        entry[0] += 1
        entry[1] += e.time_range.elapsed_us()
    return {name: {"calls": c / reps, "us": t / reps} for name, (c, t) in table.items()}


def _gemm_positions(events) -> dict:
    """Mean GPU µs of the block path's GEMM launches by their place in a block (qkv, proj, fc1, fc2: the order
    `vit_block_triton` launches them in)."""
    durations = [e.time_range.elapsed_us() for e in events if e.name == "_ln_linear_kernel"]
    names = ("qkv", "proj", "fc1", "fc2")
    return {name: sum(durations[i::4]) / max(len(durations[i::4]), 1) for i, name in enumerate(names)}


def _autotuner_choices() -> dict:
    """The config each `ln_linear` autotuner settled on, per key (M bucket, N, K, split-K, dtypes)."""
    import vitfast.kernels.ln_linear as L

    out = {}
    for label, tuner in (("pointer", L._ln_linear_kernel), ("tma", L._ln_linear_kernel_tma)):
        for key, cfg in getattr(tuner, "cache", {}).items():
            out[f"{label} {key}"] = str(cfg)
    return out


def section_kernels(fused, x, policy, inductor: bool = True) -> dict:
    """Per-kernel GPU time of one forward on the block path (and, with `inductor`, of inductor max-autotune on the
    same fused graph: its compile takes about a minute)."""
    out = {}
    with policy(cuda_kernels="blocks"):
        events = _profile(lambda: fused(x))
    out["vitfast blocks"] = _per_kernel(events)
    out["block gemms"] = _gemm_positions(events)
    out["autotuned configs"] = _autotuner_choices()
    print("block GEMMs, GPU µs per launch: " + ", ".join(f"{k} {v:.1f}" for k, v in out["block gemms"].items()))
    for key, cfg in out["autotuned configs"].items():
        print(f"autotuned {key}: {cfg}")
    if inductor:
        with policy(backend="reference"):
            compiled = torch.compile(fused, mode="max-autotune-no-cudagraphs")
            out["inductor fused"] = _per_kernel(_profile(lambda: compiled(x)))
    for row in ("vitfast blocks", "inductor fused")[: 2 if inductor else 1]:
        table = out[row]
        total = sum(v["us"] for v in table.values())
        print(f"kernels {row}: {total / 1e3:.3f} ms of GPU time per forward, "
              f"{sum(v['calls'] for v in table.values()):.0f} launches")
        for name, v in sorted(table.items(), key=lambda kv: -kv[1]["us"])[:14]:
            print(f"   {v['us']:9.1f} µs {v['calls']:5.0f}×  {_short(name)}")
    return out


def gemm_table(report: dict, command: str) -> dict:
    """The gemm section (and the kernels section's totals, when present) as a results table."""
    rows = []
    for r in report.get("gemm", []):
        forced = {k: v for k, v in r["configs"].items() if isinstance(v, float)}
        best = min(forced, key=forced.get) if forced else "–"
        flops = 2.0 * r["m"] * r["n"] * r["k"]
        rows.append({"what": f"{r['gemm']} {r['m']}×{r['n']}×{r['k']}", "epilogue": ", ".join(r["epilogue"]) or "–",
                     "vitfast_us": round(r["autotuned_us"], 1),
                     "best": f"{best}: {forced[best]:.1f}" if forced else "–",
                     "cublas_us": round(r["cublas_us"], 1),
                     "ratio": f"{r['autotuned_us'] / r['cublas_us']:.2f}× SLOWER" if r["autotuned_us"] > r["cublas_us"]
                     else f"{r['cublas_us'] / r['autotuned_us']:.2f}× faster",
                     "tflops": f"{flops / r['autotuned_us'] / 1e6:.0f} / {flops / r['cublas_us'] / 1e6:.0f}"})
    kernels = report.get("kernels") or {}
    totals = {row: sum(v["us"] for v in kernels[row].values()) for row in ("vitfast blocks", "inductor fused")
              if isinstance(kernels.get(row), dict)}
    if len(totals) == 2:
        ours, theirs = totals["vitfast blocks"], totals["inductor fused"]
        verdict = f"{ours / theirs:.2f}× SLOWER" if ours > theirs else f"{theirs / ours:.2f}× faster"
        rows.append({"what": "whole forward, all kernels", "epilogue": "–", "vitfast_us": round(ours, 1),
                     "best": "–", "cublas_us": "–", "tflops": "–",
                     "ratio": f"inductor max-autotune {theirs:.1f} µs: vitfast {verdict}"})
    return {
        "title": f"Block-path GEMMs (kernels/ln_linear.py) against cuBLAS, GPU time, {report['model']} "
                 f"θ {report.get('theta', 0.75)} "
                 f"{report['dtype']} batch {report['batch']}",
        "script": "benchmarks/gpu_profile_blocks.py", "command": command,
        "conditions": "RePa-DeiT (BN variant), random weights; each GEMM as the block path calls it in the first "
                      "block; GPU µs = summed kernel durations from torch.profiler per call, mean of 20 calls each "
                      "after a 256 MB L2-evicting fill; cuBLAS = F.linear (GEMM + bias only, no LayerNorm, no "
                      "epilogue: a lower bound); TFLOP/s vitfast / cuBLAS",
        "columns": [{"label": "GEMM", "fmt": "{what}"}, {"label": "epilogue", "fmt": "{epilogue}"},
                    {"label": "vitfast µs (autotuned)", "fmt": "{vitfast_us}"},
                    {"label": "best forced config: µs", "fmt": "{best}"},
                    {"label": "cuBLAS µs", "fmt": "{cublas_us}"},
                    {"label": "vitfast vs cuBLAS", "fmt": "{ratio}"}, {"label": "TFLOP/s", "fmt": "{tflops}"}],
        "rows": rows,
    }


def record_report(report: dict, directory: str, command: str, env: str | None = None) -> str:
    from results_file import device_env, record

    box, versions = device_env(env) if env else (None, None)
    return record("gpu_block_gemms", gemm_table(report, command), device="cuda", directory=directory, box=box,
                  versions=versions)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="deit_small_patch16_224")
    p.add_argument("--theta", type=float, default=0.75)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--dtype", default="bfloat16", choices=("float16", "bfloat16", "float32"))
    p.add_argument("--sections", default="host,sdpa,gemm,kernels", help=f"a comma-separated subset of {SECTIONS}")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--record", metavar="DIR", help="record the gemm section in DIR/<date>-<gpu>.json")
    p.add_argument("--from-json", metavar="REPORT", help="no measuring: record an earlier run's --json (with --record "
                   "DIR and --env, that run's env.txt)")
    p.add_argument("--env", help="with --from-json: the device run's env.txt (benchmarks/gpu_common.sh)")
    p.add_argument("--command", help="with --from-json: the command that measured the report")
    args = p.parse_args(argv)
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    if args.from_json:
        if not (args.record and args.env):
            p.error("--from-json: expected --record DIR and --env PATH with it")
        with open(args.from_json, encoding="utf-8") as f:
            report = json.load(f)
        print("recorded in", record_report(report, args.record, args.command or "python benchmarks/"
                                           "gpu_profile_blocks.py ...", env=args.env))
        return 0
    sections = [s for s in args.sections.split(",") if s]
    if not sections or any(s not in SECTIONS for s in sections):
        p.error(f"--sections: expected a non-empty subset of {','.join(SECTIONS)}, got {args.sections!r}")
    if not torch.cuda.is_available():
        raise SystemExit("gpu_profile_blocks.py: error: needs a CUDA device")
    from gpu_blocks import build, policy

    dtype = getattr(torch, args.dtype)
    _, fused = build(args.model, args.theta)
    fused = fused.to("cuda", dtype)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=dtype)
    heads = next(m for m in fused.modules() if hasattr(m, "num_heads")).num_heads
    report = {"model": args.model, "theta": args.theta, "batch": args.batch, "dtype": args.dtype,
              "gpu": torch.cuda.get_device_name()}
    print(f"{report['gpu']}  {args.model} θ {args.theta} batch {args.batch} {args.dtype}", flush=True)
    with policy(cuda_kernels="blocks"):
        gemms = record_block_gemms(fused, x)
    for name in sections:
        started = time.monotonic()
        try:
            if name == "host":
                with policy(cuda_kernels="blocks"):
                    report[name] = section_host(fused, x, gemms)
            elif name == "sdpa":
                from vitfast.kernels.ln_linear import ln_linear_triton

                with torch.no_grad():
                    qkv = ln_linear_triton(*gemms[0][0], **gemms[0][1])
                report[name] = section_sdpa(qkv, heads)
            elif name == "gemm":
                report[name] = section_gemm(gemms)
            else:
                report[name] = section_kernels(fused, x, policy, inductor=name == "kernels")
        except Exception as exc:  # noqa: BLE001 - one failing section must not lose the others
            report[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
            print(f"{name}: FAILED {report[name]['error']}")
        print(f"-- {name}: {time.monotonic() - started:.0f} s", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1, default=str)
    if args.record and "gemm" in report and "error" not in report["gemm"]:
        print("recorded in", record_report(report, args.record, "python " + " ".join(sys.argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
