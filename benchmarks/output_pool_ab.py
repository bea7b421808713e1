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

import sys

import switch_ab

CELLS = [("int8", 8, 2), ("bf16", 8, 2), ("fp32", 8, 2), ("int8", 1, 1)]


def main(argv=None) -> int:
    return switch_ab.main(argv, env_var="VITFAST_OUTPUT_POOL", what="cache", cells=CELLS, table="output_pool_ab",
                          title="The op-output cache off (VITFAST_OUTPUT_POOL=0) and on: RePa-DeiT-S/0.75 forwards",
                          script="benchmarks/output_pool_ab.py", description=__doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
