"""Ports of mmdet 2.28.2: box transforms, IoU, the losses, the match costs and the pseudo sampler.

- ``mmdet/core/bbox/match_costs/match_cost.py`` (``FocalLossCost``, ``BBoxL1Cost``, ``IoUCost``),
  ``mmdet/core/bbox/iou_calculators/iou2d_calculator.py`` (``bbox_overlaps``), ``mmdet/core/bbox/transforms.py``,
  ``mmdet/core/bbox/samplers/{pseudo_sampler,sampling_result}.py``;
- ``mmdet/models/losses/`` (``focal_loss.py``, ``gfocal_loss.py``, ``gaussian_focal_loss.py``,
  ``smooth_l1_loss.py``, ``iou_loss.py``, ``cross_entropy_loss.py``, ``utils.py``), ``mmdet/core/utils/
  dist_utils.py`` (``reduce_mean``).

On a GPU mmdet's ``FocalLoss`` takes mmcv's op, so :func:`focal_loss` runs the mmcv port (``benchmarks/originals.py``,
"What runs as on a GPU").
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from .mmcv import SigmoidFocalLossFunction

EPS32 = float(torch.finfo(torch.float32).eps)


# ============================================================================ mmdet 2.28.2
def bbox_cxcywh_to_xyxy(bbox: torch.Tensor) -> torch.Tensor:
    """mmdet ``core/bbox/transforms.py``."""
    cx, cy, w, h = bbox.split((1, 1, 1, 1), dim=-1)
    return torch.cat([(cx - 0.5 * w), (cy - 0.5 * h), (cx + 0.5 * w), (cy + 0.5 * h)], dim=-1)


def bbox_xyxy_to_cxcywh(bbox: torch.Tensor) -> torch.Tensor:
    """mmdet ``core/bbox/transforms.py``."""
    x1, y1, x2, y2 = bbox.split((1, 1, 1, 1), dim=-1)
    return torch.cat([(x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1), (y2 - y1)], dim=-1)


def bbox_overlaps(bboxes1, bboxes2, mode="iou", is_aligned=False, eps=1e-6):  # type: ignore[no-untyped-def]
    """mmdet ``core/bbox/iou_calculators/iou2d_calculator.py``: ``bbox_overlaps`` (``fp16_clamp`` is ``clamp``)."""
    batch_shape = bboxes1.shape[:-2]
    rows, cols = bboxes1.size(-2), bboxes2.size(-2)
    if rows * cols == 0:
        return bboxes1.new(batch_shape + ((rows,) if is_aligned else (rows, cols)))
    area1 = (bboxes1[..., 2] - bboxes1[..., 0]) * (bboxes1[..., 3] - bboxes1[..., 1])
    area2 = (bboxes2[..., 2] - bboxes2[..., 0]) * (bboxes2[..., 3] - bboxes2[..., 1])
    if is_aligned:
        lt = torch.max(bboxes1[..., :2], bboxes2[..., :2])
        rb = torch.min(bboxes1[..., 2:], bboxes2[..., 2:])
        wh = (rb - lt).clamp(min=0)
        overlap = wh[..., 0] * wh[..., 1]
        union = area1 + area2 - overlap if mode in ("iou", "giou") else area1
        if mode == "giou":
            enclosed_lt = torch.min(bboxes1[..., :2], bboxes2[..., :2])
            enclosed_rb = torch.max(bboxes1[..., 2:], bboxes2[..., 2:])
    else:
        lt = torch.max(bboxes1[..., :, None, :2], bboxes2[..., None, :, :2])
        rb = torch.min(bboxes1[..., :, None, 2:], bboxes2[..., None, :, 2:])
        wh = (rb - lt).clamp(min=0)
        overlap = wh[..., 0] * wh[..., 1]
        union = area1[..., None] + area2[..., None, :] - overlap if mode in ("iou", "giou") else area1[..., None]
        if mode == "giou":
            enclosed_lt = torch.min(bboxes1[..., :, None, :2], bboxes2[..., None, :, :2])
            enclosed_rb = torch.max(bboxes1[..., :, None, 2:], bboxes2[..., None, :, 2:])
    eps = union.new_tensor([eps])
    union = torch.max(union, eps)
    ious = overlap / union
    if mode in ("iou", "iof"):
        return ious
    enclose_wh = (enclosed_rb - enclosed_lt).clamp(min=0)
    enclose_area = enclose_wh[..., 0] * enclose_wh[..., 1]
    enclose_area = torch.max(enclose_area, eps)
    return ious - (enclose_area - union) / enclose_area


def weight_reduce_loss(loss, weight=None, reduction="mean", avg_factor=None):  # type: ignore[no-untyped-def]
    """mmdet ``models/losses/utils.py``."""
    if weight is not None:
        loss = loss * weight
    if avg_factor is None:
        return loss.mean() if reduction == "mean" else (loss.sum() if reduction == "sum" else loss)
    if reduction == "mean":
        loss = loss.sum() / (avg_factor + EPS32)
    return loss


def focal_loss(pred, target, weight=None, avg_factor=None, gamma=2.0, alpha=0.25, loss_weight=1.0):  # type: ignore[no-untyped-def]
    """mmdet ``FocalLoss.forward`` on a GPU: ``sigmoid_focal_loss``, the wrapper of mmcv's CUDA op."""
    loss = SigmoidFocalLossFunction.apply(pred.contiguous(), target.contiguous(), gamma, alpha, None, "none")
    if weight is not None and weight.shape != loss.shape:
        weight = weight.view(-1, 1) if weight.size(0) == loss.size(0) else weight.view(loss.size(0), -1)
    return loss_weight * weight_reduce_loss(loss, weight, "mean", avg_factor)


