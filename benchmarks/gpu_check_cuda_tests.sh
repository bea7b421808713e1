#!/bin/bash
# Prepared GPU run for the tests CI skips for want of a GPU (every `skipif(not cuda)` case of the suite,
# selected by name), the CPU suites of the newest C++ ops on the device's torch 2.11 (the torch>=2.4 promise),
# then the GPU report (benchmarks/cuda_report.py: ops and fused models vs timm).
# Usage from the repo root on the device machine: bash benchmarks/gpu_check_cuda_tests.sh
source benchmarks/gpu_common.sh
build_ext
run 200 t_cuda python3 -m pytest -q -rs -p no:cacheprovider -k "cuda or natively or mismatch or fine_tunes" \
  tests/test_layer_norm.py tests/test_batch_gate_triton.py tests/test_channel_idle_ffn_triton.py \
  tests/test_checkpoint.py tests/test_distributed.py tests/test_gates.py tests/test_patch_embed.py \
  tests/test_xwx_attention_triton.py tests/test_gradients.py tests/test_vit_block.py tests/test_cuda_graphs.py \
  tests/test_bench.py
run 60 t_cpu_new_ops python3 -m pytest -q -p no:cacheprovider tests/test_layer_norm.py tests/test_attention.py \
  tests/test_vit_block.py
run 220 report python3 benchmarks/cuda_report.py --json "$OUT/ops.json"
