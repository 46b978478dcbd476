#!/usr/bin/env bash
# The GPU evidence in one run, on a machine with an NVIDIA GPU and its own CUDA PyTorch (any recent version;
# no internet needed): install the wheels from scripts/gpu_wheels.sh into a private folder, then run the
# CUDA tests and every benchmark with --device cuda, each step logged, timed and allowed to fail alone.
#
#   bash scripts/gpu_check.sh OUT_DIR [--wheels DIR] [--save] [--full] [--device cuda|cpu]
#
#   OUT_DIR     logs, JUnit XML, benchmark JSON/Markdown and summary.md are written here
#   --wheels    folder of wheels from scripts/gpu_wheels.sh (default: .whl; skipped if absent)
#   --save      also copy the benchmark results to benchmarks/results/<what>-cuda.{json,md} (to commit)
#   --full      also run the whole test suite on this machine (the engine then trains on the GPU)
#   --device    cpu runs the same steps on the CPU with few repeats: a dry run of this script
# Exit status: 0 if every step passed. PYTHON selects the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# -ge 1 ] || { usage; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; esac
out="$1"; shift
wheels=.whl; save=0; full=0; device=cuda
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) wheels="$2"; shift 2 ;;
    --save) save=1; shift ;;
    --full) full=1; shift ;;
    --device) device="$2"; shift 2 ;;
    *) echo "gpu_check: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
py="${PYTHON:-python3}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

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
  "$py" -c 'import sys, numpy, torch
print("python", sys.version.split()[0], "| numpy", numpy.__version__, "| torch", torch.__version__, "| CUDA", torch.version.cuda)
print("GPU:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none visible to torch")'
  "$py" -c 'import nuscenes.eval.detection.evaluate' 2>/dev/null && echo "nuScenes devkit: imports" \
    || echo "nuScenes devkit: does not import here (the data tests and bench data need it)"
} | tee "$out/environment.txt"

if [ "$device" = cuda ]; then repeat_small=""; else repeat_small="--repeat 3 --warmup 1"; fi
# The published batch 8 on a GPU; a CPU dry run takes one iteration of batch 2 (the full size runs ~1 min each).
if [ "$device" = cuda ]; then iteration_opts="--batch 8"; else iteration_opts="--batch 2 --repeat 1 --warmup 0"; fi
status=0
printf '| step | status | seconds |\n|---|---|---:|\n' > "$out/steps.md"
step() {  # step NAME TIMEOUT_S COMMAND...: run, log to OUT/NAME.log, record status and duration
  local name="$1" limit="$2"; shift 2
  local start rc
  start=$(date +%s)
  echo "== $name: $*"
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  local took=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then echo "   ok (${took} s)"; else echo "   FAILED rc=$rc (${took} s), see $out/$name.log"; tail -5 "$out/$name.log"; status=1; fi
  printf '| %s | %s | %d |\n' "$name" "$([ $rc -eq 0 ] && echo ok || echo "failed ($rc)")" "$took" >> "$out/steps.md"
}

step tests-cuda 900 "$py" -m pytest -q -p no:cacheprovider -m cuda -rs --junitxml "$out/tests-cuda.xml" tests
for what in ragged loss precision lidar-data copy; do
  # shellcheck disable=SC2086  # repeat_small is a list of options
  step "bench-$what" 900 "$py" -m drivetrain.cli.main bench "$what" --device "$device" $repeat_small \
    --json "$out/$what-$device.json" --md "$out/$what-$device.md"
done
# Full StreamPETR training iterations, reference vs batched loss path, at the published batch 8 (the full size
# renders the synthetic set at 704x256 into data/synth-full-704 first).
for size in tiny full; do
  # shellcheck disable=SC2086  # iteration_opts is a list of options
  step "bench-iteration-$size" 1200 "$py" -m drivetrain.cli.main bench iteration --model streampetr --size "$size" \
    $iteration_opts --device "$device" --json "$out/iteration-streampetr-$size-$device.json" \
    --md "$out/iteration-streampetr-$size-$device.md" --png "$out/iteration-streampetr-$size-$device.png"
