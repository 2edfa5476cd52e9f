#!/usr/bin/env bash
# Run the test suite (slow tests included; CI runs exactly this). Extra args go to pytest,
# e.g. scripts/test.sh -m "not slow" -x.  pytest's exit code 5 (no tests collected) counts as a failure
# only when no selection was asked for.
set -uo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests" >&2
  if [ "$#" -gt 0 ]; then exit 0; fi
fi
exit "$rc"
