"""What the nuScenes format names: the ten detection classes, the map from nuScenes categories to them, the
categories and attributes (the tables and sensor channels both formats share are in :mod:`..schema`). Nothing here
imports the devkit; ``tests/test_data_index.py`` checks the category map equals the devkit's.
"""

from __future__ import annotations

__all__ = [
    "ATTRIBUTES",
    "CATEGORY_TO_CLASS",
    "CLASSES",
]

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
