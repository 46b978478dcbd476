"""Rigid transforms in the nuScenes conventions (NumPy, float64).

Quaternions are ``(w, x, y, z)`` as in the nuScenes tables; a record's ``rotation``/``translation``
map points from the record's frame to its parent (``calibrated_sensor``: sensor → ego; ``ego_pose``:
ego → global). A transform is a ``(4, 4)`` matrix acting on column vectors ``(x, y, z, 1)``.
Boxes in the lidar frame are ``(x, y, z, dx, dy, dz, yaw, vx, vy)``: ``z`` is the box *centre* (the
gravity centre, as nuScenes and StreamPETR use it; mmdetection3d's LiDAR boxes store the bottom
``z - dz/2`` instead), ``dx`` is the length along the heading, ``yaw`` the heading about +z.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "box_corners",
    "invert",
    "matrix_to_quaternion",
    "quaternion_to_matrix",
    "transform",
    "yaw_from_matrix",
    "yaw_quaternion",
]


def quaternion_to_matrix(q: np.ndarray | list[float]) -> np.ndarray:
    """``(4,)`` unit quaternion ``(w, x, y, z)`` → ``(3, 3)`` rotation matrix (normalised first)."""
    w, x, y, z = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def matrix_to_quaternion(rot: np.ndarray) -> np.ndarray:
    """``(3, 3)`` rotation matrix → ``(4,)`` quaternion ``(w, x, y, z)`` with ``w ≥ 0``."""
    m = np.asarray(rot, dtype=np.float64)
    trace = m[0, 0] + m[1, 1] + m[2, 2]
    if trace > 0:
        s = 2.0 * np.sqrt(trace + 1.0)
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        q = [(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
    elif m[1, 1] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s]
    else:
        s = 2.0 * np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s]
    q = np.array(q)
    q /= np.linalg.norm(q)
    return -q if q[0] < 0 else q


def yaw_quaternion(yaw: float) -> np.ndarray:
    """Quaternion ``(w, x, y, z)`` of a rotation by ``yaw`` about +z."""
    return np.array([np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)])


def yaw_from_matrix(rot: np.ndarray) -> np.ndarray:
    """Heading about +z of ``(..., 3, 3)`` rotations: the angle of the rotated x axis in the xy plane."""
    return np.arctan2(rot[..., 1, 0], rot[..., 0, 0])


def transform(rotation: np.ndarray | list[float], translation: np.ndarray | list[float]) -> np.ndarray:
    """``(4, 4)`` from a quaternion ``(w, x, y, z)`` (or a ``(3, 3)`` matrix) and a ``(3,)`` translation."""
    rot = np.asarray(rotation, dtype=np.float64)
    out = np.eye(4)
    out[:3, :3] = rot if rot.shape == (3, 3) else quaternion_to_matrix(rot)
    out[:3, 3] = translation
    return out


def invert(mat: np.ndarray) -> np.ndarray:
    """Inverse of rigid ``(..., 4, 4)`` transforms (transpose the rotation; no general matrix inverse)."""
    out = np.zeros_like(mat)
    rot_t = np.swapaxes(mat[..., :3, :3], -1, -2)
    out[..., :3, :3] = rot_t
    out[..., :3, 3] = -(rot_t @ mat[..., :3, 3:4])[..., 0]
    out[..., 3, 3] = 1.0
    return out


def box_corners(boxes: np.ndarray) -> np.ndarray:
    """Corners of ``(M, ≥7)`` boxes ``(x, y, z, dx, dy, dz, yaw, ...)`` (centre z) → ``(M, 8, 3)``.

    Corner order: bit 0 of the corner number picks −/+ x (length), bit 1 −/+ y (width), bit 2 −/+ z.
    """
    boxes = np.asarray(boxes, dtype=np.float64)
    signs = np.array([[(i >> 0) & 1, (i >> 1) & 1, (i >> 2) & 1] for i in range(8)], dtype=np.float64) - 0.5
    local = signs[None] * boxes[:, None, 3:6]  # (M, 8, 3)
    cos, sin = np.cos(boxes[:, 6]), np.sin(boxes[:, 6])
    x = local[..., 0] * cos[:, None] - local[..., 1] * sin[:, None]
    y = local[..., 0] * sin[:, None] + local[..., 1] * cos[:, None]
    return np.stack([x, y, local[..., 2]], axis=-1) + boxes[:, None, :3]
