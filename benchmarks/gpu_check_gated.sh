#!/bin/bash
# Prepared GPU run for the USDC gated kernels (kernels/gated.py): their native parity tests (open ==
# ungated, closed == identity, closed kernels leave their buffers untouched), the CUDA-graph test of a gated model
# (which checks that the capture goes through the gated ops), then the CUDA table of
# benchmarks/bench_batch_gate.py: DeiT-S block gated closed / gated open / ungated (+ the old gate_select path),
# eager and CUDA-graph replays, fp32 and fp16, and a 12-block model with half of its sub-blocks closed.
# Each step has its own timeout.  Usage from the repo root on the device machine:
#   bash benchmarks/gpu_check_gated.sh            (results also under $OUT, default /tmp/gpu_out)
source benchmarks/gpu_common.sh
# Cold Triton cache on a GPU: 56 of the 65 gated tests in 150 s (36 s warm), so 210 s.
run 210 t_gated python3 -m pytest -q -p no:cacheprovider tests/test_gated_triton.py tests/test_gated.py
run 120 t_gates_cuda python3 -m pytest -q -p no:cacheprovider tests/test_gates.py tests/test_batch_gate_triton.py -k "cuda or graph or triton"
# The benchmark autotunes nothing of its own (the gated kernels have fixed tiles); VITFAST_TRITON_AUTOTUNE=1 lets the
# ungated fp16 b64 FFN (channel_idle_ffn Triton) tune as it would in deployment.
VITFAST_TRITON_AUTOTUNE=1 run 210 b_gated python3 benchmarks/bench_batch_gate.py --cuda --skip-cpu --rounds 10
