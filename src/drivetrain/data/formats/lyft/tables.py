"""Facts of the Lyft Level 5 format and how a root's format is told apart from nuScenes'.

Lyft Level 5 (v1.01) stores the nuScenes schema — the same 13 tables with the same fields, read by a fork of the
nuScenes devkit (``lyft_dataset_sdk``) — with these differences (checked against the SDK 0.0.8 and the tables
of mmdetection3d's Lyft test data):

- ``category`` holds the 9 detection classes themselves (``car``, ``truck``, ...; no ``vehicle.*`` hierarchy
  and no ``index`` field), so a category *is* its class;
- ``sample_annotation.num_lidar_pts`` is ``-1`` (never counted) and ``visibility_token`` is ``""``; attributes
  are ``object_action_*`` names that no detection metric uses; there are no velocities in the metric;
- sensors: ``CAM_FRONT``, ``CAM_FRONT_RIGHT``, ``CAM_FRONT_LEFT``, ``CAM_BACK``, ``CAM_BACK_LEFT``,
  ``CAM_BACK_RIGHT`` (the six nuScenes names), ``CAM_FRONT_ZOOMED``, ``LIDAR_TOP`` and on some cars
  ``LIDAR_FRONT_LEFT`` / ``LIDAR_FRONT_RIGHT``; lidar ``.bin`` files of 5 float32 per point;
- layout: ``<root>/v1.01-train/*.json`` beside ``images/*.jpeg``, ``lidar/*.bin``, ``maps/*.png`` (Kaggle ships
  these as ``train_data``, ``train_images``, ``train_lidar``, ``train_maps``; the ``filename`` fields name
  ``images/``, ``lidar/``, ``maps/``, so those folders must carry these names).

These facts make up the ``LYFT`` record (:mod:`drivetrain.data.formats.lyft.format`), which the rest of drivetrain
asks. An index built from a Lyft root records ``meta["dataset"] = "lyft"``; a nuScenes index has no such key (so that
it stays what it was before Lyft support).
"""

from __future__ import annotations

from pathlib import Path

from drivetrain.data.errors import DataError
from drivetrain.safeio import json_files

__all__ = ["LYFT_ATTRIBUTES", "LYFT_CLASSES", "LYFT_VERSION", "check_lyft_categories", "is_lyft_root"]

LYFT_VERSION = "v1.01-train"

# The Lyft detection classes in the order mmdetection3d numbers them (label = position).
LYFT_CLASSES = (
    "car",
    "truck",
    "bus",
    "emergency_vehicle",
    "other_vehicle",
    "motorcycle",
    "bicycle",
    "pedestrian",
    "animal",
)

# The attribute table of v1.01-train (written by the synthetic generator; the index ignores attributes on Lyft).
LYFT_ATTRIBUTES = (
    "object_action_lane_change_right",
    "object_action_running",
    "object_action_lane_change_left",
    "object_action_parked",
    "object_action_standing",
    "object_action_right_turn",
    "object_action_gliding_on_wheels",
    "object_action_loss_of_control",
    "object_action_u_turn",
    "object_action_sitting",
    "object_action_walking",
    "object_action_stopped",
    "object_action_left_turn",
    "object_action_reversing",
    "is_stationary",
    "object_action_driving_straight_forward",
    "object_action_abnormal_or_traffic_violation",
    "object_action_other_motion",
)


def is_lyft_root(root: str | Path, version: str) -> bool:
    """Whether every category of ``root/version/category.json`` is a Lyft class (the Lyft format's detection rule).

    A missing or unreadable category table is not Lyft's: the caller's root check reports it.
    """
    try:
        rows = json_files.load(Path(root) / version / "category.json")
        names = {row["name"] for row in rows}
    except (OSError, ValueError, TypeError, KeyError):
        return False
    return bool(names) and names <= set(LYFT_CLASSES)


def check_lyft_categories(root: str | Path, version: str) -> None:
    """DataError naming ``category.json`` and the first category that is not a Lyft class (``--format lyft``)."""
    path = Path(root) / version / "category.json"
    try:
        rows = json_files.load(path)
        names = [row["name"] for row in rows]
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise DataError(f"cannot read the category names ({type(err).__name__}: {err})", path) from None
    unknown = [n for n in names if n not in LYFT_CLASSES]
    if unknown:
        raise DataError(f"category {unknown[0]!r} is not a Lyft class {LYFT_CLASSES} (a nuScenes root?)", path)
