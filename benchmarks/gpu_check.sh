#!/bin/bash
# One prepared GPU session (the device tool's H100/H200, torch 2.11 / triton 3.6 preinstalled): the Triton
# kernels' parity tests run natively, the CUDA-only tests, then benchmarks/cuda_report.py.  Results go to
# $OUT (or /tmp/gpu_out).  Usage from the repo root: bash benchmarks/gpu_check.sh [extra test files]
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
# The package maps vitfast.kernels to top-level kernels/ at install time; without installing, a link does it.
[ -e vitfast/kernels ] || ln -s ../kernels vitfast/kernels
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, triton, timm; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', timm.__version__)" | tee -a "$OUT/env.txt"
# The C++ extension too (16 cores): the CPU tests on torch 2.11 check the torch>=2.4 promise.
(time MAX_JOBS=16 python3 setup.py -q build_ext --inplace) > "$OUT/build.txt" 2>&1 || echo "C++ build FAILED (see build.txt)"
tests="tests/test_channel_idle_ffn_triton.py tests/test_checkpoint.py tests/test_ops.py tests/test_channel_idle_ffn.py $*"
timeout 300 python3 -m pytest -q -p no:cacheprovider -x $tests 2>&1 | tail -n 30 | tee "$OUT/tests.txt"
timeout 300 python3 benchmarks/cuda_report.py --json "$OUT/ops.json" 2>&1 | tee "$OUT/bench.txt"
