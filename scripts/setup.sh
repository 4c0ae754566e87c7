#!/usr/bin/env bash
# Sets up a virtual environment in .venv with cinq and its extras. Idempotent.
# torch is pinned and installed first: with no torch present, an unpinned one would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
python -m pip install -q numpy
python -m pip install -q -e ".[dev]"
if [ "${1:-}" = "--test" ]; then
  # Browser for the playground test (Debian chromium); harmless where it is already installed.
  if ! command -v chromium >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
      SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
      $SUDO apt-get update -qq >/dev/null 2>&1 || true
      $SUDO apt-get install -y -qq chromium >/dev/null 2>&1 || echo "setup: could not install chromium (the playground browser test will fail)"
    fi
  fi
fi