def l1_loss(pred, target, weight=None, avg_factor=None, loss_weight=1.0):  # type: ignore[no-untyped-def]
    """mmdet ``L1Loss.forward`` (``l1_loss`` under ``weighted_loss``)."""
    loss = pred.sum() * 0 if target.numel() == 0 else torch.abs(pred - target)
    return loss_weight * weight_reduce_loss(loss, weight, "mean", avg_factor)


def smooth_l1_loss(pred, target, weight=None, avg_factor=None, beta=1.0, loss_weight=1.0):  # type: ignore[no-untyped-def]
    """mmdet ``SmoothL1Loss.forward``."""
    if target.numel() == 0:
        loss = pred.sum() * 0
    else:
        diff = torch.abs(pred - target)
        loss = torch.where(diff < beta, 0.5 * diff * diff / beta, diff - 0.5 * beta)
    return loss_weight * weight_reduce_loss(loss, weight, "mean", avg_factor)


def cross_entropy_loss(cls_score, label, weight=None, avg_factor=None, loss_weight=1.0):  # type: ignore[no-untyped-def]
    """mmdet ``CrossEntropyLoss.forward`` (softmax, no class weights, ``ignore_index`` −100)."""
    loss = F.cross_entropy(cls_score, label, weight=None, reduction="none", ignore_index=-100)
    if weight is not None:
        weight = weight.float()
    return loss_weight * weight_reduce_loss(loss, weight, "mean", avg_factor)


def giou_loss(pred, target, weight=None, avg_factor=None, eps=1e-6, loss_weight=1.0):  # type: ignore[no-untyped-def]
    """mmdet ``GIoULoss.forward`` (``giou_loss`` under ``weighted_loss``)."""
    if weight is not None and not torch.any(weight > 0):
        if pred.dim() == weight.dim() + 1:
            weight = weight.unsqueeze(1)
        return (pred * weight).sum()
    if weight is not None and weight.dim() > 1:
        weight = weight.mean(-1)
    loss = 1 - bbox_overlaps(pred, target, mode="giou", is_aligned=True, eps=eps)
    return loss_weight * weight_reduce_loss(loss, weight, "mean", avg_factor)


def quality_focal_loss(pred, target, weight=None, avg_factor=None, beta=2.0, loss_weight=1.0):  # type: ignore[no-untyped-def]
    """mmdet ``QualityFocalLoss.forward`` (``quality_focal_loss`` under ``weighted_loss``)."""
    label, score = target
    pred_sigmoid = pred.sigmoid()
    scale_factor = pred_sigmoid
    zerolabel = scale_factor.new_zeros(pred.shape)
    loss = F.binary_cross_entropy_with_logits(pred, zerolabel, reduction="none") * scale_factor.pow(beta)
    bg_class_ind = pred.size(1)
    pos = ((label >= 0) & (label < bg_class_ind)).nonzero().squeeze(1)
    pos_label = label[pos].long()
    scale_factor = score[pos] - pred_sigmoid[pos, pos_label]
    loss[pos, pos_label] = F.binary_cross_entropy_with_logits(
        pred[pos, pos_label], score[pos], reduction="none"
    ) * scale_factor.abs().pow(beta)
    loss = loss.sum(dim=1, keepdim=False)
    return loss_weight * weight_reduce_loss(loss, weight, "mean", avg_factor)


