"""Ports of the original implementations' op sequences, for counting their kernels beside our reference paths.

Each ``reference`` path mirrors the original code (docs/design.md, "Two paths"), so that "reference → batched" is a
ratio over the original. To check that it also *costs* what the original costs, this module ports the original's
operations, call by call, onto our tensors, and counts them with the same counter as the reference and batched
paths (:mod:`drivetrain.profile.costmodel`): the kernels and host syncs of one call. The ports are for counting
only; each computes real values, and :mod:`tests.test_reference_costs` checks them against our reference, so that
every data-dependent branch (matches, positives, boxes kept by NMS) takes the same turn in both.

The originals, at the versions StreamPETR and mmdetection3d v1.0 pin (mmdet 2.28.2, mmcv-full 1.6.0):

- StreamPETR (exiawsh/StreamPETR): ``projects/mmdet3d_plugin/models/dense_heads/streampetr_head.py``
  (``StreamPETRHead.loss``, ``loss_single``, ``get_targets``, ``_get_target_single``, ``prepare_for_loss``,
  ``dn_loss_single``), ``.../dense_heads/focal_head.py`` (``FocalHead.loss``, ``loss_single``,
  ``_get_target_single``, ``_get_heatmap_single``), ``.../core/bbox/assigners/hungarian_assigner_{2d,3d}.py``,
  ``.../core/bbox/match_costs/match_cost.py`` (``BBox3DL1Cost``), ``.../core/bbox/util.py`` (``normalize_bbox``),
  ``.../models/utils/misc.py`` (``draw_heatmap_gaussian``, ``gaussian_2d``);
- mmdet 2.28.2: ``mmdet/core/bbox/match_costs/match_cost.py`` (``FocalLossCost``, ``BBoxL1Cost``, ``IoUCost``),
  ``mmdet/core/bbox/iou_calculators/iou2d_calculator.py`` (``bbox_overlaps``), ``mmdet/core/bbox/transforms.py``,
  ``mmdet/core/bbox/samplers/{pseudo_sampler,sampling_result}.py``, ``mmdet/core/bbox/assigners/
  max_iou_assigner.py`` (``MaxIoUAssigner.assign``, ``assign_wrt_overlaps``), ``mmdet/models/losses/``
  (``focal_loss.py``, ``gfocal_loss.py``, ``gaussian_focal_loss.py``, ``smooth_l1_loss.py``, ``iou_loss.py``,
  ``cross_entropy_loss.py``, ``utils.py``), ``mmdet/core/utils/dist_utils.py`` (``reduce_mean``);
- mmdetection3d v1.0.0rc6: ``mmdet3d/models/dense_heads/{anchor3d_head,train_mixins,shape_aware_head}.py``,
  ``mmdet3d/core/bbox/iou_calculators/iou3d_calculator.py`` (``bbox_overlaps_nearest_3d``),
  ``mmdet3d/core/bbox/structures/{base_box3d,utils}.py``, ``mmdet3d/core/bbox/coders/
  delta_xyzwhlr_bbox_coder.py``, ``mmdet3d/core/post_processing/box3d_nms.py``
  (``box3d_multiclass_nms``, ``nms_bev``), ``mmdet3d/models/utils/clip_sigmoid.py``;
- mmcv 1.6.0: ``mmcv/ops/focal_loss.py`` (``SigmoidFocalLossFunction``), ``mmcv/ops/nms.py`` (``nms_rotated``)
  with ``mmcv/ops/csrc/pytorch/cuda/nms_rotated_cuda.cu``.

**What runs as on a GPU.** The counts model the GPU run, as the cost model does: mmdet's ``FocalLoss`` takes the
mmcv CUDA op ``sigmoid_focal_loss`` when the logits are on a GPU (the CPU branch, ``py_sigmoid_focal_loss``, is
"only for debugging"), so the ports run it; mmcv's C++ kernels (``sigmoid_focal_loss_forward``/``_backward``, the
``nms_rotated`` kernel) are one custom operator each (:data:`LIBRARY`), which the counter sees as one kernel, with
the ATen ops the C++ wrapper around them dispatches (``nms_rotated_cuda``: the mask copied to the host, the kept
indices copied back, one ``index``). ``Tensor.new_tensor`` of Python numbers dispatches nothing the counter sees
(on a GPU it is a small blocking copy), in the ports as in our code.

**Inputs.** Each port takes the original's inputs, made from ours by a ``*_inputs`` function outside the counted
call, as the original's data pipeline and forward pass hand them to its loss: per-image lists of ground truth,
bottom-centre 3D boxes (StreamPETR's loss lifts them to gravity centres itself), the denoising targets its
``prepare_for_dn`` builds in the forward pass, the anchors ``get_anchors`` makes. Layout copies the original makes
in its head's forward or loss (``permute(0, 2, 3, 1).reshape``) are views here: our heads emit that layout.

One module for all of them (over the ~600 lines a module should stay under): every port sits beside the helpers it
shares (the mmdet losses, the sampler, the box structures), and one file names every original it mirrors.
Run ``drivetrain bench originals`` for the table of docs/benchmarks.md ("Do the reference paths cost what the
originals cost?").
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from drivetrain.geometry.rotated_iou import rotated_bev_iou_pairwise
from drivetrain.profile.costmodel import Cost, CostCounter, count_call, current
from drivetrain.safeio.files import replace_text

LIBRARY = "drivetrain_originals"  # the torch.library namespace of the ports' custom operators (mmcv's C++ kernels)
FLT_MIN = float(torch.finfo(torch.float32).tiny)
EPS32 = float(torch.finfo(torch.float32).eps)


# ============================================================================ mmcv's C++ kernels: one op each
def _custom_op(name: str, mutates_args: tuple[str, ...]) -> Callable[[Callable], Any]:
    """``torch.library.custom_op`` in :data:`LIBRARY`, or the operator an earlier load of this script defined."""

    def define(fn: Callable) -> Any:
        existing = getattr(getattr(torch.ops, LIBRARY), name, None)
        if existing is not None:
            return existing
        return torch.library.custom_op(f"{LIBRARY}::{name}", mutates_args=mutates_args)(fn)

    return define


@_custom_op("sigmoid_focal_loss_forward", mutates_args=("output",))
def _sigmoid_focal_loss_forward(
    input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor, output: torch.Tensor, gamma: float, alpha: float
) -> None:
    """mmcv ``sigmoid_focal_loss_forward_cuda_kernel``: the per-element focal loss of class ``c`` against label
    ``target`` (``c == target``: positive), written into ``output`` (``weight`` empty: no class weights)."""
    p = input.sigmoid()  # (N, C)
    positive = target.unsqueeze(1) == torch.arange(input.shape[1], device=input.device)  # (N, C)
    pos = -alpha * (1 - p).pow(gamma) * p.clamp(min=FLT_MIN).log()  # (N, C)
    neg = -(1 - alpha) * p.pow(gamma) * (1 - p).clamp(min=FLT_MIN).log()  # (N, C)
    output.copy_(torch.where(positive, pos, neg))


@_custom_op("sigmoid_focal_loss_backward", mutates_args=("grad_input",))
def _sigmoid_focal_loss_backward(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor,
    grad_input: torch.Tensor,
    gamma: float,
    alpha: float,
) -> None:
    """mmcv ``sigmoid_focal_loss_backward_cuda_kernel``: d(loss)/d(input) per element, into ``grad_input``."""
    p = input.sigmoid()  # (N, C)
    positive = target.unsqueeze(1) == torch.arange(input.shape[1], device=input.device)  # (N, C)
    pos = -alpha * (1 - p).pow(gamma) * (1 - p - gamma * p * p.clamp(min=FLT_MIN).log())  # (N, C)
    neg = -(1 - alpha) * p.pow(gamma) * (gamma * (1 - p) * (1 - p).clamp(min=FLT_MIN).log() - p)  # (N, C)
    grad_input.copy_(torch.where(positive, pos, neg))


@_custom_op("nms_rotated_kernel", mutates_args=())
def _nms_rotated_kernel(dets_sorted: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """mmcv ``nms_rotated_cuda_kernel``: bit mask of which score-sorted box suppresses which (IoU > threshold),
    here as a bool ``(N, N)`` matrix."""
    return rotated_bev_iou_pairwise(dets_sorted, dets_sorted) > iou_threshold  # (N, N)


class SigmoidFocalLossFunction(torch.autograd.Function):
    """mmcv 1.6.0 ``mmcv/ops/focal_loss.py``: ``SigmoidFocalLossFunction`` (forward and backward, as on CUDA)."""

    @staticmethod
    def forward(ctx, input, target, gamma=2.0, alpha=0.25, weight=None, reduction="mean"):  # type: ignore[no-untyped-def, override]
        weight = input.new_empty(0) if weight is None else weight
        ctx.reduction_dict = {"none": 0, "mean": 1, "sum": 2}
        ctx.gamma, ctx.alpha, ctx.reduction = float(gamma), float(alpha), ctx.reduction_dict[reduction]
        output = input.new_zeros(input.size())
        _sigmoid_focal_loss_forward(input, target, weight, output, ctx.gamma, ctx.alpha)
        if ctx.reduction == ctx.reduction_dict["mean"]:
            output = output.sum() / input.size(0)
        elif ctx.reduction == ctx.reduction_dict["sum"]:
            output = output.sum()
        ctx.save_for_backward(input, target, weight)
        return output

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[no-untyped-def, override]
        input, target, weight = ctx.saved_tensors
        grad_input = input.new_zeros(input.size())
        _sigmoid_focal_loss_backward(input, target, weight, grad_input, ctx.gamma, ctx.alpha)
        grad_input *= grad_output
        if ctx.reduction == ctx.reduction_dict["mean"]:
            grad_input /= input.size(0)
        return grad_input, None, None, None, None, None


def nms_rotated(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> tuple[torch.Tensor, Any]:
    """mmcv 1.6.0 ``mmcv/ops/nms.py``: ``nms_rotated`` (``clockwise=True``, no labels), with the C++ wrapper
    ``nms_rotated_cuda`` (``nms_rotated_cuda.cu``): the kernel, its mask to the host, the greedy pass there, the
    kept indices back to the device, ``order_t.index(keep)``."""
    if dets.shape[0] == 0:
        return dets, None
    _, order = scores.sort(0, descending=True)
    dets_sorted = dets.index_select(0, order)
    mask = _nms_rotated_kernel(dets_sorted, iou_threshold)  # the kernel
    mask_host = mask.cpu()  # Tensor mask_cpu = mask.to(at::kCPU)
    removed = np.zeros(dets.shape[0], dtype=bool)
    keep = []
    for i in range(dets.shape[0]):  # the host loop over the mask
        if not removed[i]:
            keep.append(i)
            removed |= mask_host[i].numpy()
    keep_inds = order[torch.tensor(keep, dtype=torch.long).to(order.device)]  # order_t.index({keep.to(device)})
    dets = torch.cat((dets[keep_inds], scores[keep_inds].reshape(-1, 1)), dim=1)
    return dets, keep_inds


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


# ============================================================================ counting: references beside originals
class PathCost(NamedTuple):
    """Kernels and host syncs of one reference path, its original's port and the batched path, in one call each.

    Attributes:
        name: the path.
        inputs: what it ran on.
        reference: the reference path's cost.
        original: the port's.
        batched: the batched path's (None where there is none to compare).
        loops: the loop counts the two counts' relation depends on (``tests/test_reference_costs.py``).
    """

    name: str
    inputs: str
    reference: Cost
    original: Cost
    batched: Cost | None
    loops: dict[str, int]

    @property
    def ratio(self) -> float:
        """Reference kernels over the original's."""
        return self.reference.kernels / max(self.original.kernels, 1)


