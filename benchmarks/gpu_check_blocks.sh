#!/bin/bash
# Prepared GPU run for the Triton block path (kernels/ln_linear.py, kernels/vit_block.py; VITFAST_CUDA_KERNELS=blocks):
# its parity tests natively (they ran only under the interpreter before), then benchmarks/gpu_blocks.py: RePa-DeiT-S/B
# θ 0.75 in bf16 at batch 64 and 256 — the block path (eager and vitfast.cuda_graph), inductor
# max-autotune-no-cudagraphs on the same fused graph (VITFAST_BACKEND=reference), timm under max-autotune and today's
# default path — with kernels per forward and the error against the fused fp32 model.
# About 8 minutes: the two test files run side by side (150 s: every kernel specialisation compiles once, cold), the
# table gets 320 s and starts no compile row after 200 s (skipped rows say so).  A second device call can take the
# rest: SKIP_TESTS=1 bash benchmarks/gpu_check_blocks.sh --rows "timm max-autotune,vitfast auto"
# The table is recorded in $OUT/results/<date>-<gpu>.json (copy it to benchmarks/results/); rows also in $OUT/blocks.json.
# Then `vitfast bench --device cuda` rows (the block path, its graph replay, inductor on the same fused graph, timm
# compiled; launches per forward) for RePa-DeiT-S at batch 1 and 64, with whatever is left of the 8 minutes (skipped
# below 100 s; the report prints only at the end, so a cut-short bench shows nothing).  Its providers:
# BENCH_PROVIDERS (default timm,vitfast,vitfast-graph,inductor-fused).  BENCH_ONLY=1 runs this step alone with the
# whole budget and every GPU provider (the max-autotune compiles take minutes): a second device call.
# Usage from the repo root on the device machine: bash benchmarks/gpu_check_blocks.sh [gpu_blocks.py options]
# Nothing here needs the C++ extension (the CUDA path is Triton and torch); VITFAST_BUILD_EXT=1 builds it anyway.
source benchmarks/gpu_common.sh
[ "${VITFAST_BUILD_EXT:-0}" = 1 ] && build_ext
TOTAL=440  # seconds of the whole script (under 8 minutes with the set-up above; two calls fit a 15-minute lease)
if [ "${BENCH_ONLY:-0}" = 1 ]; then
  SKIP_TESTS=1
  BENCH_PROVIDERS=${BENCH_PROVIDERS:-timm,vitfast,vitfast-graph,inductor-fused,inductor-fused-max-autotune,timm-max-autotune}
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== tests (tests/test_{ln_linear,vit_block}_triton.py, tests/test_triton_ops.py, side by side)"
  for t in ln_linear vit_block; do
    VITFAST_TRITON_AUTOTUNE=0 timeout 150 python3 -m pytest -q -rs -p no:cacheprovider "tests/test_${t}_triton.py" \
      > "$OUT/t_$t.txt" 2>&1 &
  done
  VITFAST_TRITON_AUTOTUNE=0 timeout 150 python3 -m pytest -q -rs -p no:cacheprovider tests/test_triton_ops.py \
    tests/test_warmup.py > "$OUT/t_ops.txt" 2>&1 &
  wait
  for t in ln_linear vit_block ops; do echo "-- $t"; tail -n 15 "$OUT/t_$t.txt"; done
fi
mkdir -p "$OUT/results"
# Autotuning on for the timed kernels (gpu_common.sh pins it off for tests).
if [ "${BENCH_ONLY:-0}" != 1 ]; then
  # With the tests skipped the table takes the whole call: no compile row starts in its last 70 s.
  table=$([ "${SKIP_TESTS:-0}" = 1 ] && echo $((TOTAL - SECONDS - 10)) || echo 320)
  run "$table" blocks env VITFAST_TRITON_AUTOTUNE=1 python3 benchmarks/gpu_blocks.py --budget-s $((table - 70)) \
    --json "$OUT/blocks.json" --record "$OUT/results" "$@"
fi
left=$((TOTAL - SECONDS))
if [ "$left" -ge 100 ]; then
  run "$left" bench env VITFAST_TRITON_AUTOTUNE=1 VITFAST_CUDA_KERNELS=blocks python3 -m vitfast bench \
    deit_small_patch16_224 --channel-idle 0.75 --device cuda --dtype bfloat16 --batch-sizes 1,64 --repeats 20 \
    --providers "${BENCH_PROVIDERS:-timm,vitfast,vitfast-graph,inductor-fused}" --json "$OUT/bench.json" --quiet
else
  echo "== bench skipped: ${left} s left of ${TOTAL} (BENCH_ONLY=1 in a second call runs it)"
fi
