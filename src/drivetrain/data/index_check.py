"""Validation of a loaded frame index: every array's dtype and shape, offsets, value ranges and finiteness,
and the metadata lists that go with them. An index is a file a user hands us; a damaged one must fail with a
:class:`DataError` naming the array or field, never as an IndexError deep in the loader or as NaN camera
matrices that project every box to nowhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from drivetrain.data.errors import DataError
from drivetrain.data.table_paths import path_problem

__all__ = ["check_index"]

# name: (rows, trailing shape with "N" for cameras, dtype kind): rows F = frames, M = boxes, S = sweeps.
_LAYOUT: dict[str, tuple[str, tuple[int | str, ...], str]] = {
    "timestamp": ("F", (), "f"),
    "scene_id": ("F", (), "i"),
    "frame_in_scene": ("F", (), "i"),
    "ego_pose": ("F", (4, 4), "f"),
    "lidar2ego": ("F", (4, 4), "f"),
    "intrinsics": ("F", ("N", 3, 3), "f"),
    "cam2lidar": ("F", ("N", 4, 4), "f"),
    "cam2ego": ("F", ("N", 4, 4), "f"),
    "cam_ego_pose": ("F", ("N", 4, 4), "f"),
    "cam_timestamp": ("F", ("N",), "f"),
    "image_size": ("F", ("N", 2), "i"),
    "boxes": ("M", (9,), "f"),
    "labels": ("M", (), "i"),
    "num_lidar_pts": ("M", (), "i"),
    "visibility": ("M", (), "i"),
    "attribute": ("M", (), "i"),
    "instance": ("M", (), "i"),
    "sweep2lidar": ("S", (4, 4), "f"),
    "sweep_dt": ("S", (), "f"),
}
# Boxes may hold NaN (checked per frame when loaded, so that on_error=skip can drop just that frame).
_MAY_BE_NON_FINITE = {"boxes"}
_META_LISTS = {"sample_tokens": "F", "prev_tokens": "F", "next_tokens": "F", "lidar_files": "F", "sweep_files": "S"}


def check_index(arrays: dict[str, np.ndarray], meta: Any, path: str | Path) -> None:
    """Raise :class:`DataError` naming the first inconsistent array or metadata field of an index."""
    if not isinstance(meta, dict):
        raise DataError(f"index metadata is a {type(meta).__name__}, not an object; rebuild the index", path)
    for key, kind in (("cameras", list), ("scenes", list), ("classes", list), ("version", str), ("splits", dict)):
        if not isinstance(meta.get(key), kind):
            raise DataError(f"index metadata field {key!r} is missing or not a {kind.__name__}", path)
    sizes = {
        "F": _rows(arrays, "timestamp", path),
        "M": _rows(arrays, "boxes", path),
        "S": _rows(arrays, "sweep_dt", path),
        "N": len(meta["cameras"]),
    }
    for name, (rows, trailing, kind) in _LAYOUT.items():
        value = arrays[name]
        want = (sizes[rows], *(sizes[d] if isinstance(d, str) else d for d in trailing))
        if value.dtype.kind != kind or value.shape != want:
            raise DataError(
                f"index array {name!r} is {value.dtype} {value.shape}, expected {'float' if kind == 'f' else 'int'} "
                f"{want}; rebuild the index",
                path,
            )
        if kind == "f" and name not in _MAY_BE_NON_FINITE and not np.isfinite(value).all():
            raise DataError(f"index array {name!r} holds non-finite values", path)
    for offset, rows in (("box_offset", "M"), ("sweep_offset", "S")):
        value = arrays[offset]
        ok = value.dtype.kind == "i" and value.shape == (sizes["F"] + 1,)
        if not ok or value[0] != 0 or value[-1] != sizes[rows] or (np.diff(value) < 0).any():
            raise DataError(f"index array {offset!r} is not a valid offset table of {rows} rows", path)
    _check_range(arrays, "scene_id", len(meta["scenes"]), path)
    _check_range(arrays, "labels", len(meta["classes"]), path)
    if (arrays["image_size"] < 1).any():
        raise DataError("index array 'image_size' holds sizes below 1 pixel", path)
    for key, rows in _META_LISTS.items():
        value = meta.get(key)
        if not isinstance(value, list) or len(value) != sizes[rows] or not all(isinstance(v, str) for v in value):
            raise DataError(f"index metadata field {key!r} must list {sizes[rows]} strings", path)
    images = meta.get("image_files")
    if (
        not isinstance(images, list)
        or len(images) != sizes["F"]
        or not all(
            isinstance(row, list) and len(row) == sizes["N"] and all(isinstance(f, str) for f in row) for row in images
        )
    ):
        raise DataError(f"index metadata field 'image_files' must list {sizes['N']} file names per frame", path)
    _check_file_names(meta, path)


def _check_file_names(meta: dict[str, Any], path: str | Path) -> None:
    """DataError naming the field, the row and the value of a file name that is absolute or has a '..' part."""
    lists = {"image_files": meta["image_files"], "lidar_files": meta["lidar_files"], "sweep_files": meta["sweep_files"]}
    for key, values in lists.items():
        for row, value in enumerate(values):
            for name in value if isinstance(value, list) else [value]:
                problem = path_problem(name)
                if problem is not None:
                    raise DataError(
                        f"index metadata {key}[{row}] {name!r} {problem}; the index's file names must be relative "
                        "to the dataset root and stay inside it (rebuild the index from trusted tables)",
                        path,
                    )


def _rows(arrays: dict[str, np.ndarray], name: str, path: str | Path) -> int:
    if arrays[name].ndim == 0:
        raise DataError(f"index array {name!r} is a scalar", path)
    return int(arrays[name].shape[0])


def _check_range(arrays: dict[str, np.ndarray], name: str, limit: int, path: str | Path) -> None:
    value = arrays[name]
    if value.size and (value.min() < 0 or value.max() >= limit):
        raise DataError(f"index array {name!r} holds values outside [0, {limit})", path)
