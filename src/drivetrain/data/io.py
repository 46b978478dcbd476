"""Reading one sensor file of a dataset: a JPEG image or a nuScenes ``.pcd.bin`` lidar sweep.

A leaf of :mod:`drivetrain.data` (it imports only :mod:`drivetrain.data.errors` and
:mod:`drivetrain.safeio.reads`), so that indexing (which counts lidar points in boxes for Lyft tables) and the
dataset (which decodes each sample) share the readers without importing each other. Every failure is a
:class:`~drivetrain.data.errors.DataError` naming the file.

A dataset folder may come from someone else (docs/safety.md), so what a file can make us allocate is bounded
before it is read, by what the index and the format say:

- a sensor file must be a regular file (a FIFO planted as a JPEG or a ``.pcd.bin`` would block the read forever);
- a JPEG may hold at most :func:`max_jpeg_bytes` of its pixels (twice the raw RGB plus 1 MiB of markers), and its
  header's size is compared with the ``(W, H)`` the index records *before* it is decoded: a 634-byte file that
  declares 30000×30000 is refused, not decoded into 2.7 GB first;
- a lidar file may hold at most :data:`MAX_POINTS` points (its size is checked before it is read).

Example:
    >>> points = read_points(root / "samples/LIDAR_TOP/frame.pcd.bin")  # (P, 5) float32
"""

from __future__ import annotations

import os
import tokenize
import zipfile
from pathlib import Path

import numpy as np
import simplejpeg

from drivetrain.data.errors import DataError
from drivetrain.safeio.reads import open_regular, read_bytes

__all__ = [
    "MAX_IMAGE_PIXELS",
    "MAX_POINTS",
    "NPZ_ERRORS",
    "max_jpeg_bytes",
    "read_image",
    "read_jpeg_bytes",
    "read_points",
]

NPZ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, SyntaxError, tokenize.TokenError)
"""What numpy raises reading a corrupt ``.npz``/``.npy``: a bad zip, a short member, a pickled array refused, and a
damaged array header — which numpy parses as a Python literal, so a cut-off one is a ``SyntaxError`` or, before
that, ``tokenize.TokenError`` (neither a ValueError; found by tests/test_fuzz_data.py's slow index fuzzing)."""

# Points in one lidar file. The densest automotive sweeps hold ~250k (a 128-beam sensor; nuScenes' 32 beams
# ~35k, Lyft's three lidars ~100k); 16× that leaves room for merged or denser clouds while keeping one file's
# read at 80 MiB for 5 floats a point (a 2 GB file would be 10 GB once merged with its sweeps and copied).
MAX_POINTS = 1 << 22
# Pixels of an image whose size the caller does not know (no index record): 64 Mpx, 192 MiB decoded; camera
# images of the datasets we read are 1.4 (nuScenes) to 2.1 Mpx (Lyft).
MAX_IMAGE_PIXELS = 1 << 26
_JPEG_MARKERS = 1 << 20  # bytes of metadata (EXIF, ICC profile, comments) a camera JPEG may carry beside its scan


def max_jpeg_bytes(width: int, height: int) -> int:
    """The most bytes a JPEG of ``width × height`` pixels may hold: twice its raw RGB bytes plus 1 MiB of markers.

    At quality 100 without chroma subsampling, uniform noise — the least compressible image — encodes to 1.46×
    its raw bytes (libjpeg-turbo through simplejpeg, 160×90 and 1600×900); a camera image is 5-20× smaller.
    """
    return 2 * 3 * width * height + _JPEG_MARKERS


def read_image(path: Path, size: tuple[int, int] | None = None) -> np.ndarray:
    """Decode a JPEG to RGB.

    Args:
        path: the ``.jpg`` file.
        size: the ``(W, H)`` the index records for it; None accepts any size.

    Returns:
        ``(H, W, 3)`` uint8 RGB.

    Raises:
        DataError: naming ``path`` when the file is missing, unreadable, not a regular file, larger than a JPEG
            of its size may be, not a JPEG or of another size (told by its header, before decoding).
    """
    data = read_jpeg_bytes(path, size)
    try:
        image = simplejpeg.decode_jpeg(data, colorspace="RGB")
    except ValueError as err:
        raise DataError(f"corrupt or non-JPEG image ({err})", path) from None
    if size is not None and (image.shape[1], image.shape[0]) != tuple(size):  # the header said otherwise: a lie
        raise DataError(f"image is {image.shape[1]}×{image.shape[0]}, the index says {size[0]}×{size[1]}", path)
    return image


def read_jpeg_bytes(path: Path, size: tuple[int, int] | None = None) -> bytes:
    """The bytes of a JPEG whose header declares ``size``, checked without decoding (module docstring).

    Args:
        path: the ``.jpg`` file.
        size: the ``(W, H)`` the index records for it; None accepts any size up to :data:`MAX_IMAGE_PIXELS`.

    Returns:
        The file's bytes, of at most :func:`max_jpeg_bytes` of the size.

    Raises:
        DataError: naming ``path``: missing, unreadable, not a regular file, too large, not a JPEG header, or a
            header of another size than ``size``.
    """
    if size is not None:
        limit, what = max_jpeg_bytes(*size), f"a {size[0]}×{size[1]} JPEG may hold"
    else:
        limit, what = max_jpeg_bytes(MAX_IMAGE_PIXELS, 1), "an image may hold"
    try:
        data = read_bytes(path, limit=limit, what=what)
    except OSError as err:
        raise DataError(f"cannot read image ({err.strerror or err})", path) from None
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as err:
        raise DataError(f"corrupt or non-JPEG image ({err})", path) from None
    if size is not None and (width, height) != tuple(size):
        raise DataError(f"image is {width}×{height}, the index says {size[0]}×{size[1]}", path)
    if width * height > MAX_IMAGE_PIXELS:
        raise DataError(f"image is {width}×{height}, more than the {MAX_IMAGE_PIXELS} pixels read", path)
    return data


def read_points(path: Path, dims: int = 5) -> np.ndarray:
    """Read a nuScenes ``.pcd.bin`` lidar file (float32 × ``dims`` per point).

    Args:
        path: the ``.pcd.bin`` file.
        dims: floats per point (nuScenes: x, y, z, intensity, ring index).

    Returns:
        ``(P, dims)`` float32.

    Raises:
        DataError: naming ``path`` when the file is missing or unreadable, not a regular file, more than
            :data:`MAX_POINTS` points (told by its size, before it is read), not a whole number of points, or holds
            non-finite coordinates.
    """
    record = 4 * dims  # float32 × dims per point
    try:
        with open_regular(path, limit=MAX_POINTS * record, what=f"{MAX_POINTS} points may hold") as f:
            size = os.fstat(f.fileno()).st_size
            if size % record:  # a truncated or padded file: trailing bytes are not silently dropped
                raise DataError(f"corrupt lidar file: {size} bytes is not a whole number of {record}-byte points", path)
            buffer = bytearray(size)  # writable, as np.fromfile's array was
            read = f.readinto(buffer)
            if read != size or f.read(1):  # the file changed while it was read: no more than was checked
                raise DataError(f"lidar file changed while it was read (it had {size} bytes)", path)
    except OSError as err:
        raise DataError(f"cannot read lidar file ({err.strerror or err})", path) from None
    raw = np.frombuffer(buffer, dtype=np.float32)
    points = raw.reshape(-1, dims)
    if not np.isfinite(points[:, :3]).all():
        raise DataError("corrupt lidar file: non-finite coordinates", path)
    return points
