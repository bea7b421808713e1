#!/bin/bash
# Shared set-up of the prepared GPU scripts (gpu_check*.sh), sourced from the repo root on the device machine:
# strict pipes, unbuffered Python on this checkout, results under $OUT (default /tmp/gpu_out), the
# vitfast.kernels link, the machine/versions in $OUT/env.txt, and two helpers:
#   build_ext            builds the C++ extension (16 cores) into $OUT/build.txt
#   run SECONDS NAME CMD runs CMD under its own timeout into $OUT/NAME.txt, then prints rc and the tail
# Each step has its own timeout so that one slow step cannot eat the whole device slot.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD VITFAST_TRITON_AUTOTUNE=${VITFAST_TRITON_AUTOTUNE:-0}
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
# The package maps vitfast.kernels to top-level kernels/ at install time; without installing, a link does it.
[ -e vitfast/kernels ] || ln -s ../kernels vitfast/kernels
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/env.txt"
python3 -c "import torch, triton, timm; print('torch', torch.__version__, 'triton', triton.__version__, 'timm', timm.__version__)" | tee -a "$OUT/env.txt"

build_ext() {
  (time MAX_JOBS=16 python3 setup.py -q build_ext --inplace) > "$OUT/build.txt" 2>&1 || echo "C++ build FAILED (see build.txt)"
  tail -3 "$OUT/build.txt"
}

run() {
  local t=$1 name=$2
  shift 2
  echo "== $name"
  timeout "$t" "$@" > "$OUT/$name.txt" 2>&1
  echo "rc=$?"
  tail -n 30 "$OUT/$name.txt"
}
