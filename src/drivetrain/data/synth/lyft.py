"""The Lyft Level 5 flavour of the synthetic generator: class names, tables and file layout of ``v1.01-train``.

The scenes are the generator's (same roads, cameras, lidar and objects), named and annotated as Lyft does:

- object kinds → Lyft classes: car, truck, bus, motorcycle, bicycle, pedestrian as such; the generator's
  construction-vehicle cuboid (6.4 × 2.8 × 3.2 m, its own colour) stands in for ``emergency_vehicle``; the
  trailer for ``other_vehicle``; every third pedestrian of a scene (the second one first, near the ego start)
  becomes an ``animal`` (0.9 × 0.4 × 0.6 m); barriers and traffic cones stay in the images and the lidar but are
  not annotated (Lyft has no such classes). All nine classes appear in every scene of reasonable length.
- tables: Lyft's 9 categories (no ``index`` field), its 18 ``object_action_*`` attributes, annotations with
  ``num_lidar_pts`` −1 and ``visibility_token`` ""; lidar sample_data without width and height.
- files: ``images/<host>_cam<k>_<timestamp>.jpeg``, ``lidar/<host>_lidar1_<timestamp>.bin`` (5 float32 per
  point; sweeps and key frames in one folder), ``maps/map_raster_palo_alto.png``; the tables in ``v1.01-train/``.
  So ``--out`` plays the part of a real ``lyft/v1.01-train`` folder.
- scene names from mmdetection3d's Lyft split (2 train, 2 val, then train), so ``train``/``val`` apply.

Not simulated: ``CAM_FRONT_ZOOMED``, ``LIDAR_FRONT_LEFT``/``RIGHT``, Lyft's 5 Hz key frames and 1920 × 1080 images
(the preset's timing and image size are kept).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from drivetrain.data.lyft_format import LYFT_ATTRIBUTES, LYFT_CLASSES
from drivetrain.data.lyft_splits import LYFT_SPLITS
from drivetrain.data.nuscenes_format import CAMERAS, LIDAR, VISIBILITY_LEVELS, token
from drivetrain.data.synth.world import SceneLayout

__all__ = ["LYFT_SYNTH_SCENES", "lyft_annotation_fields", "lyft_layout", "lyft_static_tables"]

# Two train scenes, two val scenes, then train ones: the first N ≥ 4 scenes (--scenes N) hold both splits.
LYFT_SYNTH_SCENES = LYFT_SPLITS["train"][:2] + LYFT_SPLITS["val"][:2] + LYFT_SPLITS["train"][2:8]
MAP_FILE = "maps/map_raster_palo_alto.png"

KIND_TO_CLASS: dict[str, str | None] = {
    "car": "car",
    "truck": "truck",
    "construction_vehicle": "emergency_vehicle",
    "bus": "bus",
    "trailer": "other_vehicle",
    "barrier": None,
    "motorcycle": "motorcycle",
    "bicycle": "bicycle",
    "pedestrian": "pedestrian",
    "traffic_cone": None,
}
ANIMAL_SIZE = (0.9, 0.4, 0.6)  # (dx, dy, dz) metres: a dog
# nuScenes-style attributes of the generator → the nearest Lyft object action.
ATTRIBUTE_TO_LYFT = {
    "vehicle.moving": "object_action_driving_straight_forward",
    "vehicle.stopped": "object_action_stopped",
    "vehicle.parked": "object_action_parked",
    "cycle.with_rider": "object_action_driving_straight_forward",
    "cycle.without_rider": "object_action_parked",
    "pedestrian.moving": "object_action_walking",
    "pedestrian.standing": "object_action_standing",
}


def host_of(scene: str) -> str:
    """The car of a Lyft scene name (``host-a101-lidar0-…`` → ``host-a101``); the name itself otherwise."""
    return scene.split("-lidar")[0]


def image_file(scene: str, cam: int, ts: int) -> str:
    """Camera ``cam``'s image at ``ts`` µs, named as Lyft names them."""
    return f"images/{host_of(scene)}_cam{cam}_{ts}.jpeg"


def lidar_file(scene: str, ts: int) -> str:
    """The top lidar's sweep at ``ts`` µs (Lyft's ``lidar1``), key frame or not."""
    return f"lidar/{host_of(scene)}_lidar1_{ts}.bin"


def lyft_layout(layout: SceneLayout) -> tuple[SceneLayout, list[str | None]]:
    """The layout with every third pedestrian shrunk to an animal, and each object's Lyft class (None: none)."""
    objects, classes = [], []
    pedestrians = 0
    for obj in layout.objects:
        name = KIND_TO_CLASS[obj.name]
        if obj.name == "pedestrian":
            if pedestrians % 3 == 1:
                obj, name = dataclasses.replace(obj, size=ANIMAL_SIZE), "animal"
            pedestrians += 1
        objects.append(obj)
        classes.append(name)
    return dataclasses.replace(layout, objects=tuple(objects)), classes


def lyft_static_tables(seed: int) -> dict[str, list[dict[str, Any]]]:
    """The category, attribute, visibility and sensor tables of a synthetic Lyft set."""
    sensors = [{"token": token(seed, "sensor", c), "channel": c, "modality": "camera"} for c in CAMERAS]
    sensors.append({"token": token(seed, "sensor", LIDAR), "channel": LIDAR, "modality": "lidar"})
    return {
        "category": [{"token": token(seed, "category", c), "name": c, "description": ""} for c in LYFT_CLASSES],
        "attribute": [{"token": token(seed, "attribute", a), "name": a, "description": ""} for a in LYFT_ATTRIBUTES],
        "visibility": [
            {"token": t, "level": level, "description": f"visibility of whole object is {level[1:]}%"}
            for t, level in VISIBILITY_LEVELS.items()
        ],
        "sensor": sensors,
    }


def lyft_annotation_fields(seed: int, attribute: str) -> dict[str, Any]:
    """The fields in which a Lyft annotation differs from the generator's nuScenes one."""
    lyft_attribute = ATTRIBUTE_TO_LYFT.get(attribute)
    return {
        "visibility_token": "",
        "attribute_tokens": [token(seed, "attribute", lyft_attribute)] if lyft_attribute else [],
        "num_lidar_pts": -1,
        "num_radar_pts": 0,
    }
