#!/bin/bash
# One prepared GPU session (the device tool's H100/H200, torch 2.11 / triton 3.6 preinstalled): the Triton
# kernels' parity tests run natively, the CUDA-only tests, then benchmarks/cuda_report.py.  Results go to
# $OUT (or /tmp/gpu_out).  Usage from the repo root: bash benchmarks/gpu_check.sh [extra test files]
# The C++ extension too: the CPU tests on torch 2.11 check the torch>=2.4 promise.  No autotune pinning here:
# cuda_report.py times the kernels as deployed.
export VITFAST_TRITON_AUTOTUNE=${VITFAST_TRITON_AUTOTUNE:-1}  # (the default; gpu_common.sh keeps a set value)
source benchmarks/gpu_common.sh
build_ext
tests="tests/test_channel_idle_ffn_triton.py tests/test_checkpoint.py tests/test_ops.py tests/test_channel_idle_ffn.py $*"
timeout 300 python3 -m pytest -q -p no:cacheprovider -x $tests 2>&1 | tail -n 30 | tee "$OUT/tests.txt"
timeout 300 python3 benchmarks/cuda_report.py --json "$OUT/ops.json" 2>&1 | tee "$OUT/bench.txt"
