"""Lyft Level 5 predictions files: written from boxes, an index's ground truth as one, and checked.

A predictions file is what mmdetection3d's Lyft evaluation reads: ``{"meta": {...}, "results": {sample_token:
[box, ...]}}`` with the SDK's box records ``{"sample_token", "translation", "size", "rotation", "name",
"score"}`` in the global frame (``size`` = width, length, height; ``rotation`` w-x-y-z; no velocity, no
attribute). ``lyft_boxes_to_results`` writes such records from lidar-frame boxes; ``lyft_ground_truth_submission``
writes an index's ground truth (every box: the Lyft metric's ground truth has no point-count filter), which
scores mAP 1; ``check_lyft_submission`` validates a file before the metric (:mod:`.metric`) reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from drivetrain.data.errors import DataError
from drivetrain.data.formats.lyft.tables import LYFT_CLASSES
from drivetrain.data.formats.record import IndexedFrames
from drivetrain.data.formats.submission import check_box_vectors, is_number, submission_boxes
from drivetrain.geometry.rigid import yaw_from_matrix, yaw_quaternion

__all__ = ["check_lyft_submission", "lyft_boxes_to_results", "lyft_ground_truth_submission"]


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


def lyft_ground_truth_submission(index: IndexedFrames, scenes: list[str] | None = None) -> dict[str, Any]:
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