def gaussian_focal_loss(pred, gaussian_target, avg_factor=None, alpha=2.0, gamma=4.0, loss_weight=1.0):  # type: ignore[no-untyped-def]
    """mmdet ``GaussianFocalLoss.forward`` (``gaussian_focal_loss`` under ``weighted_loss``)."""
    eps = 1e-12
    pos_weights = gaussian_target.eq(1)
    neg_weights = (1 - gaussian_target).pow(gamma)
    pos_loss = -(pred + eps).log() * (1 - pred).pow(alpha) * pos_weights
    neg_loss = -(1 - pred + eps).log() * pred.pow(alpha) * neg_weights
    return loss_weight * weight_reduce_loss(pos_loss + neg_loss, None, "mean", avg_factor)


def reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """mmdet ``core/utils/dist_utils.py``: the tensor itself without a process group (one process)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return tensor
    tensor = tensor.clone()
    torch.distributed.all_reduce(tensor.div_(torch.distributed.get_world_size()))
    return tensor


def focal_loss_cost(cls_pred, gt_labels, weight, alpha=0.25, gamma=2, eps=1e-12):  # type: ignore[no-untyped-def]
    """mmdet ``FocalLossCost._focal_loss_cost``."""
    cls_pred = cls_pred.sigmoid()
    neg_cost = -(1 - cls_pred + eps).log() * (1 - alpha) * cls_pred.pow(gamma)
    pos_cost = -(cls_pred + eps).log() * alpha * (1 - cls_pred).pow(gamma)
    cls_cost = pos_cost[:, gt_labels] - neg_cost[:, gt_labels]
    return cls_cost * weight


def cdist_cost(bbox_pred, gt_bboxes, weight):  # type: ignore[no-untyped-def]
    """StreamPETR ``BBox3DL1Cost`` (and mmdet ``BBoxL1Cost`` after its format conversion): ``cdist(p=1) · w``."""
    return torch.cdist(bbox_pred, gt_bboxes, p=1) * weight


def pseudo_sample(assign_result: SimpleNamespace, bboxes: torch.Tensor, gt_bboxes: torch.Tensor) -> SimpleNamespace:
    """mmdet ``PseudoSampler.sample`` and the ``SamplingResult`` it builds."""
    pos_inds = torch.nonzero(assign_result.gt_inds > 0, as_tuple=False).squeeze(-1).unique()
    neg_inds = torch.nonzero(assign_result.gt_inds == 0, as_tuple=False).squeeze(-1).unique()
    gt_flags = bboxes.new_zeros(bboxes.shape[0], dtype=torch.uint8)
    result = SimpleNamespace(pos_inds=pos_inds, neg_inds=neg_inds)
    result.pos_bboxes = bboxes[pos_inds]
    result.neg_bboxes = bboxes[neg_inds]
    result.pos_is_gt = gt_flags[pos_inds]
    result.num_gts = gt_bboxes.shape[0]
    result.pos_assigned_gt_inds = assign_result.gt_inds[pos_inds] - 1
    if gt_bboxes.numel() == 0:
        result.pos_gt_bboxes = torch.empty_like(gt_bboxes).view(-1, 4)
    else:
        if len(gt_bboxes.shape) < 2:
            gt_bboxes = gt_bboxes.view(-1, 4)
        result.pos_gt_bboxes = gt_bboxes[result.pos_assigned_gt_inds.long(), :]
    result.pos_gt_labels = assign_result.labels[pos_inds] if assign_result.labels is not None else None
    return result


def assign_result(num_gts, gt_inds, max_overlaps, labels=None) -> SimpleNamespace:  # type: ignore[no-untyped-def]
    """mmdet ``AssignResult`` (a record)."""
    return SimpleNamespace(num_gts=num_gts, gt_inds=gt_inds, max_overlaps=max_overlaps, labels=labels)
