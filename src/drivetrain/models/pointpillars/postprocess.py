"""Detections of the anchor heads (PointPillars' ``Anchor3DHead``, SSN's ``ShapeAwareHead``): top-k by score,
decoded deltas, multi-class rotated BEV NMS, direction-bin correction of the yaw.

Per sample, as mmdet3d's ``Base3DDenseHead._predict_by_feat_single`` (``mmdet3d/models/dense_heads/
base_3d_dense_head.py``; ``ShapeAwareHead._predict_by_feat_single`` in ``shape_aware_head.py`` is the same
steps on its concatenated tasks):

1. ``scores = sigmoid(cls_logits)``; the direction bin is ``argmax`` of the direction logits;
2. when there are more than ``nms_pre`` anchors, the ``nms_pre`` best by their maximum class score;
3. boxes decoded from their anchors (:func:`~drivetrain.geometry.delta_coder.decode_delta_xyzwlhr`);
4. ``box3d_multiclass_nms`` with rotated BEV NMS (``score_thr`` 0.05, ``nms_thr`` 0.2, ``max_num`` 500 in the
   nuScenes configs; :mod:`drivetrain.geometry.rotated_nms`);
5. ``yaw = limit_period(yaw − dir_offset, dir_limit_offset, π) + dir_offset + π · bin``.

:func:`reference_decode` does this one sample at a time as the original; :func:`decode` the whole batch at
once, with no host sync, returning ragged results. Boxes keep the gravity-centre ``z`` (the original hands
bottom-centre boxes to mmdet3d's box class at the end; our exports take the centre).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from drivetrain.geometry.delta_coder import decode_delta_xyzwlhr, limit_period
from drivetrain.geometry.rotated_nms import multiclass_rotated_nms, reference_multiclass_nms_single
from drivetrain.models.pointpillars.recipe import NUS_DIR_OFFSET, NUS_TEST_CFG
from drivetrain.ragged import RaggedBatch

__all__ = ["DecodeConfig", "decode", "reference_decode"]


@dataclass(frozen=True)
class DecodeConfig:
    """The test-time settings; the defaults are the nuScenes PointPillars / SSN ``test_cfg``
    (:data:`~.recipe.NUS_TEST_CFG`, :data:`~.recipe.NUS_DIR_OFFSET`).

    Attributes:
        nms_pre: anchors kept by maximum class score before NMS (1000).
        score_threshold: a class candidate needs a score ``> score_threshold`` (0.05).
        nms_threshold: rotated BEV IoU above which NMS suppresses (0.2).
        max_num: detections kept per sample (500).
        dir_offset, dir_limit_offset: the direction-bin convention of the head (−0.7854, 0).
    """

    nms_pre: int = NUS_TEST_CFG["nms_pre"]
    score_threshold: float = NUS_TEST_CFG["score_threshold"]
    nms_threshold: float = NUS_TEST_CFG["nms_threshold"]
    max_num: int = NUS_TEST_CFG["max_num"]
    dir_offset: float = NUS_DIR_OFFSET
    dir_limit_offset: float = 0.0

    def __post_init__(self) -> None:
        if self.nms_pre < 1 or self.max_num < 1:
            raise ValueError(f"nms_pre, max_num: must be ≥ 1, got {self.nms_pre}, {self.max_num}")
        if not 0.0 <= self.nms_threshold <= 1.0:
            raise ValueError(f"nms_threshold: must be in [0, 1], got {self.nms_threshold}")


def _check(cls_logits: torch.Tensor, box_preds: torch.Tensor, dir_logits: torch.Tensor, anchors: torch.Tensor) -> None:
    num_batch, num_anchors = cls_logits.shape[:2]
    if (
        cls_logits.dim() != 3
        or box_preds.shape[:2] != (num_batch, num_anchors)
        or dir_logits.shape != (num_batch, num_anchors, 2)
        or anchors.shape != (num_anchors, box_preds.shape[-1])
    ):
        raise ValueError(
            "cls_logits, box_preds, dir_logits, anchors: expected (B, A, C), (B, A, D), (B, A, 2), (A, D), got "
            f"{tuple(cls_logits.shape)}, {tuple(box_preds.shape)}, {tuple(dir_logits.shape)}, {tuple(anchors.shape)}"
        )


def _correct_yaw(boxes: torch.Tensor, bins: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """Step 5: the yaw folded into one half turn, then turned by π where the direction bin says so."""
    yaw = limit_period(boxes[..., 6] - cfg.dir_offset, cfg.dir_limit_offset, math.pi)  # (...)
    yaw = yaw + cfg.dir_offset + math.pi * bins.to(boxes.dtype)  # (...)
    return torch.cat([boxes[..., :6], yaw.unsqueeze(-1), boxes[..., 7:]], dim=-1)  # (..., D)


def reference_decode(
    cls_logits: torch.Tensor,
    box_preds: torch.Tensor,
    dir_logits: torch.Tensor,
    anchors: torch.Tensor,
    cfg: DecodeConfig | None = None,
) -> list[dict[str, torch.Tensor]]:
    """The original, one sample at a time, op for op as mmdet3d's ``get_bboxes_single`` (one feature level; without
    its BEV round trip through xyxyr and its background score column, see :mod:`.rotated_nms`).

    Args:
        cls_logits: ``(B, A, C)`` class logits in the head's anchor order.
        box_preds: ``(B, A, D)`` deltas.
        dir_logits: ``(B, A, 2)`` direction logits.
        anchors: ``(A, D)`` gravity-centre anchors in the same order.
        cfg: test-time settings (default :class:`DecodeConfig`).

    Returns:
        Per sample ``{"boxes": (K, D), "scores": (K,), "labels": (K,)}`` in the original's order (class by
        class unless more than ``max_num`` were kept).
    """
    cfg = cfg or DecodeConfig()
    _check(cls_logits, box_preds, dir_logits, anchors)
    out = []
    for b in range(cls_logits.shape[0]):
        dir_bins = dir_logits[b].max(dim=-1)[1]  # (A,)
        scores = cls_logits[b].sigmoid()  # (A, C)
        deltas, priors = box_preds[b], anchors  # (A, D), (A, D)
        if scores.shape[0] > cfg.nms_pre:
            _, top = scores.max(dim=1)[0].topk(cfg.nms_pre)  # (nms_pre,)
            priors, deltas, scores, dir_bins = priors[top, :], deltas[top, :], scores[top, :], dir_bins[top]
        # the original concatenates its levels' boxes, scores and bins (one level: a copy each)
        boxes = torch.cat([decode_delta_xyzwlhr(priors, deltas)])  # (N, D)
        scores, dir_bins = torch.cat([scores]), torch.cat([dir_bins])  # (N, C), (N,)
        kept = reference_multiclass_nms_single(boxes, scores, cfg.score_threshold, cfg.nms_threshold, cfg.max_num)
        kept_boxes = kept["boxes"]
        if kept_boxes.shape[0] > 0:
            kept_boxes = _correct_yaw(kept_boxes, dir_bins[kept["indices"]], cfg)
        out.append({"boxes": kept_boxes, "scores": kept["scores"], "labels": kept["labels"]})
    return out


def _candidates_only(
    boxes: torch.Tensor, scores: torch.Tensor, dir_bins: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The boxes some class may keep (a score ``> threshold``) moved to the front in their order, the rest cut
    to the batch's largest candidate count; returns the cut ``boxes``, ``scores``, ``dir_bins``, ``valid`` and the
    largest candidate count of one class in one sample (the greedy pass's length)."""
    per_class = scores > threshold  # (B, N, C)
    candidate = per_class.any(dim=-1)  # (B, N)
    counts = torch.stack([candidate.sum(dim=1).max(), per_class.sum(dim=1).max()])  # (2,)
    # sync: the largest candidate counts size the NMS (decoding for evaluation, not the training step)
    width, steps = counts.tolist()
    width = max(width, 1)
    order = (~candidate).to(torch.int8).argsort(dim=1, stable=True)[:, :width]  # (B, M) candidates first
    boxes = boxes.gather(1, order.unsqueeze(-1).expand(-1, -1, boxes.shape[-1]))  # (B, M, D)
    scores = scores.gather(1, order.unsqueeze(-1).expand(-1, -1, scores.shape[-1]))  # (B, M, C)
    return boxes, scores, dir_bins.gather(1, order), candidate.gather(1, order), steps


