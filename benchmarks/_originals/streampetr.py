"""Ports of StreamPETR's (exiawsh/StreamPETR) 3D head and 2D focal head losses, and their inputs made from ours.

- ``projects/mmdet3d_plugin/models/dense_heads/streampetr_head.py`` (``StreamPETRHead.loss``, ``loss_single``,
  ``get_targets``, ``_get_target_single``, ``prepare_for_loss``, ``dn_loss_single``);
- ``.../dense_heads/focal_head.py`` (``FocalHead.loss``, ``loss_single``, ``_get_target_single``,
  ``_get_heatmap_single``);
- ``.../core/bbox/assigners/hungarian_assigner_{2d,3d}.py``, ``.../core/bbox/match_costs/match_cost.py``
  (``BBox3DL1Cost``), ``.../core/bbox/util.py`` (``normalize_bbox``), ``.../models/utils/misc.py``
  (``draw_heatmap_gaussian``, ``gaussian_2d``).

:func:`streampetr_inputs` and :func:`focal_head_inputs` make the originals' inputs from ours, outside the counted
call (``benchmarks/originals.py``, "Inputs").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from .mmdet import (
    assign_result,
    bbox_cxcywh_to_xyxy,
    bbox_overlaps,
    bbox_xyxy_to_cxcywh,
    cdist_cost,
    focal_loss,
    focal_loss_cost,
    gaussian_focal_loss,
    giou_loss,
    l1_loss,
    pseudo_sample,
    quality_focal_loss,
    reduce_mean,
)


def _hungarian_tail(cost: torch.Tensor, bbox_pred: torch.Tensor, gt_labels: torch.Tensor, out: tuple) -> None:
    """Steps 3–4 of StreamPETR's Hungarian assigners: SciPy on the host, then the foreground written."""
    assigned_gt_inds, assigned_labels = out
    matched_row_inds, matched_col_inds = linear_sum_assignment(cost)
    matched_row_inds = torch.from_numpy(matched_row_inds).to(bbox_pred.device)
    matched_col_inds = torch.from_numpy(matched_col_inds).to(bbox_pred.device)
    assigned_gt_inds[:] = 0
    assigned_gt_inds[matched_row_inds] = matched_col_inds + 1
    assigned_labels[matched_row_inds] = gt_labels[matched_col_inds]


# ============================================================================ StreamPETR: the 2D focal head
FOCAL_HEAD_WEIGHTS = {"cls": 2.0, "bbox": 5.0, "iou": 2.0, "centers2d": 10.0, "centerness": 1.0}  # its config
FOCAL_HEAD_COSTS = {"cls": 2.0, "reg": 5.0, "iou": 2.0, "centers2d": 10.0}  # its assigner2d's costs


def hungarian_assign_2d(bbox_pred, cls_pred, pred_centers2d, gt_bboxes, gt_labels, centers2d, img_meta):  # type: ignore[no-untyped-def]
    """StreamPETR ``HungarianAssigner2D.assign`` (FocalLossCost 2, BBoxL1Cost 5 xywh, IoUCost giou 2,
    BBox3DL1Cost 10)."""
    num_gts, num_bboxes = gt_bboxes.size(0), bbox_pred.size(0)
    assigned_gt_inds = bbox_pred.new_full((num_bboxes,), -1, dtype=torch.long)
    assigned_labels = bbox_pred.new_full((num_bboxes,), -1, dtype=torch.long)
    if num_gts == 0 or num_bboxes == 0:
        if num_gts == 0:
            assigned_gt_inds[:] = 0
        return assign_result(num_gts, assigned_gt_inds, None, labels=assigned_labels)
    img_h, img_w, _ = img_meta["pad_shape"]
    factor = gt_bboxes.new_tensor([img_w, img_h, img_w, img_h]).unsqueeze(0)
    cls_cost = focal_loss_cost(cls_pred, gt_labels, FOCAL_HEAD_COSTS["cls"])
    normalize_gt_bboxes = gt_bboxes / factor
    reg_cost = cdist_cost(bbox_pred, bbox_xyxy_to_cxcywh(normalize_gt_bboxes), FOCAL_HEAD_COSTS["reg"])
    bboxes = bbox_cxcywh_to_xyxy(bbox_pred) * factor
    iou_cost = -bbox_overlaps(bboxes, gt_bboxes, mode="giou", is_aligned=False) * FOCAL_HEAD_COSTS["iou"]
    normalize_centers2d = centers2d / factor[:, 0:2]
    centers2d_cost = cdist_cost(pred_centers2d, normalize_centers2d, FOCAL_HEAD_COSTS["centers2d"])
    cost = cls_cost + reg_cost + iou_cost + centers2d_cost
    cost = torch.nan_to_num(cost, nan=100.0, posinf=100.0, neginf=-100.0)
    cost = cost.detach().cpu()
    _hungarian_tail(cost, bbox_pred, gt_labels, (assigned_gt_inds, assigned_labels))
    return assign_result(num_gts, assigned_gt_inds, None, labels=assigned_labels)


