#!/bin/bash
# Prepared GPU run that checks and diagnoses the Triton block path (VITFAST_CUDA_KERNELS=blocks).  Two device calls
# fit a 15-minute lease (each start ~35 s):
#
#   call 1 (~330 s):  bash benchmarks/gpu_check_profile.sh
#     1. the CUDA block tests natively, 16 processes (~130 s): every autotune candidate of the four RePa-DeiT-S GEMMs
#        against the fp64 reference (the H200 run of benchmarks/results/2026-11-30-nvidia-h200.json had the block
#        path's logits 7-12% off fp32 with autotuning on, 1.4-1.8% on the H100 before the TMA and persistent
#        candidates: this names the wrong one), split-K race freedom, the constant-rows fallback, the launch count,
#        TMA and persistent parity, the CUDA patch-embedding GEMM; then the Triton attention kernel's whole test file
#        natively (~30 s: parity in three dtypes, every candidate, the block path's launches with it);
#     2. benchmarks/gpu_profile_blocks.py on RePa-DeiT-S/0.75 bf16 batch 256, sections sdpa, gemm and blocks
#        (~130 s): the Triton attention (autotuned, every candidate) against each SDPA backend, each GEMM's GPU time
#        (profiler, not events: the host is slower than the kernels) at every candidate against cuBLAS, the block
#        path's GEMMs by their place in the block, the configs the autotuners chose.
#   call 2 (~450 s):
#     SKIP_TESTS=1 bash benchmarks/gpu_check_blocks.sh --rows "vitfast blocks,vitfast blocks graph,inductor fused"
#     the table against inductor on the same fused graph (four inductor max-autotune compiles, ~60 s each).
#
# Everything lands in $OUT (t_blocks.txt, profile_*.json/txt; the gemm table in results/<date>-<gpu>.json).  Usage from the repo root on the device machine.
source benchmarks/gpu_common.sh
export VITFAST_TRITON_AUTOTUNE=1  # the profile times kernels as deployed; the tests pin it off
run 150 t_blocks env VITFAST_TRITON_AUTOTUNE=0 python3 -m pytest -q -rfs -n 16 -p no:cacheprovider --tb=short \
  -k "cuda or every_candidate or constant_rows or forced or record or tma or persistent or colsum or same_block" \
  tests/test_vit_block_triton.py tests/test_ln_linear_triton.py tests/test_gpu_profile_blocks.py \
  tests/test_patch_embed.py
grep -E "^(FAILED|ERROR)|^E  " "$OUT/t_blocks.txt" | head -60
run 60 t_attention env VITFAST_TRITON_AUTOTUNE=0 python3 -m pytest -q -rfs -n 8 -p no:cacheprovider --tb=short \
  tests/test_attention_triton.py
grep -E "^(FAILED|ERROR)|^E  " "$OUT/t_attention.txt" | head -30
run 170 profile_s python3 benchmarks/gpu_profile_blocks.py --model deit_small_patch16_224 --batch 256 \
  --sections sdpa,gemm,blocks --json "$OUT/profile_s256.json" --record "$OUT/results"
