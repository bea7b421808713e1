"""The GEMMs' next-panel prefetch (csrc/kernels/next_pair_prefetch.h) off and on: forward latency of fused
RePa-DeiT-S/B/0.75 models at batch 1 on one thread on each CPU path that has it (AVX-512 fp32, AVX-512 VNNI int8 where
the CPU also has AMX, so the default int8 path is another, AVX2 fp32), and DeiT-S fp32 at batch 8 on two threads; one
fresh process per (setting, cell, round), settings interleaved over rounds (switch_ab.py).

    .venv/bin/python benchmarks/next_panel_prefetch_ab.py                  # ~8 min on two cores
    .venv/bin/python benchmarks/next_panel_prefetch_ab.py --rounds 5 --record

Off = VITFAST_NEXT_PANEL_PREFETCH=0: a panel pair's (AVX2: a panel's) weights reach the core only when its first row
tile reads them, from L3 or memory.  What it measures is that first tile's wait at batch 1, where each forward streams
all its weights once; at batch 8 every pair has ~57 row tiles per thread and the wait is a small share.
"""
from __future__ import annotations

import sys

import switch_ab

S, B = "deit_small_patch16_224", "deit_base_patch16_224"
CELLS = [("fp32", 1, 1, S, ""), ("fp32", 1, 1, B, ""), ("int8", 1, 1, S, "noamx"), ("int8", 1, 1, B, "noamx"),
         ("fp32", 1, 1, S, "avx2"), ("fp32", 1, 1, B, "avx2"), ("fp32", 8, 2, S, "")]


def main(argv=None) -> int:
    return switch_ab.main(argv, env_var="VITFAST_NEXT_PANEL_PREFETCH", what="next-panel prefetch", cells=CELLS,
                          table="next_panel_prefetch_ab",
                          title="The GEMMs' next-panel prefetch off (VITFAST_NEXT_PANEL_PREFETCH=0) and on: "
                                "RePa-DeiT/0.75 forwards",
                          script="benchmarks/next_panel_prefetch_ab.py", description=__doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
