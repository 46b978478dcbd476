"""The dataset formats drivetrain reads, one record each: nuScenes and Lyft Level 5.

Both store the nuScenes schema (the same 13 tables, read with the nuScenes devkit); everything in which they
differ is a field of :class:`DatasetFormat`: classes, categories and the category → class map, the default table
folder, the scene splits, the attribute and velocity policy, where ``num_lidar_pts`` comes from, the submission
writer, the ground truth as a submission, the metric and how its result is summarised and printed.

The format is chosen once, when a root is indexed (:func:`detect_format` from the category table, or named), and
the index records it (:func:`index_meta`; :attr:`~drivetrain.data.index.FrameIndex.format` reads it back). Code
downstream asks the index's record — ``index.format.classes``, ``index.format.metric(...)`` — and never which
dataset it is.

Example:
    >>> from drivetrain.data.formats import FORMATS
    >>> FORMATS["lyft"].default_split, len(FORMATS["nuscenes"].classes)
    ('val', 10)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from drivetrain.data.errors import DataError
from drivetrain.data.evaluate import boxes_to_submission, evaluate, ground_truth_submission
from drivetrain.data.lyft_eval import evaluate_lyft, lyft_boxes_to_results, lyft_ground_truth_submission
from drivetrain.data.lyft_format import LYFT_CLASSES, LYFT_VERSION, check_lyft_categories, detect_dataset
from drivetrain.data.lyft_splits import LYFT_SPLITS
from drivetrain.data.nuscenes_format import ATTRIBUTES, CATEGORIES, CATEGORY_TO_CLASS, CLASSES

if TYPE_CHECKING:
    from drivetrain.data.index import FrameIndex

__all__ = [
    "FORMATS",
    "LYFT",
    "NUSCENES",
    "DatasetFormat",
    "MetricOptions",
    "default_version",
    "detect_format",
    "format_of",
    "index_meta",
]


@dataclass(frozen=True)
class MetricOptions:
    """How a metric is computed, where the formats offer a choice (each format reads its own field)."""

    devkit_config: str = "detection_cvpr_2019"  # nuScenes: the devkit's detection config
    lyft_footprint: str = "heading"  # Lyft: "heading" or "pypi-0.0.8" (see drivetrain.data.lyft_metric)


@dataclass(frozen=True)
class DatasetFormat:
    """Everything in which a nuScenes-schema dataset differs from another (see the module docstring)."""

    name: str  # recorded in the index and typed as `data index --format NAME`
    title: str  # in messages
    version: str  # table folder read when none is given
    classes: tuple[str, ...]  # detection classes; a label is a position in it
    categories: tuple[str, ...]  # every category of the taxonomy (another one is warned about and left out)
    category_to_class: Mapping[str, str]  # category → detection class (categories missing here are not detected)
    attributes: tuple[str, ...]  # attributes indexed (a box's attribute is a position, −1 = none); () = none used
    velocities: bool  # boxes carry the devkit's box_velocity (False: 0, the metric has no velocity)
    count_points: bool  # num_lidar_pts is counted from the key-frame sweep (the tables hold −1), not read
    default_split: str  # the split `drivetrain eval` scores without --split
    splits: Callable[[], dict[str, list[str]]]  # scene names by split name
    check_categories: Callable[[Path, str], None]  # DataError when the root's categories are not of this format
    write_boxes: Callable[..., list[dict[str, Any]]]  # (token, boxes, labels, scores, ego_pose) → one frame's records
    ground_truth: Callable[[FrameIndex, list[str] | None], dict[str, Any]]  # an index's GT as a predictions file
    metric: Callable[..., dict[str, Any]]  # (predictions, root, *, version, split, out_dir, options) → metrics
    summary: Callable[[dict[str, Any]], dict[str, float]]  # flat numbers for metrics.jsonl and TensorBoard
    report: Callable[[dict[str, Any]], dict[str, Any]]  # what `drivetrain eval` prints (as JSON)


def _nuscenes_splits() -> dict[str, list[str]]:
    """The devkit's scene splits (nuScenes trainval/test/mini), by split name."""
    from nuscenes.utils.splits import create_splits_scenes

    return {name: list(scenes) for name, scenes in create_splits_scenes(verbose=False).items()}


def _any_categories(root: Path, version: str) -> None:
    """nuScenes takes any category table: categories it lacks are warned about and left out while indexing."""


def _nuscenes_metric(
    predictions: str | Path, root: str | Path, *, version: str, split: str, out_dir: Path | None, options: MetricOptions
) -> dict[str, Any]:
    return evaluate(predictions, root, version=version, split=split, out_dir=out_dir, config=options.devkit_config)


