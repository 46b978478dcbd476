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

import re
from collections.abc import Sequence
from typing import Any

from drivetrain.data.formats.lyft.splits import LYFT_SPLITS
from drivetrain.data.formats.lyft.tables import LYFT_ATTRIBUTES, LYFT_CLASSES, LYFT_VERSION
from drivetrain.data.formats.schema import CAMERAS, LIDAR, VISIBILITY_LEVELS, token
from drivetrain.data.formats.synth_format import TIMESTAMP, AnnotatedAs

__all__ = ["LYFT_SYNTH", "LYFT_SYNTH_SCENES", "LyftSynth", "host_of"]

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


_IMAGE = re.compile(r"(?P<host>.+)_cam(?P<cam>[0-9])_(?P<ts>[0-9]+)\.jpeg")
_LIDAR = re.compile(r"(?P<host>.+)_lidar1_(?P<ts>[0-9]+)\.bin")


def host_of(scene: str) -> str:
    """The car of a Lyft scene name (``host-a101-lidar0-…`` → ``host-a101``); the name itself otherwise."""
    return scene.split("-lidar")[0]


class LyftSynth:
    """The :class:`~drivetrain.data.formats.synth_format.SynthFormat` of Lyft Level 5 (see the module docstring)."""

    name = "lyft"
    version = LYFT_VERSION
    scene_names = LYFT_SYNTH_SCENES

    def static_tables(self, seed: int) -> dict[str, list[dict[str, Any]]]:
        """Lyft's 9 categories (no ``index``), its 18 object actions, the visibility levels, the sensors."""
        sensors = [{"token": token(seed, "sensor", c), "channel": c, "modality": "camera"} for c in CAMERAS]
        sensors.append({"token": token(seed, "sensor", LIDAR), "channel": LIDAR, "modality": "lidar"})
        return {
            "category": [{"token": token(seed, "category", c), "name": c, "description": ""} for c in LYFT_CLASSES],
            "attribute": [
                {"token": token(seed, "attribute", a), "name": a, "description": ""} for a in LYFT_ATTRIBUTES
            ],
            "visibility": [
                {"token": t, "level": level, "description": f"visibility of whole object is {level[1:]}%"}
                for t, level in VISIBILITY_LEVELS.items()
            ],
            "sensor": sensors,
        }

    def annotate(self, kinds: Sequence[str]) -> list[AnnotatedAs]:
        """Each kind's Lyft class; every third pedestrian (the second one first) an animal of a dog's size."""
        out: list[AnnotatedAs] = []
        pedestrians = 0
        for kind in kinds:
            annotated: AnnotatedAs = (KIND_TO_CLASS[kind], None)
            if kind == "pedestrian":
                if pedestrians % 3 == 1:
                    annotated = ("animal", ANIMAL_SIZE)
                pedestrians += 1
            out.append(annotated)
        return out

    def log_fields(self, scene: str) -> dict[str, Any]:
        """Lyft's car and place, no log file."""
        return {"logfile": "", "vehicle": host_of(scene)[5:], "location": "Palo Alto"}

    def sample_data_row(self, row: dict[str, Any], lidar: bool) -> dict[str, Any]:
        """jpeg / bin, and no image size on lidar records."""
        row["fileformat"] = "bin" if lidar else "jpeg"
        if lidar:
            del row["height"], row["width"]
        return row

    def annotation_fields(self, seed: int, attribute: str) -> dict[str, Any]:
        """Lyft's object action, no visibility, ``num_lidar_pts`` −1."""
        lyft_attribute = ATTRIBUTE_TO_LYFT.get(attribute)
        return {
            "visibility_token": "",
            "attribute_tokens": [token(seed, "attribute", lyft_attribute)] if lyft_attribute else [],
            "num_lidar_pts": -1,
            "num_radar_pts": 0,
        }

    def camera_file(self, scene: str, cam: int, ts: int) -> str:
        """``images/<host>_cam<k>_<ts>.jpeg``."""
        return f"images/{host_of(scene)}_cam{cam}_{ts}.jpeg"

    def lidar_file(self, scene: str, ts: int, key: bool) -> str:
        """The top lidar's sweep (Lyft's ``lidar1``), key frame or not: one folder for both."""
        return f"lidar/{host_of(scene)}_lidar1_{ts}.bin"

    def map_file(self, seed: int) -> str:
        """Lyft's one map raster."""
        return MAP_FILE

    def folders(self) -> set[str]:
        """``images``, ``lidar``, ``maps``."""
        return {"images", "lidar", "maps"}

    def scene_key(self, scene: str) -> str:
        """The scene's car: a Lyft file name carries the car, which several scenes may share."""
        return host_of(scene)

    def parse(self, name: str) -> tuple[str, int | None, int] | None:
        """Car, camera and time of ``images/<host>_cam<k>_<ts>.jpeg`` or ``lidar/<host>_lidar1_<ts>.bin``."""
        folder, _, base = name.rpartition("/")
        match = (_IMAGE if folder == "images" else _LIDAR).fullmatch(base)
        if folder not in ("images", "lidar") or match is None or not TIMESTAMP.fullmatch(match["ts"]):
            return None
        cam = int(match["cam"]) if folder == "images" else None
        if cam is not None and cam >= len(CAMERAS):
            return None
        return match["host"], cam, int(match["ts"])


LYFT_SYNTH = LyftSynth()