done
# PointPillars / SSN iterations, reference vs batched assignment and loss, at the published batch 4 (tiny and the
# published nuScenes configs on the synthetic full lidar), then SSN's precision table and the sweeps trade-off.
if [ "$device" = cuda ]; then lidar_opts="--batch 4"; else lidar_opts="--batch 2 --repeat 1 --warmup 0"; fi
for model in pointpillars ssn; do
  for size in tiny full; do
    # shellcheck disable=SC2086  # lidar_opts is a list of options
    step "bench-iteration-$model-$size" 1200 "$py" -m drivetrain.cli.main bench iteration --model "$model" \
      --size "$size" $lidar_opts --device "$device" --json "$out/iteration-$model-$size-$device.json" \
      --md "$out/iteration-$model-$size-$device.md" --png "$out/iteration-$model-$size-$device.png"
  done
done
# shellcheck disable=SC2086  # repeat_small is a list of options
step bench-precision-ssn-full 1800 "$py" -m drivetrain.cli.main bench precision --model ssn --size full \
  --device "$device" $repeat_small --json "$out/precision-ssn-full-$device.json" --md "$out/precision-ssn-full-$device.md"
if [ "$device" = cuda ]; then sweeps_opts="--steps 300"; else sweeps_opts="--steps 6 --warmup 2 --sweeps 0,5"; fi
# shellcheck disable=SC2086  # sweeps_opts is a list of options
step bench-sweeps-ssn 1800 "$py" -m drivetrain.cli.main bench sweeps --model ssn --device "$device" $sweeps_opts \
  --json "$out/sweeps-ssn-$device.json" --md "$out/sweeps-ssn-$device.md" --png "$out/sweeps-ssn-$device.png"
# Camera augmentation: per sample in the loader workers vs the whole batch on the GPU (+ side stream, + the frozen
# ResNet-50 encoder run ahead), tiny and full image sizes, batch 1/4/8, pipeline alone and training steps.
if [ "$device" = cuda ]; then augment_opts="--train"; else augment_opts="--batch 1 --sizes tiny --train --repeat 2 --warmup 1"; fi
# shellcheck disable=SC2086  # augment_opts is a list of options
step bench-augment 2400 "$py" -m drivetrain.cli.main bench augment --device "$device" $augment_opts \
  --json "$out/augment-$device.json" --md "$out/augment-$device.md" --png "$out/augment-$device.png"
# Every speed/memory switch on our models (each variant its own training process), the 3D CNN's base_channels table.
if [ "$device" = cuda ]; then switch_opts="--repeat 3"; else switch_opts="--variants channels_last --steps 2 --warmup 1 --repeat 1 --no-ddp --no-schedule --no-channels-table"; fi
for model in voxelnet streampetr pointpillars; do
  # shellcheck disable=SC2086  # switch_opts is a list of options
  step "bench-switches-$model" 2400 "$py" -m drivetrain.cli.main bench switches --model "$model" --device "$device" \
    $switch_opts --json "$out/switches-$model-$device.json" --md "$out/switches-$model-$device.md" \
    --png "$out/switches-$model-$device.png"
done
# The loader runs on the host CPU: measured here for the record, never saved over the CPU machine's results.
step bench-data 900 "$py" -m drivetrain.cli.main bench data --device cpu --repeat 2 \
  --json "$out/data-gpu-host.json" --md "$out/data-gpu-host.md"
if [ $full -eq 1 ]; then
  step tests-all 1800 "$py" -m pytest -q -p no:cacheprovider --junitxml "$out/tests-all.xml" tests
fi
if [ $save -eq 1 ] && [ "$device" = cuda ]; then
  for what in ragged loss precision lidar-data copy iteration-streampetr-tiny iteration-streampetr-full \
      iteration-pointpillars-tiny iteration-pointpillars-full iteration-ssn-tiny iteration-ssn-full \
      precision-ssn-full sweeps-ssn augment switches-voxelnet switches-streampetr switches-pointpillars; do
    for ext in json md png; do
      [ -f "$out/$what-cuda.$ext" ] && cp "$out/$what-cuda.$ext" "benchmarks/results/$what-cuda.$ext"
    done
  done
fi

{
  echo "# GPU check"
  echo
  sed 's/^/    /' "$out/environment.txt"
  echo
  cat "$out/steps.md"
} > "$out/summary.md"
echo "gpu_check: $( [ $status -eq 0 ] && echo 'all steps passed' || echo 'some steps FAILED' ); summary: $out/summary.md"
exit $status