def _count(fn: Callable[[], Any]) -> Cost:
    """``fn``'s cost after one call that warms the caches the counter would see once (cached constants)."""
    fn()
    return count_call(fn)


def _count_region(fn: Callable[[], Any], region: str) -> tuple[Cost, Cost]:
    """``fn``'s cost, and that of its region ``region`` (after one warm-up call)."""
    fn()
    counter = CostCounter()
    with counter.counting():
        fn()
    whole, part = counter.cost(), counter.cost(region)
    assert whole is not None
    return whole, part or Cost(0, 0)


def _bench_module(name: str) -> Any:
    """A sibling benchmark script as a module (for its input builders)."""
    path = Path(__file__).parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"drivetrain_bench_originals_{name}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def camera_cases(batch: int = 8, layers: int = 6, queries: int = 900, min_gt: int = 20, max_gt: int = 60,
                 dn_groups: int = 10, seed: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """``bench loss``'s inputs (its defaults: B 8, L 6, Q 900, 20–60 ground truths, 10 denoising groups; the focal
    head over 6 cameras × 16×44 tokens with 0–20 ground truths per image), by its own builders."""
    loss_bench = _bench_module("loss")
    args = argparse.Namespace(
        batch=batch, layers=layers, queries=queries, min_gt=min_gt, max_gt=max_gt, dn_groups=dn_groups
    )
    gen = torch.Generator().manual_seed(seed)
    device = torch.device("cpu")
    return loss_bench.streampetr_inputs(args, gen, device), loss_bench.focal_head_inputs(args, gen, device)


