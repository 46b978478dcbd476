"""StreamPETR's 3D box code: what its box branch regresses, its loss compares and its matcher costs.

Boxes are in the lidar frame (x forward, y left, z up) with the *gravity centre* as position:
``(x, y, z_c, dx, dy, dz, yaw, vx, vy)`` with ``dx`` the length along the heading
(:mod:`drivetrain.geometry.rigid`). StreamPETR regresses ``(x, y, z_c, ln dx, ln dy, ln dz, sin yaw, cos yaw,
vx, vy)`` (its ``normalize_bbox`` / ``denormalize_bbox``, ``projects/mmdet3d_plugin/core/bbox/util.py``).
"""

from __future__ import annotations

import torch

__all__ = ["decode_boxes", "encode_boxes"]


def encode_boxes(boxes: torch.Tensor) -> torch.Tensor:
    """Encode boxes for regression targets and matching costs.

    Args:
        boxes: ``(..., 9)`` ``(x, y, z_c, dx, dy, dz, yaw, vx, vy)`` or ``(..., 7)`` without velocity.

    Returns:
        ``(..., 10)`` (``(..., 8)`` without velocity): ``(x, y, z_c, ln dx, ln dy, ln dz, sin yaw,
        cos yaw[, vx, vy])``. Non-positive sizes give ``-inf`` in the log dims, as in the original; encode
        only real boxes (the padding of a batch is masked, never encoded into a loss).
    """
    if boxes.shape[-1] not in (7, 9):
        raise ValueError(f"boxes: last dim must be 7 or 9 (x, y, z, dx, dy, dz, yaw[, vx, vy]), got {boxes.shape[-1]}")
    parts = [boxes[..., 0:3], boxes[..., 3:6].log(), boxes[..., 6:7].sin(), boxes[..., 6:7].cos()]
    if boxes.shape[-1] == 9:
        parts.append(boxes[..., 7:9])
    return torch.cat(parts, dim=-1)  # (..., 10) or (..., 8)


def decode_boxes(codes: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`encode_boxes`: ``(..., 10)`` or ``(..., 8)`` → ``(..., 9)`` or ``(..., 7)``."""
    if codes.shape[-1] not in (8, 10):
        raise ValueError(f"codes: last dim must be 8 or 10, got {codes.shape[-1]}")
    yaw = torch.atan2(codes[..., 6:7], codes[..., 7:8])  # (..., 1)
    parts = [codes[..., 0:3], codes[..., 3:6].exp(), yaw]
    if codes.shape[-1] == 10:
        parts.append(codes[..., 8:10])
    return torch.cat(parts, dim=-1)  # (..., 9) or (..., 7)
