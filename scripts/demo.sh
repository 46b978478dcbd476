#!/usr/bin/env bash
# Main job: train a lidar detector (SSN-tiny) on the CPU on the synthetic nuScenes-format set (generated if absent), score it on mini_val with the nuScenes devkit against the same weights with the points removed, and print where a StreamPETR training iteration's time goes.
#
# Steps: set-up → `drivetrain train` (configs/ssn_tiny_demo.yaml: key frames, batch 2, 1000 steps; mini_val at the
# start and every 250 steps) → `drivetrain eval --checkpoint` (mAP X) and `drivetrain eval --checkpoint
# --blank-inputs` (control mAP Y: the same weights fed empty point clouds) → `drivetrain report` (curves, report.md)
# → `drivetrain viz frame` (a frame's BEV with boxes) → `drivetrain bench iteration --model streampetr` (reference vs
# batched loss path, the seeds' headline) → summary.
# Environment: DEMO_RUN (run directory, default runs/demo; replaced on each demo run), DEMO_STEPS (default 1000),
# DEMO_EVAL_EVERY (default 250). Extra arguments are config overrides for the training, e.g. optim.lr=2e-3.
# Exits non-zero when a step fails or the trained model does not clearly depend on its inputs (X < 0.05 or X < 3·Y).
set -euo pipefail
cd "$(dirname "$0")/.."
run="${DEMO_RUN:-runs/demo}"
steps="${DEMO_STEPS:-1000}"
every="${DEMO_EVAL_EVERY:-250}"
echo "demo: SSN-tiny on the synthetic lidar: set up, train $steps steps on the CPU, score mini_val with the nuScenes" \
  "devkit against a control with the points removed, time a StreamPETR iteration (reference vs batched loss); ~3 min on 2 CPU cores"
bash scripts/setup.sh
venv="${DRIVETRAIN_VENV:-.venv}"
drivetrain="$venv/bin/drivetrain"
start=$(date +%s)

if [ -d "$run" ]; then
  echo "demo: replacing the previous demo run in $run"
  rm -rf "$run"
fi
echo "demo: training SSN-tiny for $steps steps on the CPU → $run"
"$drivetrain" train --config configs/ssn_tiny_demo.yaml run.out_dir="$run" train.steps="$steps" \
  eval.every="$every" checkpoint.every="$every" eval.at_start=true "$@"
echo "demo: scoring the trained model on mini_val"
"$drivetrain" eval --checkpoint "$run" --device cpu --json "$run/eval.json"
echo "demo: control: the same weights on mini_val with every point cloud emptied (--blank-inputs)"
"$drivetrain" eval --checkpoint "$run" --device cpu --blank-inputs --json "$run/eval-blank.json"
"$drivetrain" report "$run" >/dev/null
echo "demo: the run's curves (loss, terms, lr, throughput, data wait, memory, mAP/NDS) → $run/report.md"
"$drivetrain" viz frame --checkpoint "$run" --frame 1 --png "$run/frame-1.png" >/dev/null
echo "demo: mini_val frame 1 from above, points with ground truth and detections → $run/frame-1.png"
echo "demo: one StreamPETR-tiny training iteration, reference vs batched loss path (batch 2, the same weights and frames)"
"$drivetrain" bench iteration --model streampetr --size tiny --batch 2 --repeat 5 --warmup 2 --device cpu
"$venv/bin/python" - "$run" "$start" <<'PY'
import json, sys, time
from pathlib import Path

run, start = Path(sys.argv[1]), float(sys.argv[2])
evals = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "eval/mAP" in r]
print("demo: mini_val over training (step: mAP / NDS)")
for r in evals:
    print(f"  step {r['step']:>5}: {r['eval/mAP']:.4f} / {r['eval/NDS']:.4f}")
x = json.loads((run / "eval.json").read_text())["mAP"]
y = json.loads((run / "eval-blank.json").read_text())["mAP"]
print(f"demo: mAP {x:.4f}")
print(f"demo: control mAP {y:.4f} (the same weights, every point cloud emptied)")
print(f"demo: {(time.time() - start) / 60:.1f} min in all")
if x < 0.05 or x < 3 * y:
    print(f"demo: the trained model does not clearly depend on its inputs (mAP {x:.4f}, control {y:.4f}; "
          "expected mAP ≥ 0.05 and ≥ 3 × control)", file=sys.stderr)
    sys.exit(1)
PY
