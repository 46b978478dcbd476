"""The names of the files the synthetic generator writes, made and recognised in one place.

A scene's files are named by the scene, the sensor and the time of the frame (µs): scene ``i`` starts at
:func:`scene_start_us`, its key frames follow every :data:`KEY_INTERVAL_US`, and each key frame's lidar sweeps
precede it every :data:`SWEEP_INTERVAL_US`. The writer (:mod:`drivetrain.data.synth.generate`) names its files with
:func:`camera_file`, :func:`lidar_file` and :func:`map_file`; :class:`GeneratedNames` answers, for a name found on
disk, whether the generator writes it for given settings — by arithmetic on the name, so the answer costs the
same for a settings file that claims a billion frames. That is how the files of a generation that was killed
before it wrote its tables are found again (:mod:`drivetrain.data.synth.outputs`).
"""

from __future__ import annotations

import bisect
import re

from drivetrain.data.nuscenes_format import CAMERAS, LIDAR, token
from drivetrain.data.synth import lyft
from drivetrain.data.synth.config import SynthConfig

__all__ = [
    "KEY_INTERVAL_US",
    "SWEEP_INTERVAL_US",
    "VERSION",
    "GeneratedNames",
    "camera_file",
    "generated_folders",
    "is_generated_file",
    "lidar_file",
    "map_file",
    "scene_start_us",
]

VERSION = "v1.0-mini"  # the table folder of the nuScenes flavour (Lyft's: lyft_format.LYFT_VERSION)
KEY_INTERVAL_US = 500_000
SWEEP_INTERVAL_US = 50_000
FIRST_SCENE_US = 1_533_000_000_000_000
SCENE_SPACING_US = 3_600_000_000

_TIME = re.compile(r"0|[1-9][0-9]{0,18}")  # a timestamp as the writer spells it: decimal, no sign or leading 0
_LYFT_IMAGE = re.compile(r"(?P<host>.+)_cam(?P<cam>[0-9])_(?P<ts>[0-9]+)\.jpeg")
_LYFT_LIDAR = re.compile(r"(?P<host>.+)_lidar1_(?P<ts>[0-9]+)\.bin")


def scene_start_us(index: int) -> int:
    """The time of scene ``index``'s first key frame (scenes are an hour apart)."""
    return FIRST_SCENE_US + index * SCENE_SPACING_US


def camera_file(scene: str, cam: int, ts: int, lyft_format: bool) -> str:
    """Camera ``cam`` (an index into ``CAMERAS``) of ``scene`` at key-frame time ``ts``."""
    if lyft_format:
        return lyft.image_file(scene, cam, ts)
    return f"samples/{CAMERAS[cam]}/{scene}__{CAMERAS[cam]}__{ts}.jpg"


def lidar_file(scene: str, ts: int, key: bool, lyft_format: bool) -> str:
    """The lidar sweep of ``scene`` at ``ts``: a key frame's under ``samples/``, a sweep's under ``sweeps/``."""
    if lyft_format:
        return lyft.lidar_file(scene, ts)
    return f"{'samples' if key else 'sweeps'}/{LIDAR}/{scene}__{LIDAR}__{ts}.pcd.bin"


def map_file(seed: int, lyft_format: bool) -> str:
    """The map mask."""
    return lyft.MAP_FILE if lyft_format else f"maps/{token(seed, 'map')}.png"


def generated_folders(lyft_format: bool) -> set[str]:
    """Every folder the generator makes (names relative to the root)."""
    if lyft_format:
        return {"images", "lidar", "maps"}
    channels = {f"samples/{c}" for c in (*CAMERAS, LIDAR)}
    return {"samples", "sweeps", "maps", f"sweeps/{LIDAR}", *channels}


