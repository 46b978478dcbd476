"""The names of the files the synthetic generator writes, made and recognised in one place.

A scene's files are named by the scene, the sensor and the time of the frame (µs): scene ``i`` starts at
:func:`scene_start_us`, its key frames follow every :data:`KEY_INTERVAL_US`, and each key frame's lidar sweeps
precede it every :data:`SWEEP_INTERVAL_US`. The writer (:mod:`drivetrain.data.synth.generate`) names its files with
the format's :class:`~drivetrain.data.formats.synth_format.SynthFormat` (``camera_file``, ``lidar_file``,
``map_file``); :class:`GeneratedNames` answers, for a name found on disk, whether the generator writes it for given
settings and format — by arithmetic on the name, so the answer costs the same for a settings file that claims a
billion frames. That is how the files of a generation that was killed
before it wrote its tables are found again (:mod:`drivetrain.data.synth.outputs`).
"""

from __future__ import annotations

import bisect

from drivetrain.data.formats.synth_format import SynthFormat
from drivetrain.data.synth.config import SynthConfig

__all__ = [
    "KEY_INTERVAL_US",
    "SWEEP_INTERVAL_US",
    "GeneratedNames",
    "is_generated_file",
    "scene_start_us",
]

KEY_INTERVAL_US = 500_000
SWEEP_INTERVAL_US = 50_000
FIRST_SCENE_US = 1_533_000_000_000_000
SCENE_SPACING_US = 3_600_000_000


def scene_start_us(index: int) -> int:
    """The time of scene ``index``'s first key frame (scenes are an hour apart)."""
    return FIRST_SCENE_US + index * SCENE_SPACING_US


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
    """The names the generator writes for ``config`` in format ``synth``, as a set one tests names against
    (``name in names``).

    A name is parsed into a scene, a sensor and a time (:meth:`~drivetrain.data.formats.synth_format.SynthFormat.
    parse`), and belongs when that scene has a frame at that time and the writer's own name for it is that name.
    The scenes are looked up by what the name carries of them (the scene's name, or its car for Lyft: several scenes
    may share it, and those whose frames span the time are tried), so a test costs the same however many scenes and
    frames the settings claim.
    """

    def __init__(self, config: SynthConfig, synth: SynthFormat) -> None:
        self.config, self.synth = config, synth
        self.map = synth.map_file(config.seed)
        self.by_key: dict[str, list[int]] = {}
        for i, scene in enumerate(config.scenes):
            self.by_key.setdefault(synth.scene_key(scene), []).append(i)

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
            synth = self.synth
            written = synth.lidar_file(scene, ts, key) if cam is None else synth.camera_file(scene, cam, ts)
            if written == name:
                return True
        return False

    def _parse(self, name: str) -> list[tuple[int, int | None, int]]:
        """The ``(scene index, camera index or None for the lidar, time)`` the file name may stand for: the scenes
        of the key it carries whose frames span the time."""
        parsed = self.synth.parse(name)
        if parsed is None:
            return []
        key, cam, ts = parsed
        indices = self.by_key.get(key, [])
        first = (ts - FIRST_SCENE_US - (self.config.samples_per_scene - 1) * KEY_INTERVAL_US) // SCENE_SPACING_US
        last = (ts - FIRST_SCENE_US + self.config.sweeps_per_sample * SWEEP_INTERVAL_US) // SCENE_SPACING_US
        found = indices[bisect.bisect_left(indices, first) : bisect.bisect_right(indices, last)]
        return [(i, cam, ts) for i in found]


def is_generated_file(name: str, config: SynthConfig, synth: SynthFormat) -> bool:
    """Whether the generator writes the file ``name`` (relative to the root, ``/``-separated) for ``config`` in
    format ``synth``; :class:`GeneratedNames` for many names."""
    return name in GeneratedNames(config, synth)
