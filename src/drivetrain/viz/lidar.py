"""A lidar frame as pictures: a bird's-eye PNG (points coloured by sweep age, boxes with their heading) and a
PLY file of the points and the boxes as closed meshes, which MeshLab, Open3D and CloudCompare open.

Boxes are lidar-frame ``(x, y, z_centre, dx, dy, dz, yaw, ...)``; points ``(x, y, z, ...)`` with the sweep age
``Δt`` in ``time_column`` when given (key-frame points have Δt 0). Ground truth is drawn green, predictions in
a warm colour (orange to red by score).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from drivetrain.geometry.rigid import box_corners
from drivetrain.safeio.files import replacing, save_figure

__all__ = ["BOX_FACES", "bev_array", "bev_png", "draw_bev", "points_extent", "write_ply"]

GT_COLOUR = (40, 180, 60)
# The six quads of a box over the corners of drivetrain.geometry.rigid.box_corners (bit 0: x, 1: y, 2: z).
BOX_FACES = ((0, 2, 3, 1), (4, 5, 7, 6), (0, 4, 6, 2), (1, 3, 7, 5), (0, 1, 5, 4), (2, 6, 7, 3))


def _prediction_colour(score: float) -> tuple[int, int, int]:
    """Orange (score 0) to red (score 1)."""
    s = float(np.clip(score, 0.0, 1.0))
    return 230, int(150 * (1.0 - s)), 20


NEWEST, OLDEST = (210, 210, 210), (40, 70, 160)  # point colours of the key frame and of the oldest sweep


def _point_colours(points: np.ndarray, time_column: int | None) -> np.ndarray:
    """``(N, 3)`` uint8: key-frame points light grey, older sweeps darker blue."""
    if time_column is None or points.shape[1] <= time_column:
        return np.full((points.shape[0], 3), 200, dtype=np.uint8)
    age = np.abs(points[:, time_column])
    span = max(float(age.max(initial=0.0)), 1e-6)
    t = (age / span)[:, None]  # 0 newest .. 1 oldest
    newest, oldest = np.array(NEWEST, dtype=np.float64), np.array(OLDEST, dtype=np.float64)
    return (newest * (1 - t) + oldest * t).astype(np.uint8)


def points_extent(points: np.ndarray | None, default: float = 50.0) -> float:
    """Half-width of a square view that holds the points: their largest |x| or |y|, rounded up to 5 m."""
    if points is None or len(points) == 0:
        return default
    reach = float(np.abs(np.asarray(points)[:, :2]).max())
    return max(5.0, 5.0 * np.ceil(reach / 5.0)) if np.isfinite(reach) else default


def _check_boxes(name: str, boxes: np.ndarray | None) -> np.ndarray:
    boxes = np.zeros((0, 7)) if boxes is None else np.asarray(boxes, dtype=np.float64)
    if boxes.ndim != 2 or boxes.shape[1] < 7:
        raise ValueError(f"{name}: expected (K, ≥7) boxes (x, y, z_centre, dx, dy, dz, yaw, ...), got {boxes.shape}")
    return boxes


def write_ply(
    path: str | Path,
    points: np.ndarray,
    gt_boxes: np.ndarray | None = None,
    pred_boxes: np.ndarray | None = None,
    pred_scores: np.ndarray | None = None,
    time_column: int | None = None,
) -> Path:
    """Write a binary little-endian PLY: one coloured vertex per point, then 8 vertices and 6 quads per box.

    Args:
        path: the ``.ply`` file to write (its folder is created).
        points: ``(N, ≥3)`` lidar points.
        gt_boxes: ``(G, ≥7)`` ground-truth boxes (green), or None.
        pred_boxes: ``(K, ≥7)`` predicted boxes (orange to red by ``pred_scores``), or None.
        pred_scores: ``(K,)`` scores in [0, 1] (default 1).
        time_column: column of ``points`` holding Δt (colours the sweeps), or None.

    Returns:
        The path written.
    """
    points = np.asarray(points, dtype=np.float32)
    if points.ndim != 2 or points.shape[1] < 3:
        raise ValueError(f"points: expected (N, ≥3), got {points.shape}")
    gt, pred = _check_boxes("gt_boxes", gt_boxes), _check_boxes("pred_boxes", pred_boxes)
    scores = np.ones(len(pred)) if pred_scores is None else np.asarray(pred_scores, dtype=np.float64)
    if scores.shape != (len(pred),):
        raise ValueError(f"pred_scores: expected ({len(pred)},), got {scores.shape}")
    colours = [_point_colours(points, time_column)]
    xyz = [points[:, :3]]
    for boxes, box_colours in ((gt, [GT_COLOUR] * len(gt)), (pred, [_prediction_colour(s) for s in scores])):
        if len(boxes):
            xyz.append(box_corners(boxes).reshape(-1, 3).astype(np.float32))  # (K·8, 3)
            colours.append(np.repeat(np.asarray(box_colours, dtype=np.uint8), 8, axis=0))
    vertices = np.concatenate(xyz)
    vertex_colours = np.concatenate(colours)
    num_boxes = len(gt) + len(pred)
    first = points.shape[0] + 8 * np.arange(num_boxes)  # (K,) index of each box's corner 0
    faces = first[:, None, None] + np.asarray(BOX_FACES)[None]  # (K, 6, 4)

    vertex = np.empty(len(vertices), dtype=[("xyz", "<f4", 3), ("rgb", "u1", 3)])
    vertex["xyz"], vertex["rgb"] = vertices, vertex_colours
    face = np.empty(num_boxes * 6, dtype=[("n", "u1"), ("idx", "<i4", 4)])
    face["n"], face["idx"] = 4, faces.reshape(-1, 4)
    header = (
        "ply\nformat binary_little_endian 1.0\ncomment drivetrain lidar frame: points, GT boxes (green), predictions\n"
        f"element vertex {len(vertex)}\nproperty float x\nproperty float y\nproperty float z\n"
        "property uchar red\nproperty uchar green\nproperty uchar blue\n"
        f"element face {len(face)}\nproperty list uchar int vertex_indices\nend_header\n"
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as f:  # a link at the name is replaced, its target never written
        f.write(header.encode("ascii"))
        f.write(vertex.tobytes())
        f.write(face.tobytes())
    return path


def bev_png(
    path: str | Path,
    points: np.ndarray,
    gt_boxes: np.ndarray | None = None,
    pred_boxes: np.ndarray | None = None,
    pred_scores: np.ndarray | None = None,
    *,
    time_column: int | None = None,
    extent: float = 50.0,
    title: str = "",
    size_px: int = 900,
) -> Path:
    """A bird's-eye PNG: points (by sweep age), box footprints with a heading tick, GT green, predictions red.

    Args:
        path: the ``.png`` file to write.
        points: ``(N, ≥3)`` lidar points.
        gt_boxes: ``(G, ≥7)`` ground-truth boxes, or None.
        pred_boxes: ``(K, ≥7)`` predicted boxes, or None.
        pred_scores: ``(K,)`` scores in [0, 1] (default 1).
        time_column: column of ``points`` holding Δt, or None.
        extent: half-width in metres of the square shown around the lidar.
        title: text above the picture.
        size_px: width and height in pixels.

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dpi = 100
    fig, ax = plt.subplots(figsize=(size_px / dpi, size_px / dpi), dpi=dpi)
    gt, pred = draw_bev(ax, points, gt_boxes, pred_boxes, pred_scores, time_column=time_column, extent=extent)
    ax.set_title(title or f"{len(gt)} ground-truth boxes (green), {len(pred)} predictions (orange → red by score)",
                 fontsize=9, loc="left")  # fmt: skip
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=dpi)  # a link at the name is replaced, its target never written
    plt.close(fig)
    return path


