#!/usr/bin/env bash
# Copy the CUDA results out of the tarballs that scripts/gpu_check.sh packed on a GPU machine into
# benchmarks/results/<what>-cuda.{json,md,png} (and data-gpu-host.{json,md}), to commit; print each file written
# and the seconds each step took. A tarball with an absolute member path, a '..' part or a link is refused, and
# then nothing at all is written. A CPU dry run's tarball gives no files.
#
#   bash scripts/gpu_results.sh TARBALL [TARBALL ...] [--dest DIR]
#
#   TARBALL   an OUT_DIR/gpu-results.tar.gz of scripts/gpu_check.sh (one per part)
#   --dest    where the results go (default: benchmarks/results)
# PYTHON selects the interpreter (default: .venv/bin/python if there, else python3); it needs no torch.
set -euo pipefail
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
[ $# -ge 1 ] || { usage; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; esac
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  if [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; else py=python3; fi
fi
# A --dest given later wins over the checkout's results folder. src/ on the path: runbook.py writes through
# drivetrain.safeio.files (standard library only), also with a Python that has no drivetrain installed.
PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" exec "$py" "$root/src/drivetrain/profile/runbook.py" collect --dest "$root/benchmarks/results" "$@"
