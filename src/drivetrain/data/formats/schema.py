"""The schema every supported format stores: the 13 nuScenes tables, the sensor channels and visibility levels, the
token rule of the synthetic sets. nuScenes and Lyft Level 5 write the same tables (the devkits read both); what
differs between them — classes, categories, splits, the metric — lives in each format's package.
"""

from __future__ import annotations

import hashlib

__all__ = ["CAMERAS", "LIDAR", "TABLES", "VISIBILITY_LEVELS", "token"]

# The tables ``nuscenes.NuScenes`` loads from ``<root>/<version>/<name>.json``.
TABLES = (
    "category",
    "attribute",
    "visibility",
    "instance",
    "sensor",
    "calibrated_sensor",
    "ego_pose",
    "log",
    "scene",
    "sample",
    "sample_data",
    "sample_annotation",
    "map",
)

# The camera order the camera models read (the order of ``info['cams']`` in the original converted info files).
CAMERAS = (
    "CAM_FRONT",
    "CAM_FRONT_RIGHT",
    "CAM_FRONT_LEFT",
    "CAM_BACK",
    "CAM_BACK_LEFT",
    "CAM_BACK_RIGHT",
)
LIDAR = "LIDAR_TOP"

# visibility token → level: the fraction of the object visible over all six camera images.
VISIBILITY_LEVELS = {"1": "v0-40", "2": "v40-60", "3": "v60-80", "4": "v80-100"}


def token(*parts: object) -> str:
    """A 32-hex-digit token derived from ``parts`` (deterministic, so a seed gives identical tables)."""
    return hashlib.md5("/".join(str(p) for p in parts).encode()).hexdigest()