def _leaves(outputs: dict[str, Any]) -> dict[str, Any]:
    """Fresh leaf copies of the floating outputs that require grad (as the loss benchmark runs them)."""
    return {
        k: v.detach().clone().requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in outputs.items()
    }


def count_streampetr(data: dict[str, Any]) -> PathCost:
    """StreamPETR's 3D loss (main head and denoising): our reference and batched paths, the original's port."""
    from drivetrain.models.streampetr.loss import streampetr_loss

    loss = streampetr_loss(backend="scipy")
    outputs, targets = data["outputs"], data["targets"]
    leaves = _leaves(outputs)  # made before counting, as the port's inputs are
    inputs = streampetr_inputs(leaves, targets, loss.code_weights, loss.dn_split)
    layers, batch = outputs["cls_logits"].shape[:2]
    num_gt = targets["gt_boxes"].sizes.tolist()
    return PathCost(
        "StreamPETR loss (3D head + denoising), forward",
        f"B {batch}, L {layers}, Q {outputs['cls_logits'].shape[2]}, ground truths {num_gt}, "
        f"{outputs.get('dn_groups', 0)} denoising groups",
        _count(lambda: loss.reference(leaves, targets)),
        _count(lambda: original_streampetr_loss(inputs)),
        _count(lambda: loss(leaves, targets)),
        {
            "layers": layers,
            "samples": batch,
            "samples_with_gt": sum(n > 0 for n in num_gt),
            "samples_without_gt": sum(n == 0 for n in num_gt),
            "denoising": int("dn_cls_logits" in outputs),
        },
    )


