"""Lidar simulation of the synthetic generator: a spinning multi-beam sensor ray-cast against boxes and ground.

Rays leave the sensor at ``rings`` elevations (−30° … +10°) × ``azimuths`` directions; each returns the
nearest hit among the ground plane (z = 0 in the ego frame) and the boxes (slab test), within the range.
Box hits are moved 2 cm towards the box centre (inside a convex box from any
surface point), so the devkit's ``points_in_box`` counts them;
the count per box of the key-frame sweep is the annotation's ``num_lidar_pts``. Points are written as
nuScenes does: float32 ``(x, y, z, intensity, ring)`` in the lidar frame.
"""

from __future__ import annotations

import numpy as np

from drivetrain.geometry.rigid import box_corners

__all__ = ["LIDAR_HEIGHT", "cast", "lidar2ego"]

LIDAR_HEIGHT = 1.84
LIDAR_POSITION = (0.94, 0.0, LIDAR_HEIGHT)
LIDAR_YAW = -np.pi / 2  # nuScenes' LIDAR_TOP: x to the right of the vehicle, y forward
_INSIDE = 0.02


def lidar2ego() -> np.ndarray:
    """``(4, 4)`` lidar → ego transform of the simulated LIDAR_TOP."""
    c, s = np.cos(LIDAR_YAW), np.sin(LIDAR_YAW)
    out = np.eye(4)
    out[:3, :3] = [[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]
    out[:3, 3] = LIDAR_POSITION
    return out


def ray_directions(rings: int, azimuths: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit directions ``(R, 3)`` in the lidar frame and the ring index ``(R,)`` of each ray."""
    elevation = np.deg2rad(np.linspace(-30.0, 10.0, rings))
    azimuth = np.linspace(-np.pi, np.pi, azimuths, endpoint=False)
    el, az = np.meshgrid(elevation, azimuth, indexing="ij")  # (rings, azimuths)
    dirs = np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], -1).reshape(-1, 3)
    ring = np.repeat(np.arange(rings), azimuths)
    return dirs, ring


def cast(
    boxes_lidar: np.ndarray,
    labels: np.ndarray,
    ground_z: float,
    rings: int,
    azimuths: int,
    max_range: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Ray-cast one sweep.

    Args:
        boxes_lidar: ``(M, ≥7)`` boxes ``(x, y, z_centre, dx, dy, dz, yaw)`` in the lidar frame.
        labels: ``(M,)`` class indices (set the intensity of their returns).
        ground_z: height of the ground plane in the lidar frame (−sensor height).
        rings: beams (elevation angles).
        azimuths: rays per beam and revolution.
        max_range: metres; a ray whose first hit is farther returns no point.
        rng: draws the intensity jitter.

    Returns:
        points ``(P, 5)`` float32 ``(x, y, z, intensity, ring)``; hit box ``(P,)`` int64, −1 = ground.
    """
    dirs, ring = ray_directions(rings, azimuths)  # (R, 3), (R,)
    t_best = np.full(len(dirs), np.inf)
    hit = np.full(len(dirs), -1, dtype=np.int64)
    down = dirs[:, 2] < -1e-9
    t_best[down] = ground_z / dirs[down, 2]
    reach = np.linalg.norm(boxes_lidar[:, :2], axis=1) - np.linalg.norm(boxes_lidar[:, 3:5], axis=1) / 2
    step = 2 * np.pi / azimuths
    for m in np.flatnonzero((reach <= max_range) & (reach > 0)):
        box = boxes_lidar[m]
        c, s = np.cos(box[6]), np.sin(box[6])
        # Only rays whose azimuth falls inside the box's angular extent (seen from the sensor) can hit it.
        corners = box_corners(box[None, :7])[0, :4, :2]  # (4, 2) BEV
        centre_az = np.arctan2(box[1], box[0])
        rel = (np.arctan2(corners[:, 1], corners[:, 0]) - centre_az + np.pi) % (2 * np.pi) - np.pi
        first = int(np.floor((centre_az + rel.min() + np.pi) / step))
        last = int(np.ceil((centre_az + rel.max() + np.pi) / step))
        cols = np.arange(first, last + 1) % azimuths
        idx = (np.arange(rings)[:, None] * azimuths + cols[None]).ravel()  # (r,)
        origin = np.array([-(c * box[0] + s * box[1]), -(-s * box[0] + c * box[1]), -box[2]])  # sensor in box frame
        dx = dirs[idx, 0] * c + dirs[idx, 1] * s
        dy = -dirs[idx, 0] * s + dirs[idx, 1] * c
        t_near = np.zeros(len(idx))
        t_far = np.full(len(idx), np.inf)
        for axis, d in enumerate((dx, dy, dirs[idx, 2])):
            with np.errstate(divide="ignore", invalid="ignore"):
                t1 = (-box[3 + axis] / 2 - origin[axis]) / d
                t2 = (box[3 + axis] / 2 - origin[axis]) / d
            t_near = np.fmax(t_near, np.fmin(t1, t2))
            t_far = np.fmin(t_far, np.fmax(t1, t2))
        ok = (t_near <= t_far) & (t_near < t_best[idx])
        t_best[idx[ok]] = t_near[ok]
        hit[idx[ok]] = m
    keep = np.isfinite(t_best) & (t_best <= max_range)
    xyz = dirs[keep] * t_best[keep, None]  # (P, 3)
    hit = hit[keep]
    on_box = hit >= 0
    towards_centre = boxes_lidar[hit[on_box], :3] - xyz[on_box]  # (P_box, 3)
    xyz[on_box] += _INSIDE * towards_centre / np.linalg.norm(towards_centre, axis=1, keepdims=True)
    intensity = np.where(hit >= 0, 20.0 + 8.0 * labels[np.maximum(hit, 0)], 5.0) + rng.uniform(0, 3, len(hit))
    points = np.concatenate([xyz, intensity[:, None], ring[keep, None]], axis=1).astype(np.float32)
    return points, hit
