#!/bin/bash
# Second prepared GPU script: the Triton kernels that have only run under the interpreter
# (xwx_attention, dwconv_attention, batch_gate/gate_select), their CUDA-side tests, and their standalone
# CUDA tables.  Each step has its own timeout so one slow step cannot eat the device slot.
# Usage from the repo root on the device machine: bash benchmarks/gpu_check_kernels.sh
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD VITFAST_TRITON_AUTOTUNE=0
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
[ -e vitfast/kernels ] || ln -s ../kernels vitfast/kernels
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"
(time MAX_JOBS=16 python3 setup.py -q build_ext --inplace) > "$OUT/build.txt" 2>&1 || echo "C++ build FAILED"
tail -3 "$OUT/build.txt"
run() { local t=$1 name=$2; shift 2; echo "== $name"; timeout "$t" "$@" > "$OUT/$name.txt" 2>&1; echo "rc=$?"; tail -n 25 "$OUT/$name.txt"; }
run 120 t_xwx python3 -m pytest -q -p no:cacheprovider tests/test_xwx_attention_triton.py
run 90 t_dwconv python3 -m pytest -q -p no:cacheprovider tests/test_dwconv_attention_triton.py
run 80 t_gate python3 -m pytest -q -p no:cacheprovider tests/test_batch_gate_triton.py tests/test_gates.py -k "cuda or triton or graph"
run 50 t_dist python3 -m pytest -q -p no:cacheprovider tests/test_distributed.py -k cuda
run 45 b_xwx python3 benchmarks/bench_xwx_attention.py
run 45 b_dw python3 benchmarks/bench_dwconv_attention.py --cuda
run 45 b_gate python3 benchmarks/bench_batch_gate.py --cuda --rounds 7