def count_focal_head(data: dict[str, Any]) -> PathCost:
    """StreamPETR's 2D focal head loss: our reference and batched paths, the original's port."""
    from drivetrain.losses.focal_head import focal_head_loss

    loss = focal_head_loss(backend="scipy")
    outputs, targets = data["outputs"], data["targets"]
    leaves = _leaves(outputs)  # made before counting, as the port's inputs are
    inputs = focal_head_inputs(leaves, targets)
    sizes = targets["gt_boxes_2d"].sizes.flatten().tolist()
    batch, cams, num_tokens = outputs["cls_logits"].shape[:3]
    return PathCost(
        "focal head loss (2D), forward",
        f"{batch * cams} images of {num_tokens} tokens, {sum(sizes)} ground truths ({min(sizes)}–{max(sizes)} each)",
        _count(lambda: loss.reference(leaves, targets)),
        _count(lambda: original_focal_head_loss(inputs)),
        _count(lambda: loss(leaves, targets)),
        {"images": len(sizes), "images_with_gt": sum(n > 0 for n in sizes), "boxes": sum(sizes),
         "positives": sum(min(n, num_tokens) for n in sizes)},
    )  # fmt: skip


def _original_heatmaps(cells: list[torch.Tensor], radii: list[torch.Tensor], shape: tuple[int, int]) -> torch.Tensor:
    """The drawing part of StreamPETR's ``_get_heatmap_single`` per image (a zero map, the radii read on the host,
    ``draw_heatmap_gaussian`` per box at its cell), stacked as ``FocalHead.loss_single`` stacks them."""
    maps = []
    for image_cells, image_radii in zip(cells, radii, strict=True):
        heatmap = torch.zeros(shape, device=image_cells.device)
        if len(image_cells) != 0:
            for center, r in zip(image_cells, image_radii.cpu().numpy().tolist(), strict=True):
                heatmap = draw_heatmap_gaussian(heatmap, center, radius=int(r), k=1)
        maps.append(heatmap)
    return torch.stack(maps, dim=0)


