"""The residual anchor box code of mmdetection3d's anchor heads (its ``DeltaXYZWLHRBBoxCoder``).

Boxes here use the gravity centre ``(x, y, z_c, dx, dy, dz, yaw[, vx, vy])`` (see :mod:`.rigid`). The
original works on bottom-centre boxes and first lifts anchor and target to their gravity centres
(``z + dz/2``) before taking differences; on centre-z inputs that lift is the identity, so the formulas
below are the original's without it (``tests/test_geometry_delta_coder.py`` checks the two agree).

With ``d = √(dx_a² + dy_a²)`` the BEV diagonal of the anchor:

``t = ((x_g−x_a)/d, (y_g−y_a)/d, (z_g−z_a)/dz_a, ln(dx_g/dx_a), ln(dy_g/dy_a), ln(dz_g/dz_a), yaw_g−yaw_a[,
vx_g−vx_a, vy_g−vy_a])``.

The direction classifier's target splits the yaw circle into ``num_bins`` bins after a shift by
``dir_offset`` (mmdet3d ``get_direction_target`` with ``limit_period``).
"""

from __future__ import annotations

import math

import torch

__all__ = ["decode_delta_xyzwlhr", "direction_target", "encode_delta_xyzwlhr", "limit_period"]


def _check_pair(anchors: torch.Tensor, other: torch.Tensor, other_name: str) -> None:
    if anchors.shape[-1] not in (7, 9):
        raise ValueError(
            f"anchors: last dim must be 7 or 9 (x, y, z, dx, dy, dz, yaw[, vx, vy]), got {anchors.shape[-1]}"
        )
    if other.shape[-1] != anchors.shape[-1]:
        raise ValueError(f"{other_name}: last dim {other.shape[-1]} differs from the anchors' {anchors.shape[-1]}")


def encode_delta_xyzwlhr(anchors: torch.Tensor, gt_boxes: torch.Tensor) -> torch.Tensor:
    """Regression targets that move ``anchors`` onto ``gt_boxes``.

    Args:
        anchors: ``(..., 7)`` or ``(..., 9)`` gravity-centre boxes (velocity dims, if any, last).
        gt_boxes: ``(..., D)`` with the same ``D``, broadcastable against ``anchors``.

    Returns:
        ``(..., D)`` deltas ``(tx, ty, tz, tdx, tdy, tdz, tyaw[, tvx, tvy])`` in the dtype of the inputs.

    Example:
        >>> deltas = encode_delta_xyzwlhr(anchors, matched_gt)  # (A, 9), (A, 9) -> (A, 9)
    """
    _check_pair(anchors, gt_boxes, "gt_boxes")
    anchors, gt_boxes = torch.broadcast_tensors(anchors, gt_boxes)  # (..., D), (..., D)
    diagonal = torch.sqrt(anchors[..., 4:5] ** 2 + anchors[..., 3:4] ** 2)  # (..., 1)
    parts = [
        (gt_boxes[..., 0:2] - anchors[..., 0:2]) / diagonal,  # (..., 2)
        (gt_boxes[..., 2:3] - anchors[..., 2:3]) / anchors[..., 5:6],  # (..., 1)
        torch.log(gt_boxes[..., 3:6] / anchors[..., 3:6]),  # (..., 3)
        gt_boxes[..., 6:7] - anchors[..., 6:7],  # (..., 1)
        gt_boxes[..., 7:] - anchors[..., 7:],  # (..., D-7)
    ]
    return torch.cat(parts, dim=-1)  # (..., D)


def decode_delta_xyzwlhr(anchors: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
    """Boxes from anchors and predicted deltas: the inverse of :func:`encode_delta_xyzwlhr`.

    Args:
        anchors: ``(..., 7)`` or ``(..., 9)`` gravity-centre boxes.
        deltas: ``(..., D)`` with the same ``D``, broadcastable against ``anchors``.

    Returns:
        ``(..., D)`` gravity-centre boxes.

    Example:
        >>> boxes = decode_delta_xyzwlhr(anchors, pred_deltas)  # (A, 9), (B, A, 9) -> (B, A, 9)
    """
    _check_pair(anchors, deltas, "deltas")
    anchors, deltas = torch.broadcast_tensors(anchors, deltas)  # (..., D), (..., D)
    diagonal = torch.sqrt(anchors[..., 4:5] ** 2 + anchors[..., 3:4] ** 2)  # (..., 1)
    parts = [
        deltas[..., 0:2] * diagonal + anchors[..., 0:2],  # (..., 2)
        deltas[..., 2:3] * anchors[..., 5:6] + anchors[..., 2:3],  # (..., 1)
        torch.exp(deltas[..., 3:6]) * anchors[..., 3:6],  # (..., 3)
        deltas[..., 6:7] + anchors[..., 6:7],  # (..., 1)
        deltas[..., 7:] + anchors[..., 7:],  # (..., D-7)
    ]
    return torch.cat(parts, dim=-1)  # (..., D)


def limit_period(value: torch.Tensor, offset: float = 0.5, period: float = math.pi) -> torch.Tensor:
    """``value − floor(value/period + offset)·period``: wraps into ``[−offset·period, (1−offset)·period)``."""
    return value - torch.floor(value / period + offset) * period


def direction_target(
    yaw: torch.Tensor, dir_offset: float, dir_limit_offset: float = 0.0, num_bins: int = 2
) -> torch.Tensor:
    """Direction-classifier bin of each yaw (mmdet3d ``get_direction_target``, ``one_hot=False``).

    ``clamp(floor(limit_period(yaw − dir_offset, dir_limit_offset, 2π) / (2π/num_bins)), 0, num_bins−1)``.
    With two bins and ``dir_offset ≈ −π/4``, bin 1 is ``yaw ∈ [3π/4, 7π/4)`` modulo 2π.

    Args:
        yaw: ``(...)`` float. The original passes ``target_delta_yaw + anchor_yaw``; callers that mirror it
            should do the same (it differs from the GT yaw by rounding).
        dir_offset: shift of the bin edges, a model's constant (mmdetection3d's nuScenes configs' ``-0.7854``;
            ``Anchor3DHead``'s default is −π/2).
        dir_limit_offset: ``limit_period`` offset (0).
        num_bins: number of bins over the full circle (2).

    Returns:
        ``(...)`` int64 in ``[0, num_bins)``.
    """
    offset_rot = limit_period(yaw - dir_offset, dir_limit_offset, 2 * math.pi)  # (...)
    bins = torch.floor(offset_rot / (2 * math.pi / num_bins)).long()  # (...)
    return bins.clamp(min=0, max=num_bins - 1)  # (...)
