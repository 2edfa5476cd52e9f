#!/usr/bin/env bash
# Set up everything the flywheel needs on a fresh Debian machine with Python 3.11:
# Debian's chromium + chromium-driver (MiniWoB's browser), a .venv with the CPU build of torch
# and the project (editable, with test extras). Idempotent: a second run only checks.
#   FLYWHEEL_TORCH=skip ./scripts/setup.sh   # keep the torch you have (GPU boxes)
#
# GPU mode, for a training worker (the `gpu` pool: sft and rl with rl.source: lake; no browser needed):
#   FLYWHEEL_GPU=1 PYTHON=/path/to/python-with-cuda-torch ./scripts/setup.sh
#   FLYWHEEL_GPU=1 FLYWHEEL_WHEELS=/dir1:/dir2 ./scripts/setup.sh      # offline: wheels from these folders only
# It installs no chromium and keeps that python's CUDA torch (and whatever else it has: peft, accelerate, ...):
# .venv sees that environment's packages (a .pth file, which also works when the torch lives in another venv),
# the project goes in without its CPU-side dependencies (--no-deps), and then the training side's:
# prefect, duckdb, transformers, liger-kernel (the `gpu` extra) — from PyPI, or from FLYWHEEL_WHEELS offline.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${FLYWHEEL_GPU:-0}" = "1" ]; then
  PY="${PYTHON:-python3}"
  if [ ! -x .venv/bin/python ]; then
    echo "setup (gpu): creating .venv over $($PY -c 'import sys; print(sys.prefix)')" >&2
    "$PY" -m venv .venv
    BASE_SITE=$("$PY" -c 'import site; print(site.getsitepackages()[0])')
    VENV_SITE=$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')
    echo "$BASE_SITE" > "$VENV_SITE/_flywheel_base_env.pth"   # the box's torch stack, after .venv's own packages
  fi
  PIP=(.venv/bin/python -m pip -q --disable-pip-version-check install)
  if [ -n "${FLYWHEEL_WHEELS:-}" ]; then
    IFS=: read -ra DIRS <<< "$FLYWHEEL_WHEELS"
    for d in "${DIRS[@]}"; do PIP+=(--find-links "$d"); done
    PIP+=(--no-index)
  fi
  "${PIP[@]}" "setuptools>=68"
  "${PIP[@]}" --no-deps --no-build-isolation -e .
  mapfile -t LAKE < <(.venv/bin/python -c 'import tomllib; print("\n".join(d for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] if d.startswith(("duckdb", "pytz"))))')
  "${PIP[@]}" "prefect>=3.8,<4" "fastapi>=0.139,<0.151" "${LAKE[@]}" "transformers>=5.18" "liger-kernel>=0.8.5"
  echo "setup (gpu): ok ($(.venv/bin/python -c 'import torch, transformers, duckdb, prefect; print(f"torch {torch.__version__} cuda {torch.cuda.is_available()}, transformers {transformers.__version__}, duckdb {duckdb.__version__}, prefect {prefect.__version__}")'))" >&2
  exit 0
fi

# Debian packages: chromium + chromium-driver (MiniWoB's browser), postgresql (the server the tests start for a
# many-machine lake catalog: 19 MB download, ~63 MB installed; the tests run their own cluster in a temp folder).
APT=()
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  APT+=(chromium chromium-driver)
fi
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  APT+=(postgresql)
fi
if ! command -v Xvfb >/dev/null 2>&1; then  # an X display for the compiled pyautogui actions' test (~14 packages)
  APT+=(xvfb)
fi
if [ "${#APT[@]}" -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "setup: installing ${APT[*]} (Debian packages)" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${APT[@]}" >/dev/null
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
