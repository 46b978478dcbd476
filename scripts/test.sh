#!/usr/bin/env bash
# Set up the environment, then run the fast test suite (slow tests: add `-m slow`) and ruff.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv="${DRIVETRAIN_VENV:-.venv}"
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
exec "$venv/bin/python" -m pytest -q "$@"