def _focal_head_target_single(cls_score, bbox_pred, pred_centers2d, gt_bboxes, gt_labels, centers2d, img_meta, c):  # type: ignore[no-untyped-def]
    """StreamPETR ``FocalHead._get_target_single``."""
    num_bboxes = bbox_pred.size(0)
    result = hungarian_assign_2d(bbox_pred, cls_score, pred_centers2d, gt_bboxes, gt_labels, centers2d, img_meta)
    sampling = pseudo_sample(result, bbox_pred, gt_bboxes)
    pos_inds, neg_inds = sampling.pos_inds, sampling.neg_inds
    labels = gt_bboxes.new_full((num_bboxes,), c, dtype=torch.long)
    labels[pos_inds] = gt_labels[sampling.pos_assigned_gt_inds].long()
    label_weights = gt_bboxes.new_ones(num_bboxes)
    bbox_targets = torch.zeros_like(bbox_pred)
    bbox_weights = torch.zeros_like(bbox_pred)
    bbox_weights[pos_inds] = 1.0
    img_h, img_w, _ = img_meta["pad_shape"]
    factor = bbox_pred.new_tensor([img_w, img_h, img_w, img_h]).unsqueeze(0)
    pos_gt_bboxes_normalized = sampling.pos_gt_bboxes / factor
    bbox_targets[pos_inds] = bbox_xyxy_to_cxcywh(pos_gt_bboxes_normalized)
    centers2d_targets = bbox_pred.new_full((num_bboxes, 2), 0.0, dtype=torch.float32)
    if gt_bboxes.numel() == 0:
        centers2d_labels = torch.empty_like(gt_bboxes).view(-1, 2)
    else:
        centers2d_labels = centers2d[sampling.pos_assigned_gt_inds.long(), :]
    centers2d_targets[pos_inds] = centers2d_labels / factor[:, 0:2]
    return labels, label_weights, bbox_targets, bbox_weights, centers2d_targets, pos_inds, neg_inds


def gaussian_2d(shape: tuple[int, int], sigma: float = 1.0) -> np.ndarray:
    """StreamPETR ``models/utils/misc.py``: ``gaussian_2d`` (NumPy, on the host)."""
    m, n = ((ss - 1.0) / 2.0 for ss in shape)
    y, x = np.ogrid[-m : m + 1, -n : n + 1]
    h = np.exp(-(x * x + y * y) / (2 * sigma * sigma))
    h[h < np.finfo(h.dtype).eps * h.max()] = 0
    return h


def draw_heatmap_gaussian(heatmap: torch.Tensor, center: torch.Tensor, radius: int, k: int = 1) -> torch.Tensor:
    """StreamPETR ``models/utils/misc.py``: ``draw_heatmap_gaussian`` (the Gaussian made on the host, copied)."""
    diameter = 2 * radius + 1
    gaussian = gaussian_2d((diameter, diameter), sigma=diameter / 6)
    x, y = int(center[0]), int(center[1])
    height, width = heatmap.shape[0:2]
    left, right = min(x, radius), min(width - x, radius + 1)
    top, bottom = min(y, radius), min(height - y, radius + 1)
    masked_heatmap = heatmap[y - top : y + bottom, x - left : x + right]
    masked_gaussian = torch.from_numpy(gaussian[radius - top : radius + bottom, radius - left : radius + right]).to(
        heatmap.device, torch.float32
    )
    if min(masked_gaussian.shape) > 0 and min(masked_heatmap.shape) > 0:
        torch.max(masked_heatmap, masked_gaussian * k, out=masked_heatmap)
    return heatmap


