"""The nuScenes detection metric of a submission file: the devkit's ``DetectionEval`` (needs the ``nuscenes``
extra), after drivetrain's own checks of the file and of its sample tokens against the split; its summary and what
``drivetrain eval`` prints of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from drivetrain.data.errors import DataError
from drivetrain.data.formats.nuscenes.submission import check_submission
from drivetrain.data.formats.record import MetricOptions
from drivetrain.data.formats.submission import check_sample_tokens
from drivetrain.data.table_paths import check_root
from drivetrain.safeio import json_files
from drivetrain.safeio.files import replace_text

__all__ = ["evaluate", "nuscenes_metric", "nuscenes_report", "nuscenes_summary"]


def evaluate(
    predictions: str | Path,
    root: str | Path,
    *,
    version: str = "v1.0-mini",
    split: str = "mini_val",
    out_dir: str | Path | None = None,
    config: str = "detection_cvpr_2019",
    verbose: bool = False,
) -> dict[str, Any]:
    """Official nuScenes detection metrics of a submission file; returns the devkit's metrics summary
    (``mean_ap``, ``nd_score``, ``tp_errors``, ``mean_dist_aps``, ...) and writes it to ``out_dir``."""
    predictions = Path(predictions)
    if not predictions.exists():
        raise DataError("predictions file does not exist", predictions)
    try:
        submission = json_files.load(predictions)  # a regular file only (a FIFO would block): OSError otherwise
    except OSError as err:
        raise DataError(f"cannot read predictions ({err.strerror or err})", predictions) from None
    except json_files.JSONLimitError as err:  # nested too deep, an integer outside 64 bits: the place is named
        raise DataError(f"predictions: {err}", predictions) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"predictions are not valid JSON ({err})", predictions) from None
    num_boxes = check_submission(submission, predictions)
    root = check_root(root, version)
    try:
        from nuscenes import NuScenes
        from nuscenes.eval.common.config import config_factory
        from nuscenes.eval.detection.evaluate import DetectionEval
        from nuscenes.utils.splits import create_splits_scenes
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("evaluation needs the nuScenes devkit: pip install 'drivetrain[nuscenes]'") from err
    splits = create_splits_scenes()
    if split not in splits:
        raise DataError(f"unknown split {split!r}; the devkit has {sorted(splits)}", "--split")
    try:
        eval_config = config_factory(config)
    except (AssertionError, FileNotFoundError, ValueError):
        raise DataError(f"unknown devkit detection config {config!r} (e.g. detection_cvpr_2019)", "--config") from None
    nusc = NuScenes(version=version, dataroot=str(root), verbose=verbose)
    wanted = set(splits[split])
    in_split = {s["token"] for s in nusc.sample if nusc.get("scene", s["scene_token"])["name"] in wanted}
    check_sample_tokens(in_split, submission["results"], split, predictions)
    out = Path(out_dir) if out_dir is not None else predictions.parent / f"{predictions.stem}_eval"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(f"cannot create the metrics folder ({err.strerror})", out) from None
    if num_boxes == 0:
        return _no_detections(eval_config, out)
    try:
        evaluator = DetectionEval(nusc, eval_config, str(predictions), split, str(out), verbose=verbose)
    except AssertionError as err:
        raise DataError(f"the devkit rejected the predictions: {err}", predictions) from None
    return evaluator.main(plot_examples=0, render_curves=False)


def _no_detections(eval_config: Any, out: Path) -> dict[str, Any]:
    """The metrics of a submission without a single box (the devkit cannot evaluate one): every AP is 0 and
    every true-positive error is 1, so mAP and NDS are 0."""
    errors = {"trans_err": 1.0, "scale_err": 1.0, "orient_err": 1.0, "vel_err": 1.0, "attr_err": 1.0}
    summary = {
        "mean_ap": 0.0,
        "nd_score": 0.0,
        "tp_errors": errors,
        "mean_dist_aps": dict.fromkeys(eval_config.class_names, 0.0),
        "note": "no detections at all: scored 0 without running the devkit",
    }
    replace_text(out / "metrics_summary.json", json.dumps(summary, indent=2))  # a link at the name is replaced
    return summary


def nuscenes_metric(
    predictions: str | Path, root: str | Path, *, version: str, split: str, out_dir: Path | None, options: MetricOptions
) -> dict[str, Any]:
    """The record's metric: :func:`evaluate` with the devkit config of ``options``."""
    return evaluate(predictions, root, version=version, split=split, out_dir=out_dir, config=options.devkit_config)


def nuscenes_summary(metrics: dict[str, Any]) -> dict[str, float]:
    """mAP, NDS, the true-positive errors and the AP per class, flat (for metrics.jsonl and TensorBoard)."""
    out = {"mAP": float(metrics["mean_ap"]), "NDS": float(metrics["nd_score"])}
    out.update({k: float(v) for k, v in metrics["tp_errors"].items()})
    out.update({f"AP/{name}": float(v) for name, v in metrics["mean_dist_aps"].items()})
    return out


def nuscenes_report(metrics: dict[str, Any]) -> dict[str, Any]:
    """What ``drivetrain eval`` prints of the metrics."""
    return {
        "mAP": metrics["mean_ap"],
        "NDS": metrics["nd_score"],
        **metrics["tp_errors"],
        "AP": metrics.get("mean_dist_aps", {}),
    }
