"""Exact bird's-eye-view IoU of rotated rectangles, vectorised over pairs.

A BEV box is ``(x, y, dx, dy, yaw)``: centre, size along its own x and y axes, and the heading about +z,
counter-clockwise in the lidar frame (corners ``c + R(yaw) (±dx/2, ±dy/2)`` with the usual
``R = [[cos, -sin], [sin, cos]]``). From a 3D box ``(x, y, z_c, dx, dy, dz, yaw, ...)`` take columns
``[0, 1, 3, 4, 6]``, as mmdet3d's ``LiDARInstance3DBoxes.bev`` does.

How: box ``a`` is moved into the frame of box ``b`` (where ``b`` is the axis-aligned rectangle
``|u| <= dx_b/2, |v| <= dy_b/2``), clipped against ``b``'s four half-planes with Sutherland–Hodgman, and
the area of what is left comes from the shoelace formula. Working in ``b``'s frame makes every clip line
an axis line, so intersection points lie exactly on it, and it centres the coordinates (mmcv shifts the
pair to its mid-point for the same reason). Each clip keeps its polygon in 8 fixed slots plus a vertex
count (two convex quadrilaterals meet in at most 8 vertices), compacted with a cumulative sum, so there is
no Python loop over boxes and no host sync.

Relation to mmcv's ``box_iou_rotated`` (``mmcv/ops/csrc/common/box_iou_rotated_utils.hpp``), which
mmdet3d's rotated NMS uses: the same quantity up to float rounding. mmcv collects edge intersections and
contained corners, orders them with a Graham scan and sums triangle areas; here the polygon comes out of
the clipping already ordered. Its vertex formula is ``R(a) (±w/2, ±h/2)`` with the matrix above, so its
"clockwise" angle (image axes, y down) is our counter-clockwise yaw (lidar axes, y up): mmdet3d passes
the lidar yaw unchanged, and so do we. Kept from mmcv: a box whose area ``dx·dy`` is below ``1e-14`` has
IoU 0 with everything; the union ``area_a + area_b - inter`` gets no epsilon. mmcv also skips edge pairs
with ``|cross| <= 1e-14`` (parallel edges) and treats hulls of under three points as empty; both only
decide degenerate cases of zero area, which the clipping gets right without a tolerance.
"""

from __future__ import annotations

import math

import torch

from drivetrain.constants import constant

__all__ = ["rotated_bev_iou_aligned", "rotated_bev_iou_pairwise"]

_MAX_VERTICES = 8  # two convex quadrilaterals intersect in a convex polygon of at most 8 vertices
_MIN_AREA = 1e-14  # mmcv: boxes with w·h below this have IoU 0
_PAIRS_PER_CHUNK = 1 << 18  # pairwise rows are processed in chunks of about this many pairs (memory)


def _check5(boxes: torch.Tensor, name: str) -> None:
    if boxes.shape[-1] != 5:
        raise ValueError(f"{name}: last dim must be 5 (x, y, dx, dy, yaw), got shape {tuple(boxes.shape)}")
    if not boxes.is_floating_point():
        raise ValueError(f"{name}: expected a floating dtype, got {boxes.dtype}")


