"""Packed weights and scratch on huge pages (csrc/kernels/huge_arena.h) on and off: forward latency, page faults and
system time of fused RePa-DeiT-S/0.75 models (fp32, int8, bf16) on vitfast's CPU kernels, one fresh process per
(setting, precision, cell), settings interleaved over rounds (switch_ab.py).

    .venv/bin/python benchmarks/huge_pages_ab.py                  # ~6 min on two cores
    .venv/bin/python benchmarks/huge_pages_ab.py --rounds 5 --record

Off = VITFAST_HUGE_PAGES=0: every packed weight from aligned_alloc in 4 KiB pages (DeiT-S's weights are all under
2 MiB, so before the arena none of them was on a huge page).  What it measures is the TLB: at batch 1 each forward
streams ~50 MB of weights from L3 or memory.
"""
from __future__ import annotations

import sys

import switch_ab

CELLS = [("fp32", 1, 1), ("int8", 1, 1), ("bf16", 1, 1), ("fp32", 8, 2), ("int8", 8, 2), ("bf16", 8, 2)]


def main(argv=None) -> int:
    return switch_ab.main(argv, env_var="VITFAST_HUGE_PAGES", what="huge pages", cells=CELLS, table="huge_pages_ab",
                          title="Packed weights on huge pages off (VITFAST_HUGE_PAGES=0) and on: RePa-DeiT-S/0.75 forwards",
                          script="benchmarks/huge_pages_ab.py", description=__doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
