"""Camera projection of 3D boxes: the per-camera 2D ground truth of image-space heads (2D boxes, centres, depths).

For each box and camera: the 2D box is the min/max of the cuboid's projection — corners in front of the
near plane plus the points where its edges cross that plane, so boxes reaching behind the camera are
handled — clipped to the image; ``centers_2d`` is the projection of the 3D box centre and ``depths_2d``
its depth (camera z). A box is kept for a camera when its centre lies at least ``min_depth`` in front of
the camera and projects inside the image, and its clipped 2D box is at least ``min_size`` pixels wide and
high (as StreamPETR's converter, whose 2D ground truth its focal head learns: depth > 0.1 m, ≥ 2 px... it keeps
the centre inside the image).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from drivetrain.geometry.rigid import box_corners

__all__ = ["Boxes2D", "lidar2img", "project_boxes"]

# The 12 edges of box_corners' numbering (pairs of corners differing in one bit).
EDGES = np.array([(a, a | (1 << bit)) for a in range(8) for bit in range(3) if not a & (1 << bit)])  # (12, 2)


@dataclass(frozen=True)
class Boxes2D:
    """Projected boxes of one camera; ``index`` says which 3D box each row comes from."""

    index: np.ndarray  # (K,) int64 into the 3D boxes
    boxes: np.ndarray  # (K, 4) float32 pixel xyxy
    centers: np.ndarray  # (K, 2) float32 pixels
    depths: np.ndarray  # (K,) float32 metres


def lidar2img(intrinsics: np.ndarray, cam2lidar: np.ndarray) -> np.ndarray:
    """``(..., 4, 4)`` lidar → image: ``viewpad(K) @ inv(cam2lidar)`` (rows 0–2 give ``(u·d, v·d, d)``)."""
    viewpad = np.zeros((*intrinsics.shape[:-2], 4, 4))
    viewpad[..., :3, :3] = intrinsics
    viewpad[..., 3, 3] = 1.0
    return viewpad @ np.linalg.inv(cam2lidar)


def project_boxes(
    boxes: np.ndarray,
    intrinsics: np.ndarray,
    cam2lidar: np.ndarray,
    image_size: tuple[int, int],
    *,
    min_depth: float = 0.1,
    min_size: float = 2.0,
) -> Boxes2D:
    """2D ground truth of ``(M, ≥7)`` lidar-frame boxes in one camera (``intrinsics`` ``(3, 3)``,
    ``cam2lidar`` ``(4, 4)``, ``image_size`` ``(W, H)``)."""
    width, height = image_size
    lidar2cam = np.linalg.inv(cam2lidar)
    boxes = np.asarray(boxes, dtype=np.float64)
    centres = boxes[:, :3] @ lidar2cam[:3, :3].T + lidar2cam[:3, 3]  # (M, 3) camera frame
    corners = box_corners(boxes) @ lidar2cam[:3, :3].T + lidar2cam[:3, 3]  # (M, 8, 3)
    a, b = corners[:, EDGES[:, 0]], corners[:, EDGES[:, 1]]  # (M, 12, 3)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (min_depth - a[..., 2]) / (b[..., 2] - a[..., 2])  # (M, 12)
    crossing_ok = (t > 0) & (t < 1)
    t = np.where(crossing_ok, t, 0.0)
    crossing = a + t[..., None] * (b - a)  # (M, 12, 3)
    pts = np.concatenate([corners, crossing], axis=1)  # (M, 20, 3)
    ok = np.concatenate([corners[..., 2] >= min_depth, crossing_ok], axis=1)  # (M, 20)
    z = np.where(ok, pts[..., 2], 1.0)
    uv = (pts @ intrinsics.T)[..., :2] / z[..., None]  # (M, 20, 2)
    lo = np.where(ok[..., None], uv, np.inf).min(1)  # (M, 2)
    hi = np.where(ok[..., None], uv, -np.inf).max(1)  # (M, 2)
    x0, y0 = np.clip(lo[:, 0], 0, width), np.clip(lo[:, 1], 0, height)
    x1, y1 = np.clip(hi[:, 0], 0, width), np.clip(hi[:, 1], 0, height)
    depth = centres[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        cuv = (centres @ intrinsics.T)[:, :2] / depth[:, None]  # (M, 2)
    keep = (
        (depth > min_depth)
        & (cuv[:, 0] >= 0)
        & (cuv[:, 0] < width)
        & (cuv[:, 1] >= 0)
        & (cuv[:, 1] < height)
        & (x1 - x0 >= min_size)
        & (y1 - y0 >= min_size)
    )
    index = np.flatnonzero(keep)
    xyxy = np.stack([x0, y0, x1, y1], -1)[index].astype(np.float32)
    return Boxes2D(index, xyxy, cuv[index].astype(np.float32), depth[index].astype(np.float32))