def _corners_in_frame_of(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Corners of ``a`` in the frame of ``b``: ``(..., 5)`` × ``(..., 5)`` → ``(..., 4, 2)``, counter-clockwise."""
    cos_b, sin_b = torch.cos(b[..., 4]), torch.sin(b[..., 4])  # (...)
    dx, dy = a[..., 0] - b[..., 0], a[..., 1] - b[..., 1]  # (...)
    centre_u = cos_b * dx + sin_b * dy  # (...) R(-yaw_b) (a_c - b_c)
    centre_v = -sin_b * dx + cos_b * dy  # (...)
    rel = a[..., 4] - b[..., 4]  # (...) yaw of a relative to b
    cos_r, sin_r = torch.cos(rel), torch.sin(rel)  # (...)
    half_x, half_y = a[..., 2] / 2, a[..., 3] / 2  # (...)
    sign_x = constant((1.0, -1.0, -1.0, 1.0), dtype=a.dtype, device=a.device)  # (4,) corners counter-clockwise
    sign_y = constant((1.0, 1.0, -1.0, -1.0), dtype=a.dtype, device=a.device)  # (4,)
    local_x = sign_x * half_x.unsqueeze(-1)  # (..., 4)
    local_y = sign_y * half_y.unsqueeze(-1)  # (..., 4)
    u = centre_u.unsqueeze(-1) + cos_r.unsqueeze(-1) * local_x - sin_r.unsqueeze(-1) * local_y  # (..., 4)
    v = centre_v.unsqueeze(-1) + sin_r.unsqueeze(-1) * local_x + cos_r.unsqueeze(-1) * local_y  # (..., 4)
    return torch.stack([u, v], dim=-1)  # (..., 4, 2)


def _clip(points: torch.Tensor, count: torch.Tensor, axis: int, sign: float, limit: torch.Tensor):
    """One Sutherland–Hodgman step: keep the part of each polygon where ``sign * p[axis] <= limit``.

    Args:
        points: ``(..., S, 2)`` vertices in order; slots ``>= count`` are ignored.
        count: int64 ``(...)`` number of vertices (0 = empty polygon).
        axis: 0 clips on u, 1 on v.
        sign: +1 keeps ``p <= limit``, -1 keeps ``p >= -limit``.
        limit: ``(...)`` half-size of the clipping box along ``axis``.

    Returns:
        ``(..., 8, 2)`` clipped vertices and their int64 ``(...)`` count.
    """
    slots = points.shape[-2]
    index = torch.arange(slots, device=points.device)  # (S,)
    present = index < count.unsqueeze(-1)  # (..., S)
    nxt = torch.where(index + 1 < count.unsqueeze(-1), index + 1, 0)  # (..., S) next vertex, cyclic
    q = points.gather(-2, nxt.unsqueeze(-1).expand(*nxt.shape, 2))  # (..., S, 2)
    coord_p = sign * points[..., axis]  # (..., S)
    coord_q = sign * q[..., axis]  # (..., S)
    bound = limit.unsqueeze(-1)  # (..., 1)
    inside_p = coord_p <= bound  # (..., S)
    inside_q = coord_q <= bound  # (..., S)
    crosses = present & (inside_p != inside_q)  # (..., S)
    denom = torch.where(crosses, coord_q - coord_p, torch.ones_like(coord_p))  # (..., S) nonzero where used
    t = (bound - coord_p) / denom  # (..., S)
    other = 1 - axis
    cross_other = points[..., other] + t * (q[..., other] - points[..., other])  # (..., S)
    cross_axis = (sign * bound).expand_as(cross_other)  # (..., S) exactly on the clip line
    crossing = torch.stack([cross_axis, cross_other] if axis == 0 else [cross_other, cross_axis], dim=-1)
    # Per edge p → q: the crossing point (if the edge crosses), then q (if q is inside).
    candidates = torch.stack([crossing, q], dim=-2).flatten(-3, -2)  # (..., 2S, 2)
    emit = torch.stack([crosses, present & inside_q], dim=-1).flatten(-2)  # (..., 2S)
    position = emit.cumsum(-1) - 1  # (..., 2S)
    position = torch.where(emit & (position < _MAX_VERTICES), position, _MAX_VERTICES)  # (..., 2S) else dump slot
    out = points.new_zeros(*points.shape[:-2], _MAX_VERTICES + 1, 2)  # (..., 9, 2)
    out.scatter_(-2, position.unsqueeze(-1).expand(*position.shape, 2), candidates)
    new_count = emit.sum(-1).clamp(max=_MAX_VERTICES)  # (...)
    return out[..., :_MAX_VERTICES, :], new_count


def _intersection_area(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Area of the intersection of broadcastable BEV boxes: ``(..., 5)`` × ``(..., 5)`` → ``(...)``."""
    a, b = torch.broadcast_tensors(a, b)
    points = _corners_in_frame_of(a, b)  # (..., 4, 2)
    count = torch.full(a.shape[:-1], 4, dtype=torch.int64, device=a.device)  # (...)
    half_x, half_y = b[..., 2] / 2, b[..., 3] / 2  # (...)
    for axis, sign, limit in ((0, 1.0, half_x), (0, -1.0, half_x), (1, 1.0, half_y), (1, -1.0, half_y)):
        points, count = _clip(points, count, axis, sign, limit)  # (..., 8, 2), (...)
    index = torch.arange(_MAX_VERTICES, device=a.device)  # (8,)
    present = index < count.unsqueeze(-1)  # (..., 8)
    nxt = torch.where(index + 1 < count.unsqueeze(-1), index + 1, 0)  # (..., 8)
    q = points.gather(-2, nxt.unsqueeze(-1).expand(*nxt.shape, 2))  # (..., 8, 2)
    cross = points[..., 0] * q[..., 1] - points[..., 1] * q[..., 0]  # (..., 8)
    area = torch.where(present, cross, torch.zeros_like(cross)).sum(-1) / 2  # (...)
    return area.clamp(min=0)  # (...) counter-clockwise, so ≥ 0 up to rounding


def rotated_bev_iou_aligned(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of corresponding rotated BEV boxes: ``(..., 5)`` and ``(..., 5)`` → ``(...)`` (broadcast).

    Args:
        a: ``(..., 5)`` float boxes ``(x, y, dx, dy, yaw)``, yaw counter-clockwise about +z.
        b: ``(..., 5)`` the same, broadcastable with ``a``.

    Returns:
        ``(...)`` IoU in [0, 1], dtype of the inputs; 0 where either box has area below 1e-14.

    Example:
        >>> box = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0])
        >>> rotated_bev_iou_aligned(box, box.clone())
        tensor(1.)
    """
    _check5(a, "a")
    _check5(b, "b")
    inter = _intersection_area(a, b)  # (...)
    area_a = a[..., 2] * a[..., 3]  # (...)
    area_b = b[..., 2] * b[..., 3]  # (...)
    degenerate = (area_a < _MIN_AREA) | (area_b < _MIN_AREA)  # (...)
    union = torch.where(degenerate, torch.ones_like(inter), area_a + area_b - inter)  # (...)
    return torch.where(degenerate, torch.zeros_like(inter), inter / union)  # (...)


def rotated_bev_iou_pairwise(a: torch.Tensor, b: torch.Tensor, *, sparse: bool = False) -> torch.Tensor:
    """IoU of every pair of rotated BEV boxes: ``(..., N, 5)`` and ``(..., M, 5)`` → ``(..., N, M)``.

    Leading dims broadcast. Rows of ``a`` are processed in chunks (a loop over shapes, not values) so
    that the clipping buffers stay small; no host sync.

    ``sparse=True`` clips only the pairs whose circumscribed circles meet (the others cannot overlap, and their
    IoU is exactly the 0 the dense path computes): the same matrix, far cheaper when most boxes are apart (a
    frame's detections), for one host read of the number of such pairs.

    Args:
        a: ``(..., N, 5)`` float boxes ``(x, y, dx, dy, yaw)``.
        b: ``(..., M, 5)`` float boxes, same dtype and device.
        sparse: compute the meeting pairs only (see above).

    Returns:
        ``(..., N, M)`` IoU in [0, 1].

    Example:
        >>> a = torch.tensor([[0.0, 0.0, 2.0, 1.0, 0.0]])
        >>> rotated_bev_iou_pairwise(a, a.clone()).shape
        torch.Size([1, 1])
    """
    _check5(a, "a")
    _check5(b, "b")
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    num_a, num_b = a.shape[-2], b.shape[-2]
    if sparse:
        return _pairwise_sparse(a.expand(*batch, num_a, 5), b.expand(*batch, num_b, 5))
    pairs_per_row = max(1, math.prod(batch) * num_b)
    rows = max(1, _PAIRS_PER_CHUNK // pairs_per_row)
    b_cols = b.unsqueeze(-3)  # (..., 1, M, 5)
    parts = [
        rotated_bev_iou_aligned(a[..., start : start + rows, :].unsqueeze(-2), b_cols)  # (..., n, M)
        for start in range(0, num_a, rows)
    ]
    if not parts:
        return a.new_zeros(*batch, 0, num_b)
    return torch.cat(parts, dim=-2)  # (..., N, M)


def _pairwise_sparse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """:func:`rotated_bev_iou_pairwise` over the pairs whose circumscribed circles meet; ``a``, ``b`` expanded."""
    radius_a = torch.hypot(a[..., 2], a[..., 3]) / 2  # (..., N)
    radius_b = torch.hypot(b[..., 2], b[..., 3]) / 2  # (..., M)
    # each pair's difference, not cdist's matmul form |a|² + |b|² − 2a·b (its default beyond 25 rows): that cancels
    # (float32 far from the origin) and on CUDA runs as a TF32 matmul under allow_tf32, metres off at lidar range
    gap = torch.cdist(a[..., :2].contiguous(), b[..., :2].contiguous(), compute_mode="donot_use_mm_for_euclid_dist")
    meet = gap <= (radius_a.unsqueeze(-1) + radius_b.unsqueeze(-2)) * (1 + 1e-6) + 1e-9  # (..., N, M) margin: rounding
    out = a.new_zeros(meet.shape)  # (..., N, M)
    if out.numel() == 0:
        return out
    # sync: the meeting pairs are gathered by index (decoding / test-time merging, not the training step)
    pairs = meet.nonzero()  # (P, len(...) + 2)
    lead, rows, cols = pairs[:, :-2], pairs[:, -2], pairs[:, -1]
    num_lead = math.prod(meet.shape[:-2])
    flat_a = a.reshape(num_lead, a.shape[-2], 5)  # (L, N, 5)
    flat_b = b.reshape(num_lead, b.shape[-2], 5)  # (L, M, 5)
    strides = torch.tensor([math.prod(meet.shape[i + 1 : -2]) for i in range(lead.shape[1])], device=a.device)
    batch_index = (lead * strides).sum(-1) if lead.shape[1] else torch.zeros_like(rows)  # (P,)
    values = torch.cat(
        [
            rotated_bev_iou_aligned(flat_a[batch_index[s : s + _PAIRS_PER_CHUNK], rows[s : s + _PAIRS_PER_CHUNK]],
                                    flat_b[batch_index[s : s + _PAIRS_PER_CHUNK], cols[s : s + _PAIRS_PER_CHUNK]])
            for s in range(0, pairs.shape[0], _PAIRS_PER_CHUNK)
        ]
        or [a.new_zeros(0)]
    )  # (P,)  # fmt: skip
    out[tuple(pairs.unbind(-1))] = values
    return out