def _frame(config: SynthConfig, scene: int, ts: int) -> tuple[int, int] | None:
    """``(j, k)`` when ``ts`` is sweep ``k`` before key frame ``j`` of scene ``scene`` (``k == 0``: the key frame
    itself), None when the generator writes nothing at ``ts`` for that scene."""
    since = ts - scene_start_us(scene)
    j = -(-since // KEY_INTERVAL_US)  # the first key frame at or after ts (sweeps precede their key frame)
    before, rest = divmod(j * KEY_INTERVAL_US - since, SWEEP_INTERVAL_US)
    if rest or not 0 <= j < config.samples_per_scene or not 0 <= before <= config.sweeps_per_sample:
        return None
    return j, before


class GeneratedNames:
    """The names the generator writes for ``config``, as a set one tests names against (``name in names``).

    A name is parsed into a scene, a sensor and a time, and belongs when that scene has a frame at that time and
    the writer's own name for it is that name. The scenes are looked up by name (or by car, for Lyft), so a test
    costs the same however many scenes and frames the settings claim.
    """

    def __init__(self, config: SynthConfig, lyft_format: bool) -> None:
        self.config, self.lyft = config, lyft_format
        self.map = map_file(config.seed, lyft_format)
        self.scenes = {scene: i for i, scene in enumerate(config.scenes)}
        self.by_host: dict[str, list[int]] = {}
        for scene, i in self.scenes.items():
            self.by_host.setdefault(lyft.host_of(scene), []).append(i)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name == self.map:
            return True
        for i, cam, ts in self._parse(name):
            frame = _frame(self.config, i, ts)
            if frame is None or (cam is not None and frame[1] != 0):
                continue  # no frame of the scene then, or a camera at a sweep's time
            scene, key = self.config.scenes[i], frame[1] == 0
            written = lidar_file(scene, ts, key, self.lyft) if cam is None else camera_file(scene, cam, ts, self.lyft)
            if written == name:
                return True
        return False

    def _parse(self, name: str) -> list[tuple[int, int | None, int]]:
        """The ``(scene index, camera index or None for the lidar, time)`` the file name may stand for (a Lyft name
        carries the scene's car, which several scenes may share: those whose frames span the time)."""
        folder, _, base = name.rpartition("/")
        if self.lyft:
            match = (_LYFT_IMAGE if folder == "images" else _LYFT_LIDAR).fullmatch(base)
            if folder not in ("images", "lidar") or match is None or not _TIME.fullmatch(match["ts"]):
                return []
            cam = int(match["cam"]) if folder == "images" else None
            if cam is not None and cam >= len(CAMERAS):
                return []
            ts = int(match["ts"])
            indices = self.by_host.get(match["host"], [])
            first = (ts - FIRST_SCENE_US - (self.config.samples_per_scene - 1) * KEY_INTERVAL_US) // SCENE_SPACING_US
            last = (ts - FIRST_SCENE_US + self.config.sweeps_per_sample * SWEEP_INTERVAL_US) // SCENE_SPACING_US
            found = indices[bisect.bisect_left(indices, first) : bisect.bisect_right(indices, last)]
            return [(i, cam, ts) for i in found]
        channel = folder.rpartition("/")[2]
        suffix = ".pcd.bin" if channel == LIDAR else ".jpg"
        parts = base.removesuffix(suffix).rsplit("__", 2)
        if channel not in (*CAMERAS, LIDAR) or not base.endswith(suffix) or len(parts) != 3:
            return []
        scene, named_channel, ts_text = parts
        if named_channel != channel or scene not in self.scenes or not _TIME.fullmatch(ts_text):
            return []
        return [(self.scenes[scene], None if channel == LIDAR else CAMERAS.index(channel), int(ts_text))]


def is_generated_file(name: str, config: SynthConfig, lyft_format: bool) -> bool:
    """Whether the generator writes the file ``name`` (relative to the root, ``/``-separated) for ``config``;
    :class:`GeneratedNames` for many names."""
    return name in GeneratedNames(config, lyft_format)
