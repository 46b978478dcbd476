"""The dataset formats drivetrain reads, by name: nuScenes and Lyft Level 5, and what is asked of the set of them.

Each format is one :class:`~drivetrain.data.formats.record.DatasetFormat` record, built in its own package
(``drivetrain.data.formats.nuscenes``, ``drivetrain.data.formats.lyft``); this module lists them. The format is
chosen once, when a root is indexed (:func:`detect_format` asks each format's rule, or it is named), and the index
records it (:func:`index_meta`; :attr:`~drivetrain.data.index.FrameIndex.format` reads it back through
:func:`format_of`). Code downstream asks the index's record — ``index.format.classes``, ``index.format.metric(...)``
— and never which dataset it is; the command line takes its ``--format`` choices from :data:`FORMATS`.

Example:
    >>> from drivetrain.data.formats.registry import FORMATS
    >>> FORMATS["lyft"].default_split, len(FORMATS["nuscenes"].classes)
    ('val', 10)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from drivetrain.data.errors import DataError
from drivetrain.data.formats.lyft.format import LYFT
from drivetrain.data.formats.nuscenes.format import NUSCENES
from drivetrain.data.formats.record import DatasetFormat

__all__ = ["DEFAULT", "FORMATS", "default_version", "detect_format", "format_of", "index_meta"]

FORMATS: dict[str, DatasetFormat] = {f.name: f for f in (NUSCENES, LYFT)}
DEFAULT = NUSCENES  # an index without a recorded format (every nuScenes index) is of this one


def format_of(meta: Mapping[str, Any]) -> DatasetFormat:
    """The format an index's metadata records; DataError naming the root for a name drivetrain does not know."""
    name = meta.get("dataset", DEFAULT.name)
    if name not in FORMATS:
        raise DataError(f"index of unknown dataset format {name!r}; known: {sorted(FORMATS)}", meta.get("root"))
    return FORMATS[name]


def index_meta(fmt: DatasetFormat) -> dict[str, str]:
    """What an index (or a synthetic set's manifest) records of its format: nothing for the default one (so a
    nuScenes index keeps exactly the metadata it had before Lyft support), else ``{"dataset": name}``."""
    return {} if fmt is DEFAULT else {"dataset": fmt.name}


def detect_format(root: str | Path, version: str) -> DatasetFormat:
    """The format of ``root/version``: the first other format whose rule recognises it (Lyft: every category a Lyft
    class), else the default one."""
    for fmt in FORMATS.values():
        if fmt is not DEFAULT and fmt.recognises(Path(root), version):
            return fmt
    return DEFAULT


def default_version(root: str | Path, name: str | None = None) -> str:
    """The table folder to read when none is given: format ``name``'s; without a name ``v1.0-mini``, or the one
    folder of another format when only that exists (a Lyft root's ``v1.01-train``)."""
    if name is not None:
        return FORMATS[name].version
    root = Path(root)
    if (root / DEFAULT.version).is_dir():
        return DEFAULT.version
    present = [f.version for f in FORMATS.values() if (root / f.version).is_dir()]
    return present[0] if present else DEFAULT.version
