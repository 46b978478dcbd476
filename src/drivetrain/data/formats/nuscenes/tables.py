"""Facts of the nuScenes format that every part of ``drivetrain.data`` shares.

Table names and the fields the devkit reads, the camera order StreamPETR uses, the ten detection
classes and the map from nuScenes categories to them, attributes and visibility levels. Nothing here
imports the devkit; ``tests/test_data_index.py`` checks the category map equals the devkit's.
"""

from __future__ import annotations

import hashlib

__all__ = [
    "ATTRIBUTES",
    "CAMERAS",
    "CATEGORY_TO_CLASS",
    "CLASSES",
    "LIDAR",
    "TABLES",
    "VISIBILITY_LEVELS",
    "token",
]

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

# StreamPETR's camera order (the order of ``info['cams']`` in its converted info files).
CAMERAS = (
    "CAM_FRONT",
    "CAM_FRONT_RIGHT",
    "CAM_FRONT_LEFT",
    "CAM_BACK",
    "CAM_BACK_LEFT",
    "CAM_BACK_RIGHT",
)
LIDAR = "LIDAR_TOP"

# The nuScenes detection classes in the order mmdetection3d / StreamPETR number them (label = position).
CLASSES = (
    "car",
    "truck",
    "construction_vehicle",
    "bus",
    "trailer",
    "barrier",
    "motorcycle",
    "bicycle",
    "pedestrian",
    "traffic_cone",
)

# nuScenes category name → detection class (categories missing here are not evaluated: animals,
# strollers, wheelchairs, personal mobility, debris, push-pull objects, bicycle racks, ambulances, police).
CATEGORY_TO_CLASS = {
    "movable_object.barrier": "barrier",
    "vehicle.bicycle": "bicycle",
    "vehicle.bus.bendy": "bus",
    "vehicle.bus.rigid": "bus",
    "vehicle.car": "car",
    "vehicle.construction": "construction_vehicle",
    "vehicle.motorcycle": "motorcycle",
    "human.pedestrian.adult": "pedestrian",
    "human.pedestrian.child": "pedestrian",
    "human.pedestrian.construction_worker": "pedestrian",
    "human.pedestrian.police_officer": "pedestrian",
    "movable_object.trafficcone": "traffic_cone",
    "vehicle.trailer": "trailer",
    "vehicle.truck": "truck",
}

# All 23 nuScenes categories (the category table of a real release lists each once).
CATEGORIES = (
    "animal",
    "human.pedestrian.adult",
    "human.pedestrian.child",
    "human.pedestrian.construction_worker",
    "human.pedestrian.personal_mobility",
    "human.pedestrian.police_officer",
    "human.pedestrian.stroller",
    "human.pedestrian.wheelchair",
    "movable_object.barrier",
    "movable_object.debris",
    "movable_object.pushable_pullable",
    "movable_object.trafficcone",
    "static_object.bicycle_rack",
    "vehicle.bicycle",
    "vehicle.bus.bendy",
    "vehicle.bus.rigid",
    "vehicle.car",
    "vehicle.construction",
    "vehicle.emergency.ambulance",
    "vehicle.emergency.police",
    "vehicle.motorcycle",
    "vehicle.trailer",
    "vehicle.truck",
)

ATTRIBUTES = (
    "vehicle.moving",
    "vehicle.stopped",
    "vehicle.parked",
    "cycle.with_rider",
    "cycle.without_rider",
    "pedestrian.sitting_lying_down",
    "pedestrian.standing",
    "pedestrian.moving",
)

# visibility token → level: the fraction of the object visible over all six camera images.
VISIBILITY_LEVELS = {"1": "v0-40", "2": "v40-60", "3": "v60-80", "4": "v80-100"}


def token(*parts: object) -> str:
    """A 32-hex-digit token derived from ``parts`` (deterministic, so a seed gives identical tables)."""
    return hashlib.md5("/".join(str(p) for p in parts).encode()).hexdigest()