def _focal_head_heatmap_single(obj_centers2d, obj_bboxes, img_shape, stride):  # type: ignore[no-untyped-def]
    """StreamPETR ``FocalHead._get_heatmap_single``."""
    img_h, img_w, _ = img_shape
    heatmap = torch.zeros(img_h // stride, img_w // stride, device=obj_centers2d.device)
    if len(obj_centers2d) != 0:
        left = obj_centers2d[..., 0:1] - obj_bboxes[..., 0:1]
        top = obj_centers2d[..., 1:2] - obj_bboxes[..., 1:2]
        right = obj_bboxes[..., 2:3] - obj_centers2d[..., 0:1]
        bottom = obj_bboxes[..., 3:4] - obj_centers2d[..., 1:2]
        bound = torch.cat([left, top, right, bottom], dim=-1)
        radius = torch.ceil(torch.min(bound, dim=-1)[0] / 16)
        radius = torch.clamp(radius, 1.0).cpu().numpy().tolist()
        for center, r in zip(obj_centers2d, radius, strict=True):
            heatmap = draw_heatmap_gaussian(heatmap, center / 16, radius=int(r), k=1)
    return heatmap


def original_focal_head_loss(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """StreamPETR ``FocalHead.loss`` → ``loss_single`` (one call over every image of the batch).

    Args:
        inputs: from :func:`focal_head_inputs`.

    Returns:
        The five terms, weighted as the original returns them.
    """
    cls_scores, bbox_preds = inputs["enc_cls_scores"], inputs["enc_bbox_preds"]  # (B·N, Q, C), (B·N, Q, 4)
    pred_centers2d, centerness = inputs["pred_centers2d"], inputs["centerness"]  # (B·N, Q, 2), (B·N, Q, 1)
    gt_bboxes_list, gt_labels_list = inputs["gt_bboxes2d"], inputs["gt_labels2d"]  # per image
    centers2d_list, img_metas, stride = inputs["centers2d"], inputs["img_metas"], inputs["stride"]
    num_classes = cls_scores.shape[-1]
    num_imgs = cls_scores.size(0)
    img_meta = {"pad_shape": img_metas[0]["pad_shape"][0]}
    targets = [
        _focal_head_target_single(
            cls_scores[i], bbox_preds[i], pred_centers2d[i], gt_bboxes_list[i], gt_labels_list[i],
            centers2d_list[i], img_meta, num_classes,
        )
        for i in range(num_imgs)
    ]  # fmt: skip
    labels_list, label_weights_list, bbox_targets_list, bbox_weights_list, centers2d_list_t, pos, neg = zip(
        *targets, strict=True
    )
    num_total_pos = sum(inds.numel() for inds in pos)
    num_total_neg = sum(inds.numel() for inds in neg)
    labels = torch.cat(labels_list, 0)
    label_weights = torch.cat(label_weights_list, 0)
    bbox_targets = torch.cat(bbox_targets_list, 0)
    bbox_weights = torch.cat(bbox_weights_list, 0)
    centers2d_targets = torch.cat(centers2d_list_t, 0)
    img_h, img_w, _ = img_metas[0]["pad_shape"][0]
    factors = []
    for bbox_pred in bbox_preds:
        factors.append(bbox_pred.new_tensor([img_w, img_h, img_w, img_h]).unsqueeze(0).repeat(bbox_pred.size(0), 1))
    factors = torch.cat(factors, 0)
    bbox_preds = bbox_preds.reshape(-1, 4)
    bboxes = bbox_cxcywh_to_xyxy(bbox_preds) * factors
    bboxes_gt = bbox_cxcywh_to_xyxy(bbox_targets) * factors
    w = FOCAL_HEAD_WEIGHTS
    loss_iou = giou_loss(bboxes, bboxes_gt, bbox_weights, avg_factor=num_total_pos, loss_weight=w["iou"])
    iou_score = bbox_overlaps(bboxes_gt, bboxes, is_aligned=True).reshape(-1)
    cls_scores = cls_scores.reshape(-1, num_classes)
    cls_avg_factor = max(num_total_pos * 1.0 + num_total_neg * 0.0, 1)  # bg_cls_weight 0, sync_cls_avg_factor off
    loss_cls = quality_focal_loss(
        cls_scores, (labels, iou_score.detach()), label_weights, avg_factor=cls_avg_factor, loss_weight=w["cls"]
    )
    num_total_pos = loss_cls.new_tensor([num_total_pos])
    num_total_pos = torch.clamp(reduce_mean(num_total_pos), min=1).item()
    img_shape = [img_metas[0]["pad_shape"][0]] * num_imgs
    heatmaps = [
        _focal_head_heatmap_single(c, b, s, stride)
        for c, b, s in zip(centers2d_list, gt_bboxes_list, img_shape, strict=True)
    ]
    heatmaps = torch.stack(heatmaps, dim=0)
    centerness = torch.clamp(centerness.sigmoid(), min=1e-4, max=1 - 1e-4)  # clip_sigmoid (its sigmoid_ in place)
    loss_centerness = gaussian_focal_loss(
        centerness, heatmaps.view(num_imgs, -1, 1), avg_factor=max(num_total_pos, 1), loss_weight=w["centerness"]
    )
    loss_bbox = l1_loss(bbox_preds, bbox_targets, bbox_weights, avg_factor=num_total_pos, loss_weight=w["bbox"])
    pred_centers2d = pred_centers2d.view(-1, 2)
    loss_centers2d = l1_loss(
        pred_centers2d, centers2d_targets, bbox_weights[:, 0:2], avg_factor=num_total_pos, loss_weight=w["centers2d"]
    )
    return {
        "enc_loss_cls": loss_cls,
        "enc_loss_bbox": loss_bbox,
        "enc_loss_iou": loss_iou,
        "centers2d_loss": loss_centers2d,
        "centerness_loss": loss_centerness,
    }


# ============================================================================ StreamPETR: the 3D head
STREAMPETR_WEIGHTS = {"cls": 2.0, "bbox": 0.25}  # loss_cls (FocalLoss), loss_bbox (L1Loss) of its config
STREAMPETR_COSTS = {"cls": 2.0, "reg": 0.25}  # its assigner's FocalLossCost and BBox3DL1Cost


def normalize_bbox(bboxes: torch.Tensor) -> torch.Tensor:
    """StreamPETR ``core/bbox/util.py``: ``normalize_bbox``."""
    cx, cy, cz = bboxes[..., 0:1], bboxes[..., 1:2], bboxes[..., 2:3]
    w, l, h = bboxes[..., 3:4].log(), bboxes[..., 4:5].log(), bboxes[..., 5:6].log()  # noqa: E741
    rot = bboxes[..., 6:7]
    if bboxes.size(-1) > 7:
        vx, vy = bboxes[..., 7:8], bboxes[..., 8:9]
        return torch.cat((cx, cy, cz, w, l, h, rot.sin(), rot.cos(), vx, vy), dim=-1)
    return torch.cat((cx, cy, cz, w, l, h, rot.sin(), rot.cos()), dim=-1)


def gravity_center(bottom_boxes: torch.Tensor) -> torch.Tensor:
    """mmdet3d ``LiDARInstance3DBoxes.gravity_center`` of a ``(M, 9)`` bottom-centre tensor."""
    bottom_center = bottom_boxes[:, :3]
    center = torch.zeros_like(bottom_center)
    center[:, :2] = bottom_center[:, :2]
    center[:, 2] = bottom_center[:, 2] + bottom_boxes[:, 5] * 0.5
    return center


def hungarian_assign_3d(bbox_pred, cls_pred, gt_bboxes, gt_labels, code_weights):  # type: ignore[no-untyped-def]
    """StreamPETR ``HungarianAssigner3D.assign`` (``match_with_velo=False``: the first 8 code dims)."""
    num_gts, num_bboxes = gt_bboxes.size(0), bbox_pred.size(0)
    assigned_gt_inds = bbox_pred.new_full((num_bboxes,), -1, dtype=torch.long)
    assigned_labels = bbox_pred.new_full((num_bboxes,), -1, dtype=torch.long)
    if num_gts == 0 or num_bboxes == 0:
        if num_gts == 0:
            assigned_gt_inds[:] = 0
        return assign_result(num_gts, assigned_gt_inds, None, labels=assigned_labels)
    cls_cost = focal_loss_cost(cls_pred, gt_labels, STREAMPETR_COSTS["cls"])
    normalized_gt_bboxes = normalize_bbox(gt_bboxes)
    bbox_pred = bbox_pred * code_weights
    normalized_gt_bboxes = normalized_gt_bboxes * code_weights
    reg_cost = cdist_cost(bbox_pred[:, :8], normalized_gt_bboxes[:, :8], STREAMPETR_COSTS["reg"])
    cost = cls_cost + reg_cost
    cost = cost.detach().cpu()
    cost = torch.nan_to_num(cost, nan=100.0, posinf=100.0, neginf=-100.0)
    _hungarian_tail(cost, bbox_pred, gt_labels, (assigned_gt_inds, assigned_labels))
    return assign_result(num_gts, assigned_gt_inds, None, labels=assigned_labels)


def _streampetr_target_single(cls_score, bbox_pred, gt_labels, gt_bboxes, code_weights, c):  # type: ignore[no-untyped-def]
    """StreamPETR ``StreamPETRHead._get_target_single``."""
    num_bboxes = bbox_pred.size(0)
    result = hungarian_assign_3d(bbox_pred, cls_score, gt_bboxes, gt_labels, code_weights)
    sampling = pseudo_sample(result, bbox_pred, gt_bboxes)
    pos_inds, neg_inds = sampling.pos_inds, sampling.neg_inds
    labels = gt_bboxes.new_full((num_bboxes,), c, dtype=torch.long)
    label_weights = gt_bboxes.new_ones(num_bboxes)
    code_size = gt_bboxes.size(1)
    bbox_targets = torch.zeros_like(bbox_pred)[..., :code_size]
    bbox_weights = torch.zeros_like(bbox_pred)
    if sampling.num_gts > 0:
        bbox_targets[pos_inds] = sampling.pos_gt_bboxes
        bbox_weights[pos_inds] = 1.0
        labels[pos_inds] = gt_labels[sampling.pos_assigned_gt_inds]
    return labels, label_weights, bbox_targets, bbox_weights, pos_inds, neg_inds


def _streampetr_loss_single(cls_scores, bbox_preds, gt_bboxes_list, gt_labels_list, code_weights):  # type: ignore[no-untyped-def]
    """StreamPETR ``StreamPETRHead.loss_single`` (one decoder layer)."""
    num_imgs, num_classes = cls_scores.size(0), cls_scores.shape[-1]
    targets = [
        _streampetr_target_single(cls_scores[i], bbox_preds[i], gt_labels_list[i], gt_bboxes_list[i], code_weights,
                                  num_classes)
        for i in range(num_imgs)
    ]  # fmt: skip
    labels_list, label_weights_list, bbox_targets_list, bbox_weights_list, pos, neg = zip(*targets, strict=True)
    num_total_pos = sum(inds.numel() for inds in pos)
    num_total_neg = sum(inds.numel() for inds in neg)
    labels = torch.cat(labels_list, 0)
    label_weights = torch.cat(label_weights_list, 0)
    bbox_targets = torch.cat(bbox_targets_list, 0)
    bbox_weights = torch.cat(bbox_weights_list, 0)
    cls_scores = cls_scores.reshape(-1, num_classes)
    cls_avg_factor = max(num_total_pos * 1.0 + num_total_neg * 0.0, 1)
    loss_cls = focal_loss(cls_scores, labels, label_weights, cls_avg_factor, loss_weight=STREAMPETR_WEIGHTS["cls"])
    num_total_pos = loss_cls.new_tensor([num_total_pos])
    num_total_pos = torch.clamp(reduce_mean(num_total_pos), min=1).item()
    bbox_preds = bbox_preds.reshape(-1, bbox_preds.size(-1))
    normalized_bbox_targets = normalize_bbox(bbox_targets)
    isnotnan = torch.isfinite(normalized_bbox_targets).all(dim=-1)
    bbox_weights = bbox_weights * code_weights
    loss_bbox = l1_loss(
        bbox_preds[isnotnan, :10], normalized_bbox_targets[isnotnan, :10], bbox_weights[isnotnan, :10],
        avg_factor=num_total_pos, loss_weight=STREAMPETR_WEIGHTS["bbox"],
    )  # fmt: skip
    return torch.nan_to_num(loss_cls), torch.nan_to_num(loss_bbox)


def _streampetr_dn_loss_single(cls_scores, bbox_preds, known_bboxs, known_labels, num_total_pos, code_weights, split):  # type: ignore[no-untyped-def]
    """StreamPETR ``StreamPETRHead.dn_loss_single`` (one decoder layer; ``dn_weight`` 1)."""
    cls_scores = cls_scores.reshape(-1, cls_scores.shape[-1])
    cls_avg_factor = num_total_pos * 3.14159 / 6 * split * split * split
    bbox_weights = torch.ones_like(bbox_preds)
    label_weights = torch.ones_like(known_labels)
    cls_avg_factor = max(cls_avg_factor, 1)
    loss_cls = focal_loss(
        cls_scores, known_labels.long(), label_weights, cls_avg_factor, loss_weight=STREAMPETR_WEIGHTS["cls"]
    )
    num_total_pos = loss_cls.new_tensor([num_total_pos])
    num_total_pos = torch.clamp(reduce_mean(num_total_pos), min=1).item()
    bbox_preds = bbox_preds.reshape(-1, bbox_preds.size(-1))
    normalized_bbox_targets = normalize_bbox(known_bboxs)
    isnotnan = torch.isfinite(normalized_bbox_targets).all(dim=-1)
    bbox_weights = bbox_weights * code_weights
    loss_bbox = l1_loss(
        bbox_preds[isnotnan, :10], normalized_bbox_targets[isnotnan, :10], bbox_weights[isnotnan, :10],
        avg_factor=num_total_pos, loss_weight=STREAMPETR_WEIGHTS["bbox"],
    )  # fmt: skip
    return 1.0 * torch.nan_to_num(loss_cls), 1.0 * torch.nan_to_num(loss_bbox)


def original_streampetr_loss(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """StreamPETR ``StreamPETRHead.loss``: ``loss_single`` per decoder layer, then (with denoising)
    ``prepare_for_loss`` and ``dn_loss_single`` per layer.

    Args:
        inputs: from :func:`streampetr_inputs`.

    Returns:
        The terms, weighted as the original returns them (``d{l}.``-prefixed for the earlier layers).
    """
    all_cls_scores, all_bbox_preds = inputs["all_cls_scores"], inputs["all_bbox_preds"]  # (L, B, Q, C), (L, B, Q, 10)
    code_weights = inputs["code_weights"]  # (10,) a parameter of the head, on the device
    num_dec_layers = len(all_cls_scores)
    gt_bboxes_list = [
        torch.cat((gravity_center(boxes), boxes[:, 3:]), dim=1).to(all_cls_scores.device)
        for boxes in inputs["gt_bboxes_3d"]
    ]  # the LiDARInstance3DBoxes' gravity centres
    gt_labels_list = inputs["gt_labels_3d"]
    losses = [
        _streampetr_loss_single(all_cls_scores[i], all_bbox_preds[i], gt_bboxes_list, gt_labels_list, code_weights)
        for i in range(num_dec_layers)
    ]
    names = [f"d{i}." if i < num_dec_layers - 1 else "" for i in range(num_dec_layers)]
    out = {}
    for name, (loss_cls, loss_bbox) in zip(names, losses, strict=True):
        out[f"{name}loss_cls"], out[f"{name}loss_bbox"] = loss_cls, loss_bbox
    mask_dict = inputs.get("dn_mask_dict")
    if mask_dict is not None:
        output_known_class, output_known_coord = mask_dict["output_known_lbs_bboxes"]  # prepare_for_loss
        known_labels, known_bboxs = mask_dict["known_lbs_bboxes"]
        map_known_indice = torch.from_numpy(mask_dict["map_known_indice"]).long()  # host tensors, as the original's
        known_indice = mask_dict["known_indice"].long().cpu()
        batch_idx = torch.from_numpy(mask_dict["batch_idx"]).long()
        bid = batch_idx[known_indice]
        if len(output_known_class) > 0:
            output_known_class = output_known_class.permute(1, 2, 0, 3)[(bid, map_known_indice)].permute(1, 0, 2)
            output_known_coord = output_known_coord.permute(1, 2, 0, 3)[(bid, map_known_indice)].permute(1, 0, 2)
        num_tgt = known_indice.numel()
        dn_losses = [
            _streampetr_dn_loss_single(
                output_known_class[i], output_known_coord[i], known_bboxs, known_labels, num_tgt, code_weights,
                inputs["dn_split"],
            )
            for i in range(num_dec_layers)
        ]  # fmt: skip
        for name, (loss_cls, loss_bbox) in zip(names, dn_losses, strict=True):
            out[f"{name}dn_loss_cls"], out[f"{name}dn_loss_bbox"] = loss_cls, loss_bbox
    return out


# ============================================================================ inputs: ours → the originals'
def _images(rb: Any) -> list[torch.Tensor]:
    """A ``(B, N, G, ·)`` RaggedBatch as the original's flat per-image list (``[x for sample in rb for x in
    sample]``, as ``FocalHead.loss`` flattens it)."""
    return [t for row in rb.to_list() for t in row]


def focal_head_inputs(outputs: dict[str, Any], targets: dict[str, Any], stride: int = 16) -> dict[str, Any]:
    """``FocalHead.loss``'s inputs from :class:`~drivetrain.losses.focal_head.FocalHeadLoss`'s:
    per-image ground truth, predictions flattened over the cameras (views), ``pad_shape`` ``(H, W, 3)``."""
    logits = outputs["cls_logits"]  # (B, N, Q, C)
    batch, cams, num_tokens, num_classes = logits.shape
    width, height = (int(v) for v in targets["image_size"])
    return {
        "enc_cls_scores": logits.reshape(batch * cams, num_tokens, num_classes),
        "enc_bbox_preds": outputs["boxes"].reshape(batch * cams, num_tokens, 4),
        "pred_centers2d": outputs["centres"].reshape(batch * cams, num_tokens, 2),
        "centerness": outputs["centerness"].reshape(batch * cams, num_tokens, 1),
        "gt_bboxes2d": [t.float() for t in _images(targets["gt_boxes_2d"])],
        "gt_labels2d": [t.long() for t in _images(targets["gt_labels_2d"])],
        "centers2d": [t.float() for t in _images(targets["centers_2d"])],
        "img_metas": [{"pad_shape": [(height, width, 3)] * cams}],
        "stride": stride,
    }


def streampetr_inputs(outputs: dict[str, Any], targets: dict[str, Any], code_weights: torch.Tensor,
                      dn_split: float = 0.75) -> dict[str, Any]:  # fmt: skip
    """``StreamPETRHead.loss``'s inputs from :class:`~drivetrain.models.streampetr.loss_3d.StreamPETRLoss`'s:
    bottom-centre boxes per sample (the original's ``LiDARInstance3DBoxes``), and, with denoising, the ``mask_dict``
    its ``prepare_for_dn`` builds in the forward pass (group-major targets; a DN query is background where
    ``dn_background`` says)."""
    boxes = [b.float() for b in targets["gt_boxes"].to_list()]  # (M_b, 9) gravity centre
    labels = [t.long() for t in targets["gt_labels"].to_list()]
    bottom = [torch.cat([b[:, :2], b[:, 2:3] - b[:, 5:6] * 0.5, b[:, 3:]], dim=-1) for b in boxes]
    out: dict[str, Any] = {
        "all_cls_scores": outputs["cls_logits"],
        "all_bbox_preds": outputs["box_codes"],
        "gt_bboxes_3d": bottom,
        "gt_labels_3d": labels,
        "code_weights": code_weights,
        "dn_split": dn_split,
    }
    if "dn_cls_logits" not in outputs:
        return out
    groups, device = outputs["dn_groups"], outputs["dn_cls_logits"].device
    single_pad = outputs["dn_cls_logits"].shape[2] // groups
    known_num = [b.shape[0] for b in boxes]
    batch_idx = np.concatenate([np.full(n, i, dtype=np.int64) for i, n in enumerate(known_num)] or [np.zeros(0, int)])
    known_indice = torch.arange(sum(known_num), device=device).repeat(groups, 1).view(-1)
    per_sample = np.concatenate([np.arange(n, dtype=np.int64) for n in known_num] or [np.zeros(0, int)])
    map_known_indice = np.concatenate([per_sample + single_pad * i for i in range(groups)])
    known_labels = torch.cat(labels).repeat(groups, 1).view(-1)
    known_bboxs = torch.cat(boxes).repeat(groups, 1)
    noise = outputs["dn_background"][batch_idx[known_indice.cpu().numpy()], map_known_indice]  # left the ball
    known_labels[noise] = outputs["cls_logits"].shape[-1]
    out["dn_mask_dict"] = {
        "known_indice": known_indice,
        "batch_idx": batch_idx,
        "map_known_indice": map_known_indice,
        "known_lbs_bboxes": (known_labels, known_bboxs),
        "output_known_lbs_bboxes": (outputs["dn_cls_logits"], outputs["dn_box_codes"]),
    }
    return out
