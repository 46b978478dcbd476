"""Camera rig and rasteriser of the synthetic generator: shaded, class-coloured cuboids with a z-buffer.

The rig is a ring of six cameras at 60° yaw steps, 1.5 m above the ground, looking horizontally
(camera frame: x right, y down, z forward, as nuScenes). Each visible face of each box is clipped at the
near plane, projected and filled; a per-pixel depth test (z-buffer, depth from the face's plane) keeps
the nearest surface, so occlusion is exact for any arrangement of boxes. Faces are shaded by a fixed
sun direction; the background is sky above the horizon and ground shaded by distance below it.
The renderer also returns an instance-id map (−1 = background), used for visibility and tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from drivetrain.data.formats.schema import CAMERAS
from drivetrain.geometry.rigid import box_corners, transform

__all__ = ["CLASS_COLORS", "CameraRig", "Rendered", "make_rig", "render"]

CLASS_COLORS = np.array(
    [
        [220, 40, 40],  # car
        [40, 90, 220],  # truck
        [240, 170, 20],  # construction_vehicle
        [30, 170, 60],  # bus
        [150, 60, 200],  # trailer
        [240, 240, 240],  # barrier
        [230, 90, 200],  # motorcycle
        [20, 200, 200],  # bicycle
        [250, 230, 60],  # pedestrian
        [255, 120, 0],  # traffic_cone
    ],
    dtype=np.float64,
)
CAMERA_YAW_DEG = {
    "CAM_FRONT": 0.0,
    "CAM_FRONT_RIGHT": -60.0,
    "CAM_BACK_RIGHT": -120.0,
    "CAM_BACK": 180.0,
    "CAM_BACK_LEFT": 120.0,
    "CAM_FRONT_LEFT": 60.0,
}
CAMERA_HEIGHT = 1.5
NEAR = 0.1
SUN = np.array([0.35, 0.55, 0.76]) / np.linalg.norm([0.35, 0.55, 0.76])
# Faces of box_corners' numbering: (corner indices in order around the face, outward normal in the box frame).
FACES = (
    ((0, 2, 6, 4), (-1, 0, 0)),
    ((1, 5, 7, 3), (1, 0, 0)),
    ((0, 4, 5, 1), (0, -1, 0)),
    ((2, 3, 7, 6), (0, 1, 0)),
    ((0, 1, 3, 2), (0, 0, -1)),
    ((4, 6, 7, 5), (0, 0, 1)),
)
FACE_INDEX = np.array([idx for idx, _ in FACES])  # (6, 4)
# The camera frame's axes in a forward-looking (x forward, y left, z up) frame: columns = cam x, y, z.
_CAM_AXES = np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])


@dataclass(frozen=True)
class CameraRig:
    """Per camera: ``cam2ego`` ``(4, 4)`` and ``intrinsics`` ``(3, 3)``; image size in pixels."""

    names: tuple[str, ...]
    cam2ego: np.ndarray  # (N, 4, 4)
    intrinsics: np.ndarray  # (N, 3, 3)
    width: int
    height: int


def make_rig(width: int, height: int, focal: float) -> CameraRig:
    """Six cameras at 60° steps around the vehicle, 1.5 m high, principal point at the image centre."""
    cam2ego, intrinsics = [], []
    for name in CAMERAS:
        yaw = np.deg2rad(CAMERA_YAW_DEG[name])
        rz = np.array([[np.cos(yaw), -np.sin(yaw), 0.0], [np.sin(yaw), np.cos(yaw), 0.0], [0.0, 0.0, 1.0]])
        position = np.array([1.0 + 0.6 * np.cos(yaw), 0.5 * np.sin(yaw), CAMERA_HEIGHT])
        cam2ego.append(transform(rz @ _CAM_AXES, position))
        intrinsics.append(np.array([[focal, 0.0, width / 2], [0.0, focal, height / 2], [0.0, 0.0, 1.0]]))
    return CameraRig(CAMERAS, np.stack(cam2ego), np.stack(intrinsics), width, height)


@dataclass(frozen=True)
class Rendered:
    """One camera image and, per pixel, which box it shows."""

    image: np.ndarray  # (H, W, 3) uint8 RGB
    instance: np.ndarray  # (H, W) int32, index of the box seen at each pixel, −1 for background
    covered: np.ndarray  # (M,) int64: pixels each box's visible faces cover before the depth test


def background(rig: CameraRig, cam: int) -> np.ndarray:
    """``(H, W, 3)`` float sky/ground image of one camera (depends only on the rig: compute once)."""
    h, w = rig.height, rig.width
    u, v = np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)
    rays = np.stack([u, v, np.ones_like(u)], -1) @ np.linalg.inv(rig.intrinsics[cam]).T  # (H, W, 3) camera frame
    rays = rays @ rig.cam2ego[cam][:3, :3].T  # (H, W, 3) ego frame
    down = rays[..., 2] < -1e-6
    dist = np.where(down, rig.cam2ego[cam][2, 3] / np.maximum(-rays[..., 2], 1e-6), np.inf)
    ground = 70.0 + 60.0 * np.exp(-dist / 25.0)
    sky = 150.0 + 80.0 * np.clip(rays[..., 2] / np.linalg.norm(rays, axis=-1), 0, 1)
    img = np.where(
        down[..., None], ground[..., None] * np.array([1.0, 1.0, 0.95]), sky[..., None] * np.array([0.75, 0.85, 1.0])
    )
    return img


def render(
    rig: CameraRig, cam: int, boxes_cam: np.ndarray, labels: np.ndarray, bg: np.ndarray, sun_cam: np.ndarray
) -> Rendered:
    """Render boxes given in this camera's frame.

    Args:
        rig: the camera rig.
        cam: index of the camera in the rig.
        boxes_cam: ``(M, 8, 3)`` box corners in the camera frame (``box_corners`` numbering).
        labels: ``(M,)`` class indices (colour).
        bg: ``(H, W, 3)`` background from :func:`background`.
        sun_cam: ``(3,)`` unit direction towards the sun in the camera frame.
    """
    h, w = rig.height, rig.width
    k = rig.intrinsics[cam]
    image = bg.copy()
    depth = np.full((h, w), np.inf)
    instance = np.full((h, w), -1, dtype=np.int32)
    covered = np.zeros(len(boxes_cam), dtype=np.int64)
    k_inv = np.linalg.inv(k)
    if len(boxes_cam) == 0:
        return Rendered(np.clip(image, 0, 255).astype(np.uint8), instance, covered)
    # Frustum culling: skip boxes wholly behind the near plane or wholly left/right/above/below the image.
    z = boxes_cam[..., 2]  # (M, 8)
    x_lim, y_lim = boxes_cam[..., 0] / np.maximum(z, NEAR), boxes_cam[..., 1] / np.maximum(z, NEAR)
    half_w, half_h = w / 2 / k[0, 0], h / 2 / k[1, 1]
    front = z > NEAR
    outside = (
        ~front.any(1)
        | (front.all(1) & ((x_lim.max(1) < -half_w - 0.01) | (x_lim.min(1) > half_w + 0.01)))
        | (front.all(1) & ((y_lim.max(1) < -half_h - 0.01) | (y_lim.min(1) > half_h + 0.01)))
    )
    faces = boxes_cam[:, FACE_INDEX]  # (M, 6, 4, 3)
    normals = np.cross(faces[:, :, 1] - faces[:, :, 0], faces[:, :, 3] - faces[:, :, 0])  # (M, 6, 3)
    normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
    outward = np.einsum("mfk,mfk->mf", normals, faces.mean(2) - boxes_cam.mean(1)[:, None])
    normals *= np.where(outward < 0, -1.0, 1.0)[..., None]
    offsets = np.einsum("mfk,mfk->mf", normals, faces[:, :, 0])  # (M, 6): plane n·X = offset
    for m in np.flatnonzero(~outside):
        for f in np.flatnonzero(offsets[m] < 0):  # front faces: the camera is on the outer side
            normal, offset = normals[m, f], float(offsets[m, f])
            poly = _clip_near(faces[m, f])
            if len(poly) < 3:
                continue
            pix = poly @ k.T
            pix = pix[:, :2] / pix[:, 2:3]  # (V, 2)
            x0, y0 = np.floor(pix.min(0)).astype(int)
            x1, y1 = np.ceil(pix.max(0)).astype(int)
            x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
            if x0 >= x1 or y0 >= y1:
                continue
            u, v = np.meshgrid(np.arange(x0, x1) + 0.5, np.arange(y0, y1) + 0.5)
            inside = _inside_convex(pix, u, v)
            if not inside.any():
                continue
            covered[m] += int(inside.sum())
            rays = np.stack([u, v, np.ones_like(u)], -1) @ k_inv.T  # (h', w', 3), z = 1
            depth_face = offset / np.minimum(rays @ normal, -1e-12)  # depth along the optical axis
            win = inside & (depth_face < depth[y0:y1, x0:x1])
            shade = 0.45 + 0.55 * max(0.0, float(np.dot(normal, sun_cam)))
            depth[y0:y1, x0:x1][win] = depth_face[win]
            instance[y0:y1, x0:x1][win] = m
            image[y0:y1, x0:x1][win] = CLASS_COLORS[labels[m]] * shade
    return Rendered(np.clip(image, 0, 255).astype(np.uint8), instance, covered)


def _clip_near(poly: np.ndarray) -> np.ndarray:
    """Clip a ``(V, 3)`` polygon to ``z ≥ NEAR`` (Sutherland–Hodgman against one plane)."""
    out = []
    for i in range(len(poly)):
        a, b = poly[i], poly[(i + 1) % len(poly)]
        a_in, b_in = a[2] >= NEAR, b[2] >= NEAR
        if a_in:
            out.append(a)
        if a_in != b_in:
            t = (NEAR - a[2]) / (b[2] - a[2])
            out.append(a + t * (b - a))
    return np.array(out).reshape(-1, 3)


def _inside_convex(pix: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Pixels ``(u, v)`` inside the convex polygon ``pix`` ``(V, 2)`` (either orientation)."""
    area2 = 0.0
    for i in range(len(pix)):
        a, b = pix[i], pix[(i + 1) % len(pix)]
        area2 += a[0] * b[1] - b[0] * a[1]
    sign = 1.0 if area2 >= 0 else -1.0
    inside = np.ones(u.shape, dtype=bool)
    for i in range(len(pix)):
        a, b = pix[i], pix[(i + 1) % len(pix)]
        inside &= sign * ((b[0] - a[0]) * (v - a[1]) - (b[1] - a[1]) * (u - a[0])) >= 0
    return inside


def corners_in_camera(boxes_ego: np.ndarray, cam2ego: np.ndarray) -> np.ndarray:
    """``(M, 9)`` boxes in the ego frame → ``(M, 8, 3)`` corners in the camera frame."""
    corners = box_corners(boxes_ego)  # (M, 8, 3)
    ego2cam = np.linalg.inv(cam2ego)
    return corners @ ego2cam[:3, :3].T + ego2cam[:3, 3]
