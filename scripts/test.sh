#!/usr/bin/env bash
# Set up, then run the test suite. Extra arguments go to pytest.
#
# The suite runs in LEGO_TEST_WORKERS parallel pytest workers (default 4; 1 runs it in one process), one test file
# per worker at a time: most tests wait on containers, harness processes and servers rather than compute, so even
# two cores overlap them. Each worker has a work dir of its own (tests/conftest.py); all share the one Docker engine
# started here.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh -c test || exit 1
.venv/bin/ruff check lego lego_cli flows tests || exit 1
# Bytecode caches on, whatever the shell says: the suite starts over a hundred Python processes that import Lego, and
# without them each one compiles it again.
unset PYTHONDONTWRITEBYTECODE
WORKERS=${LEGO_TEST_WORKERS:-4}
parallel=()
if [ "$WORKERS" -gt 1 ]; then
  engine=$(.venv/bin/lego docker up -c test | grep -o '[a-z]*://[^ ]*' | tail -1)
  if [ -z "$engine" ]; then
    echo "could not start the test config's Docker engine (lego docker up -c test)" >&2
    exit 1
  fi
  export DOCKER_HOST="$engine"
  parallel=(-n "$WORKERS" --dist loadfile --no-loadscope-reorder)  # the order tests/conftest.py sets
fi
.venv/bin/pytest -q -rs --durations=25 "${parallel[@]}" "$@"
rc=$?
.venv/bin/lego docker down -c test >/dev/null 2>&1 || true
if [ $rc -eq 5 ]; then
  echo "pytest collected no tests: the suite or the -k/-m filter selects nothing" >&2
  exit 1
fi
exit $rc
