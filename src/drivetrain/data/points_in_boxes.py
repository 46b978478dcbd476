"""Lidar points inside 3D boxes: how ``num_lidar_pts`` is counted for a format whose tables do not hold it (Lyft's
hold −1; :attr:`~drivetrain.data.formats.record.DatasetFormat.count_points`)."""

from __future__ import annotations

import numpy as np

__all__ = ["count_points_in_boxes"]


def count_points_in_boxes(points: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Points inside each box, boundary included (the devkit's ``points_in_box`` test).

    Args:
        points: ``(P, 3)`` x, y, z in the boxes' frame.
        boxes: ``(M, 7)`` ``(x, y, z_centre, dx, dy, dz, yaw)``, yaw about z.

    Returns:
        ``(M,)`` int64 counts.

    Example:
        >>> count_points_in_boxes(np.zeros((1, 3)), np.array([[0, 0, 0, 2, 2, 2, 0.3]]))
        array([1])
    """
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    counts = np.zeros(len(boxes), dtype=np.int64)
    for m, (x, y, z, dx, dy, dz, yaw) in enumerate(boxes):
        # A cheap bounding-circle cut first: a key-frame sweep has ~10⁵ points and a frame ~10² boxes.
        rel = points - (x, y, z)  # (P, 3)
        near = np.flatnonzero((np.abs(rel[:, 2]) <= dz / 2) & ((rel[:, :2] ** 2).sum(1) <= (dx * dx + dy * dy) / 4))
        c, s = np.cos(yaw), np.sin(yaw)
        along = rel[near, 0] * c + rel[near, 1] * s  # (P',)
        across = -rel[near, 0] * s + rel[near, 1] * c  # (P',)
        counts[m] = int(((np.abs(along) <= dx / 2) & (np.abs(across) <= dy / 2)).sum())
    return counts