def count_heatmap(data: dict[str, Any]) -> PathCost:
    """``bench loss``'s heatmap-drawing row: every box of every image drawn, per-box loop vs one scatter."""
    from drivetrain.geometry.heatmap import draw_gaussians, focal_head_radius, reference_draw_gaussians

    targets = data["targets"]
    centres, boxes = targets["centers_2d"], targets["gt_boxes_2d"]
    batch, cams = centres.batch_shape
    hf, wf = data["outputs"]["centerness"].shape[-2:]
    cells = centres.apply(lambda t: (t / 16).long())
    radii = centres.with_tensor(focal_head_radius(centres.tensor, boxes.tensor, 16))
    heat = torch.zeros(batch, cams, hf, wf)
    cell_list = [c for row in cells.to_list() for c in row]
    radius_list = [r for row in radii.to_list() for r in row]
    sizes = centres.sizes.flatten().tolist()
    return PathCost(
        "heatmap drawing",
        f"{batch * cams} images {hf}×{wf}, {sum(sizes)} boxes",
        _count(lambda: reference_draw_gaussians(heat.view(-1, hf, wf), cell_list, radius_list)),
        _count(lambda: _original_heatmaps(cell_list, radius_list, (hf, wf))),
        _count(lambda: draw_gaussians(heat, cells, radii)),
        {"images": len(sizes), "images_with_gt": sum(n > 0 for n in sizes), "boxes": sum(sizes)},
    )


def lidar_case(model_name: str, batch: int = 4, min_gt: int = 21, max_gt: int = 40, seed: int = 0,
               feature_size: tuple[int, int] = (64, 64)) -> dict[str, Any]:  # fmt: skip
    """A PointPillars / SSN model from ``configs/<model>_tiny.yaml`` (``bench iteration``'s default), its anchors on
    the tiny grid's neck map, random head outputs, and per sample ``min_gt``–``max_gt`` ground truths made from
    random anchors (jittered centre, size and yaw; SSN: labelled with their anchor's class), so that the assigner
    finds positives, low-quality matches and ignored anchors as on real data."""
    from drivetrain.engine import load_config
    from drivetrain.engine.build import build_model
    from drivetrain.ragged import RaggedBatch

    config = Path(__file__).resolve().parents[1] / "configs" / f"{model_name}_tiny.yaml"
    torch.manual_seed(seed)
    model = build_model(load_config(config, []).model).train()
    model.set_path(impl="reference")
    gen = torch.Generator().manual_seed(seed)
    anchors, classes, _ = model.anchor_set(feature_size, torch.device("cpu"))
    num_anchors, dim = anchors.shape
    boxes, labels = [], []
    for n in torch.randint(min_gt, max_gt + 1, (batch,), generator=gen).tolist():
        index = torch.randint(0, num_anchors, (n,), generator=gen)
        box = anchors[index].clone()
        box[:, :2] += torch.randn(n, 2, generator=gen) * 0.4
        box[:, 3:6] *= torch.rand(n, 3, generator=gen) * 0.4 + 0.8
        box[:, 6] += torch.randn(n, generator=gen) * 0.3
        boxes.append(box)
        labels.append(
            classes[index] if classes is not None else torch.randint(0, model.num_classes, (n,), generator=gen)
        )
    outputs = {
        "cls_logits": torch.randn(batch, num_anchors, model.num_classes, generator=gen) - 4.0,  # ~14 % over 0.05
        "box_preds": torch.randn(batch, num_anchors, dim, generator=gen) * 0.1,
        "dir_logits": torch.randn(batch, num_anchors, 2, generator=gen),
        "anchors": anchors,
        "feature_size": feature_size,
    }
    gt_boxes, gt_labels = RaggedBatch.from_list(boxes), RaggedBatch.from_list(labels)
    return {"model": model, "outputs": outputs, "gt_boxes": gt_boxes, "gt_labels": gt_labels, "classes": classes}


