"""The ``LYFT`` record: Lyft Level 5 as :class:`~drivetrain.data.formats.record.DatasetFormat` holds it, and how a
root is recognised as Lyft's (:func:`~drivetrain.data.formats.lyft.tables.is_lyft_root`: every category a Lyft class).

A category is its class; ``object_action_*`` attributes and visibility are used by no detection metric, velocities
are not in it; the tables hold ``num_lidar_pts`` = −1 (counted from the key-frame sweep instead); mmdetection3d's
splits. The predictions writer and the metric are imported when first called (see
:mod:`drivetrain.data.formats.nuscenes.format`).
"""

from __future__ import annotations

from typing import Any

from drivetrain.data.formats.lyft.splits import LYFT_SPLITS
from drivetrain.data.formats.lyft.synth import LYFT_SYNTH
from drivetrain.data.formats.lyft.tables import LYFT_CLASSES, LYFT_VERSION, check_lyft_categories, is_lyft_root
from drivetrain.data.formats.record import DatasetFormat

__all__ = ["LYFT", "is_lyft_root"]


def _write_boxes(*args: Any) -> list[dict[str, Any]]:
    """``(token, boxes, labels, scores, ego_pose)`` → the frame's Lyft records, labels indexing the Lyft classes."""
    from drivetrain.data.formats.lyft.submission import lyft_boxes_to_results

    return lyft_boxes_to_results(*args, LYFT_CLASSES)


def _ground_truth(*args: Any, **kwargs: Any) -> dict[str, Any]:
    from drivetrain.data.formats.lyft.submission import lyft_ground_truth_submission

    return lyft_ground_truth_submission(*args, **kwargs)


def _metric(*args: Any, **kwargs: Any) -> dict[str, Any]:
    from drivetrain.data.formats.lyft.metric import lyft_metric

    return lyft_metric(*args, **kwargs)


def _summary(metrics: dict[str, Any]) -> dict[str, float]:
    from drivetrain.data.formats.lyft.metric import lyft_summary

    return lyft_summary(metrics)


def _report(metrics: dict[str, Any]) -> dict[str, Any]:
    from drivetrain.data.formats.lyft.metric import lyft_report

    return lyft_report(metrics)


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
    recognises=is_lyft_root,
    check_categories=check_lyft_categories,
    write_boxes=_write_boxes,
    ground_truth=_ground_truth,
    metric=_metric,
    summary=_summary,
    report=_report,
    synth=LYFT_SYNTH,
)
