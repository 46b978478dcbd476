"""The Lyft metric of a predictions file over a split: the ground truth read straight from the tables (no devkit
needed), the file checked, average precisions by :mod:`.average_precision`, the summary written beside it; and what
``drivetrain eval`` and the trainer's metrics take of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from drivetrain.data.errors import DataError
from drivetrain.data.formats.lyft.average_precision import IOU_THRESHOLDS, LyftBoxes, lyft_average_precisions
from drivetrain.data.formats.lyft.splits import LYFT_SPLITS
from drivetrain.data.formats.lyft.submission import check_lyft_submission
from drivetrain.data.formats.lyft.tables import LYFT_CLASSES, LYFT_VERSION
from drivetrain.data.formats.record import MetricOptions
from drivetrain.data.formats.submission import check_sample_tokens
from drivetrain.data.table_paths import check_root
from drivetrain.safeio import json_files
from drivetrain.safeio.files import replace_text

__all__ = ["evaluate_lyft", "lyft_ground_truth", "lyft_metric", "lyft_report", "lyft_summary"]


def _table(root: Path, version: str, name: str) -> list[dict[str, Any]]:
    return json_files.load(root / version / f"{name}.json")  # after check_root read it: valid, bounded


def lyft_ground_truth(
    root: str | Path, version: str, scenes: list[str]
) -> tuple[list[str], dict[str, list[dict[str, Any]]]]:
    """The sample tokens of ``scenes`` (scene order, then time) and their annotations of the Lyft classes.

    Returns:
        ``(sample_tokens, {sample_token: [record, ...]})`` with the SDK's ground-truth records (``translation``,
        ``size``, ``rotation``, ``name``).

    Raises:
        DataError: naming the table folder when a table lacks a field or a token dangles.
    """
    root = Path(root)
    position = {name: i for i, name in enumerate(scenes)}
    try:
        wanted = {s["token"]: position[s["name"]] for s in _table(root, version, "scene") if s["name"] in position}
        samples = sorted(
            (s for s in _table(root, version, "sample") if s["scene_token"] in wanted),
            key=lambda s: (wanted[s["scene_token"]], s["timestamp"]),
        )
        class_of = {c["token"]: c["name"] for c in _table(root, version, "category")}
        instance_class = {i["token"]: class_of[i["category_token"]] for i in _table(root, version, "instance")}
        gt: dict[str, list[dict[str, Any]]] = {s["token"]: [] for s in samples}
        for ann in _table(root, version, "sample_annotation"):
            name = instance_class[ann["instance_token"]]
            if ann["sample_token"] in gt and name in LYFT_CLASSES:
                record = {k: ann[k] for k in ("translation", "size", "rotation")}
                gt[ann["sample_token"]].append({"sample_token": ann["sample_token"], **record, "name": name})
    except (KeyError, TypeError) as err:
        raise DataError(
            f"inconsistent Lyft tables ({type(err).__name__}: {err}); regenerate or repair them", root / version
        ) from None
    return [s["token"] for s in samples], gt


def evaluate_lyft(
    predictions: str | Path,
    root: str | Path,
    *,
    version: str = LYFT_VERSION,
    split: str = "val",
    out_dir: str | Path | None = None,
    footprint: str = "heading",
) -> dict[str, Any]:
    """The Lyft metric of a predictions file over the samples of ``split``; writes ``out_dir/lyft_metrics.json``.

    Args:
        predictions: the predictions file (see the module docstring); it must list every sample of the split
            (``[]`` where nothing is detected) and no other.
        root: Lyft-format root (holds ``version/``).
        version: table folder.
        split: ``train`` or ``val`` (mmdetection3d's Lyft split).
        out_dir: metrics folder (default: ``<predictions stem>_eval`` beside the file).
        footprint: ``"heading"`` or ``"pypi-0.0.8"`` (see :mod:`drivetrain.data.formats.lyft.average_precision`).

    Returns:
        ``{"mAP", "AP": {class: mean over thresholds}, "mAP_per_iou": {threshold: mAP}, "AP_per_iou": {class:
        [AP per threshold]}, "iou_thresholds", "classes", "classes_without_gt", "footprint", "num_gt",
        "num_predictions"}``; classes without ground truth in the split are left out of the mAP and listed.
    """
    predictions = Path(predictions)
    if not predictions.is_file():
        raise DataError("predictions file does not exist", predictions)
    try:
        submission = json_files.load(predictions)
    except json_files.JSONLimitError as err:  # nested too deep, an integer outside 64 bits: the place is named
        raise DataError(f"predictions: {err}", predictions) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"predictions are not valid JSON ({err})", predictions) from None
    num_boxes = check_lyft_submission(submission, predictions)
    root = check_root(root, version)
    if split not in LYFT_SPLITS:
        raise DataError(f"unknown Lyft split {split!r}; there are {sorted(LYFT_SPLITS)}", "--split")
    tokens, gt = lyft_ground_truth(root, version, list(LYFT_SPLITS[split]))
    if not tokens:
        raise DataError(f"no scene of Lyft split {split!r} is in this root", root / version / "scene.json")
    check_sample_tokens(set(tokens), submission["results"], split, predictions)
    sample_id = {t: i for i, t in enumerate(tokens)}
    gt_rows = [r for t in tokens for r in gt[t]]
    pred_rows = [r for t in submission["results"] for r in submission["results"][t]]
    if not gt_rows:
        raise DataError(f"split {split!r} has no annotations of the Lyft classes: its mAP is undefined", root / version)
    aps = lyft_average_precisions(
        _boxes(gt_rows, sample_id), _labels(gt_rows), _boxes(pred_rows, sample_id), _labels(pred_rows),
        len(LYFT_CLASSES), IOU_THRESHOLDS, footprint,
    )  # fmt: skip
    summary = _summary(aps, footprint, len(gt_rows), num_boxes)
    out = Path(out_dir) if out_dir is not None else predictions.parent / f"{predictions.stem}_eval"
    try:
        out.mkdir(parents=True, exist_ok=True)
        replace_text(out / "lyft_metrics.json", json.dumps(summary, indent=2))  # a link at the name is replaced
    except OSError as err:
        raise DataError(f"cannot write the metrics ({err.strerror})", out) from None
    return summary


def _boxes(rows: list[dict[str, Any]], sample_id: dict[str, int]) -> LyftBoxes:
    def column(key: str, width: int) -> np.ndarray:
        return np.array([r[key] for r in rows], dtype=np.float64).reshape(len(rows), width)

    return LyftBoxes(
        sample=np.array([sample_id[r["sample_token"]] for r in rows], dtype=np.int64),
        translation=column("translation", 3),
        size=column("size", 3),
        rotation=column("rotation", 4),
        score=np.array([r.get("score", 1.0) for r in rows], dtype=np.float64),
    )


def _labels(rows: list[dict[str, Any]]) -> np.ndarray:
    label = {name: i for i, name in enumerate(LYFT_CLASSES)}
    return np.array([label[r["name"]] for r in rows], dtype=np.int64)


def _summary(aps: np.ndarray, footprint: str, num_gt: int, num_predictions: int) -> dict[str, Any]:
    """The metrics of ``aps`` ``(C, T)`` (NaN rows: classes without ground truth)."""
    has_gt = ~np.isnan(aps[:, 0])  # (C,)
    evaluated = [c for c, ok in zip(LYFT_CLASSES, has_gt, strict=True) if ok]
    return {
        "mAP": float(aps[has_gt].mean()),
        "AP": {c: float(aps[i].mean()) for i, c in enumerate(LYFT_CLASSES) if has_gt[i]},
        "mAP_per_iou": {str(t): float(aps[has_gt, k].mean()) for k, t in enumerate(IOU_THRESHOLDS)},
        "AP_per_iou": {c: aps[i].tolist() for i, c in enumerate(LYFT_CLASSES) if has_gt[i]},
        "iou_thresholds": list(IOU_THRESHOLDS),
        "classes": evaluated,
        "classes_without_gt": [c for c in LYFT_CLASSES if c not in evaluated],
        "footprint": footprint,
        "num_gt": num_gt,
        "num_predictions": num_predictions,
    }


def lyft_metric(
    predictions: str | Path, root: str | Path, *, version: str, split: str, out_dir: Path | None, options: MetricOptions
) -> dict[str, Any]:
    """The record's metric: :func:`evaluate_lyft` with the footprint of ``options``."""
    return evaluate_lyft(
        predictions, root, version=version, split=split, out_dir=out_dir, footprint=options.lyft_footprint
    )


def lyft_summary(metrics: dict[str, Any]) -> dict[str, float]:
    """mAP and the AP per class, flat (for metrics.jsonl and TensorBoard)."""
    return {"mAP": float(metrics["mAP"]), **{f"AP/{name}": float(v) for name, v in metrics["AP"].items()}}


def lyft_report(metrics: dict[str, Any]) -> dict[str, Any]:
    """What ``drivetrain eval`` prints of the metrics."""
    keys = ("mAP", "AP", "mAP_per_iou", "classes_without_gt", "footprint", "num_gt", "num_predictions")
    return {k: metrics[k] for k in keys}
