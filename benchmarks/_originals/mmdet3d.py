"""Ports of mmdetection3d v1.0.0rc6: the anchor heads' targets and losses, max-IoU assignment, and decoding.

- ``mmdet3d/models/dense_heads/{anchor3d_head,train_mixins,shape_aware_head}.py``;
- ``mmdet3d/core/bbox/iou_calculators/iou3d_calculator.py`` (``bbox_overlaps_nearest_3d``),
  ``mmdet3d/core/bbox/structures/{base_box3d,utils}.py``, ``mmdet3d/core/bbox/coders/
  delta_xyzwhlr_bbox_coder.py``, ``mmdet3d/core/post_processing/box3d_nms.py`` (``box3d_multiclass_nms``,
  ``nms_bev``), ``mmdet3d/models/utils/clip_sigmoid.py``;
- mmdet 2.28.2's ``mmdet/core/bbox/assigners/max_iou_assigner.py`` (``MaxIoUAssigner.assign``,
  ``assign_wrt_overlaps``), which these heads' assigners are.

:func:`anchor_head_inputs`, :func:`nms_inputs` and :func:`decode_inputs` make the originals' inputs from ours,
outside the counted call (``benchmarks/originals.py``, "Inputs").
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from drivetrain.profile.costmodel import current

from .mmcv import nms_rotated
from .mmdet import assign_result, bbox_overlaps, cross_entropy_loss, focal_loss, pseudo_sample, smooth_l1_loss


# ============================================================================ mmdetection3d v1.0.0rc6: anchor heads
def _region(name: str) -> Any:
    """A region of the counter now counting (to count a port's assignment apart), or a no-op."""
    counter = current()
    return counter.region(name) if counter is not None else contextlib.nullcontext()


def lidar_boxes(tensor: torch.Tensor) -> torch.Tensor:
    """``LiDARInstance3DBoxes(tensor, box_dim)``: ``BaseInstance3DBoxes.__init__`` keeps a clone (its ``.tensor``)."""
    tensor = torch.as_tensor(tensor, dtype=torch.float32, device=tensor.device)
    if tensor.numel() == 0:
        tensor = tensor.reshape((0, tensor.shape[-1])).to(dtype=torch.float32, device=tensor.device)
    return tensor.clone()


def limit_period(val: torch.Tensor, offset: float = 0.5, period: float = np.pi) -> torch.Tensor:
    """mmdet3d ``core/bbox/structures/utils.py``."""
    return val - torch.floor(val / period + offset) * period


def nearest_bev(tensor: torch.Tensor) -> torch.Tensor:
    """mmdet3d ``BaseInstance3DBoxes.nearest_bev`` (with ``bev``)."""
    bev_rotated_boxes = tensor[:, [0, 1, 3, 4, 6]]
    rotations = bev_rotated_boxes[:, -1]
    normed_rotations = torch.abs(limit_period(rotations, 0.5, np.pi))
    conditions = (normed_rotations > np.pi / 4)[..., None]
    bboxes_xywh = torch.where(conditions, bev_rotated_boxes[:, [0, 1, 3, 2]], bev_rotated_boxes[:, :4])
    centers, dims = bboxes_xywh[:, :2], bboxes_xywh[:, 2:]
    return torch.cat([centers - dims / 2, centers + dims / 2], dim=-1)


def bbox_overlaps_nearest_3d(bboxes1: torch.Tensor, bboxes2: torch.Tensor) -> torch.Tensor:
    """mmdet3d ``iou3d_calculator.py``: ``bbox_overlaps_nearest_3d`` (``BboxOverlapsNearest3D``, mode iou, lidar)."""
    bboxes1, bboxes2 = lidar_boxes(bboxes1), lidar_boxes(bboxes2)
    return bbox_overlaps(nearest_bev(bboxes1), nearest_bev(bboxes2), mode="iou", is_aligned=False)


def assign_wrt_overlaps(overlaps: torch.Tensor, gt_labels: torch.Tensor | None, cfg: Any) -> SimpleNamespace:
    """mmdet ``MaxIoUAssigner.assign_wrt_overlaps`` (``cfg``: a :class:`~drivetrain.match.max_iou.MaxIoUConfig`)."""
    num_gts, num_bboxes = overlaps.size(0), overlaps.size(1)
    assigned_gt_inds = overlaps.new_full((num_bboxes,), -1, dtype=torch.long)
    if num_gts == 0 or num_bboxes == 0:
        max_overlaps = overlaps.new_zeros((num_bboxes,))
        if num_gts == 0:
            assigned_gt_inds[:] = 0
        labels = None if gt_labels is None else overlaps.new_full((num_bboxes,), -1, dtype=torch.long)
        return assign_result(num_gts, assigned_gt_inds, max_overlaps, labels=labels)
    max_overlaps, argmax_overlaps = overlaps.max(dim=0)
    gt_max_overlaps, gt_argmax_overlaps = overlaps.max(dim=1)
    if isinstance(cfg.neg_iou_thr, float):
        assigned_gt_inds[(max_overlaps >= 0) & (max_overlaps < cfg.neg_iou_thr)] = 0
    else:
        assigned_gt_inds[(max_overlaps >= cfg.neg_iou_thr[0]) & (max_overlaps < cfg.neg_iou_thr[1])] = 0
    pos_inds = max_overlaps >= cfg.pos_iou_thr
    assigned_gt_inds[pos_inds] = argmax_overlaps[pos_inds] + 1
    if cfg.match_low_quality:
        for i in range(num_gts):
            if gt_max_overlaps[i] >= cfg.min_pos_iou:
                if cfg.gt_max_assign_all:
                    max_iou_inds = overlaps[i, :] == gt_max_overlaps[i]
                    assigned_gt_inds[max_iou_inds] = i + 1
                else:
                    assigned_gt_inds[gt_argmax_overlaps[i]] = i + 1
    if gt_labels is not None:
        assigned_labels = assigned_gt_inds.new_full((num_bboxes,), -1)
        pos_inds = torch.nonzero(assigned_gt_inds > 0, as_tuple=False).squeeze()
        if pos_inds.numel() > 0:
            assigned_labels[pos_inds] = gt_labels[assigned_gt_inds[pos_inds] - 1]
    else:
        assigned_labels = None
    return assign_result(num_gts, assigned_gt_inds, max_overlaps, labels=assigned_labels)


def max_iou_assign(bboxes: torch.Tensor, gt_bboxes: torch.Tensor, gt_labels: torch.Tensor, cfg: Any) -> Any:
    """mmdet ``MaxIoUAssigner.assign`` with ``BboxOverlapsNearest3D`` (no ignored boxes, assigned on the device)."""
    overlaps = bbox_overlaps_nearest_3d(gt_bboxes, bboxes)
    return assign_wrt_overlaps(overlaps, gt_labels, cfg)


def delta_encode(src_boxes: torch.Tensor, dst_boxes: torch.Tensor) -> torch.Tensor:
    """mmdet3d ``DeltaXYZWLHRBBoxCoder.encode`` (bottom-centre boxes, lifted to their centres)."""
    cas, cgs, cts = [], [], []
    if src_boxes.shape[-1] > 7:
        xa, ya, za, wa, la, ha, ra, *cas = torch.split(src_boxes, 1, dim=-1)
        xg, yg, zg, wg, lg, hg, rg, *cgs = torch.split(dst_boxes, 1, dim=-1)
        cts = [g - a for g, a in zip(cgs, cas, strict=True)]
    else:
        xa, ya, za, wa, la, ha, ra = torch.split(src_boxes, 1, dim=-1)
        xg, yg, zg, wg, lg, hg, rg = torch.split(dst_boxes, 1, dim=-1)
    za = za + ha / 2
    zg = zg + hg / 2
    diagonal = torch.sqrt(la**2 + wa**2)
    xt, yt, zt = (xg - xa) / diagonal, (yg - ya) / diagonal, (zg - za) / ha
    lt, wt, ht = torch.log(lg / la), torch.log(wg / wa), torch.log(hg / ha)
    rt = rg - ra
    return torch.cat([xt, yt, zt, wt, lt, ht, rt, *cts], dim=-1)


def delta_decode(anchors: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
    """mmdet3d ``DeltaXYZWLHRBBoxCoder.decode`` (bottom-centre boxes out)."""
    cas, cts = [], []
    if anchors.shape[-1] > 7:
        xa, ya, za, wa, la, ha, ra, *cas = torch.split(anchors, 1, dim=-1)
        xt, yt, zt, wt, lt, ht, rt, *cts = torch.split(deltas, 1, dim=-1)
    else:
        xa, ya, za, wa, la, ha, ra = torch.split(anchors, 1, dim=-1)
        xt, yt, zt, wt, lt, ht, rt = torch.split(deltas, 1, dim=-1)
    za = za + ha / 2
    diagonal = torch.sqrt(la**2 + wa**2)
    xg, yg, zg = xt * diagonal + xa, yt * diagonal + ya, zt * ha + za
    lg, wg, hg = torch.exp(lt) * la, torch.exp(wt) * wa, torch.exp(ht) * ha
    rg = rt + ra
    zg = zg - hg / 2
    cgs = [t + a for t, a in zip(cts, cas, strict=True)]
    return torch.cat([xg, yg, zg, wg, lg, hg, rg, *cgs], dim=-1)


def get_direction_target(anchors, reg_targets, dir_offset=0, dir_limit_offset=0, num_bins=2):  # type: ignore[no-untyped-def]
    """mmdet3d ``train_mixins.py``: ``get_direction_target`` (``one_hot=False``)."""
    rot_gt = reg_targets[..., 6] + anchors[..., 6]
    offset_rot = limit_period(rot_gt - dir_offset, dir_limit_offset, 2 * np.pi)
    dir_cls_targets = torch.floor(offset_rot / (2 * np.pi / num_bins)).long()
    return torch.clamp(dir_cls_targets, min=0, max=num_bins - 1)


def anchor_target_single_assigner(assigner, anchors, gt_bboxes, gt_labels, head):  # type: ignore[no-untyped-def]
    """mmdet3d ``AnchorTrainMixin.anchor_target_single_assigner`` (pseudo sampler, ``pos_weight`` −1)."""
    anchors = anchors.reshape(-1, anchors.size(-1))
    num_valid_anchors = anchors.shape[0]
    bbox_targets = torch.zeros_like(anchors)
    bbox_weights = torch.zeros_like(anchors)
    dir_targets = anchors.new_zeros((anchors.shape[0]), dtype=torch.long)
    dir_weights = anchors.new_zeros((anchors.shape[0]), dtype=torch.float)
    labels = anchors.new_zeros(num_valid_anchors, dtype=torch.long)
    label_weights = anchors.new_zeros(num_valid_anchors, dtype=torch.float)
    if len(gt_bboxes) > 0:
        with _region("assignment"):
            result = max_iou_assign(anchors, gt_bboxes, gt_labels, assigner)
        sampling = pseudo_sample(result, anchors, gt_bboxes)
        pos_inds, neg_inds = sampling.pos_inds, sampling.neg_inds
    else:
        pos_inds = (
            torch.nonzero(anchors.new_zeros((anchors.shape[0],), dtype=torch.bool) > 0, as_tuple=False)
            .squeeze(-1)
            .unique()
        )
        neg_inds = (
            torch.nonzero(anchors.new_zeros((anchors.shape[0],), dtype=torch.bool) == 0, as_tuple=False)
            .squeeze(-1)
            .unique()
        )
    if gt_labels is not None:
        labels += head["num_classes"]
    if len(pos_inds) > 0:
        pos_bbox_targets = delta_encode(sampling.pos_bboxes, sampling.pos_gt_bboxes)
        pos_dir_targets = get_direction_target(
            sampling.pos_bboxes, pos_bbox_targets, head["dir_offset"], head["dir_limit_offset"]
        )
        bbox_targets[pos_inds, :] = pos_bbox_targets
        bbox_weights[pos_inds, :] = 1.0
        dir_targets[pos_inds] = pos_dir_targets
        dir_weights[pos_inds] = 1.0
        labels[pos_inds] = gt_labels[sampling.pos_assigned_gt_inds]
        label_weights[pos_inds] = 1.0
    if len(neg_inds) > 0:
        label_weights[neg_inds] = 1.0
    return labels, label_weights, bbox_targets, bbox_weights, dir_targets, dir_weights, pos_inds, neg_inds


def _anchor_target_3d_single(anchors, gt_bboxes, gt_labels, head):  # type: ignore[no-untyped-def]
    """mmdet3d ``AnchorTrainMixin.anchor_target_3d_single``: one assigner (PointPillars), or, with a list of
    per-class anchors, one per class on the class's ground truth (SSN's ``assign_per_class``)."""
    if not isinstance(anchors, list):
        return anchor_target_single_assigner(head["assigners"][0], anchors, gt_bboxes, gt_labels, head)
    totals: list[list[torch.Tensor]] = [[] for _ in range(8)]
    for i, assigner in enumerate(head["assigners"]):
        gt_per_cls = gt_labels == i
        class_boxes = lidar_boxes(gt_bboxes[gt_per_cls, :])  # LiDARInstance3DBoxes.__getitem__: a new box object
        targets = anchor_target_single_assigner(assigner, anchors[i], class_boxes, gt_labels[gt_per_cls], head)
        for total, target in zip(totals, targets, strict=True):
            total.append(target)
    return tuple(torch.cat(total, dim=0) for total in totals)


def _anchor_target_3d(anchor_list, gt_bboxes_list, gt_labels_list, head):  # type: ignore[no-untyped-def]
    """mmdet3d ``AnchorTrainMixin.anchor_target_3d`` (one feature level)."""
    num_imgs = len(gt_bboxes_list)
    if isinstance(anchor_list[0][0], list):  # per-class anchors: the sizes of their one level
        num_level_anchors = [sum(anchor.size(0) for anchor in anchors) for anchors in anchor_list[0]]
        anchor_list = [anchor_list[i][0] for i in range(num_imgs)]
    else:
        num_level_anchors = [anchors.view(-1, head["box_code_size"]).size(0) for anchors in anchor_list[0]]
        anchor_list = [torch.cat(anchor_list[i]) for i in range(num_imgs)]
    results = [
        _anchor_target_3d_single(anchor_list[i], gt_bboxes_list[i], gt_labels_list[i], head) for i in range(num_imgs)
    ]
    all_labels, all_label_weights, all_bbox_targets, all_bbox_weights, all_dir_targets, all_dir_weights, pos, neg = (
        list(x) for x in zip(*results, strict=True)
    )
    num_total_pos = sum(max(inds.numel(), 1) for inds in pos)
    num_total_neg = sum(max(inds.numel(), 1) for inds in neg)

    def images_to_levels(target: list[torch.Tensor]) -> list[torch.Tensor]:  # mmdet core/anchor/utils.py
        target = torch.stack(target, 0)
        levels, start = [], 0
        for n in num_level_anchors:
            levels.append(target[:, start : start + n])
            start += n
        return levels

    return (
        images_to_levels(all_labels), images_to_levels(all_label_weights), images_to_levels(all_bbox_targets),
        images_to_levels(all_bbox_weights), images_to_levels(all_dir_targets), images_to_levels(all_dir_weights),
        num_total_pos, num_total_neg,
    )  # fmt: skip


def add_sin_difference(boxes1: torch.Tensor, boxes2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mmdet3d ``Anchor3DHead.add_sin_difference``."""
    rad_pred_encoding = torch.sin(boxes1[..., 6:7]) * torch.cos(boxes2[..., 6:7])
    rad_tg_encoding = torch.cos(boxes1[..., 6:7]) * torch.sin(boxes2[..., 6:7])
    boxes1 = torch.cat([boxes1[..., :6], rad_pred_encoding, boxes1[..., 7:]], dim=-1)
    boxes2 = torch.cat([boxes2[..., :6], rad_tg_encoding, boxes2[..., 7:]], dim=-1)
    return boxes1, boxes2


def _anchor3d_loss_single(cls_score, bbox_pred, dir_cls_preds, targets, num_total_samples, head):  # type: ignore[no-untyped-def]
    """mmdet3d ``Anchor3DHead.loss_single`` (PointPillars): the box and direction terms on the positives."""
    labels, label_weights, bbox_targets, bbox_weights, dir_targets, dir_weights = targets
    num_classes, code_size, w = head["num_classes"], head["box_code_size"], head["weights"]
    labels = labels.reshape(-1)
    label_weights = label_weights.reshape(-1)
    cls_score = cls_score.reshape(-1, num_classes)  # the original's permute(0, 2, 3, 1) copy: in our head
    assert labels.max().item() <= num_classes
    loss_cls = focal_loss(cls_score, labels, label_weights, num_total_samples, loss_weight=w["loss_cls"])
    bbox_pred = bbox_pred.reshape(-1, code_size)
    bbox_targets = bbox_targets.reshape(-1, code_size)
    bbox_weights = bbox_weights.reshape(-1, code_size)
    pos_inds = ((labels >= 0) & (labels < num_classes)).nonzero(as_tuple=False).reshape(-1)
    num_pos = len(pos_inds)
    pos_bbox_pred, pos_bbox_targets, pos_bbox_weights = (
        bbox_pred[pos_inds],
        bbox_targets[pos_inds],
        bbox_weights[pos_inds],
    )
    dir_cls_preds = dir_cls_preds.reshape(-1, 2)
    dir_targets, dir_weights = dir_targets.reshape(-1), dir_weights.reshape(-1)
    pos_dir_cls_preds, pos_dir_targets, pos_dir_weights = (
        dir_cls_preds[pos_inds], dir_targets[pos_inds], dir_weights[pos_inds]
    )  # fmt: skip
    if num_pos > 0:
        pos_bbox_weights = pos_bbox_weights * bbox_weights.new_tensor(head["code_weights"])
        pos_bbox_pred, pos_bbox_targets = add_sin_difference(pos_bbox_pred, pos_bbox_targets)
        loss_bbox = smooth_l1_loss(
            pos_bbox_pred, pos_bbox_targets, pos_bbox_weights, num_total_samples, head["beta"], w["loss_bbox"]
        )
        loss_dir = cross_entropy_loss(
            pos_dir_cls_preds, pos_dir_targets, pos_dir_weights, num_total_samples, w["loss_dir"]
        )
    else:
        loss_bbox, loss_dir = pos_bbox_pred.sum(), pos_dir_cls_preds.sum()
    return loss_cls, loss_bbox, loss_dir


def _shape_aware_loss_single(cls_score, bbox_pred, dir_cls_preds, targets, num_total_samples, head):  # type: ignore[no-untyped-def]
    """mmdet3d ``ShapeAwareHead.loss_single`` (SSN): the box and direction terms on every anchor, weighted."""
    labels, label_weights, bbox_targets, bbox_weights, dir_targets, dir_weights = targets
    num_classes, code_size, w = head["num_classes"], head["box_code_size"], head["weights"]
    labels = labels.reshape(-1)
    label_weights = label_weights.reshape(-1)
    cls_score = cls_score.reshape(-1, num_classes)
    loss_cls = focal_loss(cls_score, labels, label_weights, num_total_samples, loss_weight=w["loss_cls"])
    bbox_targets = bbox_targets.reshape(-1, code_size)
    bbox_weights = bbox_weights.reshape(-1, code_size)
    bbox_weights = bbox_weights * bbox_weights.new_tensor(head["code_weights"])
    bbox_pred = bbox_pred.reshape(-1, code_size)
    bbox_pred, bbox_targets = add_sin_difference(bbox_pred, bbox_targets)
    loss_bbox = smooth_l1_loss(bbox_pred, bbox_targets, bbox_weights, num_total_samples, head["beta"], w["loss_bbox"])
    dir_cls_preds = dir_cls_preds.reshape(-1, 2)
    dir_targets, dir_weights = dir_targets.reshape(-1), dir_weights.reshape(-1)
    loss_dir = cross_entropy_loss(dir_cls_preds, dir_targets, dir_weights, num_total_samples, w["loss_dir"])
    return loss_cls, loss_bbox, loss_dir


def original_anchor_head_loss(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """mmdet3d ``Anchor3DHead.loss`` (PointPillars) or ``ShapeAwareHead.loss`` (SSN, per-class anchors): the
    targets per sample (``anchor_target_3d``, with the max-IoU assignment inside, counted as the region
    ``assignment``), then ``loss_single`` on the one feature level.

    Args:
        inputs: from :func:`anchor_head_inputs`.

    Returns:
        ``{"loss_cls", "loss_bbox", "loss_dir"}``, weighted as the original returns them.
    """
    head = inputs["head"]
    targets = _anchor_target_3d(inputs["anchor_list"], inputs["gt_bboxes"], inputs["gt_labels"], head)
    num_total_samples = targets[6]  # num_total_pos (no sampling)
    level = tuple(t[0] for t in targets[:6])
    loss_single = _shape_aware_loss_single if head["per_class"] else _anchor3d_loss_single
    loss_cls, loss_bbox, loss_dir = loss_single(
        inputs["cls_score"], inputs["bbox_pred"], inputs["dir_cls_preds"], level, num_total_samples, head
    )
    return {"loss_cls": loss_cls, "loss_bbox": loss_bbox, "loss_dir": loss_dir}


# ============================================================================ mmdetection3d v1.0.0rc6: decoding
def xywhr2xyxyr(boxes_xywhr: torch.Tensor) -> torch.Tensor:
    """mmdet3d ``core/bbox/structures/utils.py``."""
    boxes = torch.zeros_like(boxes_xywhr)
    half_w, half_h = boxes_xywhr[..., 2] / 2, boxes_xywhr[..., 3] / 2
    boxes[..., 0] = boxes_xywhr[..., 0] - half_w
    boxes[..., 1] = boxes_xywhr[..., 1] - half_h
    boxes[..., 2] = boxes_xywhr[..., 0] + half_w
    boxes[..., 3] = boxes_xywhr[..., 1] + half_h
    boxes[..., 4] = boxes_xywhr[..., 4]
    return boxes


def nms_bev(boxes: torch.Tensor, scores: torch.Tensor, thresh: float) -> torch.Tensor:
    """mmdet3d ``core/post_processing/box3d_nms.py``: ``nms_bev`` (xyxyr back to xywhr, mmcv's ``nms_rotated``)."""
    order = scores.sort(0, descending=True)[1]
    boxes = boxes[order].contiguous()
    scores = scores[order]
    boxes = torch.stack(
        (
            (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2,
            boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1], boxes[:, 4],
        ),
        dim=-1,
    )  # fmt: skip
    keep = nms_rotated(boxes, scores, thresh)[1]
    return order[keep]


def box3d_multiclass_nms(mlvl_bboxes, mlvl_bboxes_for_nms, mlvl_scores, score_thr, max_num, nms_thr, mlvl_dir_scores):  # type: ignore[no-untyped-def]
    """mmdet3d ``box3d_multiclass_nms`` (``use_rotate_nms``, with direction scores)."""
    num_classes = mlvl_scores.shape[1] - 1
    bboxes, scores, labels, dir_scores = [], [], [], []
    for i in range(0, num_classes):
        cls_inds = mlvl_scores[:, i] > score_thr
        if not cls_inds.any():
            continue
        _scores = mlvl_scores[cls_inds, i]
        _bboxes_for_nms = mlvl_bboxes_for_nms[cls_inds, :]
        selected = nms_bev(_bboxes_for_nms, _scores, nms_thr)
        _mlvl_bboxes = mlvl_bboxes[cls_inds, :]
        bboxes.append(_mlvl_bboxes[selected])
        scores.append(_scores[selected])
        labels.append(mlvl_bboxes.new_full((len(selected),), i, dtype=torch.long))
        if mlvl_dir_scores is not None:
            dir_scores.append(mlvl_dir_scores[cls_inds][selected])
    if bboxes:
        bboxes, scores, labels = torch.cat(bboxes, dim=0), torch.cat(scores, dim=0), torch.cat(labels, dim=0)
        dir_scores = torch.cat(dir_scores, dim=0)
        if bboxes.shape[0] > max_num:
            _, inds = scores.sort(descending=True)
            inds = inds[:max_num]
            bboxes, labels, scores, dir_scores = bboxes[inds, :], labels[inds], scores[inds], dir_scores[inds]
    else:
        bboxes = mlvl_scores.new_zeros((0, mlvl_bboxes.size(-1)))
        scores = mlvl_scores.new_zeros((0,))
        labels = mlvl_scores.new_zeros((0,), dtype=torch.long)
        dir_scores = mlvl_scores.new_zeros((0,))
    return bboxes, scores, labels, dir_scores


def original_multiclass_nms(inputs: dict[str, Any]) -> list[tuple[torch.Tensor, ...]]:
    """mmdet3d ``box3d_multiclass_nms`` per sample, as ``get_bboxes_single`` calls it (its inputs made by the
    caller: :func:`nms_inputs`).

    Args:
        inputs: from :func:`nms_inputs`.

    Returns:
        Per sample ``(boxes, scores, labels, dir_scores)``.
    """
    cfg = inputs["cfg"]
    return [
        box3d_multiclass_nms(boxes, for_nms, scores, cfg.score_threshold, cfg.max_num, cfg.nms_threshold, dirs)
        for boxes, for_nms, scores, dirs in zip(
            inputs["mlvl_bboxes"],
            inputs["mlvl_bboxes_for_nms"],
            inputs["mlvl_scores"],
            inputs["mlvl_dir_scores"],
            strict=True,
        )
    ]


def original_decode(inputs: dict[str, Any]) -> list[tuple[torch.Tensor, ...]]:
    """mmdet3d ``Anchor3DHead.get_bboxes`` → ``get_bboxes_single`` per sample (one level, sigmoid scores).

    Args:
        inputs: from :func:`decode_inputs`.

    Returns:
        Per sample ``(boxes (K, D) bottom centre, scores, labels)``.
    """
    cfg, code_size = inputs["cfg"], inputs["box_code_size"]
    anchors = inputs["anchors"]
    out = []
    for img_id in range(inputs["cls_scores"].shape[0]):
        cls_score = inputs["cls_scores"][img_id].detach()  # our layout: the original's permute(1, 2, 0) copies
        bbox_pred = inputs["bbox_preds"][img_id].detach()
        dir_cls_pred = inputs["dir_cls_preds"][img_id].detach()
        dir_cls_score = torch.max(dir_cls_pred.reshape(-1, 2), dim=-1)[1]
        scores = cls_score.reshape(-1, cls_score.shape[-1]).sigmoid()
        bbox_pred = bbox_pred.reshape(-1, code_size)
        level_anchors = anchors
        if 0 < cfg.nms_pre < scores.shape[0]:
            max_scores, _ = scores.max(dim=1)
            _, topk_inds = max_scores.topk(cfg.nms_pre)
            level_anchors = level_anchors[topk_inds, :]
            bbox_pred = bbox_pred[topk_inds, :]
            scores = scores[topk_inds, :]
            dir_cls_score = dir_cls_score[topk_inds]
        bboxes = delta_decode(level_anchors, bbox_pred)
        mlvl_bboxes = torch.cat([bboxes])
        mlvl_bboxes_for_nms = xywhr2xyxyr(lidar_boxes(mlvl_bboxes)[:, [0, 1, 3, 4, 6]])  # box_type_3d(...).bev
        mlvl_scores = torch.cat([scores])
        mlvl_dir_scores = torch.cat([dir_cls_score])
        padding = mlvl_scores.new_zeros(mlvl_scores.shape[0], 1)
        mlvl_scores = torch.cat([mlvl_scores, padding], dim=1)
        bboxes, scores, labels, dir_scores = box3d_multiclass_nms(
            mlvl_bboxes, mlvl_bboxes_for_nms, mlvl_scores, cfg.score_threshold, cfg.max_num, cfg.nms_threshold,
            mlvl_dir_scores,
        )  # fmt: skip
        if bboxes.shape[0] > 0:
            dir_rot = limit_period(bboxes[..., 6] - cfg.dir_offset, cfg.dir_limit_offset, np.pi)
            bboxes[..., 6] = dir_rot + cfg.dir_offset + np.pi * dir_scores.to(bboxes.dtype)
        out.append((lidar_boxes(bboxes), scores, labels))
    return out


def _bottom(boxes: torch.Tensor) -> torch.Tensor:
    """Gravity-centre boxes ``(…, D)`` as the bottom-centre boxes mmdet3d's lidar boxes hold (``z − dz/2``)."""
    return torch.cat([boxes[..., :2], boxes[..., 2:3] - boxes[..., 5:6] * 0.5, boxes[..., 3:]], dim=-1)


def anchor_head_inputs(model: Any, outputs: dict[str, Any], gt_boxes: Any, gt_labels: Any) -> dict[str, Any]:
    """``Anchor3DHead.loss`` / ``ShapeAwareHead.loss`` inputs from a PointPillars / SSN model's: its anchors (bottom
    centre; per class for SSN, their contiguous class blocks), its ground truth per sample (bottom centre), its head
    outputs in our ``(B, A, ·)`` layout, and the head's settings (assigners, code weights, loss weights)."""
    anchors, classes, _ = model.anchor_set(outputs["feature_size"], outputs["anchors"].device)
    bottom = _bottom(anchors.float())  # (A, D)
    batch = outputs["cls_logits"].shape[0]
    if classes is None:
        anchor_list = [[bottom] for _ in range(batch)]  # one level, the same tensors for every image
    else:
        sizes = torch.bincount(classes, minlength=len(model.assigners)).tolist()
        anchor_list = [[list(bottom.split(sizes))] for _ in range(batch)]
    options = model.criterion.options
    head = {
        "num_classes": model.num_classes, "box_code_size": anchors.shape[-1], "assigners": model.assigners,
        "dir_offset": options["dir_offset"], "dir_limit_offset": options["dir_limit_offset"],
        "code_weights": list(options["code_weights"]), "beta": options["beta"], "weights": model.criterion.weights,
        "per_class": classes is not None,
    }  # fmt: skip
    return {
        "anchor_list": anchor_list,
        "gt_bboxes": [_bottom(b.float()) for b in gt_boxes.to_list()],
        "gt_labels": [t.long() for t in gt_labels.to_list()],
        "cls_score": outputs["cls_logits"],
        "bbox_pred": outputs["box_preds"],
        "dir_cls_preds": outputs["dir_logits"],
        "head": head,
    }


def nms_inputs(boxes: torch.Tensor, scores: torch.Tensor, cfg: Any) -> dict[str, Any]:
    """``box3d_multiclass_nms``'s inputs per sample as ``get_bboxes_single`` makes them: the boxes, their BEV in
    xyxyr, the scores with the background column, direction bins (zeros here)."""
    return {
        "mlvl_bboxes": list(boxes.unbind(0)),
        "mlvl_bboxes_for_nms": [xywhr2xyxyr(b[:, [0, 1, 3, 4, 6]]) for b in boxes.unbind(0)],
        "mlvl_scores": [torch.cat([s, s.new_zeros(s.shape[0], 1)], dim=1) for s in scores.unbind(0)],
        "mlvl_dir_scores": [torch.zeros(b.shape[0], dtype=torch.long) for b in boxes.unbind(0)],
        "cfg": cfg,
    }


def decode_inputs(
    cls_logits: torch.Tensor, box_preds: torch.Tensor, dir_logits: torch.Tensor, anchors: torch.Tensor, cfg: Any
) -> dict[str, Any]:
    """``get_bboxes``'s inputs: the head outputs in our layout, the anchors at their bottom centres."""
    return {
        "cls_scores": cls_logits,
        "bbox_preds": box_preds,
        "dir_cls_preds": dir_logits,
        "anchors": _bottom(anchors.float()),
        "box_code_size": anchors.shape[-1],
        "cfg": cfg,
    }
