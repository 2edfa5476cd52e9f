#!/usr/bin/env bash
# Run the test suite (slow tests included; CI runs exactly this). Extra args go to pytest,
# e.g. scripts/test.sh -m "not slow" -x.  pytest's exit code 5 (no tests collected) counts as a failure
# only when no selection was asked for. Lint (ruff check, ruff format --check) runs first and fails the script.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/ruff ]; then  # FLYWHEEL_GPU=1 setups skip the dev extra
  echo "test.sh: .venv/bin/ruff is missing: install the dev extra (.venv/bin/python -m pip install -e '.[dev]')" >&2
  exit 1
fi
if ! { .venv/bin/ruff check . && .venv/bin/ruff format --check .; }; then
  echo "test.sh: lint failed (ruff check / ruff format --check; fix, or run .venv/bin/ruff format .)" >&2
  exit 1
fi
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests" >&2
  if [ "$#" -gt 0 ]; then exit 0; fi
fi
exit "$rc"