def count_anchor_head(case: dict[str, Any]) -> tuple[PathCost, PathCost]:
    """PointPillars / SSN: the max-IoU assignment and the targets + loss (the two regions of the model's loss):
    our reference and batched paths, and the original's ``Anchor3DHead.loss`` / ``ShapeAwareHead.loss`` (whose
    assigner calls are its ``assignment`` region)."""
    from drivetrain.models.pointpillars.paths import BatchedPath, ReferencePath

    model, outputs, gt_boxes, gt_labels = case["model"], case["outputs"], case["gt_boxes"], case["gt_labels"]
    name = "SSN" if case["classes"] is not None else "PointPillars"

    def assign(impl: str) -> torch.Tensor:
        model.set_path(impl=impl)
        return model.assign(outputs["feature_size"], gt_boxes, gt_labels)

    paths = {"reference": ReferencePath(), "batched": BatchedPath()}

    def targets_loss(impl: str, assigned: torch.Tensor, pairs: Any = None) -> dict[str, torch.Tensor]:
        return paths[impl].terms(model, outputs, assigned, pairs, gt_boxes, gt_labels)

    assigned = assign("reference")  # the model is left on its reference path (as lidar_case builds it)
    inputs = anchor_head_inputs(model, outputs, gt_boxes, gt_labels)
    whole, part = _count_region(lambda: original_anchor_head_loss(inputs), "assignment")
    sizes = gt_boxes.sizes.tolist()
    described = f"{outputs['anchors'].shape[0]} anchors, B {len(sizes)}, ground truths {sizes}"
    positive = assigned > 0  # (B, A)
    loops = {
        "samples": len(sizes),
        "samples_with_gt": sum(n > 0 for n in sizes),
        "samples_with_positives": int(positive.any(1).sum()),
        "any_positive": int(positive.any()),
        "boxes": sum(sizes),
    }
    if case["classes"] is not None:  # (sample, class) pairs with ground truth, and with positive anchors
        loops["class_samples_with_gt"] = sum(len(set(t.tolist())) for t in gt_labels.to_list())
        blocks = torch.bincount(case["classes"], minlength=model.num_classes).tolist()
        loops["class_samples_with_positives"] = sum(int(block.any(1).sum()) for block in positive.split(blocks, dim=1))
    batched_assignment = _count(lambda: assign("batched"))
    _, pairs = model.path.assign(model, outputs["feature_size"], gt_boxes, gt_labels)  # as the model's loss runs it
    model.set_path(impl="reference")
    return (
        PathCost(f"{name} max-IoU assignment", described, _count(lambda: assign("reference")), part,
                 batched_assignment, loops),
        PathCost(f"{name} anchor-head targets + loss, forward", described,
                 _count(lambda: targets_loss("reference", assigned)), Cost(whole.kernels - part.kernels,
                 whole.syncs - part.syncs), _count(lambda: targets_loss("batched", assigned, pairs)), loops),
    )  # fmt: skip


def decode_case(case: dict[str, Any]) -> dict[str, Any]:
    """The decoding inputs of a :func:`lidar_case`: its head outputs, anchors and the model's test settings."""
    return {**{k: case["outputs"][k] for k in ("cls_logits", "box_preds", "dir_logits", "anchors")},
            "cfg": case["model"].decode_config}  # fmt: skip


