"""The anchor-head loss's reference path (:mod:`.loss`): mmdetection3d's targets and losses, op for op.

Targets per sample (``anchor_target_3d_single`` with mmdet's pseudo sampler: positives and negatives by
``nonzero``, deltas encoded for the positives only; for SSN per class, as its ``assign_per_class``), stacked over
the batch, then ``Anchor3DHead``'s positives selected again by their label and the three losses computed on them
(SSN: ``ShapeAwareHead``'s, on every anchor with weights). The batched path (:mod:`.loss_batched`) is proven
equal to it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from drivetrain.geometry.delta_coder import direction_target, encode_delta_xyzwlhr
from drivetrain.losses.functional import class_mask, fp32, sigmoid_focal_loss, sine_difference, smooth_l1_loss
from drivetrain.losses.sampling import pseudo_sample

__all__ = ["AVG_EPS", "check_code", "reference_anchor_head_loss"]

AVG_EPS = float(torch.finfo(torch.float32).eps)  # mmdet's weight_reduce_loss: loss.sum() / (avg_factor + eps)


def check_code(code_weights: Sequence[float], dim: int) -> None:
    """ValueError unless the box code is 7- or 9-dim with one weight per dim."""
    if dim not in (7, 9):
        raise ValueError(f"box code: last dim must be 7 or 9, got {dim}")
    if len(code_weights) != dim:
        raise ValueError(f"code_weights: {len(code_weights)} weights for a {dim}-dim box code")


def _reference_targets(
    anchors: torch.Tensor,
    assigned: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_labels: torch.Tensor,
    has_gt: bool,
    num_classes: int,
    dir_offset: float,
    dir_limit_offset: float,
    num_dir_bins: int,
) -> tuple[torch.Tensor, ...]:
    """One sample's (SSN: one class's) targets as ``anchor_target_single_assigner`` builds them after its assigner
    (mmdet3d ``models/dense_heads/train_mixins.py``; pseudo sampler, ``pos_weight`` −1), op for op.

    Args:
        anchors: ``(A, D)`` (the class's anchors for SSN).
        assigned: int64 ``(A,)``: −1 ignore, 0 negative, ``k ≥ 1`` ground truth ``k − 1`` of ``gt_boxes``.
        gt_boxes: ``(G, D)`` the sample's ground truth.
        gt_labels: int64 ``(G,)``.
        has_gt: whether the assigner ran (the original's ``len(gt_bboxes) > 0``, of the class for SSN); without it
            every anchor is a negative.
        num_classes: ``C``, the background label.
        dir_offset: shift of the direction bin edges.
        dir_limit_offset: ``limit_period`` offset of the direction target.
        num_dir_bins: direction bins over the full circle.

    Returns:
        ``labels`` ``(A,)`` (background ``C``), ``label_weights``, ``bbox_targets`` ``(A, D)``, ``bbox_weights``,
        ``dir_targets``, ``dir_weights`` and the number of positives (a host int).
    """
    num_anchors = anchors.shape[0]
    bbox_targets = torch.zeros_like(anchors)  # (A, D)
    bbox_weights = torch.zeros_like(anchors)  # (A, D)
    dir_targets = anchors.new_zeros(num_anchors, dtype=torch.long)  # (A,)
    dir_weights = anchors.new_zeros(num_anchors, dtype=torch.float)  # (A,)
    labels = anchors.new_zeros(num_anchors, dtype=torch.long)  # (A,)
    label_weights = anchors.new_zeros(num_anchors, dtype=torch.float)  # (A,)
    if has_gt:
        sampled = pseudo_sample(assigned, None, anchors, gt_boxes)
        pos_inds, neg_inds = sampled.pos_inds, sampled.neg_inds  # (P,), (A−P−I,)
    else:  # no ground truth: the original makes every anchor a negative without assigning
        pos_inds = torch.nonzero(anchors.new_zeros(num_anchors, dtype=torch.bool) > 0).squeeze(-1).unique()  # (0,)
        neg_inds = torch.nonzero(anchors.new_zeros(num_anchors, dtype=torch.bool) == 0).squeeze(-1).unique()  # (A,)
    labels += num_classes  # background = C
    if len(pos_inds) > 0:
        pos_bbox_targets = encode_delta_xyzwlhr(sampled.pos_bboxes, sampled.pos_gt_bboxes)  # (P, D)
        pos_yaw = pos_bbox_targets[..., 6] + sampled.pos_bboxes[..., 6]  # (P,) as get_direction_target
        bbox_targets[pos_inds, :] = pos_bbox_targets
        bbox_weights[pos_inds, :] = 1.0
        dir_targets[pos_inds] = direction_target(pos_yaw, dir_offset, dir_limit_offset, num_dir_bins)
        dir_weights[pos_inds] = 1.0
        labels[pos_inds] = gt_labels[sampled.pos_assigned_gt_inds].long()
        label_weights[pos_inds] = 1.0
    if len(neg_inds) > 0:
        label_weights[neg_inds] = 1.0
    return labels, label_weights, bbox_targets, bbox_weights, dir_targets, dir_weights, len(pos_inds)


def _reference_sample_targets(
    anchors: torch.Tensor,
    class_sizes: list[int] | None,
    assigned: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_labels: torch.Tensor,
    options: tuple[int, float, float, int],
) -> tuple[torch.Tensor, ...]:
    """One sample's targets as ``anchor_target_3d_single``: one assigner's (PointPillars), or one per class on the
    class's anchors, concatenated in class order (SSN's ``assign_per_class``); the last entry counts positives."""
    num_gts = gt_boxes.shape[0]
    if class_sizes is None:
        # the original concatenates the levels' anchors per sample (one level: a copy)
        return _reference_targets(torch.cat([anchors]), assigned, gt_boxes, gt_labels, num_gts > 0, *options)
    per_class_gts = [0] * len(class_sizes)
    for label in gt_labels.tolist():  # sync: the classes present (the original splits its boxes by class)
        per_class_gts[label] += 1
    parts = [
        _reference_targets(class_anchors, class_assigned, gt_boxes, gt_labels, per_class_gts[c] > 0, *options)
        for c, (class_anchors, class_assigned) in enumerate(
            zip(anchors.split(class_sizes), assigned.split(class_sizes), strict=True)
        )
    ]
    return (*(torch.cat([part[i] for part in parts]) for i in range(6)), sum(part[6] for part in parts))


@fp32
def reference_anchor_head_loss(
    pred_cls: Sequence[torch.Tensor],
    pred_boxes: Sequence[torch.Tensor],
    pred_dir: Sequence[torch.Tensor],
    anchors: torch.Tensor,
    assigned: Sequence[torch.Tensor],
    gt_boxes: Sequence[torch.Tensor],
    gt_labels: Sequence[torch.Tensor],
    *,
    code_weights: Sequence[float],
    dir_offset: float,
    alpha: float = 0.25,
    gamma: float = 2.0,
    beta: float = 1.0 / 9.0,
    dir_limit_offset: float = 0.0,
    num_dir_bins: int = 2,
    anchor_classes: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The loss as mmdet3d computes it, op for op: per-sample targets, then one loss over the stacked batch.

    Without ``anchor_classes``, ``Anchor3DHead.loss`` (PointPillars): ``anchor_target_3d`` per sample, then
    ``loss_single`` with the box and direction terms on the positives, selected by label. With them,
    ``ShapeAwareHead.loss`` (SSN, ``assign_per_class``): the targets of each class's anchors on their own,
    concatenated, and the box and direction terms on every anchor, weighted (so a non-finite prediction of a
    non-positive anchor reaches them there, as in the original; the batched path keeps it out).

    Args:
        pred_cls: per sample ``(A, C)`` logits.
        pred_boxes: per sample ``(A, D)`` predicted deltas.
        pred_dir: per sample ``(A, num_dir_bins)`` direction logits.
        anchors: ``(A, D)`` shared by all samples.
        assigned: per sample int64 ``(A,)``: −1 ignore, 0 negative, ``k ≥ 1`` matched to GT ``k − 1``.
        gt_boxes: per sample ``(G_b, D)``.
        gt_labels: per sample int ``(G_b,)`` in ``[0, C)``.
        code_weights: per-dim weights of the ``D``-dim code (a model's ``train_cfg.code_weight``).
        dir_offset: shift of the direction bin edges (a model's ``dir_offset``).
        alpha: focal loss positive weight (mmdet ``FocalLoss``'s 0.25).
        gamma: focal loss exponent (its 2).
        beta: smooth-L1 transition point (``Anchor3DHead``'s 1/9).
        dir_limit_offset: ``limit_period`` offset of the direction target.
        num_dir_bins: direction bins over the full circle.
        anchor_classes: int64 ``(A,)`` the class of each anchor, in contiguous class blocks (SSN), or None.

    Returns:
        ``{"loss_cls", "loss_bbox", "loss_dir"}``, each a ``()`` float32 tensor, unweighted.
    """
    num_classes, dim = pred_cls[0].shape[-1], anchors.shape[-1]
    check_code(code_weights, dim)
    class_sizes = None
    if anchor_classes is not None:  # sync: the class blocks' lengths (the original holds a tensor per class)
        class_sizes = torch.bincount(anchor_classes, minlength=num_classes).tolist()
    options = (num_classes, dir_offset, dir_limit_offset, num_dir_bins)
    targets = [
        _reference_sample_targets(anchors.float(), class_sizes, a, g.float(), lab, options)
        for a, g, lab in zip(assigned, gt_boxes, gt_labels, strict=True)
    ]
    labels, label_weights, bbox_targets, bbox_weights, dir_targets, dir_weights = (
        torch.stack([t[i] for t in targets]).flatten(0, 1) for i in range(6)
    )  # the original's images_to_levels: (B·A,), (B·A,), (B·A, D), (B·A, D), (B·A,), (B·A,)
    avg_factor = sum(max(t[6], 1) for t in targets) + AVG_EPS  # anchor_target_3d's num_total_pos (+ mmdet's eps)
    cls_score = torch.cat(list(pred_cls)).float()  # (B·A, C)
    bbox_pred = torch.cat(list(pred_boxes)).float()  # (B·A, D)
    dir_pred = torch.cat(list(pred_dir)).float()  # (B·A, num_dir_bins)
    weights = bbox_weights.new_tensor(list(code_weights))  # (D,)

    if class_sizes is None and int(labels.max()) > num_classes:  # sync: Anchor3DHead.loss_single's assert
        raise ValueError(f"gt_labels: a label above the {num_classes} classes")
    focal = sigmoid_focal_loss(cls_score, class_mask(labels, num_classes).float(), alpha, gamma)  # (B·A, C)
    loss_cls = (focal * label_weights[:, None]).sum() / avg_factor  # ()
    if class_sizes is not None:  # ShapeAwareHead.loss_single: every anchor, weighted
        pred_sin, target_sin = sine_difference(bbox_pred, bbox_targets)  # (B·A, D), (B·A, D)
        loss_bbox = smooth_l1_loss(pred_sin, target_sin, beta, bbox_weights * weights).sum() / avg_factor  # ()
        ce = F.cross_entropy(dir_pred, dir_targets, reduction="none")  # (B·A,)
        return {"loss_cls": loss_cls, "loss_bbox": loss_bbox, "loss_dir": (ce * dir_weights).sum() / avg_factor}
    # Anchor3DHead.loss_single: the positives, selected by label
    pos_inds = ((labels >= 0) & (labels < num_classes)).nonzero(as_tuple=False).reshape(-1)  # (P,)
    pos_bbox_pred, pos_bbox_targets, pos_bbox_weights = (
        bbox_pred[pos_inds],
        bbox_targets[pos_inds],
        bbox_weights[pos_inds],
    )  # (P, D) each
    pos_dir_pred, pos_dir_targets, pos_dir_weights = dir_pred[pos_inds], dir_targets[pos_inds], dir_weights[pos_inds]
    if len(pos_inds) == 0:
        return {"loss_cls": loss_cls, "loss_bbox": pos_bbox_pred.sum(), "loss_dir": pos_dir_pred.sum()}  # exact 0s
    pred_sin, target_sin = sine_difference(pos_bbox_pred, pos_bbox_targets)  # (P, D), (P, D)
    loss_bbox = smooth_l1_loss(pred_sin, target_sin, beta, pos_bbox_weights * weights).sum() / avg_factor  # ()
    ce = F.cross_entropy(pos_dir_pred, pos_dir_targets, reduction="none")  # (P,)
    return {"loss_cls": loss_cls, "loss_bbox": loss_bbox, "loss_dir": (ce * pos_dir_weights).sum() / avg_factor}
