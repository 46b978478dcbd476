"""Predictions in the nuScenes submission format and the devkit's official detection metrics.

``boxes_to_submission`` turns lidar-frame boxes ``(x, y, z_centre, dx, dy, dz, yaw, vx, vy)`` of one frame
into the submission's global-frame records (translation, size as width-length-height, w-x-y-z rotation,
velocity, detection name, score, attribute). ``ground_truth_submission`` does it for the index's ground
truth: evaluated, it must score mAP ≈ 1, which checks every transform between the tables, the index and
back. ``evaluate`` runs ``nuscenes.eval.detection.evaluate.DetectionEval`` (needs the ``nuscenes`` extra).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from drivetrain import safe_json
from drivetrain.data.errors import DataError
from drivetrain.data.nuscenes_format import ATTRIBUTES, CLASSES
from drivetrain.data.table_paths import check_root
from drivetrain.geometry.rigid import matrix_to_quaternion
from drivetrain.safe_files import replace_text

if TYPE_CHECKING:
    from drivetrain.data.index import FrameIndex

__all__ = [
    "boxes_to_submission",
    "check_submission",
    "evaluate",
    "ground_truth_submission",
    "submission_meta",
    "write_submission",
]

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


def ground_truth_submission(index: FrameIndex, scenes: list[str] | None = None, min_points: int = 1) -> dict[str, Any]:
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


def submission_meta(*, camera: bool = True, lidar: bool = False) -> dict[str, bool]:
    """The submission's ``meta`` block: which sensors the predictions used (the model's ``input_modalities``), no
    radar, map or external data."""
    return {"use_camera": camera, "use_lidar": lidar, "use_radar": False, "use_map": False, "use_external": False}


# Fields of a submission box: (length, element check) — the devkit's DetectionBox, checked before it runs.
_VECTORS = {"translation": 3, "size": 3, "rotation": 4, "velocity": 2}


def check_submission(submission: Any, path: Path) -> int:
    """Validate a submission's structure and values; returns the number of boxes.

    Raises:
        DataError: naming the file and the first offending entry (``results[TOKEN][i].FIELD``): a missing or
            non-numeric field, a non-finite value, a size that is not positive, an unknown class or attribute,
            a missing score, or a box whose ``sample_token`` differs from the key it is listed under.
    """
    if not isinstance(submission, dict) or not isinstance(submission.get("results"), dict) or "meta" not in submission:
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


def submission_boxes(submission: dict[str, Any], path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every box of a predictions file's ``results`` with its place ``results[TOKEN][i]``, after the checks a
    nuScenes submission and a Lyft predictions file share: a list per sample token, objects, and each box's
    ``sample_token`` equal to its key. DataError names the file and the entry."""
    for token, boxes in submission["results"].items():
        if not isinstance(boxes, list):
            raise DataError(f"results[{token!r}]: must be a list of boxes, got {type(boxes).__name__}", path)
        for i, box in enumerate(boxes):
            where = f"results[{token!r}][{i}]"
            if not isinstance(box, dict):
                raise DataError(f"{where}: must be an object, got {type(box).__name__}", path)
            if box.get("sample_token") != token:
                found = box.get("sample_token")
                raise DataError(f"{where}.sample_token: {found!r} differs from its key {token!r}", path)
            yield where, box


def check_box_vectors(box: dict[str, Any], where: str, vectors: dict[str, int], path: Path) -> None:
    """The box's vector fields (name → length) are lists of finite numbers, and its ``size`` is positive."""
    for field, length in vectors.items():
        value = box.get(field)
        if not isinstance(value, list) or len(value) != length or not all(is_number(v) for v in value):
            raise DataError(f"{where}.{field}: must be a list of {length} numbers, got {value!r}", path)
        if not np.isfinite(value).all():
            raise DataError(f"{where}.{field}: non-finite value {value!r}", path)
    if min(box["size"]) <= 0:
        raise DataError(f"{where}.size: must be positive, got {box['size']!r}", path)


def _numbers(value: Any, length: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == length
        and all(is_number(v) for v in value)
        and bool(np.isfinite(value).all())
    )


def is_number(value: Any) -> bool:
    """A JSON number (int or float, not bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def write_submission(submission: dict[str, Any], path: str | Path) -> Path:
    """Write ``submission`` as JSON to ``path`` (parent folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return replace_text(path, json.dumps(submission))  # a link at the name is replaced, never written through


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
        submission = safe_json.load(predictions)  # a regular file only (a FIFO would block): OSError otherwise
    except OSError as err:
        raise DataError(f"cannot read predictions ({err.strerror or err})", predictions) from None
    except safe_json.JSONLimitError as err:  # nested too deep, an integer outside 64 bits: the place is named
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
    _check_tokens(nusc, splits[split], submission["results"], split, predictions)
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


def _check_tokens(nusc: Any, scenes: list[str], results: dict[str, Any], split: str, path: Path) -> None:
    """DataError naming the sample tokens the split has and the predictions lack, or the other way round."""
    wanted = set(scenes)
    in_split = {s["token"] for s in nusc.sample if nusc.get("scene", s["scene_token"])["name"] in wanted}
    missing, extra = sorted(in_split - set(results)), sorted(set(results) - in_split)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} sample(s) of split {split!r} have no entry (e.g. {missing[:3]})")
        if extra:
            parts.append(f"{len(extra)} entr(y/ies) are not samples of split {split!r} (e.g. {extra[:3]})")
        raise DataError("; ".join(parts) + "; list every sample of the split, with [] where nothing is detected", path)


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
