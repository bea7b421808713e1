#!/bin/bash
# Prepared GPU run that diagnoses the Triton block path (VITFAST_CUDA_KERNELS=blocks) where gpu_blocks.py measured it
# slower than inductor on the same fused graph (benchmarks/results/2026-11-28-nvidia-h100-80gb-hbm3.json):
#   1. the CUDA-only block tests natively: the kernel names when a block launches more than five, the TMA and
#      persistent candidates against the pointer loads (same bits), and the constant-rows test that failed on the
#      first H100 run (its traceback: that run was cut before pytest's summary) (~150 s);
#   2. benchmarks/gpu_profile_blocks.py on RePa-DeiT-S/0.75 bf16 at batch 256 (the worst ratio, 0.70× with graphs):
#      eager host time and synchronising calls, SDPA per backend on the packed-qkv views, the four GEMMs autotuned,
#      at each of the ten candidates and against cuBLAS, and per-kernel GPU time against inductor
#      max-autotune-no-cudagraphs (~200 s);
#   3. the GEMM and SDPA sections again for RePa-DeiT-B/0.75 at batch 64 (~60 s).
# About 8 minutes.  Everything lands in $OUT (profile_*.json, *.txt).  Usage from the repo root on the device
# machine: bash benchmarks/gpu_check_profile.sh
source benchmarks/gpu_common.sh
export VITFAST_TRITON_AUTOTUNE=1  # the profile times kernels as deployed; the tests pin it off
run 150 t_blocks env VITFAST_TRITON_AUTOTUNE=0 python3 -m pytest -q -rs -p no:cacheprovider --tb=short -k "cuda or constant_rows or forced or record or tma or persistent" \
  tests/test_vit_block_triton.py tests/test_ln_linear_triton.py tests/test_gpu_profile_blocks.py
run 240 profile_s python3 benchmarks/gpu_profile_blocks.py --model deit_small_patch16_224 --batch 256 \
  --json "$OUT/profile_s256.json"
run 90 profile_b python3 benchmarks/gpu_profile_blocks.py --model deit_base_patch16_224 --batch 64 \
  --sections sdpa,gemm --json "$OUT/profile_b64.json"
