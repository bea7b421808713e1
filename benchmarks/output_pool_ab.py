"""The op-output cache (csrc/ops/output_pool.h) on and off: forward latency, page faults and system time of fused
RePa-DeiT-S/0.75 models (fp32, int8, bf16) on vitfast's CPU kernels, one fresh process per (setting, precision, cell),
settings interleaved over rounds (switch_ab.py).

    .venv/bin/python benchmarks/output_pool_ab.py                 # ~4 min on two cores
    .venv/bin/python benchmarks/output_pool_ab.py --rounds 5 --record

What the cache removes is glibc's state-dependent habit of returning freed blocks to the kernel (its trim threshold
follows the largest block freed so far), so the same process would carry one setting's heap into the other's.  Off =
VITFAST_OUTPUT_POOL=0 (every output from the CPU allocator, as before the cache).
"""
from __future__ import annotations

import argparse
import sys

from switch_ab import measure, record_rows

CELLS = [("int8", 8, 2), ("bf16", 8, 2), ("fp32", 8, 2), ("int8", 1, 1)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--record", action="store_true", help="write the table into benchmarks/results/")
    args = p.parse_args(argv)
    rows = measure("VITFAST_OUTPUT_POOL", "cache", CELLS, args.rounds, args.calls)
    if args.record:
        path = record_rows("output_pool_ab", "The op-output cache off (VITFAST_OUTPUT_POOL=0) and on: "
                           "RePa-DeiT-S/0.75 forwards", "benchmarks/output_pool_ab.py", "cache", rows, args.rounds,
                           args.calls)
        print(f"recorded: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
