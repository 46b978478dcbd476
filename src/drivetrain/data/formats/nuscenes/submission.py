"""Predictions in the nuScenes submission format: written from boxes, the ground truth as one, and checked.

``boxes_to_submission`` turns lidar-frame boxes ``(x, y, z_centre, dx, dy, dz, yaw, vx, vy)`` of one frame
into the submission's global-frame records (translation, size as width-length-height, w-x-y-z rotation,
velocity, detection name, score, attribute). ``ground_truth_submission`` does it for the index's ground
truth: evaluated, it must score mAP ≈ 1, which checks every transform between the tables, the index and
back. ``check_submission`` validates a submission before the devkit's metric (:mod:`.metric`) reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from drivetrain.data.errors import DataError
from drivetrain.data.formats.nuscenes.tables import ATTRIBUTES, CLASSES
from drivetrain.data.formats.record import IndexedFrames
from drivetrain.data.formats.submission import check_box_vectors, is_number, submission_boxes, submission_meta
from drivetrain.geometry.rigid import matrix_to_quaternion

__all__ = ["DEFAULT_ATTRIBUTE", "boxes_to_submission", "check_submission", "ground_truth_submission"]

# The attribute reported for a class when a prediction has none (the most common one in nuScenes).
DEFAULT_ATTRIBUTE = {
    "car": "vehicle.parked",
    "truck": "vehicle.parked",
    "construction_vehicle": "vehicle.parked",
    "bus": "vehicle.moving",
    "trailer": "vehicle.parked",
    "barrier": "",
    "motorcycle": "cycle.without_rider",
    "bicycle": "cycle.without_rider",
    "pedestrian": "pedestrian.moving",
    "traffic_cone": "",
}


def boxes_to_submission(
    sample_token: str,
    boxes: np.ndarray,
    labels: np.ndarray,
    scores: np.ndarray,
    ego_pose: np.ndarray,
    attributes: np.ndarray | None = None,
) -> list[dict[str, Any]]:
    """Submission records of one frame.

    Args:
        sample_token: the frame's sample token.
        boxes: ``(K, 9)`` lidar frame ``(x, y, z_centre, dx, dy, dz, yaw, vx, vy)``.
        labels: ``(K,)`` indices into ``CLASSES``.
        scores: ``(K,)`` detection scores.
        ego_pose: ``(4, 4)`` lidar → global of the frame.
        attributes: ``(K,)`` indices into ``ATTRIBUTES`` (−1 or absent: the class default).

    Returns:
        One ``sample_result`` dict per box, in the global frame, as the devkit reads them.
    """
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 9)
    rot, trans = np.asarray(ego_pose[:3, :3], np.float64), np.asarray(ego_pose[:3, 3], np.float64)
    out = []
    for k, box in enumerate(boxes):
        name = CLASSES[int(labels[k])]
        c, s = np.cos(box[6]), np.sin(box[6])
        box_rot = rot @ np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
        velocity = rot @ np.array([box[7], box[8], 0.0])
        attr = DEFAULT_ATTRIBUTE[name]
        if attributes is not None and attributes[k] >= 0 and DEFAULT_ATTRIBUTE[name]:
            attr = ATTRIBUTES[int(attributes[k])]
        out.append(
            {
                "sample_token": sample_token,
                "translation": (rot @ box[:3] + trans).tolist(),
                "size": [float(box[4]), float(box[3]), float(box[5])],
                "rotation": matrix_to_quaternion(box_rot).tolist(),
                "velocity": velocity[:2].tolist(),
                "detection_name": name,
                "detection_score": float(scores[k]),
                "attribute_name": attr,
            }
        )
    return out


def ground_truth_submission(
    index: IndexedFrames, scenes: list[str] | None = None, min_points: int = 1
) -> dict[str, Any]:
    """The index's ground truth as a submission (score 1), for frames of ``scenes`` (default: all).

    Boxes with fewer than ``min_points`` lidar points are left out, as the evaluation drops such GT.
    """
    arr, meta = index.arrays, index.meta
    if index.format.classes != CLASSES:  # its labels index another format's classes: ask index.format.ground_truth
        raise DataError(f"the index was built from a {index.format.title} root, not a nuScenes one", meta.get("root"))
    wanted = None if scenes is None else set(scenes)
    results: dict[str, list[dict[str, Any]]] = {}
    for f in range(len(index)):
        if wanted is not None and meta["scenes"][arr["scene_id"][f]] not in wanted:
            continue
        sl = index.boxes_of(f)
        keep = arr["num_lidar_pts"][sl] >= min_points
        boxes, labels, attrs = arr["boxes"][sl][keep], arr["labels"][sl][keep], arr["attribute"][sl][keep]
        token = meta["sample_tokens"][f]
        results[token] = boxes_to_submission(token, boxes, labels, np.ones(len(boxes)), arr["ego_pose"][f], attrs)
    return {"meta": submission_meta(), "results": results}


# Fields of a submission box: (length, element check) — the devkit's DetectionBox, checked before it runs.
_VECTORS = {"translation": 3, "size": 3, "rotation": 4, "velocity": 2}


def check_submission(submission: Any, path: Path) -> int:
    """Validate a submission's structure and values; returns the number of boxes.

    Raises:
        DataError: naming the file and the first offending entry (``results[TOKEN][i].FIELD``): a missing or
            non-numeric field, a non-finite value, a size that is not positive, an unknown class or attribute,
            a missing score, or a box whose ``sample_token`` differs from the key it is listed under.
    """
    # the devkit copies "meta" as a dict (DetectionEval.main: self.meta.copy())
    if (
        not isinstance(submission, dict)
        or not isinstance(submission.get("results"), dict)
        or not isinstance(submission.get("meta"), dict)
    ):
        raise DataError('predictions must be a nuScenes submission: {"meta": {...}, "results": {token: [...]}}', path)
    attributes = {"", *ATTRIBUTES}
    count = 0
    for where, box in submission_boxes(submission, path):
        check_box_vectors(box, where, _VECTORS, path)
        if not isinstance(box.get("detection_name"), str) or box["detection_name"] not in CLASSES:
            raise DataError(f"{where}.detection_name: {box.get('detection_name')!r} is not one of {CLASSES}", path)
        score = box.get("detection_score")
        if not is_number(score) or not np.isfinite(score):
            raise DataError(f"{where}.detection_score: must be a finite number, got {score!r}", path)
        if "ego_translation" in box and not _numbers(box["ego_translation"], 3):
            raise DataError(f"{where}.ego_translation: must be a list of 3 finite numbers", path)
        if "num_pts" in box and not (is_number(box["num_pts"]) and float(box["num_pts"]).is_integer()):
            raise DataError(f"{where}.num_pts: must be an integer, got {box['num_pts']!r}", path)
        attribute = box.get("attribute_name")
        if not isinstance(attribute, str) or attribute not in attributes:  # required by the devkit, "" = none
            raise DataError(f"{where}.attribute_name: {box.get('attribute_name')!r} is not a nuScenes attribute", path)
        count += 1
    return count


def _numbers(value: Any, length: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == length
        and all(is_number(v) for v in value)
        and bool(np.isfinite(value).all())
    )
