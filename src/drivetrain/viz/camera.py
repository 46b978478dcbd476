"""A camera frame as a picture: the six camera images with the 3D boxes projected onto them (ground truth thick,
predictions thin, both in their class's colour) and, when the frame has lidar points, a bird's-eye panel.

Boxes are lidar-frame ``(x, y, z_centre, dx, dy, dz, yaw, ...)``; each image's ``lidar2img`` (``K₄ · lidar2cam``)
projects their 8 corners; an edge is drawn when both of its ends lie at least ``NEAR`` metres in front of the
camera (edges that cross the image plane are left out rather than drawn through infinity). Lines are drawn with
PIL on the pixels themselves (so a picture's coloured pixels can be counted), then laid out with matplotlib.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from drivetrain.geometry.rigid import box_corners
from drivetrain.safeio.files import save_figure

__all__ = ["CLASS_COLOURS", "NEAR", "camera_grid", "draw_boxes", "frame_png", "project_box_edges"]

NEAR = 0.1  # metres in front of the camera an edge's ends must be
# One colour per class index (nuScenes' 10 detection classes in drivetrain's order; more indices cycle): ten
# distinct hues (matplotlib's tab10), so that car, truck, trailer and construction vehicle tell apart at a glance.
CLASS_COLOURS = (
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
)  # fmt: skip
# The 12 edges of a box over the corners of box_corners (bit 0: x, 1: y, 2: z); the first four are the front face.
EDGES = ((1, 3), (3, 7), (7, 5), (5, 1), (0, 2), (2, 6), (6, 4), (4, 0), (0, 1), (2, 3), (4, 5), (6, 7))


def project_box_edges(boxes: np.ndarray, lidar2img: np.ndarray) -> list[np.ndarray]:
    """Per box, the ``(E, 2, 2)`` pixel end points of its edges that lie in front of the camera (see the module)."""
    boxes = np.asarray(boxes, dtype=np.float64)
    if len(boxes) == 0:
        return []
    corners = box_corners(boxes)  # (K, 8, 3)
    homogeneous = np.concatenate([corners, np.ones((*corners.shape[:2], 1))], axis=-1)  # (K, 8, 4)
    projected = homogeneous @ np.asarray(lidar2img, dtype=np.float64).T  # (K, 8, 4)
    depth = projected[..., 2]  # (K, 8)
    pixels = projected[..., :2] / np.maximum(depth[..., None], NEAR)  # (K, 8, 2)
    out = []
    for k in range(len(boxes)):
        segments = [pixels[k, [a, b]] for a, b in EDGES if depth[k, a] >= NEAR and depth[k, b] >= NEAR]
        out.append(np.stack(segments) if segments else np.zeros((0, 2, 2)))
    return out


def draw_boxes(
    image: np.ndarray, lidar2img: np.ndarray, boxes: np.ndarray, labels: np.ndarray, *, width: int = 3
) -> np.ndarray:
    """``image`` (uint8 ``(H, W, 3)``) with ``boxes`` drawn in their labels' colours; a new array."""
    from PIL import Image, ImageDraw

    picture = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8))
    pen = ImageDraw.Draw(picture)
    for edges, label in zip(project_box_edges(boxes, lidar2img), np.asarray(labels).tolist(), strict=True):
        colour = CLASS_COLOURS[int(label) % len(CLASS_COLOURS)]
        for (x0, y0), (x1, y1) in edges.tolist():
            pen.line([(x0, y0), (x1, y1)], fill=colour, width=width)
    return np.asarray(picture)


