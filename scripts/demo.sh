#!/usr/bin/env bash
# Set up (if needed) and run the main job: `vitfast demo` (train a channel-idle ViT on the digits, fuse, compare).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/vitfast demo "$@"
