#!/bin/bash
# Second prepared GPU script: the Triton kernels that have only run under the interpreter
# (xwx_attention, dwconv_attention, batch_gate/gate_select), their CUDA-side tests, and their standalone
# CUDA tables.  Each step has its own timeout so one slow step cannot eat the device slot.
# Usage from the repo root on the device machine: bash benchmarks/gpu_check_kernels.sh
source benchmarks/gpu_common.sh
build_ext
run 120 t_xwx python3 -m pytest -q -p no:cacheprovider tests/test_xwx_attention_triton.py
# Cold Triton cache on a GPU: 45 of the 54 dwconv tests in 80 s (19 s warm), so 130 s.
run 130 t_dwconv python3 -m pytest -q -p no:cacheprovider tests/test_dwconv_attention_triton.py
run 80 t_gate python3 -m pytest -q -p no:cacheprovider tests/test_batch_gate_triton.py tests/test_gates.py -k "cuda or triton or graph"
run 50 t_dist python3 -m pytest -q -p no:cacheprovider tests/test_distributed.py -k cuda
run 45 b_xwx python3 benchmarks/bench_xwx_attention.py
run 45 b_dw python3 benchmarks/bench_dwconv_attention.py --cuda
run 45 b_gate python3 benchmarks/bench_batch_gate.py --cuda --rounds 7
