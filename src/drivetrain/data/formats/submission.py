"""What every format's predictions file shares: the ``meta`` block, the walk over its boxes with the checks both
formats make, the vector checks, and writing it.

A predictions file is ``{"meta": {...}, "results": {sample_token: [box, ...]}}`` in each format; the fields of a box
are the format's (``drivetrain.data.formats.<name>.submission``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from drivetrain.data.errors import DataError
from drivetrain.safeio.files import replace_text

__all__ = [
    "check_box_vectors",
    "check_sample_tokens",
    "is_number",
    "submission_boxes",
    "submission_meta",
    "write_submission",
]


def submission_meta(*, camera: bool = True, lidar: bool = False) -> dict[str, bool]:
    """The submission's ``meta`` block: which sensors the predictions used (the model's ``input_modalities``), no
    radar, map or external data."""
    return {"use_camera": camera, "use_lidar": lidar, "use_radar": False, "use_map": False, "use_external": False}


def submission_boxes(submission: dict[str, Any], path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every box of a predictions file's ``results`` with its place ``results[TOKEN][i]``, after the checks a
    nuScenes submission and a Lyft predictions file share: a list per sample token, objects, and each box's
    ``sample_token`` equal to its key. DataError names the file and the entry."""
    for token, boxes in submission["results"].items():
        if not isinstance(boxes, list):
            raise DataError(f"results[{token!r}]: must be a list of boxes, got {type(boxes).__name__}", path)
        for i, box in enumerate(boxes):
            where = f"results[{token!r}][{i}]"
            if not isinstance(box, dict):
                raise DataError(f"{where}: must be an object, got {type(box).__name__}", path)
            if box.get("sample_token") != token:
                found = box.get("sample_token")
                raise DataError(f"{where}.sample_token: {found!r} differs from its key {token!r}", path)
            yield where, box


def check_box_vectors(box: dict[str, Any], where: str, vectors: dict[str, int], path: Path) -> None:
    """The box's vector fields (name → length) are lists of finite numbers, and its ``size`` is positive."""
    for field, length in vectors.items():
        value = box.get(field)
        if not isinstance(value, list) or len(value) != length or not all(is_number(v) for v in value):
            raise DataError(f"{where}.{field}: must be a list of {length} numbers, got {value!r}", path)
        if not np.isfinite(value).all():
            raise DataError(f"{where}.{field}: non-finite value {value!r}", path)
    if min(box["size"]) <= 0:
        raise DataError(f"{where}.size: must be positive, got {box['size']!r}", path)


def check_sample_tokens(in_split: set[str], results: dict[str, Any], split: str, path: Path) -> None:
    """DataError naming the sample tokens of ``split`` the predictions lack, or the entries that are not its samples
    (a submission lists every sample of the split, with ``[]`` where nothing is detected)."""
    missing, extra = sorted(in_split - set(results)), sorted(set(results) - in_split)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} sample(s) of split {split!r} have no entry (e.g. {missing[:3]})")
        if extra:
            parts.append(f"{len(extra)} entr(y/ies) are not samples of split {split!r} (e.g. {extra[:3]})")
        raise DataError("; ".join(parts) + "; list every sample of the split, with [] where nothing is detected", path)


def is_number(value: Any) -> bool:
    """A JSON number (int or float, not bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def write_submission(submission: dict[str, Any], path: str | Path) -> Path:
    """Write ``submission`` as JSON to ``path`` (parent folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return replace_text(path, json.dumps(submission))  # a link at the name is replaced, never written through
