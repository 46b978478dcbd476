"""Cross-check drivetrain's Lyft metric against lyft_dataset_sdk's own mAP_evaluation.py.

The SDK is not a drivetrain dependency (it pulls opencv-python beside our opencv-python-headless, numpy 2 against
the nuScenes devkit's numpy<2, and black/flake8/pytest at run time), so run this in a throwaway environment:

    python -m venv /tmp/lyftvenv && /tmp/lyftvenv/bin/pip install numpy shapely pyquaternion
    /tmp/lyftvenv/bin/pip install --no-deps lyft-dataset-sdk            # 0.0.8, the footprint turned by -yaw
    /tmp/lyftvenv/bin/python scripts/lyft_sdk_crosscheck.py --footprint pypi-0.0.8
    # GitHub master (0.0.10, the fixed footprint): pass its file
    /tmp/lyftvenv/bin/python scripts/lyft_sdk_crosscheck.py --sdk-file path/to/mAP_evaluation.py --footprint heading

It draws random scenes (ground truth of seven classes, noisy detections with duplicates and score ties, false
positives of all nine classes, every third scene with a pitched prediction rotation), scores them with the SDK's
``get_average_precisions`` at each of the ten thresholds over ``get_class_names(gt)`` (what mmdetection3d's
``lyft_eval`` does) and with ``lyft_average_precisions`` of ``drivetrain.data.formats.lyft.average_precision``, and
prints the largest AP difference. drivetrain's module is loaded from its file, so the environment needs no torch.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

CLASSES = ["car", "truck", "bus", "emergency_vehicle", "other_vehicle", "motorcycle", "bicycle", "pedestrian", "animal"]


def load(name: str, path: str | Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def quaternion(yaw: float, pitch: float = 0.0) -> list[float]:
    cy, sy, cp, sp = np.cos(yaw / 2), np.sin(yaw / 2), np.cos(pitch / 2), np.sin(pitch / 2)
    return [cy * cp, -sy * sp, cy * sp, sy * cp]  # rotation about z, then about y


def scene(seed: int, samples: int, pitch: float) -> tuple[list[dict], list[dict]]:
    rng = np.random.default_rng(seed)
    gt, pred = [], []
    for s in range(samples):
        token = f"sample-{s:03d}"
        for _ in range(rng.integers(0, 12)):
            name = CLASSES[rng.integers(0, 7)]  # pedestrian and animal get no ground truth
            centre = [1000 + rng.uniform(-40, 40), 2000 + rng.uniform(-40, 40), rng.uniform(-20, -18)]
            size = [rng.uniform(0.5, 3), rng.uniform(0.5, 8), rng.uniform(0.5, 3)]
            yaw = rng.uniform(-np.pi, np.pi)
            gt.append({"sample_token": token, "translation": centre, "size": size, "rotation": quaternion(yaw),
                       "name": name})  # fmt: skip
            for _ in range(rng.integers(0, 3)):  # 0-2 detections of it: misses and duplicates
                pred.append({
                    "sample_token": token,
                    "translation": list(np.array(centre) + rng.normal(0, 0.08, 3)),
                    "size": list(np.array(size) * rng.uniform(0.92, 1.08, 3)),
                    "rotation": quaternion(yaw + rng.normal(0, 0.08), pitch),
                    "name": name,
                    "score": float(np.round(rng.uniform(0, 1), 1)),  # ties on purpose
                })  # fmt: skip
        for _ in range(rng.integers(0, 4)):  # false positives
            pred.append({
                "sample_token": token,
                "translation": [1000 + rng.uniform(-40, 40), 2000 + rng.uniform(-40, 40), -19.0],
                "size": [1.0, 2.0, 1.5],
                "rotation": quaternion(rng.uniform(-3, 3), pitch),
                "name": CLASSES[rng.integers(0, 9)],
                "score": float(rng.uniform(0, 1)),
            })  # fmt: skip
    return gt, pred


def ours(metric, gt: list[dict], pred: list[dict], class_names: list[str], footprint: str) -> np.ndarray:
    tokens = {t: i for i, t in enumerate(sorted({b["sample_token"] for b in gt + pred}))}
    label = {c: i for i, c in enumerate(class_names)}
    pred = [b for b in pred if b["name"] in label]

    def arrays(rows: list[dict]):
        return metric.LyftBoxes(
            np.array([tokens[r["sample_token"]] for r in rows], np.int64).reshape(-1),
            np.array([r["translation"] for r in rows], float).reshape(-1, 3),
            np.array([r["size"] for r in rows], float).reshape(-1, 3),
            np.array([r["rotation"] for r in rows], float).reshape(-1, 4),
            np.array([r.get("score", 1.0) for r in rows], float).reshape(-1),
        )

    labels = [np.array([label[r["name"]] for r in rows], np.int64).reshape(-1) for rows in (gt, pred)]
    return metric.lyft_average_precisions(
        arrays(gt), labels[0], arrays(pred), labels[1], len(class_names), metric.IOU_THRESHOLDS, footprint
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sdk-file", default=None, help="the SDK's mAP_evaluation.py (default: the installed one)")
    parser.add_argument("--footprint", choices=["heading", "pypi-0.0.8"], default="pypi-0.0.8")
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--samples", type=int, default=40, help="samples per random scene")
    args = parser.parse_args()
    if args.sdk_file is None:
        from lyft_dataset_sdk.eval.detection import mAP_evaluation as sdk
    else:
        sdk = load("sdk_map_evaluation", args.sdk_file)
    metric = load(
        "average_precision",
        Path(__file__).resolve().parents[1] / "src/drivetrain/data/formats/lyft/average_precision.py",
    )
    worst, total = 0.0, 0
    for seed in range(args.seeds):
        gt, pred = scene(seed, args.samples, pitch=0.05 if seed % 3 == 2 else 0.0)
        class_names = sdk.get_class_names(gt)
        start = time.perf_counter()
        ref = np.stack([sdk.get_average_precisions(gt, pred, class_names, t) for t in metric.IOU_THRESHOLDS], 1)
        middle = time.perf_counter()
        mine = ours(metric, gt, pred, class_names, args.footprint)
        end = time.perf_counter()
        diff = float(np.abs(ref - mine).max())
        worst, total = max(worst, diff), total + len(pred)
        print(f"seed {seed:2d}: {len(gt)} gt, {len(pred)} predictions, mAP sdk {ref.mean():.6f} ours {mine.mean():.6f}"
              f", max |ΔAP| {diff:.1e} (sdk {middle - start:.2f} s, ours {end - middle:.2f} s)")  # fmt: skip
    print(f"footprint={args.footprint}: max |ΔAP| {worst:.1e} over {args.seeds} scenes, {total} predictions")
    return 0 if worst < 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
