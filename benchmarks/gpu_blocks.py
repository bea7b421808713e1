"""GPU table of the Triton block path (kernels/vit_block.py, VITFAST_CUDA_KERNELS=blocks) against the compiler on the
same fused graph and against timm compiled, with kernel launches per forward.

    python benchmarks/gpu_blocks.py [--models deit_small_patch16_224,deit_base_patch16_224] [--batches 64,256]
                                    [--dtype bfloat16] [--rows R1,R2] [--budget-s 420] [--json PATH] [--record DIR]
                                    [--dry-run] [--from-json ROWS --env ENV --record DIR [--command C]]

Models: RePa-DeiT (timm DeiT, `vitfast.convert.from_timm(channel_idle=0.75)`, then `vitfast.fuse`), random weights.
Rows per (model, batch), run row by row over every model and batch in this order (the most wanted first, so a run
cut short by its budget or timeout still has them; `--rows` picks a subset, e.g. for a second device call):

    vitfast blocks         the fused model eager, VITFAST_CUDA_KERNELS=blocks (five launches per block)
    vitfast blocks graph   the same under vitfast.cuda_graph
    inductor fused         torch.compile(mode="max-autotune-no-cudagraphs") of the fused model on the reference ops
                           (VITFAST_BACKEND=reference: the same fused graph, plain torch ops the compiler can see)
    timm max-autotune      torch.compile(mode="max-autotune") of the timm model (its CUDA graphs included)
    vitfast auto           the fused model eager on today's default CUDA policy

Times: CUDA-event medians of `--reps` calls after warm-up.  Launches: CUDA kernels per forward counted by
torch.profiler (for a graph-replayed row, the kernels inside the graph).  Error: max |y − y_ref| / max |y_ref| of the
logits against the fused model in fp32 on the reference ops (TF32 off), same input.  Compiles are autotuned; once
`--budget-s` seconds have passed, the compile rows not yet started are skipped (reported as such), so the run fits
the device slot.  The JSON is rewritten after every row, so a kill keeps what was measured.

`--from-json` (no GPU needed): records the rows of an earlier run's `--json` for the machine its env.txt names
(a device call cut short by its timeout returns the JSON; `--record` now also rewrites the results file after every
row).

`--dry-run` (no GPU needed): builds the models on the CPU, checks the fused model's blocks can take the block path
(every block a FusedBlock the planner accepts), prints the planned rows and exits before anything needs CUDA.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time

import torch

ROWS = ("vitfast blocks", "vitfast blocks graph", "inductor fused", "timm max-autotune", "vitfast auto")
# Rows whose first call compiles and autotunes new code (the default policy's Triton FFN kernel included): they start
# only while the time budget lasts.
COMPILED = ("inductor fused", "timm max-autotune", "vitfast auto")


def build(name: str, theta: float):
    """(timm baseline, fused RePa model), eval, CPU fp32."""
    import timm

    import vitfast

    torch.manual_seed(0)
    baseline = timm.create_model(name, pretrained=False).eval()
    fused = vitfast.fuse(vitfast.convert.from_timm(baseline, channel_idle=theta)).eval()
    return baseline, fused


def block_plan(fused) -> tuple[int, int]:
    """(blocks that may run as one vit_block call, all blocks): what VITFAST_CUDA_KERNELS=blocks can reach."""
    from vitfast.nn.block import FusedBlock, plan_whole_block

    blocks = [m for m in fused.modules() if isinstance(m, FusedBlock)]
    return sum(plan_whole_block(b).runs_as_one_op for b in blocks), len(blocks)


@contextlib.contextmanager
def policy(backend: str = "auto", cuda_kernels: str = "auto"):
    import vitfast

    saved = vitfast.get_backend(), vitfast.get_cuda_kernels()
    vitfast.set_backend(backend)
    vitfast.set_cuda_kernels(cuda_kernels)
    try:
        yield
    finally:
        vitfast.set_backend(saved[0])
        vitfast.set_cuda_kernels(saved[1])


def time_ms(fn, x, reps: int) -> float:
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kernels_per_forward(fn, x) -> int:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(x)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def providers(baseline, fused, dtype):
    """row -> (context factory, callable) (compiled rows compile lazily, on their first call, under their context)."""
    import vitfast

    base = baseline.to("cuda", dtype)
    model = fused.to("cuda", dtype)
    return {
        "vitfast blocks": (lambda: policy(cuda_kernels="blocks"), model),
        "vitfast blocks graph": (lambda: policy(cuda_kernels="blocks"), vitfast.cuda_graph(model)),
        "vitfast auto": (policy, model),
        "inductor fused": (lambda: policy(backend="reference"), torch.compile(model, mode="max-autotune-no-cudagraphs")),
        "timm max-autotune": (policy, torch.compile(base, mode="max-autotune")),
    }


def rel_err(y, ref) -> float:
    return ((y.float() - ref).abs().max() / ref.abs().max()).item()


def measure(record, context, fn, x, ref, reps) -> None:
    try:
        with context(), torch.no_grad():
            started = time.monotonic()
            y = fn(x)  # first call: compile / capture / autotune
            torch.cuda.synchronize()
            record["first_call_s"] = round(time.monotonic() - started, 2)
            # Read at once: a CUDA-graph replay may overwrite this output.
            record["rel_err_vs_fp32"] = float(f"{rel_err(y, ref):.2e}")
            record["median_ms"] = round(time_ms(fn, x, reps), 3)
            record["kernels"] = kernels_per_forward(fn, x)
    except Exception as exc:  # noqa: BLE001 - one failing row is reported, it must not lose the others
        record["error"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


def run(args) -> list:
    """Every row of `args.rows` over every model and batch; compile rows only while the budget lasts."""
    dtype = getattr(torch, args.dtype)
    t0 = time.monotonic()
    models = {}
    for name in args.models:
        baseline, fused = build(name, args.theta)
        reachable, total = block_plan(fused)
        print(f"== {name} θ {args.theta} {args.dtype}: {reachable}/{total} blocks take the block path", flush=True)
        models[name] = (baseline, fused)
    if args.dry_run:
        for row in args.rows:
            for name in args.models:
                for batch in args.batches:
                    print(f"   planned: {name:<24} batch {batch:>4}  {row}")
        return []
    torch.backends.cuda.matmul.allow_tf32 = False
    inputs = {b: torch.randn(b, 3, 224, 224, device="cuda") for b in args.batches}
    calls, refs = {}, {}
    for name, (baseline, fused) in models.items():
        with policy(backend="reference"), torch.no_grad():
            exact = fused.to("cuda")  # the fp32 reference logits, before providers() casts the model
            refs[name] = {b: exact(x).float() for b, x in inputs.items()}
        calls[name] = providers(baseline, fused, dtype)
    rows: list = []
    for row in args.rows:
        for name in args.models:
            for batch in args.batches:
                record = {"model": name, "theta": args.theta, "dtype": args.dtype, "batch": batch, "row": row}
                if row in COMPILED and time.monotonic() - t0 > args.budget_s:
                    record["skipped"] = f"time budget of {args.budget_s:.0f} s spent before this compile"
                else:
                    context, fn = calls[name][row]
                    measure(record, context, fn, inputs[batch].to(dtype), refs[name][batch], args.reps)
                rows.append(record)
                print("   " + json.dumps(record, ensure_ascii=False), flush=True)
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump(rows, f, indent=1)
                if args.record:  # after every row too: a run cut by its device call's timeout keeps what it measured
                    record_results(rows, args.record, "python " + " ".join(sys.argv))
    return rows


def table(rows) -> str:
    """The rows as a text table with speed-ups of `vitfast blocks` (eager and graph) over the compiled rows."""
    lines = [f"{'model':<24} {'batch':>5} {'row':<22} {'ms':>8} {'kernels':>8} {'rel err':>8}  note"]
    by_key = {(r["model"], r["batch"], r["row"]): r for r in rows}
    for r in rows:
        note = r.get("skipped") or r.get("error") or ""
        if "median_ms" in r and r["row"].startswith("vitfast blocks"):
            for other in COMPILED:
                o = by_key.get((r["model"], r["batch"], other), {})
                if "median_ms" in o:
                    note += f" {o['median_ms'] / r['median_ms']:.2f}× vs {other};"
        ms = f"{r['median_ms']:.3f}" if "median_ms" in r else "–"
        lines.append(f"{r['model']:<24} {r['batch']:>5} {r['row']:<22} {ms:>8} {r.get('kernels', '–'):>8} "
                     f"{r.get('rel_err_vs_fp32', '–'):>8}  {note.strip()}")
    return "\n".join(lines)


def record_results(rows, directory: str, command: str, env: str | None = None) -> str:
    """Record the rows as table `gpu_blocks` for this machine's GPU, or for the machine whose env.txt is `env`."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from results_file import device_env, record

    box, versions = device_env(env) if env else (None, None)
    inductor = {(r["model"], r["batch"]): r["median_ms"] for r in rows
                if r["row"] == "inductor fused" and "median_ms" in r}

    def vs_inductor(r) -> str:
        # inductor's ms ÷ this row's (above 1: this row is faster), for vitfast's rows with both measured.
        theirs = inductor.get((r["model"], r["batch"]))
        if not r["row"].startswith("vitfast") or theirs is None or "median_ms" not in r:
            return "–"
        ratio = theirs / r["median_ms"]
        return f"{ratio:.2f}×" + (" SLOWER" if ratio < 1 else "")

    measured = [dict(r, ms=r.get("median_ms", "–"), kernels=r.get("kernels", "–"), err=r.get("rel_err_vs_fp32", "–"),
                     vs_inductor=vs_inductor(r), note=r.get("skipped") or r.get("error") or "") for r in rows]
    return record("gpu_blocks", {
        "title": "Triton block path vs inductor on the same fused graph vs timm max-autotune",
        "script": "benchmarks/gpu_blocks.py", "command": command,
        "conditions": "RePa-DeiT θ 0.75 (BN variant), random weights; CUDA-event medians; kernels per forward by "
                      "torch.profiler; rel err of the logits vs the fused fp32 model (reference ops, TF32 off); speed "
                      "vs inductor = inductor max-autotune-no-cudagraphs ms ÷ row ms (above 1 vitfast is faster)",
        "columns": [{"label": k, "fmt": "{" + k + "}"} for k in ("model", "batch", "dtype", "row", "ms", "kernels",
                                                                  "err")]
                   + [{"label": "speed vs inductor fused", "fmt": "{vs_inductor}"}, {"label": "note", "fmt": "{note}"}],
        "rows": measured,
    }, device="cuda", directory=directory, box=box, versions=versions)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="deit_small_patch16_224,deit_base_patch16_224")
    p.add_argument("--theta", type=float, default=0.75)
    p.add_argument("--batches", default="64,256")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--rows", default=",".join(ROWS), help=f"a comma-separated subset of: {', '.join(ROWS)}")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--budget-s", type=float, default=420.0, help="start no compile row after this many seconds")
    p.add_argument("--json", help="rewrite the rows to this file after each one")
    p.add_argument("--record", metavar="DIR", help="also record the table in DIR/<date>-<gpu>.json (results_file.py)")
    p.add_argument("--dry-run", action="store_true", help="build and plan on the CPU, stop before CUDA is needed")
    p.add_argument("--from-json", metavar="ROWS", help="no measuring: record the rows of an earlier run's --json "
                   "(with --record DIR and --env, the env.txt of that run's machine)")
    p.add_argument("--env", help="with --from-json: the device run's env.txt (benchmarks/gpu_common.sh)")
    p.add_argument("--command", help="with --from-json: the command that measured the rows")
    args = p.parse_args(argv)
    if args.from_json:
        if not (args.record and args.env):
            p.error("--from-json: expected --record DIR and --env PATH with it")
        with open(args.from_json, encoding="utf-8") as f:
            rows = json.load(f)
        print(table(rows))
        command = args.command or "python benchmarks/gpu_blocks.py ..."
        print("recorded in", record_results(rows, args.record, command, env=args.env))
        return 0
    args.models = [m for m in args.models.split(",") if m]
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown or not args.rows:
        p.error(f"--rows: expected a non-empty subset of {', '.join(ROWS)}, got {args.rows}")
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu_blocks.py: error: needs a CUDA device (or --dry-run)")
    if not args.dry_run:
        import triton

        print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  "
              f"{datetime.date.today().isoformat()}", flush=True)
    rows = run(args)
    if args.dry_run:
        return 0
    print(table(rows))
    if args.record:
        print("recorded in", record_results(rows, args.record, "python " + " ".join(sys.argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
