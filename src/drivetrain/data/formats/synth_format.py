"""What a dataset format tells the synthetic generator: :class:`SynthFormat`, one object per format.

The generator (:mod:`drivetrain.data.synth.generate`) simulates the same world for every format — roads, objects
of the ten nuScenes kinds, six cameras, a lidar — and asks the format's object how to write it: the table folder,
the static tables (categories, attributes, visibility, sensors), which category each object is annotated as (or
none), the fields in which its rows differ from nuScenes', and the names of its files. The removal of a generated
set (:mod:`drivetrain.data.synth.outputs`) asks the same object which names it wrote (:meth:`SynthFormat.parse`).

Each format's package holds its object (``drivetrain.data.formats.<name>.synth``) and its record's ``synth`` field
points at it; this module imports nothing of drivetrain.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["TIMESTAMP", "AnnotatedAs", "SynthFormat"]

TIMESTAMP = re.compile(r"0|[1-9][0-9]{0,18}")  # a time in µs as the writer spells it: decimal, no sign or leading 0

# How one object of the simulated world is annotated: its category (None: not annotated, scenery only) and the
# (dx, dy, dz) size it takes instead of its kind's (None: its own).
AnnotatedAs = tuple[str | None, tuple[float, float, float] | None]


class SynthFormat(Protocol):
    """How the synthetic generator writes one dataset format (see the module docstring)."""

    name: str  # the format's name, as in its record and the manifest
    version: str  # the table folder written
    scene_names: tuple[str, ...] | None  # scene names that replace the preset's (None: the preset's, v1.0-mini's)

    def static_tables(self, seed: int) -> dict[str, list[dict[str, Any]]]:
        """The category, attribute, visibility and sensor tables."""
        ...

    def annotate(self, kinds: Sequence[str]) -> list[AnnotatedAs]:
        """How each object of a scene, by its kind (a nuScenes class name) in layout order, is annotated."""
        ...

    def log_fields(self, scene: str) -> dict[str, Any]:
        """The fields of the scene's ``log`` row that differ from the generator's nuScenes one."""
        ...

    def sample_data_row(self, row: dict[str, Any], lidar: bool) -> dict[str, Any]:
        """A ``sample_data`` row as this format writes it (``row`` is the generator's nuScenes one)."""
        ...

    def annotation_fields(self, seed: int, attribute: str) -> dict[str, Any]:
        """The fields of a ``sample_annotation`` row that differ from the generator's nuScenes one."""
        ...

    def camera_file(self, scene: str, cam: int, ts: int) -> str:
        """Camera ``cam``'s image of ``scene`` at key-frame time ``ts`` µs (relative to the root)."""
        ...

    def lidar_file(self, scene: str, ts: int, key: bool) -> str:
        """The lidar sweep of ``scene`` at ``ts`` µs, a key frame's (``key``) or a sweep between key frames."""
        ...

    def map_file(self, seed: int) -> str:
        """The map mask."""
        ...

    def folders(self) -> set[str]:
        """Every folder the generator makes for this format (relative to the root)."""
        ...

    def scene_key(self, scene: str) -> str:
        """What a file name tells of its scene: the scene's name, or what :meth:`parse` reads in its place."""
        ...

    def parse(self, name: str) -> tuple[str, int | None, int] | None:
        """``(scene key, camera index or None for the lidar, time in µs)`` of a file name this format's writer
        could have written; None for any other name."""
        ...
