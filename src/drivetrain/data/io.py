"""Reading one sensor file of a dataset: a JPEG image or a nuScenes ``.pcd.bin`` lidar sweep.

A leaf of :mod:`drivetrain.data` (it imports only :mod:`drivetrain.data.errors`), so that indexing (which counts
lidar points in boxes for Lyft tables) and the dataset (which decodes each sample) share the readers without
importing each other. Every failure is a :class:`~drivetrain.data.errors.DataError` naming the file.

Example:
    >>> points = read_points(root / "samples/LIDAR_TOP/frame.pcd.bin")  # (P, 5) float32
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import simplejpeg

from drivetrain.data.errors import DataError

__all__ = ["read_image", "read_points"]


def read_image(path: Path, size: tuple[int, int] | None = None) -> np.ndarray:
    """Decode a JPEG to RGB.

    Args:
        path: the ``.jpg`` file.
        size: the ``(W, H)`` the index records for it; None accepts any size.

    Returns:
        ``(H, W, 3)`` uint8 RGB.

    Raises:
        DataError: naming ``path`` when the file is missing, unreadable, not a JPEG or of another size.
    """
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read image ({err.strerror or err})", path) from None
    try:
        image = simplejpeg.decode_jpeg(data, colorspace="RGB")
    except ValueError as err:
        raise DataError(f"corrupt or non-JPEG image ({err})", path) from None
    if size is not None and (image.shape[1], image.shape[0]) != tuple(size):
        raise DataError(f"image is {image.shape[1]}×{image.shape[0]}, the index says {size[0]}×{size[1]}", path)
    return image


def read_points(path: Path, dims: int = 5) -> np.ndarray:
    """Read a nuScenes ``.pcd.bin`` lidar file (float32 × ``dims`` per point).

    Args:
        path: the ``.pcd.bin`` file.
        dims: floats per point (nuScenes: x, y, z, intensity, ring index).

    Returns:
        ``(P, dims)`` float32.

    Raises:
        DataError: naming ``path`` when the file is missing or unreadable, not a whole number of points, or holds
            non-finite coordinates.
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            record = 4 * dims  # float32 × dims per point
            if size % record:  # a truncated or padded file: trailing bytes are not silently dropped
                raise DataError(f"corrupt lidar file: {size} bytes is not a whole number of {record}-byte points", path)
            raw = np.fromfile(f, dtype=np.float32)
    except OSError as err:
        raise DataError(f"cannot read lidar file ({err.strerror or err})", path) from None
    points = raw.reshape(-1, dims)
    if not np.isfinite(points[:, :3]).all():
        raise DataError("corrupt lidar file: non-finite coordinates", path)
    return points
