#!/usr/bin/env bash
# One-time set-up on a fresh machine (idempotent: later runs only redo what changed).
#   - system packages for the aarch64 cross test (g++-aarch64-linux-gnu, qemu-user-static) when root + apt;
#   - .venv with torch (pinned per architecture), the Python dependencies, and vitfast built in place
#     (the C++ extension vitfast._C is compiled here, once — never at import or test time).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# ---- system packages (cross toolchain + user-mode qemu for the NEON tests)
if ! command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || ! command -v qemu-aarch64-static >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing g++-aarch64-linux-gnu and qemu-user-static (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq g++-aarch64-linux-gnu qemu-user-static >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && apt-get install -y -qq g++-aarch64-linux-gnu qemu-user-static >/dev/null; }
  else
    log "WARNING: aarch64-linux-gnu-g++ / qemu-aarch64-static missing and cannot apt-get (not root):"
    log "         the NEON cross-build tests will fail; install g++-aarch64-linux-gnu qemu-user-static"
  fi
fi

# ---- virtual environment
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python

if ! "$VPY" -c "import torch, torchvision" >/dev/null 2>&1; then
  case "$(uname -m)" in
    x86_64) TORCH_PINS="torch==2.14.1 torchvision==0.29.1" ;;
    aarch64|arm64) TORCH_PINS="torch==2.9.1 torchvision==0.24.1" ;;
    *) TORCH_PINS="torch torchvision" ;;
  esac
  log "installing $TORCH_PINS"
  "$VPY" -m pip install -q --upgrade pip
  "$VPY" -m pip install -q $TORCH_PINS
fi

STAMP=.venv/.vitfast-requirements
REQ_HASH=$(cat requirements.txt pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$REQ_HASH" ]; then
  log "installing Python dependencies"
  "$VPY" -m pip install -q -r requirements.txt
  echo "$REQ_HASH" > "$STAMP"
fi

# ---- build vitfast (C++ extension) in place; rebuild only when csrc/ changed
SRC_HASH=$( (find csrc -type f | sort | xargs cat; cat setup.py pyproject.toml) | sha256sum | cut -d' ' -f1)
BUILD_STAMP=.venv/.vitfast-build
if [ ! -f "$BUILD_STAMP" ] || [ "$(cat "$BUILD_STAMP")" != "$SRC_HASH" ] \
   || ! "$VPY" -c "import vitfast, sys; sys.exit(0 if vitfast.ops.extension_loaded() else 1)" >/dev/null 2>&1; then
  log "building vitfast (C++ extension, about a minute)"
  "$VPY" -m pip install -q --no-build-isolation -e .
  echo "$SRC_HASH" > "$BUILD_STAMP"
fi
log "ready: $("$VPY" -c "import torch, vitfast; print(f'torch {torch.__version__}, vitfast {vitfast.__version__}, CPU path {vitfast.ops.cpu_isa()}')")"
