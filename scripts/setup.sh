#!/usr/bin/env bash
# Set up everything the flywheel needs on a fresh Debian machine with Python 3.11:
# Debian's chromium + chromium-driver (MiniWoB's browser), a .venv with the CPU build of torch
# and the project (editable, with test extras). Idempotent: a second run only checks.
#   FLYWHEEL_TORCH=skip ./scripts/setup.sh   # keep the torch you have (GPU boxes)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "setup: installing chromium + chromium-driver (Debian packages)" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
fi

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PY --version)" >&2
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/python -m pip -q --disable-pip-version-check)
if [ "${FLYWHEEL_TORCH:-cpu}" = "cpu" ]; then
  # Pinned: an unpinned torch resolves to a multi-GB CUDA build. 2.13.0 CPU is on local disk here.
  "${PIP[@]}" install "torch==2.13.0" 2> >(grep -v "is ignored" >&2)
fi
"${PIP[@]}" install -e ".[dev]" 2> >(grep -v "is ignored" >&2)
echo "setup: ok ($(.venv/bin/python -c 'import torch, transformers, duckdb, prefect; print(f"torch {torch.__version__}, transformers {transformers.__version__}, duckdb {duckdb.__version__}, prefect {prefect.__version__}")'))" >&2