def draw_bev(
    ax: Any,
    points: np.ndarray,
    gt_boxes: np.ndarray | None = None,
    pred_boxes: np.ndarray | None = None,
    pred_scores: np.ndarray | None = None,
    *,
    time_column: int | None = None,
    extent: float = 50.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Draw the bird's-eye view of :func:`bev_png` on the matplotlib axis ``ax``; returns the checked boxes."""
    points = np.asarray(points, dtype=np.float64)
    gt, pred = _check_boxes("gt_boxes", gt_boxes), _check_boxes("pred_boxes", pred_boxes)
    scores = np.ones(len(pred)) if pred_scores is None else np.asarray(pred_scores, dtype=np.float64)
    ax.set_facecolor("black")
    near = (np.abs(points[:, 0]) <= extent) & (np.abs(points[:, 1]) <= extent)
    ax.scatter(points[near, 0], points[near, 1], s=1.2, c=_point_colours(points[near], time_column) / 255.0, lw=0)
    for boxes, colours, width in (
        (gt, [GT_COLOUR] * len(gt), 1.4),
        (pred, [_prediction_colour(s) for s in scores], 1.0),
    ):
        for box, colour in zip(boxes, colours, strict=True):
            corners = box_corners(box[None])[0, [0, 2, 3, 1, 0], :2]  # footprint, closed
            rgb = np.asarray(colour) / 255.0
            ax.plot(corners[:, 0], corners[:, 1], color=rgb, lw=width)
            front = corners[2:4].mean(axis=0)  # the +x face: the box's heading
            ax.plot([box[0], front[0]], [box[1], front[1]], color=rgb, lw=width)
    if time_column is not None and points.shape[1] > time_column and len(points):
        from matplotlib.lines import Line2D

        oldest = float(np.abs(points[:, time_column]).max())
        handles = [
            Line2D([], [], ls="", marker="o", ms=4, color=np.asarray(colour) / 255.0, label=label)
            for colour, label in ((NEWEST, "key frame (Δt 0 s)"), (OLDEST, f"oldest sweep (Δt {oldest:.2f} s)"))
        ]
        ax.legend(handles=handles, loc="upper right", fontsize=7, facecolor="black", labelcolor="white", framealpha=0.6)
    ax.set_xlim(-extent, extent)
    ax.set_ylim(-extent, extent)
    ax.set_aspect("equal")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    return gt, pred


def bev_array(
    points: np.ndarray,
    gt_boxes: np.ndarray | None = None,
    pred_boxes: np.ndarray | None = None,
    pred_scores: np.ndarray | None = None,
    *,
    extent: float = 50.0,
    size_px: int = 600,
) -> np.ndarray:
    """:func:`bev_png`'s picture as a uint8 ``(H, W, 3)`` array (for TensorBoard)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dpi = 100
    fig, ax = plt.subplots(figsize=(size_px / dpi, size_px / dpi), dpi=dpi)
    draw_bev(ax, points, gt_boxes, pred_boxes, pred_scores, extent=extent)
    fig.tight_layout()
    fig.canvas.draw()
    picture = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return picture
