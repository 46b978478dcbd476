"""2D box formats and IoU / GIoU for padded batches.

Formats: ``xyxy`` (x1, y1, x2, y2) and ``cxcywh`` (centre, width, height), in pixels or normalised by
the image size ``(W, H)``. All functions broadcast over leading dims, so one call covers every image of a
padded batch (``(B, N, Q, 4)`` against ``(B, N, G, 4)``); padding rows give finite garbage that the caller
masks.
"""

from __future__ import annotations

import torch

from drivetrain.constants import constant

__all__ = [
    "boxes_cxcywh_to_xyxy",
    "boxes_xyxy_to_cxcywh",
    "giou_aligned",
    "giou_pairwise",
    "iou_aligned",
    "iou_pairwise",
    "normalize_boxes",
    "unnormalize_boxes",
]


def _check4(boxes: torch.Tensor, name: str) -> None:
    if boxes.shape[-1] != 4:
        raise ValueError(f"{name}: last dim must be 4, got shape {tuple(boxes.shape)}")


def boxes_cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """``(..., 4)`` (cx, cy, w, h) → ``(..., 4)`` (x1, y1, x2, y2)."""
    _check4(boxes, "boxes")
    centre, size = boxes[..., :2], boxes[..., 2:]
    return torch.cat([centre - size / 2, centre + size / 2], dim=-1)  # (..., 4)


def boxes_xyxy_to_cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    """``(..., 4)`` (x1, y1, x2, y2) → ``(..., 4)`` (cx, cy, w, h)."""
    _check4(boxes, "boxes")
    low, high = boxes[..., :2], boxes[..., 2:]
    return torch.cat([(low + high) / 2, high - low], dim=-1)  # (..., 4)


def _scale(image_size: torch.Tensor | tuple[float, float], like: torch.Tensor) -> torch.Tensor:
    """``(W, H)`` (or ``(..., 2)`` per image) → ``(..., 4)`` factors (W, H, W, H)."""
    if isinstance(image_size, torch.Tensor):
        size = image_size.to(like)  # (..., 2)
        return torch.cat([size, size], dim=-1)  # (..., 4)
    width, height = image_size
    return constant((width, height, width, height), dtype=like.dtype, device=like.device)  # (4,)


def normalize_boxes(boxes: torch.Tensor, image_size: torch.Tensor | tuple[float, float]) -> torch.Tensor:
    """Pixels → [0, 1]: divide x by ``W`` and y by ``H`` (either box format)."""
    _check4(boxes, "boxes")
    return boxes / _scale(image_size, boxes)  # (..., 4)


def unnormalize_boxes(boxes: torch.Tensor, image_size: torch.Tensor | tuple[float, float]) -> torch.Tensor:
    """[0, 1] → pixels (either box format)."""
    _check4(boxes, "boxes")
    return boxes * _scale(image_size, boxes)  # (..., 4)


def _iou_parts(a: torch.Tensor, b: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """IoU, union and enclosing area of broadcastable xyxy boxes ``a`` and ``b``.

    Works on the four coordinates separately, so the pairwise case is a chain of outer ``(..., Q, 1)`` ×
    ``(..., 1, G)`` operations (about 2× faster on the CPU than broadcasting ``(..., Q, G, 2)`` corners).
    """
    ax1, ay1, ax2, ay2 = a.unbind(-1)
    bx1, by1, bx2, by2 = b.unbind(-1)
    inter_w = (torch.minimum(ax2, bx2) - torch.maximum(ax1, bx1)).clamp(min=0)  # (...)
    inter_h = (torch.minimum(ay2, by2) - torch.maximum(ay1, by1)).clamp(min=0)  # (...)
    inter = inter_w * inter_h  # (...)
    area_a = (ax2 - ax1).clamp(min=0) * (ay2 - ay1).clamp(min=0)  # (...)
    area_b = (bx2 - bx1).clamp(min=0) * (by2 - by1).clamp(min=0)  # (...)
    union = (area_a + area_b - inter).clamp(min=eps)  # (...)
    hull_w = (torch.maximum(ax2, bx2) - torch.minimum(ax1, bx1)).clamp(min=0)  # (...)
    hull_h = (torch.maximum(ay2, by2) - torch.minimum(ay1, by1)).clamp(min=0)  # (...)
    hull = (hull_w * hull_h).clamp(min=eps)  # (...)
    return inter / union, union, hull


def iou_aligned(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """IoU of corresponding xyxy boxes: ``(..., 4)`` and ``(..., 4)`` → ``(...)``."""
    _check4(a, "a")
    _check4(b, "b")
    return _iou_parts(a, b, eps)[0]  # (...)


def giou_aligned(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Generalised IoU of corresponding xyxy boxes: ``(..., 4)`` and ``(..., 4)`` → ``(...)`` in [-1, 1]."""
    _check4(a, "a")
    _check4(b, "b")
    iou, union, hull = _iou_parts(a, b, eps)
    return iou - (hull - union) / hull  # (...)


def iou_pairwise(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """IoU of every pair: ``(..., Q, 4)`` and ``(..., G, 4)`` → ``(..., Q, G)``."""
    _check4(a, "a")
    _check4(b, "b")
    return _iou_parts(a.unsqueeze(-2), b.unsqueeze(-3), eps)[0]  # (..., Q, G)


def giou_pairwise(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Generalised IoU of every pair: ``(..., Q, 4)`` and ``(..., G, 4)`` → ``(..., Q, G)``."""
    _check4(a, "a")
    _check4(b, "b")
    iou, union, hull = _iou_parts(a.unsqueeze(-2), b.unsqueeze(-3), eps)
    return iou - (hull - union) / hull  # (..., Q, G)
