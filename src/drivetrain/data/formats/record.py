"""The record of a dataset format: everything in which one nuScenes-schema dataset differs from another.

Every format drivetrain reads stores the nuScenes schema (the same 13 tables, read with the nuScenes devkit);
what differs is a field of :class:`DatasetFormat`: classes, categories and the category → class map, the default
table folder, the scene splits, the attribute and velocity policy, where ``num_lidar_pts`` comes from, how a root
is recognised, the submission writer, the ground truth as a submission, the metric and how its result is
summarised and printed, and what the synthetic generator writes (:class:`~drivetrain.data.formats.synth_format.
SynthFormat`).

This module is the bottom of ``drivetrain.data.formats``: it imports no format. Each format's package
(``drivetrain.data.formats.<name>``) builds its record from its own modules; the registry
(:mod:`drivetrain.data.formats.registry`) lists the records by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from drivetrain.data.formats.synth_format import SynthFormat

if TYPE_CHECKING:
    import numpy as np

__all__ = ["DatasetFormat", "IndexedFrames", "MetricOptions"]


class IndexedFrames(Protocol):
    """What a ground-truth writer reads of a frame index (:class:`~drivetrain.data.index.FrameIndex` is one)."""

    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]

    def __len__(self) -> int: ...

    @property
    def format(self) -> DatasetFormat:
        """The format the index was built from."""
        ...

    def boxes_of(self, frame: int) -> slice:
        """Rows of the box arrays that belong to ``frame``."""
        ...


@dataclass(frozen=True)
class MetricOptions:
    """How a metric is computed, where the formats offer a choice (each format reads its own field)."""

    devkit_config: str = "detection_cvpr_2019"  # nuScenes: the devkit's detection config
    lyft_footprint: str = (
        "heading"  # Lyft: "heading" or "pypi-0.0.8" (see drivetrain.data.formats.lyft.average_precision)
    )


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
    recognises: Callable[[Path, str], bool]  # whether root/version is of this format (the registry asks in turn)
    check_categories: Callable[[Path, str], None]  # DataError when the root's categories are not of this format
    write_boxes: Callable[..., list[dict[str, Any]]]  # (token, boxes, labels, scores, ego_pose) → one frame's records
    ground_truth: Callable[[IndexedFrames, list[str] | None], dict[str, Any]]  # an index's GT as a predictions file
    metric: Callable[..., dict[str, Any]]  # (predictions, root, *, version, split, out_dir, options) → metrics
    summary: Callable[[dict[str, Any]], dict[str, float]]  # flat numbers for metrics.jsonl and TensorBoard
    report: Callable[[dict[str, Any]], dict[str, Any]]  # what `drivetrain eval` prints (as JSON)
    synth: SynthFormat  # what `data synth --format NAME` writes