def _nuscenes_summary(metrics: dict[str, Any]) -> dict[str, float]:
    out = {"mAP": float(metrics["mean_ap"]), "NDS": float(metrics["nd_score"])}
    out.update({k: float(v) for k, v in metrics["tp_errors"].items()})
    out.update({f"AP/{name}": float(v) for name, v in metrics["mean_dist_aps"].items()})
    return out


def _nuscenes_report(metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        "mAP": metrics["mean_ap"],
        "NDS": metrics["nd_score"],
        **metrics["tp_errors"],
        "AP": metrics.get("mean_dist_aps", {}),
    }


def _lyft_metric(
    predictions: str | Path, root: str | Path, *, version: str, split: str, out_dir: Path | None, options: MetricOptions
) -> dict[str, Any]:
    return evaluate_lyft(
        predictions, root, version=version, split=split, out_dir=out_dir, footprint=options.lyft_footprint
    )


def _lyft_summary(metrics: dict[str, Any]) -> dict[str, float]:
    return {"mAP": float(metrics["mAP"]), **{f"AP/{name}": float(v) for name, v in metrics["AP"].items()}}


def _lyft_report(metrics: dict[str, Any]) -> dict[str, Any]:
    keys = ("mAP", "AP", "mAP_per_iou", "classes_without_gt", "footprint", "num_gt", "num_predictions")
    return {k: metrics[k] for k in keys}


def _lyft_boxes(
    token: str, boxes: np.ndarray, labels: np.ndarray, scores: np.ndarray, ego_pose: np.ndarray
) -> list[dict[str, Any]]:
    return lyft_boxes_to_results(token, boxes, labels, scores, ego_pose, LYFT_CLASSES)


NUSCENES = DatasetFormat(
    name="nuscenes",
    title="nuScenes",
    version="v1.0-mini",
    classes=CLASSES,
    categories=CATEGORIES,
    category_to_class=CATEGORY_TO_CLASS,
    attributes=ATTRIBUTES,
    velocities=True,
    count_points=False,
    default_split="mini_val",
    splits=_nuscenes_splits,
    check_categories=_any_categories,
    write_boxes=boxes_to_submission,
    ground_truth=ground_truth_submission,
    metric=_nuscenes_metric,
    summary=_nuscenes_summary,
    report=_nuscenes_report,
)

# Lyft Level 5 (drivetrain.data.lyft_format): a category is its class; object_action_* attributes and visibility are
# used by no detection metric, velocities are not in it; the tables hold num_lidar_pts = −1; mmdetection3d's splits.
LYFT = DatasetFormat(
    name="lyft",
    title="Lyft Level 5",
    version=LYFT_VERSION,
    classes=LYFT_CLASSES,
    categories=LYFT_CLASSES,
    category_to_class={c: c for c in LYFT_CLASSES},
    attributes=(),
    velocities=False,
    count_points=True,
    default_split="val",
    splits=lambda: {name: list(scenes) for name, scenes in LYFT_SPLITS.items()},
    check_categories=check_lyft_categories,
    write_boxes=_lyft_boxes,
    ground_truth=lyft_ground_truth_submission,
    metric=_lyft_metric,
    summary=_lyft_summary,
    report=_lyft_report,
)

FORMATS: dict[str, DatasetFormat] = {f.name: f for f in (NUSCENES, LYFT)}
DEFAULT = NUSCENES  # an index without a recorded format (every nuScenes index) is of this one


def format_of(meta: Mapping[str, Any]) -> DatasetFormat:
    """The format an index's metadata records; DataError naming the root for a name drivetrain does not know."""
    name = meta.get("dataset", DEFAULT.name)
    if name not in FORMATS:
        raise DataError(f"index of unknown dataset format {name!r}; known: {sorted(FORMATS)}", meta.get("root"))
    return FORMATS[name]


def index_meta(fmt: DatasetFormat) -> dict[str, str]:
    """What an index records of its format: nothing for the default one (so a nuScenes index keeps exactly the
    metadata it had before Lyft support), else ``{"dataset": name}``."""
    return {} if fmt is DEFAULT else {"dataset": fmt.name}


def detect_format(root: str | Path, version: str) -> DatasetFormat:
    """The format of ``root/version``, told from its category table (every name a Lyft class: Lyft)."""
    return FORMATS[detect_dataset(root, version)]


def default_version(root: str | Path, name: str | None = None) -> str:
    """The table folder to read when none is given: format ``name``'s; without a name ``v1.0-mini``, or the one
    folder of another format when only that exists (a Lyft root's ``v1.01-train``)."""
    if name is not None:
        return FORMATS[name].version
    root = Path(root)
    if (root / DEFAULT.version).is_dir():
        return DEFAULT.version
    present = [f.version for f in FORMATS.values() if (root / f.version).is_dir()]
    return present[0] if present else DEFAULT.version
