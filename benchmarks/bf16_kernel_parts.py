"""The bf16 kernels' parts on one core: builds the C++ benchmark `bench_gemm_bf16` (csrc/bench/bench_gemm_bf16.cpp)
with CMake, runs it and prints its table — attention_head_bf16 for every head of a DeiT-S / DeiT-B image against the
fp32 head and its steps alone (K/V packing, Q rounding, S = Q·Kᵀ, the softmax to bf16 P, P·V with the 1/Σ epilogue),
gemm_bf16 at DeiT linear shapes with a hot weight and with 16 weights in rotation (a model's blocks: the weights
come from L3 or memory each forward), the bf16 block's GEMM epilogues against a plain store, the channel-idle
FFN's output as two GEMMs against one over [h_act | x], and the core's
`vdpbf16ps` peak (a register-only loop), each row's GFLOP/s also as a share of that peak.  --record writes the
table `bf16_kernel_parts` into benchmarks/results/.

    python benchmarks/bf16_kernel_parts.py [--rounds 9] [--record]

Needs a CPU with AVX512_BF16 (the program says so and exits 2 otherwise).  Thread CPU time, medians of interleaved
rounds (int8_gemm_peak.py explains why).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from int8_gemm_peak import build  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--record", action="store_true", help="write the table into benchmarks/results/")
    parser.add_argument("--build-dir", default=os.path.join(ROOT, "build", "bf16-bench"))
    args = parser.parse_args()
    program = build(args.build_dir, "bench_gemm_bf16")
    done = subprocess.run([program, "--json", "--rounds", str(args.rounds)], capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        print(done.stderr.strip() or f"bench_gemm_bf16 exited with {done.returncode}", file=sys.stderr)
        return done.returncode
    report = json.loads(done.stdout)
    # Each row's share of the core's vdpbf16ps peak (the program's register-only loop, same process).
    peak = next((r["gflops"] for r in report["rows"] if r["name"] == "vdpbf16ps zmm"), None)
    for r in report["rows"]:
        r["pct_peak"] = f"{100.0 * r['gflops'] / peak:.1f}%" if peak and r["gflops"] else "–"
        flops = f"{r['gflops']:8.1f} GFLOP/s {r['pct_peak']:>6s}" if r["gflops"] else ""
        print(f"{r['group']:52s} {r['name']:44s} {r['us']:9.1f} us {flops}")
    if args.record:
        from results_file import command_line, record

        path = record("bf16_kernel_parts", {
            "title": "bf16 kernels' parts, one core: attention heads and their steps, GEMMs with hot and rotating "
                     "weights",
            "script": "benchmarks/bf16_kernel_parts.py", "command": command_line(),
            "conditions": f"one thread, thread CPU time, medians of {args.rounds} interleaved rounds",
            "columns": [{"label": "case", "fmt": "{group}"}, {"label": "kernel / step", "fmt": "{name}"},
                        {"label": "µs", "fmt": "{us:.1f}"}, {"label": "GFLOP/s", "fmt": "{gflops:.1f}"},
                        {"label": "% of vdpbf16ps peak", "fmt": "{pct_peak}"}],
            "rows": report["rows"],
        })
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