def camera_grid(
    images: np.ndarray,
    lidar2img: np.ndarray,
    gt_boxes: np.ndarray,
    gt_labels: np.ndarray,
    pred_boxes: np.ndarray | None = None,
    pred_labels: np.ndarray | None = None,
    columns: int = 3,
) -> np.ndarray:
    """The cameras with projected boxes tiled into one uint8 ``(rows·H, columns·W, 3)`` array (no matplotlib):
    what TensorBoard shows at evaluation time."""
    cameras, height, width = images.shape[:3]
    columns = min(columns, cameras)
    rows = -(-cameras // columns)
    out = np.zeros((rows * height, columns * width, 3), dtype=np.uint8)
    for n in range(cameras):
        picture = draw_boxes(images[n], lidar2img[n], gt_boxes, gt_labels, width=3)
        if pred_boxes is not None and len(pred_boxes):
            picture = draw_boxes(picture, lidar2img[n], pred_boxes, pred_labels, width=1)
        r, c = divmod(n, columns)
        out[r * height : (r + 1) * height, c * width : (c + 1) * width] = picture
    return out


def frame_png(
    path: str | Path,
    images: np.ndarray,
    lidar2img: np.ndarray,
    gt_boxes: np.ndarray,
    gt_labels: np.ndarray,
    pred_boxes: np.ndarray | None = None,
    pred_labels: np.ndarray | None = None,
    *,
    points: np.ndarray | None = None,
    time_column: int | None = None,
    extent: float = 50.0,
    camera_names: Sequence[str] | None = None,
    class_names: Sequence[str] | None = None,
    title: str = "",
) -> Path:
    """The cameras (2 rows of up to 3) with projected boxes, and a BEV panel when ``points`` are given.

    Args:
        path: the PNG to write.
        images: uint8 ``(N, H, W, 3)``.
        lidar2img: ``(N, 4, 4)``.
        gt_boxes: ``(G, ≥7)`` ground truth (drawn 3 px wide).
        gt_labels: ``(G,)`` their class indices.
        pred_boxes: ``(K, ≥7)`` predictions (1 px), or None.
        pred_labels: ``(K,)`` their class indices, or None.
        points: ``(P, ≥3)`` lidar points for the BEV panel, or None.
        time_column: the points' Δt column (sweeps coloured by age).
        extent: half-width of the BEV panel in metres.
        camera_names: a title per camera.
        class_names: the legend's names of the class indices.
        title: the figure's title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from drivetrain.viz.lidar import draw_bev

    cameras = len(images)
    columns = min(3, cameras)
    rows = -(-cameras // columns)
    bev = points is not None
    height, width = images.shape[1:3]
    fig = plt.figure(figsize=(4.2 * columns + (5.0 if bev else 0), 4.2 * rows * height / width + 0.8), dpi=100)
    grid = fig.add_gridspec(rows, columns + (2 if bev else 0))
    for n in range(cameras):
        picture = draw_boxes(images[n], lidar2img[n], gt_boxes, gt_labels, width=3)
        if pred_boxes is not None and len(pred_boxes):
            picture = draw_boxes(picture, lidar2img[n], pred_boxes, pred_labels, width=1)
        ax = fig.add_subplot(grid[n // columns, n % columns])
        ax.imshow(picture)
        ax.set_axis_off()
        ax.set_title(camera_names[n] if camera_names else f"camera {n}", fontsize=8)
    if bev:
        ax = fig.add_subplot(grid[:, columns:])
        draw_bev(ax, points, gt_boxes, pred_boxes, None, time_column=time_column, extent=extent)
    shown = [np.asarray(gt_labels).ravel(), np.asarray(pred_labels if pred_labels is not None else []).ravel()]
    used = sorted({int(v) for v in np.concatenate(shown)})
    handles = [
        Line2D([], [], color=np.asarray(CLASS_COLOURS[c % len(CLASS_COLOURS)]) / 255, lw=3,
               label=class_names[c] if class_names and c < len(class_names) else f"class {c}")
        for c in used
    ]  # fmt: skip
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 10), fontsize=7, frameon=False)
    fig.suptitle(title or "ground truth thick, predictions thin; colour by class", fontsize=9, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)  # a link at the name is replaced, its target never written
    plt.close(fig)
    return path
