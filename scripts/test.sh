#!/usr/bin/env bash
# Set up the environment, then run the fast test suite (slow tests: add `-m slow`) and ruff.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv="${DRIVETRAIN_VENV:-.venv}"
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
# One pytest worker per core (pytest-xdist; a test module's tests stay on one worker, so its fixtures are built
# once; the README gives the measured time on 2 cores). DRIVETRAIN_TEST_WORKERS=1 runs them in one
# process (e.g. for the slow set's timing-sensitive benchmarks).
workers="${DRIVETRAIN_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}"
# Compiled test modules (pytest's assertion rewriting) and sources are cached in the venv, not in the tree, even where
# the environment sets PYTHONDONTWRITEBYTECODE: a second run collects in ~3 s per worker instead of ~10.
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$(cd "$venv" && pwd)/pycache}"
unset PYTHONDONTWRITEBYTECODE
parallel=()
if [ "$workers" -gt 1 ]; then
  parallel=(-n "$workers" --dist loadscope)
fi
exec "$venv/bin/python" -m pytest -q ${parallel[@]+"${parallel[@]}"} "$@"
