#!/usr/bin/env bash
# Set up, then lint, type-check and run the whole test suite. Exits non-zero on any failure.
# PostgreSQL tests run too when TEST_DATABASE_URL is set (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
echo "== ruff check";        .venv/bin/ruff check .
echo "== ruff format";       .venv/bin/ruff format --check .
echo "== mypy";              .venv/bin/mypy
echo "== import contracts";  .venv/bin/lint-imports
if [ -n "${TEST_DATABASE_URL:-}" ]; then
  echo "== pytest (SQLite and PostgreSQL)"
else
  echo "== pytest (SQLite only: set TEST_DATABASE_URL to include PostgreSQL)"
fi
# pytest exits 5 when a selection holds no test (e.g. only one file asked for): not a failure.
run_pytest() {
  local rc=0
  .venv/bin/python -m pytest "$@" || rc=$?
  [ "$rc" -eq 5 ] && rc=0
  return "$rc"
}
# Two workers (pytest-xdist): the suite waits on the databases as much as it computes, so two
# processes finish well ahead of one even on a 2-core machine (PYTEST_WORKERS=0: one process).
# Tests that assert wall-clock bounds (marker `timing`) then run alone, so a neighbouring
# worker cannot push them over their bounds. Arguments go to both passes.
# Both passes always run (a failure in the first must not hide the second's); the script fails
# when either does.
echo "-- in ${PYTEST_WORKERS:-2} workers, timing tests excluded"
parallel_rc=0
run_pytest -n "${PYTEST_WORKERS:-2}" -m "not timing" "$@" || parallel_rc=$?
echo "-- timing tests, alone"
timing_rc=0
run_pytest -m timing "$@" || timing_rc=$?
if [ "$parallel_rc" -ne 0 ] || [ "$timing_rc" -ne 0 ]; then
  echo "FAILED: parallel pass exit $parallel_rc, timing pass exit $timing_rc" >&2
  exit 1
fi
