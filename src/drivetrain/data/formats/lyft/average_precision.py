"""The Lyft Level 5 detection metric: mAP over 3D-IoU thresholds 0.5, 0.55, …, 0.95, in NumPy.

Follows ``lyft_dataset_sdk.eval.detection.mAP_evaluation`` (``Box3D``, ``recall_precision``, ``get_ap``) as
mmdetection3d's ``get_classwise_aps`` applies it to all thresholds at once:

- **3D IoU**: bird's-eye-view footprint intersection × vertical overlap, over ``volume_a + volume_b −
  intersection`` (clipped to [0, 1]); volumes are ``width × length × height``; a footprint is the rectangle
  ``length × width`` about the centre along ``(R[0, 0], R[1, 0])`` of the rotation matrix ``R`` of the
  w-x-y-z quaternion (exact for yaw-only rotations; a pitched box's footprint shrinks by cos(pitch), as in
  the SDK). The SDK intersects the footprints with shapely; :func:`bev_intersection` clips convex polygons.
- **Matching**, per class and threshold: predictions sorted by score, highest first (a stable sort: ties keep
  submission order); each takes the ground truth of its sample with the largest IoU (the first on ties); it is
  a true positive if that IoU is *strictly* above the threshold and that ground truth is not taken yet at this
  threshold, else a false positive (also when a different, free ground truth overlaps enough: VOC style).
- **AP**: recall = TP / #GT, precision = TP / (TP + FP), with sentinels (recall 0 → precision 0, recall 1 →
  precision 0), the precision envelope (running maximum from the right), then Σ Δrecall × precision wherever the
  recall changes (all-point interpolation, as PASCAL VOC 2010+).
- **mAP**: the mean over the classes that have ground truth in the evaluated samples (mmdetection3d's
  ``get_class_names(gt)``) and over the ten thresholds. A class with ground truth and no prediction scores 0;
  predictions of a class without ground truth are ignored (the SDK's ``recall_precision`` would fail on them).

``footprint="pypi-0.0.8"`` reproduces the footprint of lyft-dataset-sdk 0.0.8, the latest release on PyPI, which
takes ``R[0, 1]`` (= −sin yaw) as the sine and so turns every footprint by −yaw instead of +yaw; lyft/nuscenes-
devkit fixed this in PR #64 (GitHub version 0.0.10, never released to PyPI). The two agree for boxes with the same
centre (so ground truth scored as predictions gives 1 with both) and for headings that are multiples of 90°; for
other pairs they differ: 0.0.8 scores the pair as if the offset between the centres were mirrored in the boxes'
frame. mmdetection3d's published Lyft numbers were computed with 0.0.8.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "FOOTPRINTS",
    "IOU_THRESHOLDS",
    "LyftBoxes",
    "average_precision",
    "bev_intersection",
    "class_average_precisions",
    "footprint_corners",
    "iou_3d",
    "lyft_average_precisions",
]

# mmdetection3d's lyft_eval thresholds, written out (np.arange would give 0.6000000000000001, and matching is `>`).
IOU_THRESHOLDS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
FOOTPRINTS = ("heading", "pypi-0.0.8")
_EPS = 1e-9  # m²: tolerance of the point-in-footprint test (coordinates are relative to a box centre)


@dataclass(frozen=True)
class LyftBoxes:
    """K boxes in the Lyft record format (global frame), as arrays.

    Attributes:
        sample: ``(K,)`` int64 sample id (boxes match only within a sample).
        translation: ``(K, 3)`` float64 box centre.
        size: ``(K, 3)`` float64 ``(width, length, height)``, as nuScenes/Lyft tables store it.
        rotation: ``(K, 4)`` float64 w-x-y-z quaternion (need not be normalised).
        score: ``(K,)`` float64 detection score (ground truth: ignored).
    """

    sample: np.ndarray
    translation: np.ndarray
    size: np.ndarray
    rotation: np.ndarray
    score: np.ndarray

    def __len__(self) -> int:
        return len(self.sample)

    def take(self, rows: np.ndarray) -> LyftBoxes:
        """The boxes at ``rows`` (an index array or a boolean mask)."""
        return LyftBoxes(
            self.sample[rows], self.translation[rows], self.size[rows], self.rotation[rows], self.score[rows]
        )


def footprint_corners(boxes: LyftBoxes, footprint: str = "heading") -> np.ndarray:
    """Bird's-eye-view corners ``(K, 4, 2)`` of the boxes, counter-clockwise, as the SDK's ``Box3D`` builds them.

    Args:
        boxes: the K boxes.
        footprint: ``"heading"`` (the footprint turned by the box's yaw) or ``"pypi-0.0.8"`` (turned by −yaw, as
            lyft-dataset-sdk 0.0.8 does; see the module docstring).
    """
    if footprint not in FOOTPRINTS:
        raise ValueError(f"footprint: expected one of {FOOTPRINTS}, got {footprint!r}")
    q = boxes.rotation / np.linalg.norm(boxes.rotation, axis=1, keepdims=True)  # (K, 4)
    w, x, y, z = q.T  # (K,) each
    cos = 1.0 - 2.0 * (y * y + z * z)  # R[0, 0]
    sin = 2.0 * (x * y + w * z) if footprint == "heading" else 2.0 * (x * y - w * z)  # R[1, 0] or R[0, 1]
    half_l, half_w = boxes.size[:, 1] / 2, boxes.size[:, 0] / 2  # (K,)
    along = np.stack([cos, sin], 1) * half_l[:, None]  # (K, 2)
    across = np.stack([-sin, cos], 1) * half_w[:, None]  # (K, 2)
    offsets = np.stack([along - across, along + across, -along + across, -along - across], 1)  # (K, 4, 2)
    return boxes.translation[:, None, :2] + offsets  # (K, 4, 2)


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]


def _inside(points: np.ndarray, poly: np.ndarray) -> np.ndarray:
    """``(K, n)`` whether each of ``points`` ``(K, n, 2)`` lies in the convex CCW ``poly`` ``(K, 4, 2)``."""
    edges = np.roll(poly, -1, axis=1) - poly  # (K, 4, 2)
    rel = points[:, :, None, :] - poly[:, None, :, :]  # (K, n, 4, 2)
    return (_cross(edges[:, None], rel) >= -_EPS).all(-1)  # (K, n)


def bev_intersection(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Areas of the intersections of convex quadrilaterals, pair by pair.

    The intersection of two convex polygons is the convex polygon whose vertices are the corners of each that lie
    in the other plus the crossings of their edges; these are ordered by angle about their mean and summed with
    the shoelace formula.

    Args:
        a: ``(K, 4, 2)`` counter-clockwise corners.
        b: ``(K, 4, 2)`` counter-clockwise corners.

    Returns:
        ``(K,)`` float64 intersection areas.

    Example:
        >>> square = np.array([[[0, 0], [1, 0], [1, 1], [0, 1]]], dtype=float)
        >>> bev_intersection(square, square + 0.5)
        array([0.25])
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    origin = b.mean(1, keepdims=True)  # (K, 1, 2): work near the origin (global coordinates are ~10³ m)
    a, b = a - origin, b - origin
    ea, eb = np.roll(a, -1, 1) - a, np.roll(b, -1, 1) - b  # (K, 4, 2) edge vectors
    denom = _cross(ea[:, :, None], eb[:, None, :])  # (K, 4, 4)
    gap = b[:, None, :, :] - a[:, :, None, :]  # (K, 4, 4, 2) from a's edge start to b's edge start
    parallel = np.abs(denom) < 1e-12
    safe = np.where(parallel, 1.0, denom)
    t = _cross(gap, eb[:, None, :]) / safe  # (K, 4, 4) position along a's edge
    u = _cross(gap, ea[:, :, None]) / safe  # (K, 4, 4) position along b's edge
    crossing = ~parallel & (t >= 0) & (t <= 1) & (u >= 0) & (u <= 1)  # (K, 4, 4)
    crossings = a[:, :, None, :] + t[..., None] * ea[:, :, None, :]  # (K, 4, 4, 2)
    points = np.concatenate([a, b, crossings.reshape(-1, 16, 2)], 1)  # (K, 24, 2)
    valid = np.concatenate([_inside(a, b), _inside(b, a), crossing.reshape(-1, 16)], 1)  # (K, 24)
    count = valid.sum(1)  # (K,)
    centre = (points * valid[..., None]).sum(1) / np.maximum(count, 1)[:, None]  # (K, 2)
    rel = points - centre[:, None]  # (K, 24, 2)
    angle = np.where(valid, np.arctan2(rel[..., 1], rel[..., 0]), np.inf)  # (K, 24)
    order = np.argsort(angle, axis=1, kind="stable")  # (K, 24): valid points first, by angle
    ring = np.take_along_axis(rel, order[..., None], 1)  # (K, 24, 2)
    # Invalid slots (at the end) repeat the first point, so they add nothing to the shoelace sum.
    ring = np.where((np.arange(24) < count[:, None])[..., None], ring, ring[:, :1])  # (K, 24, 2)
    area = 0.5 * np.abs(_cross(ring, np.roll(ring, -1, 1)).sum(1))  # (K,)
    return np.where(count >= 3, area, 0.0)


def iou_3d(pred: LyftBoxes, gt: LyftBoxes, footprint: str = "heading") -> np.ndarray:
    """3D IoU of the SDK's ``Box3D.get_iou``, pair by pair.

    Args:
        pred: K boxes.
        gt: K boxes (pair k is ``pred[k]``, ``gt[k]``).
        footprint: see :func:`footprint_corners`.

    Returns:
        ``(K,)`` float64 IoU in [0, 1].
    """
    area = bev_intersection(footprint_corners(pred, footprint), footprint_corners(gt, footprint))  # (K,)
    return _iou_from_area(area, pred, gt)


def average_precision(recalls: np.ndarray, precisions: np.ndarray) -> float:
    """The SDK's ``get_ap``: area under the precision envelope, with sentinels (0, 0) and (1, 0).

    Args:
        recalls: ``(D,)`` recall after each of the D detections, in score order.
        precisions: ``(D,)`` precision after each detection.

    Example:
        >>> average_precision(np.array([0.0, 1.0]), np.array([0.0, 0.5]))  # a false positive, then the hit
        0.5
    """
    recall = np.concatenate([[0.0], recalls, [1.0]])
    precision = np.concatenate([[0.0], precisions, [0.0]])
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    change = np.flatnonzero(recall[1:] != recall[:-1])
    return float(np.sum((recall[change + 1] - recall[change]) * precision[change + 1]))


def class_average_precisions(
    gt: LyftBoxes, pred: LyftBoxes, iou_thresholds: Sequence[float] = IOU_THRESHOLDS, footprint: str = "heading"
) -> np.ndarray:
    """AP of one class at each threshold (mmdetection3d's ``get_single_class_aps``).

    Args:
        gt: the class's G ground-truth boxes (G ≥ 1).
        pred: the class's D predictions, in submission order (the order breaks score ties).
        iou_thresholds: T thresholds; a match needs IoU strictly above one.
        footprint: see :func:`footprint_corners`.

    Returns:
        ``(T,)`` float64 APs (0 where there are no predictions).
    """
    thresholds = np.asarray(iou_thresholds, dtype=np.float64)  # (T,)
    if len(gt) == 0:
        raise ValueError("class_average_precisions: needs ground truth (the recall of a class without it is 0/0)")
    if len(pred) == 0:
        return np.zeros(len(thresholds))
    order = np.argsort(-pred.score, kind="stable")  # (D,)
    pred = pred.take(order)
    ious = _ious_within_samples(gt, pred, footprint)  # per prediction: IoU with each GT of its sample
    gt_rows = {s: np.flatnonzero(gt.sample == s) for s in np.unique(gt.sample)}
    taken = {s: np.zeros((len(rows), len(thresholds)), dtype=bool) for s, rows in gt_rows.items()}  # (G_s, T)
    tp = np.zeros((len(pred), len(thresholds)), dtype=bool)  # (D, T)
    for i, row in enumerate(ious):
        if row.size == 0:
            continue
        j = int(np.argmax(row))
        hit = (row[j] > thresholds) & ~taken[int(pred.sample[i])][j]  # (T,)
        tp[i] = hit
        taken[int(pred.sample[i])][j] |= hit
    tps = np.cumsum(tp, 0)  # (D, T)
    fps = np.cumsum(~tp, 0)  # (D, T)
    recalls = tps / float(len(gt))
    precisions = tps / np.maximum(tps + fps, np.finfo(np.float64).eps)
    return np.array([average_precision(recalls[:, k], precisions[:, k]) for k in range(len(thresholds))])


def _ious_within_samples(gt: LyftBoxes, pred: LyftBoxes, footprint: str) -> list[np.ndarray]:
    """For each prediction, its IoU with every ground truth of its sample (in GT order); empty if none."""
    out: list[np.ndarray] = [np.zeros(0)] * len(pred)
    gt_corners, pred_corners = footprint_corners(gt, footprint), footprint_corners(pred, footprint)  # (G|D, 4, 2)
    gt_radius = np.hypot(gt.size[:, 0], gt.size[:, 1]) / 2  # (G,) footprints farther apart than r_a + r_b miss
    pred_radius = np.hypot(pred.size[:, 0], pred.size[:, 1]) / 2  # (D,)
    for s in np.unique(pred.sample):
        p_rows, g_rows = np.flatnonzero(pred.sample == s), np.flatnonzero(gt.sample == s)
        if len(g_rows) == 0:
            continue
        gap = np.linalg.norm(pred.translation[p_rows, None, :2] - gt.translation[None, g_rows, :2], axis=-1)
        near = gap < pred_radius[p_rows, None] + gt_radius[None, g_rows]  # (D_s, G_s)
        pi, gj = np.nonzero(near)
        iou = np.zeros(near.shape)  # (D_s, G_s)
        if len(pi):
            area = bev_intersection(pred_corners[p_rows[pi]], gt_corners[g_rows[gj]])  # (K,)
            iou[pi, gj] = _iou_from_area(area, pred.take(p_rows[pi]), gt.take(g_rows[gj]))
        for k, row in enumerate(p_rows):
            out[row] = iou[k]
    return out


def _iou_from_area(area: np.ndarray, pred: LyftBoxes, gt: LyftBoxes) -> np.ndarray:
    """``(K,)`` IoU from the footprint intersections ``area`` ``(K,)``: × vertical overlap, over the union."""
    top = np.minimum(pred.translation[:, 2] + pred.size[:, 2] / 2, gt.translation[:, 2] + gt.size[:, 2] / 2)
    bottom = np.maximum(pred.translation[:, 2] - pred.size[:, 2] / 2, gt.translation[:, 2] - gt.size[:, 2] / 2)
    inter = area * np.maximum(top - bottom, 0.0)
    return np.clip(inter / (pred.size.prod(1) + gt.size.prod(1) - inter), 0.0, 1.0)


def lyft_average_precisions(
    gt: LyftBoxes,
    gt_labels: np.ndarray,
    pred: LyftBoxes,
    pred_labels: np.ndarray,
    num_classes: int,
    iou_thresholds: Sequence[float] = IOU_THRESHOLDS,
    footprint: str = "heading",
) -> np.ndarray:
    """AP per class and threshold; NaN rows for classes without ground truth (left out of the mAP).

    Args:
        gt: ground-truth boxes.
        gt_labels: ``(G,)`` int64 class indices in ``[0, num_classes)``.
        pred: predicted boxes (in submission order).
        pred_labels: ``(D,)`` int64 class indices.
        num_classes: C.
        iou_thresholds: T thresholds.
        footprint: see :func:`footprint_corners`.

    Returns:
        ``(C, T)`` float64; the mAP is ``np.nanmean`` of it (every row of a class with ground truth is finite).

    Example:
        >>> box = LyftBoxes(np.zeros(1, np.int64), np.zeros((1, 3)), np.ones((1, 3)), np.array([[1.0, 0, 0, 0]]),
        ...                 np.ones(1))
        >>> lyft_average_precisions(box, np.array([0]), box, np.array([0]), 2)[:, 0]
        array([ 1., nan])
    """
    aps = np.full((num_classes, len(iou_thresholds)), np.nan)
    for c in range(num_classes):
        gt_c = gt_labels == c
        if gt_c.any():
            aps[c] = class_average_precisions(gt.take(gt_c), pred.take(pred_labels == c), iou_thresholds, footprint)
    return aps
