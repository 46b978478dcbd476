#!/usr/bin/env bash
# Main job: train StreamPETR-tiny on the CPU on the synthetic nuScenes-format set (generated if absent), evaluate it on mini_val with the nuScenes devkit, plot its losses and print where a training iteration's time goes.
#
# Steps: set-up → `drivetrain train` (configs/streampetr_tiny.yaml, batched loss path; the initial weights are
# evaluated first as the baseline, then every DEMO_EVAL_EVERY steps) → `drivetrain eval --checkpoint` (the
# devkit's tables) → `drivetrain report` (curves, report.md) → `drivetrain viz frame` (a frame's cameras with
# boxes) → `drivetrain bench iteration` (reference vs batched loss path) → summary.
# Environment: DEMO_RUN (run directory, default runs/demo; replaced on each demo run), DEMO_STEPS (default 600),
# DEMO_EVAL_EVERY (default 200). Extra arguments are config overrides for the training, e.g. optim.lr=2e-3.
set -euo pipefail
cd "$(dirname "$0")/.."
run="${DEMO_RUN:-runs/demo}"
steps="${DEMO_STEPS:-600}"
every="${DEMO_EVAL_EVERY:-200}"
echo "demo: StreamPETR-tiny on the synthetic nuScenes-format set: set up, train $steps steps on the CPU, evaluate" \
  "on mini_val with the nuScenes devkit, plot the losses, time one iteration (reference vs batched loss); ~6 min"
bash scripts/setup.sh
venv="${DRIVETRAIN_VENV:-.venv}"
drivetrain="$venv/bin/drivetrain"
start=$(date +%s)

if [ -d "$run" ]; then
  echo "demo: replacing the previous demo run in $run"
  rm -rf "$run"
fi
echo "demo: training StreamPETR-tiny for $steps steps on the CPU → $run"
"$drivetrain" train --config configs/streampetr_tiny.yaml run.out_dir="$run" train.steps="$steps" \
  eval.every="$every" eval.at_start=true "$@"
echo "demo: evaluating the trained model on mini_val"
"$drivetrain" eval --checkpoint "$run" --device cpu
"$drivetrain" report "$run" >/dev/null
echo "demo: the run's curves (loss, terms, lr, throughput, data wait, memory, mAP/NDS) → $run/report.md"
"$drivetrain" viz frame --checkpoint "$run" --frame 1 --png "$run/frame-1.png" >/dev/null
echo "demo: mini_val frame 1, its six cameras with ground truth and detections → $run/frame-1.png"
echo "demo: one training iteration, reference vs batched loss path (batch 2, the same weights and frames)"
"$drivetrain" bench iteration --model streampetr --size tiny --batch 2 --repeat 5 --warmup 2 --device cpu
"$venv/bin/python" - "$run" "$start" <<'PY'
import json, sys, time
from pathlib import Path

run, start = Path(sys.argv[1]), float(sys.argv[2])
evals = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "eval/mAP" in r]
print("demo: mini_val over training (step: mAP / NDS)")
for r in evals:
    print(f"  step {r['step']:>5}: {r['eval/mAP']:.4f} / {r['eval/NDS']:.4f}")
first, last = evals[0], evals[-1]
print(f"demo: mAP {first['eval/mAP']:.4f} at random init → {last['eval/mAP']:.4f} after {last['step']} steps; "
      f"NDS {first['eval/NDS']:.4f} → {last['eval/NDS']:.4f} ({(time.time() - start) / 60:.1f} min in all)")
PY
