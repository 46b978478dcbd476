"""StreamPETR's NMS-free decoding: the ``max_num`` best (query, class) scores of the last decoder layer.

Per sample: ``sigmoid`` of all ``Q × C`` logits, the top ``max_num`` (300) of them; label = index mod ``C``,
query = index div ``C``; that query's box code decoded to ``(x, y, z_centre, dx, dy, dz, yaw, vx, vy)``
(``exp`` of the log sizes, ``atan2`` of sin/cos); kept when its centre lies in ``post_center_range`` (and
its score reaches ``score_threshold`` when one is given). No NMS.

:func:`reference_decode` mirrors ``NMSFreeCoder.decode`` / ``decode_single`` of StreamPETR
(``projects/mmdet3d_plugin/core/bbox/coders/nms_free_coder.py``, with ``denormalize_bbox`` of
``projects/mmdet3d_plugin/core/bbox/util.py``): one sample at a time. :func:`decode` does the whole batch
at once and returns ragged results without a host sync. Deviation of both: boxes keep the gravity-centre
``z`` (our ground truth and submission export use it), where the original's ``get_bboxes`` moves it to the
bottom face for mmdet3d's box class; the score-threshold test is ``score >= threshold`` as the original,
applied whenever a threshold is given (the original skips a threshold of exactly 0).
"""

from __future__ import annotations

import torch

from drivetrain import ragged
from drivetrain.constants import constant
from drivetrain.models.streampetr.box_code import decode_boxes
from drivetrain.models.streampetr.recipe import MAX_NUM, POST_CENTER_RANGE
from drivetrain.ragged import RaggedBatch

__all__ = ["decode", "reference_decode"]


def _check(cls_logits: torch.Tensor, box_codes: torch.Tensor, max_num: int) -> None:
    if cls_logits.dim() != 3 or box_codes.shape[:2] != cls_logits.shape[:2] or box_codes.shape[-1] != 10:
        raise ValueError(
            f"cls_logits, box_codes: expected (B, Q, C) and (B, Q, 10), got {tuple(cls_logits.shape)} and "
            f"{tuple(box_codes.shape)}"
        )
    if not 0 < max_num <= cls_logits.shape[1] * cls_logits.shape[2]:
        raise ValueError(f"max_num: must be in [1, Q·C = {cls_logits.shape[1] * cls_logits.shape[2]}], got {max_num}")


def decode(
    cls_logits: torch.Tensor,
    box_codes: torch.Tensor,
    max_num: int = MAX_NUM,
    post_center_range: tuple[float, ...] = POST_CENTER_RANGE,
    score_threshold: float | None = None,
) -> tuple[RaggedBatch, RaggedBatch, RaggedBatch]:
    """Top-``max_num`` detections of every sample at once (see the module docstring); no host sync.

    Args:
        cls_logits: ``(B, Q, C)`` class logits of the last decoder layer.
        box_codes: ``(B, Q, 10)`` box codes ``(x, y, z_c, ln dx, ln dy, ln dz, sin, cos, vx, vy)`` in metres.
        max_num: detections per sample before the range filter (300).
        post_center_range: ``(x_min, y_min, z_min, x_max, y_max, z_max)`` a kept centre lies in.
        score_threshold: minimum score, or None.

    Returns:
        ``boxes`` RaggedBatch ``(B, K, 9)``, ``scores`` ``(B, K)`` and int64 ``labels`` ``(B, K)``, by
        descending score; the padded length stays ``max_num``.
    """
    _check(cls_logits, box_codes, max_num)
    num_classes = cls_logits.shape[-1]
    scores, index = cls_logits.sigmoid().flatten(1).topk(max_num, dim=1)  # (B, K), (B, K)
    labels = index % num_classes  # (B, K)
    query = torch.div(index, num_classes, rounding_mode="floor")  # (B, K)
    codes = box_codes.gather(1, query.unsqueeze(-1).expand(*query.shape, 10))  # (B, K, 10)
    boxes = decode_boxes(codes)  # (B, K, 9)
    keep = _in_range(boxes, post_center_range)  # (B, K)
    if score_threshold is not None:
        keep = keep & (scores >= score_threshold)  # (B, K)
    return (
        ragged.select(boxes, keep, trim=False),  # (B, K', 9)
        ragged.select(scores, keep, trim=False),  # (B, K')
        ragged.select(labels, keep, trim=False),  # (B, K')
    )


def reference_decode(
    cls_logits: torch.Tensor,
    box_codes: torch.Tensor,
    max_num: int = MAX_NUM,
    post_center_range: tuple[float, ...] = POST_CENTER_RANGE,
    score_threshold: float | None = None,
) -> list[dict[str, torch.Tensor]]:
    """The original's per-sample decoding (arguments as :func:`decode`).

    Returns:
        Per sample ``{"boxes": (K_b, 9), "scores": (K_b,), "labels": (K_b,)}``.
    """
    _check(cls_logits, box_codes, max_num)
    num_classes = cls_logits.shape[-1]
    out = []
    for b in range(cls_logits.shape[0]):
        scores, index = cls_logits[b].sigmoid().view(-1).topk(max_num)  # (K,), (K,)
        labels = index % num_classes  # (K,)
        boxes = decode_boxes(box_codes[b][torch.div(index, num_classes, rounding_mode="floor")])  # (K, 9)
        mask = _in_range(boxes, post_center_range)  # (K,)
        if score_threshold is not None:
            mask &= scores >= score_threshold
        out.append({"boxes": boxes[mask], "scores": scores[mask], "labels": labels[mask]})
    return out


def _in_range(boxes: torch.Tensor, post_center_range: tuple[float, ...]) -> torch.Tensor:
    """``(..., 9)`` boxes → bool ``(...)``: the centre lies inside the range (bounds included)."""
    low = constant(post_center_range[:3], dtype=boxes.dtype, device=boxes.device)  # (3,)
    high = constant(post_center_range[3:], dtype=boxes.dtype, device=boxes.device)  # (3,)
    return ((boxes[..., :3] >= low) & (boxes[..., :3] <= high)).all(-1)  # (...)
