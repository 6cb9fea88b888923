#!/usr/bin/env bash
# Set up, then run the test suite. Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh -c test || exit 1
.venv/bin/ruff check lego lego_cli flows tasks tests || exit 1
.venv/bin/pytest -q -rs "$@"
rc=$?
.venv/bin/lego docker down -c test >/dev/null 2>&1 || true
if [ $rc -eq 5 ]; then
  echo "pytest collected no tests: the suite or the -k/-m filter selects nothing" >&2
  exit 1
fi
exit $rc
