#!/bin/bash
# Prepared GPU run for the inference paths of fused models on CUDA: vitfast.cuda_graph's CUDA tests (real captures
# of fused models in fp32/fp16, under autocast, after vitfast.load; the bench providers), the CUDA-only capture test
# of the gated model, the eager whole-block path (ops.vit_block_cuda_eager, same bits as the module calls), then the
# end-to-end rows of benchmarks/cuda_report.py (timm and vitfast, eager and CUDA-graph
# replays, DeiT-Ti/B at batch 1 and 64, fp32 and bf16).  Usage from the repo root: bash benchmarks/gpu_check_graphs.sh
source benchmarks/gpu_common.sh
build_ext
run 120 t_graphs python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda_graphs.py \
  "tests/test_bench.py::test_cli_cuda_bfloat16" \
  "tests/test_bench.py::test_cli_cuda_default_providers_include_the_graph_replays" \
  "tests/test_gates.py::test_cuda_gated_model_matches_cpu_and_survives_graph_capture" \
  "tests/test_vit_block.py::test_cuda_impl_is_the_six_cuda_ops" "tests/test_checkpoint.py::test_load_then_cuda"
run 300 models python3 benchmarks/cuda_report.py --no-ops --model-dtypes float32,bfloat16
