"""The nuScenes flavour of the synthetic generator: the tables and file layout of ``v1.0-mini``.

Every object of the simulated world is annotated with the nuScenes category of its kind; the static tables hold all
23 categories (with their ``index``), the 8 attributes, the 4 visibility levels and the 7 sensors; files go under
``samples/<CHANNEL>/`` (key frames) and ``sweeps/LIDAR_TOP/`` (sweeps between them), named
``<scene>__<CHANNEL>__<time µs>.jpg`` / ``.pcd.bin``, and the map mask under ``maps/``. Scene names are the
preset's (v1.0-mini's), so the devkit's ``mini_train``/``mini_val`` splits apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from drivetrain.data.formats.nuscenes.tables import ATTRIBUTES, CATEGORIES
from drivetrain.data.formats.schema import CAMERAS, LIDAR, VISIBILITY_LEVELS, token
from drivetrain.data.formats.synth_format import TIMESTAMP, AnnotatedAs

__all__ = ["CATEGORY", "NUSCENES_SYNTH", "NuScenesSynth"]

# The nuScenes category each kind of object of the simulated world is annotated as.
CATEGORY = {
    "car": "vehicle.car",
    "truck": "vehicle.truck",
    "construction_vehicle": "vehicle.construction",
    "bus": "vehicle.bus.rigid",
    "trailer": "vehicle.trailer",
    "barrier": "movable_object.barrier",
    "motorcycle": "vehicle.motorcycle",
    "bicycle": "vehicle.bicycle",
    "pedestrian": "human.pedestrian.adult",
    "traffic_cone": "movable_object.trafficcone",
}


class NuScenesSynth:
    """The :class:`~drivetrain.data.formats.synth_format.SynthFormat` of nuScenes (see the module docstring)."""

    name = "nuscenes"
    version = "v1.0-mini"
    scene_names = None

    def static_tables(self, seed: int) -> dict[str, list[dict[str, Any]]]:
        """The category, attribute, visibility and sensor tables."""
        sensors = [{"token": token(seed, "sensor", c), "channel": c, "modality": "camera"} for c in CAMERAS]
        sensors.append({"token": token(seed, "sensor", LIDAR), "channel": LIDAR, "modality": "lidar"})
        return {
            "category": [
                {"token": token(seed, "category", c), "name": c, "description": f"synthetic {c}", "index": i}
                for i, c in enumerate(CATEGORIES)
            ],
            "attribute": [{"token": token(seed, "attribute", a), "name": a, "description": a} for a in ATTRIBUTES],
            "visibility": [
                {"token": t, "level": level, "description": f"visibility of the whole object is {level[1:]}%"}
                for t, level in VISIBILITY_LEVELS.items()
            ],
            "sensor": sensors,
        }

    def annotate(self, kinds: Sequence[str]) -> list[AnnotatedAs]:
        """Each kind's nuScenes category (every object is annotated)."""
        return [(CATEGORY[kind], None) for kind in kinds]

    def log_fields(self, scene: str) -> dict[str, Any]:
        """None: the generator's log row is nuScenes'."""
        return {}

    def sample_data_row(self, row: dict[str, Any], lidar: bool) -> dict[str, Any]:
        """The row as it is."""
        return row

    def annotation_fields(self, seed: int, attribute: str) -> dict[str, Any]:
        """None: the generator's annotation row is nuScenes'."""
        return {}

    def camera_file(self, scene: str, cam: int, ts: int) -> str:
        """``samples/<CAM>/<scene>__<CAM>__<ts>.jpg``."""
        return f"samples/{CAMERAS[cam]}/{scene}__{CAMERAS[cam]}__{ts}.jpg"

    def lidar_file(self, scene: str, ts: int, key: bool) -> str:
        """``samples/`` (key frame) or ``sweeps/`` ``LIDAR_TOP/<scene>__LIDAR_TOP__<ts>.pcd.bin``."""
        return f"{'samples' if key else 'sweeps'}/{LIDAR}/{scene}__{LIDAR}__{ts}.pcd.bin"

    def map_file(self, seed: int) -> str:
        """``maps/<token>.png``."""
        return f"maps/{token(seed, 'map')}.png"

    def folders(self) -> set[str]:
        """``samples``, ``sweeps``, ``maps`` and a folder per channel."""
        channels = {f"samples/{c}" for c in (*CAMERAS, LIDAR)}
        return {"samples", "sweeps", "maps", f"sweeps/{LIDAR}", *channels}

    def scene_key(self, scene: str) -> str:
        """The scene's name itself (a nuScenes file name carries it)."""
        return scene

    def parse(self, name: str) -> tuple[str, int | None, int] | None:
        """Scene, camera and time of ``samples/<CHANNEL>/<scene>__<CHANNEL>__<ts>.<ext>`` (or ``sweeps/``)."""
        folder, _, base = name.rpartition("/")
        channel = folder.rpartition("/")[2]
        suffix = ".pcd.bin" if channel == LIDAR else ".jpg"
        parts = base.removesuffix(suffix).rsplit("__", 2)
        if channel not in (*CAMERAS, LIDAR) or not base.endswith(suffix) or len(parts) != 3:
            return None
        scene, named_channel, ts_text = parts
        if named_channel != channel or not TIMESTAMP.fullmatch(ts_text):
            return None
        return scene, None if channel == LIDAR else CAMERAS.index(channel), int(ts_text)


NUSCENES_SYNTH = NuScenesSynth()
