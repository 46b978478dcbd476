"""Lyft Level 5 predictions files and their evaluation with the Lyft metric (:mod:`.lyft_metric`).

A predictions file is what mmdetection3d's Lyft evaluation reads: ``{"meta": {...}, "results": {sample_token:
[box, ...]}}`` with the SDK's box records ``{"sample_token", "translation", "size", "rotation", "name",
"score"}`` in the global frame (``size`` = width, length, height; ``rotation`` w-x-y-z; no velocity, no
attribute). ``lyft_boxes_to_results`` writes such records from lidar-frame boxes; ``lyft_ground_truth_submission``
writes an index's ground truth (every box: the Lyft metric's ground truth has no point-count filter), which
scores mAP 1. ``evaluate_lyft`` reads the ground truth straight from the tables (no devkit needed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from drivetrain import safe_json
from drivetrain.data.errors import DataError
from drivetrain.data.evaluate import check_box_vectors, is_number, submission_boxes
from drivetrain.data.lyft_format import LYFT_CLASSES, LYFT_VERSION
from drivetrain.data.lyft_metric import IOU_THRESHOLDS, LyftBoxes, lyft_average_precisions
from drivetrain.data.lyft_splits import LYFT_SPLITS
from drivetrain.data.table_paths import check_root
from drivetrain.geometry.rigid import yaw_from_matrix, yaw_quaternion
from drivetrain.safe_files import replace_text

if TYPE_CHECKING:
    from drivetrain.data.index import FrameIndex

__all__ = [
    "check_lyft_submission",
    "evaluate_lyft",
    "lyft_boxes_to_results",
    "lyft_ground_truth",
    "lyft_ground_truth_submission",
]


def lyft_boxes_to_results(
    sample_token: str,
    boxes: np.ndarray,
    labels: np.ndarray,
    scores: np.ndarray,
    ego_pose: np.ndarray,
    classes: tuple[str, ...] | list[str] = LYFT_CLASSES,
) -> list[dict[str, Any]]:
    """Lyft box records of one frame, in the global frame.

    Boxes are upright (as Lyft annotates them): the rotation is the global heading alone, so the ego vehicle's
    pitch and roll do not tilt (and, in the metric, shrink) the footprint.

    Args:
        sample_token: the frame's sample token.
        boxes: ``(K, 7+)`` lidar frame ``(x, y, z_centre, dx, dy, dz, yaw, ...)``; velocity columns are ignored.
        labels: ``(K,)`` indices into ``classes``.
        scores: ``(K,)`` detection scores.
        ego_pose: ``(4, 4)`` lidar → global of the frame.
        classes: the class names the labels index (an index's ``meta["classes"]``).

    Returns:
        One record per box.
    """
    if len(labels) == 0:  # a frame without detections (reshape(0, -1) has no width to infer)
        return []
    boxes = np.asarray(boxes, dtype=np.float64).reshape(len(labels), -1)
    rot, trans = np.asarray(ego_pose[:3, :3], np.float64), np.asarray(ego_pose[:3, 3], np.float64)
    out = []
    for k, box in enumerate(boxes):
        c, s = np.cos(box[6]), np.sin(box[6])
        heading = float(yaw_from_matrix(rot @ np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])))
        out.append(
            {
                "sample_token": sample_token,
                "translation": (rot @ box[:3] + trans).tolist(),
                "size": [float(box[4]), float(box[3]), float(box[5])],
                "rotation": yaw_quaternion(heading).tolist(),
                "name": classes[int(labels[k])],
                "score": float(scores[k]),
            }
        )
    return out


def lyft_ground_truth_submission(index: FrameIndex, scenes: list[str] | None = None) -> dict[str, Any]:
    """The ground truth of a Lyft index as a predictions file (score 1), for frames of ``scenes`` (default: all)."""
    if index.format.classes != LYFT_CLASSES:  # its labels index another format's classes
        raise DataError(f"the index was built from a {index.format.title} root, not a Lyft one", index.meta.get("root"))
    arr, meta = index.arrays, index.meta
    wanted = None if scenes is None else set(scenes)
    results: dict[str, list[dict[str, Any]]] = {}
    for f in range(len(index)):
        if wanted is not None and meta["scenes"][arr["scene_id"][f]] not in wanted:
            continue
        sl, token = index.boxes_of(f), meta["sample_tokens"][f]
        boxes, labels = arr["boxes"][sl], arr["labels"][sl]
        results[token] = lyft_boxes_to_results(
            token, boxes, labels, np.ones(len(boxes)), arr["ego_pose"][f], meta["classes"]
        )
    return {"meta": {"use_camera": True, "use_lidar": False}, "results": results}


def check_lyft_submission(submission: Any, path: Path) -> int:
    """Validate a Lyft predictions file's structure and values; returns the number of boxes.

    Raises:
        DataError: naming the file and the first offending entry (``results[TOKEN][i].FIELD``): a missing or
            non-numeric field, a non-finite value, a size that is not positive, a zero quaternion, a class that
            is not a Lyft class, or a box whose ``sample_token`` differs from the key it is listed under.
    """
    if not isinstance(submission, dict) or not isinstance(submission.get("results"), dict):
        raise DataError('Lyft predictions must be {"meta": {...}, "results": {sample_token: [box, ...]}}', path)
    count = 0
    for where, box in submission_boxes(submission, path):
        check_box_vectors(box, where, {"translation": 3, "size": 3, "rotation": 4}, path)
        if not any(box["rotation"]):
            raise DataError(f"{where}.rotation: the zero quaternion is no rotation", path)
        name = box.get("name")
        if not isinstance(name, str) or name not in LYFT_CLASSES:
            hint = " (Lyft records name the class in 'name')" if "detection_name" in box else ""
            raise DataError(f"{where}.name: {name!r} is not one of the Lyft classes {LYFT_CLASSES}{hint}", path)
        score = box.get("score")
        if not is_number(score) or not np.isfinite(score):
            raise DataError(f"{where}.score: must be a finite number, got {score!r}", path)
        count += 1
    return count


def _table(root: Path, version: str, name: str) -> list[dict[str, Any]]:
    return safe_json.load(root / version / f"{name}.json")  # after check_root read it: valid, bounded


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
        footprint: ``"heading"`` or ``"pypi-0.0.8"`` (see :mod:`drivetrain.data.lyft_metric`).

    Returns:
        ``{"mAP", "AP": {class: mean over thresholds}, "mAP_per_iou": {threshold: mAP}, "AP_per_iou": {class:
        [AP per threshold]}, "iou_thresholds", "classes", "classes_without_gt", "footprint", "num_gt",
        "num_predictions"}``; classes without ground truth in the split are left out of the mAP and listed.
    """
    predictions = Path(predictions)
    if not predictions.is_file():
        raise DataError("predictions file does not exist", predictions)
    try:
        submission = safe_json.load(predictions)
    except safe_json.JSONLimitError as err:  # nested too deep, an integer outside 64 bits: the place is named
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
    _check_tokens(tokens, submission["results"], split, predictions)
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


def _check_tokens(tokens: list[str], results: dict[str, Any], split: str, path: Path) -> None:
    """DataError naming the sample tokens the split has and the predictions lack, or the other way round."""
    in_split = set(tokens)
    missing, extra = sorted(in_split - set(results)), sorted(set(results) - in_split)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} sample(s) of split {split!r} have no entry (e.g. {missing[:3]})")
        if extra:
            parts.append(f"{len(extra)} entr(y/ies) are not samples of split {split!r} (e.g. {extra[:3]})")
        raise DataError("; ".join(parts) + "; list every sample of the split, with [] where nothing is detected", path)