def decode(
    cls_logits: torch.Tensor,
    box_preds: torch.Tensor,
    dir_logits: torch.Tensor,
    anchors: torch.Tensor,
    cfg: DecodeConfig | None = None,
    *,
    compact: bool = False,
) -> tuple[RaggedBatch, RaggedBatch, RaggedBatch]:
    """The whole batch at once (arguments as :func:`reference_decode`); no host sync unless ``compact``.

    ``compact=True`` first drops the boxes that are no class's NMS candidate (every score ``≤
    score_threshold``), keeping the rest in their order, and clips only the candidate pairs whose circumscribed
    circles meet, and the greedy pass visits only as many positions as one class has candidates: the same
    detections at a fraction of the cost (evaluation), for two host reads (the largest candidate counts, the number
    of meeting pairs).

    Returns:
        ``boxes (B, K, D)``, ``scores (B, K)``, int64 ``labels (B, K)`` as RaggedBatches, each sample's rows in
        the reference's order.

    Example:
        >>> boxes, scores, labels = decode(out["cls_logits"], out["box_preds"], out["dir_logits"], out["anchors"])
    """
    cfg = cfg or DecodeConfig()
    _check(cls_logits, box_preds, dir_logits, anchors)
    scores = cls_logits.sigmoid()  # (B, A, C)
    dir_bins = dir_logits.max(dim=-1)[1]  # (B, A)
    num_batch, num_anchors = scores.shape[:2]
    if num_anchors > cfg.nms_pre:
        _, top = scores.max(dim=2)[0].topk(cfg.nms_pre, dim=1)  # (B, nms_pre)
        priors = anchors[top]  # (B, nms_pre, D)
        deltas = box_preds.gather(1, top.unsqueeze(-1).expand(-1, -1, box_preds.shape[-1]))  # (B, nms_pre, D)
        scores = scores.gather(1, top.unsqueeze(-1).expand(-1, -1, scores.shape[-1]))  # (B, nms_pre, C)
        dir_bins = dir_bins.gather(1, top)  # (B, nms_pre)
    else:
        priors, deltas = anchors.expand(num_batch, -1, -1), box_preds  # (B, A, D)
    boxes = decode_delta_xyzwlhr(priors, deltas)  # (B, N, D)
    valid = torch.ones(boxes.shape[:2], dtype=torch.bool, device=boxes.device)  # (B, N)
    steps = None
    if compact:
        boxes, scores, dir_bins, valid, steps = _candidates_only(boxes, scores, dir_bins, cfg.score_threshold)
    kept_boxes, kept_scores, labels, indices = multiclass_rotated_nms(
        boxes, scores, valid, cfg.score_threshold, cfg.nms_threshold, cfg.max_num, sparse=compact, max_candidates=steps
    )
    corrected = _correct_yaw(kept_boxes.tensor, dir_bins.gather(1, indices.tensor), cfg)  # (B, K, D)
    return kept_boxes.with_tensor(corrected), kept_scores, labels
