"""The ``NUSCENES`` record: nuScenes as :class:`~drivetrain.data.formats.record.DatasetFormat` holds it, and how a
root is recognised as nuScenes (any nuScenes-schema root another format does not claim: the registry's default).

The submission writer and the metric are imported when first called, so that the registry — which the command line
reads for its ``--format`` choices — loads neither NumPy's users nor torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drivetrain.data.formats.nuscenes.splits import nuscenes_splits
from drivetrain.data.formats.nuscenes.synth import NUSCENES_SYNTH
from drivetrain.data.formats.nuscenes.tables import ATTRIBUTES, CATEGORIES, CATEGORY_TO_CLASS, CLASSES
from drivetrain.data.formats.record import DatasetFormat

__all__ = ["NUSCENES", "is_nuscenes_root"]


def is_nuscenes_root(root: str | Path, version: str) -> bool:
    """Every nuScenes-schema root is one (its categories need not all be nuScenes'): the rule of last resort."""
    return True


def _any_categories(root: Path, version: str) -> None:
    """nuScenes takes any category table: categories it lacks are warned about and left out while indexing."""


def _write_boxes(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    from drivetrain.data.formats.nuscenes.submission import boxes_to_submission

    return boxes_to_submission(*args, **kwargs)


def _ground_truth(*args: Any, **kwargs: Any) -> dict[str, Any]:
    from drivetrain.data.formats.nuscenes.submission import ground_truth_submission

    return ground_truth_submission(*args, **kwargs)


def _metric(*args: Any, **kwargs: Any) -> dict[str, Any]:
    from drivetrain.data.formats.nuscenes.metric import nuscenes_metric

    return nuscenes_metric(*args, **kwargs)


def _summary(metrics: dict[str, Any]) -> dict[str, float]:
    from drivetrain.data.formats.nuscenes.metric import nuscenes_summary

    return nuscenes_summary(metrics)


def _report(metrics: dict[str, Any]) -> dict[str, Any]:
    from drivetrain.data.formats.nuscenes.metric import nuscenes_report

    return nuscenes_report(metrics)


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
    splits=nuscenes_splits,
    recognises=is_nuscenes_root,
    check_categories=_any_categories,
    write_boxes=_write_boxes,
    ground_truth=_ground_truth,
    metric=_metric,
    summary=_summary,
    report=_report,
    synth=NUSCENES_SYNTH,
)
