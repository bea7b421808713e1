#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite: Python tests, C++ CTest suite (natively, under ASan+UBSan and
# TSan), aarch64/NEON under qemu, Triton kernels through the interpreter (natively when a GPU is present).
# Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
