#!/bin/bash
# Prepared GPU run for the Triton block path (kernels/ln_linear.py, kernels/vit_block.py; VITFAST_CUDA_KERNELS=blocks):
# its parity tests natively (they ran only under the interpreter before), then benchmarks/gpu_blocks.py: RePa-DeiT-S/B
# θ 0.75 in bf16 at batch 64 and 256 — the block path (eager and vitfast.cuda_graph), today's default path, inductor
# max-autotune-no-cudagraphs on the same fused graph (VITFAST_BACKEND=reference) and timm under max-autotune — with
# kernels per forward.  About 8 minutes: the tests get 100 s, the table 360 s, and no compile row starts after 240 s.
# The table is recorded in $OUT/results/<date>-<gpu>.json (copy it to benchmarks/results/).
# Usage from the repo root on the device machine: bash benchmarks/gpu_check_blocks.sh
# Nothing here needs the C++ extension (the CUDA path is Triton and torch); VITFAST_BUILD_EXT=1 builds it anyway.
source benchmarks/gpu_common.sh
[ "${VITFAST_BUILD_EXT:-0}" = 1 ] && build_ext
run 100 t_blocks env VITFAST_TRITON_AUTOTUNE=0 python3 -m pytest -q -rs -p no:cacheprovider \
  tests/test_ln_linear_triton.py tests/test_vit_block_triton.py
mkdir -p "$OUT/results"
# Autotuning on for the timed kernels (gpu_common.sh pins it off for tests).
run 360 blocks env VITFAST_TRITON_AUTOTUNE=1 python3 benchmarks/gpu_blocks.py --budget-s 240 \
  --json "$OUT/blocks.json" --record "$OUT/results"