def count_decode(data: dict[str, Any]) -> tuple[PathCost, PathCost]:
    """The multi-class rotated NMS alone (on the decoded top-``nms_pre`` boxes) and the whole decoding: our
    reference and batched paths, the original's ``box3d_multiclass_nms`` and ``get_bboxes``."""
    from drivetrain.geometry.delta_coder import decode_delta_xyzwlhr
    from drivetrain.geometry.rotated_nms import multiclass_rotated_nms, reference_multiclass_rotated_nms
    from drivetrain.models.pointpillars.postprocess import decode, reference_decode

    cfg, head = data["cfg"], (data["cls_logits"], data["box_preds"], data["dir_logits"], data["anchors"])
    scores = data["cls_logits"].sigmoid()  # (B, A, C)
    _, top = scores.max(dim=2)[0].topk(min(cfg.nms_pre, scores.shape[1]), dim=1)  # (B, N)
    boxes = decode_delta_xyzwlhr(data["anchors"][top], data["box_preds"].gather(1, top[..., None].expand(-1, -1, 9)))
    scores = scores.gather(1, top[..., None].expand(-1, -1, scores.shape[-1]))  # (B, N, C)
    valid = torch.ones(boxes.shape[:2], dtype=torch.bool)
    nms = (boxes, scores, valid, cfg.score_threshold, cfg.nms_threshold, cfg.max_num)
    candidates = (scores > cfg.score_threshold).sum(1)  # (B, C) candidates of each NMS call
    calls = int((candidates > 0).sum())
    loops = {
        "samples": boxes.shape[0],
        "samples_with_calls": int((candidates > 0).any(1).sum()),
        "nms_calls": calls,
        "most_candidates": int(candidates.max()),
    }
    described = f"B {boxes.shape[0]}, {data['anchors'].shape[0]} anchors, top {boxes.shape[1]}, {calls} NMS calls"
    nms_inputs_ = nms_inputs(boxes, scores, cfg)
    decode_inputs_ = decode_inputs(*head, cfg)
    return (
        PathCost("rotated multi-class NMS", described, _count(lambda: reference_multiclass_rotated_nms(*nms)),
                 _count(lambda: original_multiclass_nms(nms_inputs_)), _count(lambda: multiclass_rotated_nms(*nms)),
                 loops),
        PathCost("PointPillars decoding (top-k, NMS, yaw)", described, _count(lambda: reference_decode(*head, cfg)),
                 _count(lambda: original_decode(decode_inputs_)), _count(lambda: decode(*head, cfg, compact=True)),
                 loops),
    )  # fmt: skip


def count_all(seed: int = 0) -> list[PathCost]:
    """Every reference path beside its original, at the benchmarks' default inputs (as docs/benchmarks.md)."""
    streampetr, focal_head = camera_cases(seed=seed)
    rows = [count_streampetr(streampetr), count_focal_head(focal_head), count_heatmap(focal_head)]
    for model_name in ("pointpillars", "ssn"):
        case = lidar_case(model_name, seed=seed)
        rows += count_anchor_head(case)
        if model_name == "pointpillars":
            rows += count_decode(decode_case(case))
    return rows


def _table(rows: list[PathCost]) -> str:
    lines = [
        "| reference path | inputs | kernels ref / original (ratio) | syncs ref / original | kernels batched |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        batched = "–" if r.batched is None else f"{r.batched.kernels:,.0f}"
        lines.append(
            f"| {r.name} | {r.inputs} | {r.reference.kernels:,.0f} / {r.original.kernels:,.0f} (×{r.ratio:.2f}) | "
            f"{r.reference.syncs:,.0f} / {r.original.syncs:,.0f} | {batched} |"
        )
    return "\n".join(lines)


def _row_json(row: PathCost) -> dict[str, Any]:
    batched = None if row.batched is None else row.batched.as_dict()
    return {"name": row.name, "inputs": row.inputs, "reference": row.reference.as_dict(),
            "original": row.original.as_dict(), "batched": batched, "loops": row.loops}  # fmt: skip


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``drivetrain bench originals``: the kernels of each reference path beside its original's (no timing)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    parser.add_argument("--json", type=Path, default=None, help="write the counts as JSON here")
    args = parser.parse_args(argv)
    rows = count_all(args.seed)
    print(_table(rows))
    print(f"\n*Counted on the CPU as a GPU runs them (drivetrain.profile.costmodel), one call each; torch "
          f"{torch.__version__}.*")  # fmt: skip
    if args.json is not None:
        data = {
            "benchmark": "originals",
            "torch": torch.__version__,
            "seed": args.seed,
            "rows": [_row_json(r) for r in rows],
        }
        replace_text(args.json, json.dumps(data, indent=1))  # a link at the name is replaced, never written through
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
