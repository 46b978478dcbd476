"""Nearest-BEV IoU of 3D boxes, as mmdetection3d's ``BboxOverlapsNearest3D`` computes it for anchor assignment.

Each box is replaced by the axis-aligned BEV rectangle it is "nearest" to: its yaw is folded into
``[-π/2, π/2)`` with ``limit_period(yaw, 0.5, π)``; if the folded angle's magnitude exceeds ``π/4`` the box
is closer to lying across the axes, so ``dx`` and ``dy`` swap. The IoU of those rectangles is then the
plain 2D IoU (mmdet's ``bbox_overlaps`` in mode ``'iou'``, union clamped to ``eps = 1e-6``). The box
centre height, ``dz`` and any extra dims (velocity) play no part, so bottom- and gravity-centre boxes
give the same IoU.

Every arithmetic step is the original's, in float32 and in the same order, so values agree bit for bit
with a per-sample call; that matters because the max-IoU assigner compares IoUs for equality.
"""

from __future__ import annotations

import math

import torch

__all__ = ["limit_period", "nearest_bev_boxes", "nearest_bev_dims", "nearest_bev_iou"]

IOU_EPS = 1e-6


def limit_period(value: torch.Tensor, offset: float = 0.5, period: float = math.pi) -> torch.Tensor:
    """Fold ``value`` into ``[-offset·period, (1 − offset)·period)``: ``v − floor(v / period + offset)·period``."""
    return value - torch.floor(value / period + offset) * period  # (...)


def nearest_bev_dims(boxes: torch.Tensor) -> torch.Tensor:
    """Width and height ``(..., 2)`` (float32) of the axis-aligned BEV rectangles :func:`nearest_bev_boxes` makes:
    ``(dx, dy)``, swapped where ``|limit_period(yaw)| > π/4``."""
    if boxes.shape[-1] < 7:
        raise ValueError(f"boxes: need at least 7 values per box (x, y, z, dx, dy, dz, yaw), got {tuple(boxes.shape)}")
    boxes = boxes.float()
    yaw = limit_period(boxes[..., 6], 0.5, math.pi).abs()  # (...)
    across = (yaw > math.pi / 4)[..., None]  # (..., 1)
    return torch.where(across, boxes[..., [4, 3]], boxes[..., [3, 4]])  # (..., 2)


def nearest_bev_boxes(boxes: torch.Tensor) -> torch.Tensor:
    """Axis-aligned BEV rectangles nearest to rotated 3D boxes.

    Args:
        boxes: ``(..., ≥7)`` (x, y, z, dx, dy, dz, yaw, ...); converted to float32 as the original does.

    Returns:
        float32 ``(..., 4)`` (x1, y1, x2, y2) with ``dx``/``dy`` swapped where ``|limit_period(yaw)| > π/4``.
    """
    dims = nearest_bev_dims(boxes)  # (..., 2)
    centres = boxes[..., :2].float()  # (..., 2)
    return torch.cat([centres - dims / 2, centres + dims / 2], dim=-1)  # (..., 4)


def nearest_bev_iou(boxes_a: torch.Tensor, boxes_b: torch.Tensor) -> torch.Tensor:
    """Pairwise nearest-BEV IoU, batched over broadcastable leading dims.

    Args:
        boxes_a: ``(..., N, ≥7)`` (x, y, z, dx, dy, dz, yaw, ...).
        boxes_b: ``(..., M, ≥7)`` same layout; leading dims broadcast against ``boxes_a``'s.

    Returns:
        float32 ``(..., N, M)`` IoU in ``[0, 1]``; ``nearest_bev_iou(b, a)`` is its exact transpose.

    Example:
        >>> box = torch.tensor([[0.0, 0, 0, 4, 2, 1.5, 0]])
        >>> nearest_bev_iou(box, box[:, [0, 1, 2, 4, 3, 5, 6]])  # same footprint, dims swapped: 4/12 = 1/3
        tensor([[0.3333]])
    """
    rect_a = nearest_bev_boxes(boxes_a)  # (..., N, 4)
    rect_b = nearest_bev_boxes(boxes_b)  # (..., M, 4)
    return _rect_iou(rect_a, rect_b)  # (..., N, M)


def _rect_iou(rect_a: torch.Tensor, rect_b: torch.Tensor) -> torch.Tensor:
    """mmdet ``bbox_overlaps(mode='iou', is_aligned=False)`` over broadcast dims, per axis to save memory.

    The original forms ``(..., N, M, 2)`` corner tensors; doing x and y separately gives the same floats
    (max, min, subtract and clamp are per element) with half the peak memory.
    """
    area_a = (rect_a[..., 2] - rect_a[..., 0]) * (rect_a[..., 3] - rect_a[..., 1])  # (..., N)
    area_b = (rect_b[..., 2] - rect_b[..., 0]) * (rect_b[..., 3] - rect_b[..., 1])  # (..., M)
    a, b = rect_a[..., :, None, :], rect_b[..., None, :, :]  # (..., N, 1, 4), (..., 1, M, 4)
    width = (torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0])).clamp_(min=0)  # (..., N, M)
    height = (torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1])).clamp_(min=0)  # (..., N, M)
    overlap = width.mul_(height)  # (..., N, M)
    union = (area_a[..., :, None] + area_b[..., None, :]).sub_(overlap).clamp_(min=IOU_EPS)  # (..., N, M)
    return overlap.div_(union)  # (..., N, M)
