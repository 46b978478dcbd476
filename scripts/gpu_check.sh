#!/usr/bin/env bash
# The GPU evidence within a time budget, on a machine with an NVIDIA GPU and its own CUDA PyTorch (no internet
# needed): install the wheels from scripts/gpu_wheels.sh into a private folder, then run the run book's steps
# highest priority first (CUDA tests, solver, trainer step and profile, iterations, data path, the rest), each
# capped to end inside the budget; a step that cannot fit is skipped and named (drivetrain/profile/runbook.py).
#
#   bash scripts/gpu_check.sh OUT_DIR [--budget SECONDS] [--part N] [--device cuda|cpu] [--wheels DIR] [--save] [--full]
#
#   OUT_DIR     receives two files: gpu-results.tar.gz (logs, JUnit XML, results, environment.txt, steps.json;
#               at most 16 MiB) and summary.md (step, part, status, seconds, cap, expected), both rewritten before
#               every step: a run killed part-way (SIGKILL) leaves every finished step's results there
#   --budget    seconds for the whole command, wheel install included (default: every step's cap)
#   --part      1-7: only that part's steps (a 15-minute GPU lease runs parts 1 and 2): 1 CUDA tests (device
#               tests, then those that train), bench solve, bench train --profile and full-size
#               iterations of the three published configs (9 min); 2 tiny iterations, copy, loss, ragged
#               (4.5 min); 3 augment, precision, switches; 4 the rest; 5 eager vs the compiled step replayed as
#               CUDA graphs (bench train --compare, PointPillars and SSN; 9 min); 6 the same at StreamPETR's
#               published config (a lease of its own); 7 the CUDA tests that compile with inductor (CUDA
#               graphs, compiled losses; a lease of its own);
#               without it every step runs in priority order
#   --device    cpu: a dry run of the run book with tiny sizes and few repeats (CUDA-only steps are skipped)
#   --wheels    folder of wheels from scripts/gpu_wheels.sh (default: .whl; skipped if absent)
#   --save      also copy the CUDA results to benchmarks/results/<what>-cuda.{json,md,png} (as gpu_results.sh)
#   --full      also run the whole test suite (part 4)
# Exit status: 0 if no step failed or timed out. PYTHON selects the interpreter (default python3).
set -uo pipefail
started=$(date +%s)
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
[ $# -ge 1 ] || { usage; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; esac
out="$1"; shift
wheels=.whl; device=cuda; opts=()
while [ $# -gt 0 ]; do
  case "$1" in --budget|--part|--device|--wheels) [ $# -ge 2 ] || { echo "gpu_check: $1 needs a value" >&2; exit 2; } ;; esac
  case "$1" in
    --budget|--part) opts+=("$1" "$2"); shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --wheels) wheels="$2"; shift 2 ;;
    --save|--full) opts+=("$1"); shift ;;
    *) echo "gpu_check: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
case "$device" in cuda|cpu) ;; *) echo "gpu_check: --device is cuda or cpu, not '$device'" >&2; exit 2 ;; esac
py="${PYTHON:-python3}"
mkdir -p "$out" && out="$(cd "$out" && pwd)" || exit 2  # OUT_DIR and --wheels are the caller's paths
if [ -d "$wheels" ]; then wheels="$(cd "$wheels" && pwd)"; fi
cd "$(dirname "$0")/.." || exit 2
work="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# Our dependencies go to a private folder: the machine's torch, numpy and CUDA stay as they are.
site=/tmp/drivetrain-gpu-site
if compgen -G "$wheels/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --upgrade \
    --target "$site" "$wheels"/*.whl || { echo "gpu_check: installing the wheels from $wheels failed" >&2; exit 1; }
fi
export PYTHONPATH="$PWD/src:$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 DRIVETRAIN_BENCHMARKS="$PWD/benchmarks"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm), $(nproc) CPUs"
  nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not available"
  # versions (torch, CUDA, cuDNN, driver), the GPU, whether the GPU solver is usable, the TF32/cudnn.benchmark flags
  "$py" -m drivetrain.cli.gpu_environment || echo "drivetrain.cli.gpu_environment: failed (see above)"
  "$py" -c 'import nuscenes.eval.detection.evaluate' 2>/dev/null && echo "nuScenes devkit: imports" \
    || echo "nuScenes devkit: does not import here (the data tests and bench data need it)"
  "$py" -c 'import nvidia.dali' 2>/dev/null && echo "DALI: imports" \
    || echo "DALI: not installed (bench augment and bench data run without their DALI variant)"
} | tee "$work/environment.txt"

"$py" -m drivetrain.profile.runbook run --out "$out" --work "$work" --started "$started" --device "$device" \
  --python "$py" "${opts[@]}"
