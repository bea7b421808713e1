#!/bin/bash
# Prepared GPU run for the USDC gated kernels (kernels/gated.py, issue 6): their native parity tests (open ==
# ungated, closed == identity, closed kernels leave their buffers untouched), the CUDA-graph test of a gated model
# (which checks that the capture goes through the gated ops), then the CUDA table of
# benchmarks/bench_batch_gate.py: DeiT-S block gated closed / gated open / ungated (+ the old gate_select path),
# eager and CUDA-graph replays, fp32 and fp16, and a 12-block model with half of its sub-blocks closed.
# Each step has its own timeout.  Usage from the repo root on the device machine:
#   bash benchmarks/gpu_check_gated.sh            (results also under $OUT, default /tmp/gpu_out)
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD VITFAST_TRITON_AUTOTUNE=0
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
[ -e vitfast/kernels ] || ln -s ../kernels vitfast/kernels
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"
run() { local t=$1 name=$2; shift 2; echo "== $name"; timeout "$t" "$@" > "$OUT/$name.txt" 2>&1; echo "rc=$?"; tail -n 30 "$OUT/$name.txt"; }
run 180 t_gated python3 -m pytest -q -p no:cacheprovider tests/test_gated_triton.py tests/test_gated.py
run 120 t_gates_cuda python3 -m pytest -q -p no:cacheprovider tests/test_gates.py tests/test_batch_gate_triton.py -k "cuda or graph or triton"
# The benchmark autotunes nothing of its own (the gated kernels have fixed tiles); VITFAST_TRITON_AUTOTUNE=1 lets the
# ungated fp16 b64 FFN (channel_idle_ffn Triton) tune as it would in deployment.
VITFAST_TRITON_AUTOTUNE=1 run 300 b_gated python3 benchmarks/bench_batch_gate.py --cuda --skip-cpu --rounds 10
