#!/usr/bin/env bash
# Set up the environment, then run the main job: the ragged-ops benchmark on the CPU.
# Extra arguments go to `drivetrain bench ragged` (e.g. --repeat 50, --save).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv="${DRIVETRAIN_VENV:-.venv}"
exec "$venv/bin/drivetrain" bench ragged --device cpu "$@"
