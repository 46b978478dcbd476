"""PointPillars' anchor-head loss (mmdetection3d ``Anchor3DHead``): focal classification, smooth-L1 box
regression with the sine difference on yaw, and a two-bin direction classifier.

Two implementations of one specification (see DESIGN.md, "The two paths"):

``reference``: as the original, op for op: targets per sample (``anchor_target_3d_single`` with mmdet's pseudo
    sampler: positives and negatives by ``nonzero``, deltas encoded for the positives only; for SSN per class, as
    its ``assign_per_class``), stacked over the batch, then ``Anchor3DHead``'s positives selected again by their
    label and the three losses computed on them (SSN: ``ShapeAwareHead``'s, on every anchor with weights).
``batched``: targets for every anchor of every sample at once by gathering the matched ground truth;
    non-positive anchors are switched off with masks (``torch.where``), never selected, so nothing reads a
    value on the host. The focal term is :func:`~drivetrain.losses.functional.sigmoid_focal_loss_sum` (the
    label's entry gathered instead of a one-hot target, the gradient in closed form) and the box and direction
    terms one autograd function (:class:`_BoxDirSum`): a few passes over ``(B, A, ·)`` where autograd through
    the elementwise formulas makes ~3× as many. Given the windowed assignment's pairs
    (:class:`~drivetrain.match.anchor_window.WindowPairs`, which hold every positive with its GT), the targets
    and the box and direction terms are computed on those pairs only (PointPillars: ~13 % of the ``B·A`` anchors
    at the tiny size, ~10 % at the full one; SSN ≤ 1.2 %): the same summands, summed in pair order instead of
    anchor order.

Inputs come from an anchor assigner: ``assigned`` is int64 per anchor, ``-1`` ignore, ``0`` negative and
``k ≥ 1`` positive, matched to ground truth ``k − 1``. Anchors and ground truths are gravity-centre boxes
``(x, y, z_c, dx, dy, dz, yaw[, vx, vy])`` (``D = 9``, nuScenes; ``D = 7``, Lyft).

Both return the same dict of **unweighted** terms (the weights a model passes are :attr:`AnchorHeadLoss.weights`,
applied by :meth:`AnchorHeadLoss.total`), each divided by ``N = Σ_b max(n_pos_b, 1) + ε`` (``ε`` the float32
epsilon that mmdet's ``weight_reduce_loss`` adds to every ``avg_factor``), counted on this rank only as in the
original (no averaging across ranks):

- ``loss_cls = Σ_{a, c} w_a · FL(s_ac, one_hot(label_a)) / N`` (``w_a`` = 0 for ignored anchors, else 1).
- ``loss_bbox = Σ_{a ∈ pos} Σ_k c_k · SmoothL1_β(p̃_ak − t̃_ak) / N``, slot 6 through the sine difference.
- ``loss_dir = Σ_{a ∈ pos} CE(d_a, bin_a) / N``.

With no positive in the whole batch the box and direction terms are exact zeros with zero gradients (the
original returns the sum of an empty selection). A sample without ground truth has only negatives, whatever
its assignment says, as in the original. The original computes these per feature level and sums the levels;
the nuScenes SECFPN head has one level, which is the case implemented here (the FPN variant would call this
once per level with that level's anchors).

``AnchorHeadLoss(..., compile=True)`` runs the batched loss through ``torch.compile`` with the ground-truth dim
dynamic (:mod:`drivetrain.compiled`); PointPillars' ``compile_loss`` compiles the batched max-IoU assignment and this
loss together, in one graph (neither has a host call, so there is no graph break).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from drivetrain.compiled import compile_options, compiled, ragged_dynamic
from drivetrain.constants import constant
from drivetrain.geometry.delta_coder import direction_target, encode_delta_xyzwlhr
from drivetrain.losses.functional import (
    class_mask,
    fp32,
    sigmoid_focal_loss,
    sigmoid_focal_loss_sum,
    sine_difference,
    smooth_l1_loss,
)
from drivetrain.losses.sampling import pseudo_sample
from drivetrain.losses.weights import weighted_total
from drivetrain.match.anchor_window import WindowPairs
from drivetrain.ragged import RaggedBatch

__all__ = [
    "AnchorHeadLoss",
    "batched_anchor_head_loss",
    "reference_anchor_head_loss",
]

TERMS = ("loss_cls", "loss_bbox", "loss_dir")
AVG_EPS = float(torch.finfo(torch.float32).eps)  # mmdet's weight_reduce_loss: loss.sum() / (avg_factor + eps)


def _check_code(code_weights: Sequence[float], dim: int) -> None:
    if dim not in (7, 9):
        raise ValueError(f"box code: last dim must be 7 or 9, got {dim}")
    if len(code_weights) != dim:
        raise ValueError(f"code_weights: {len(code_weights)} weights for a {dim}-dim box code")


# ---------------------------------------------------------------------------------------------- reference
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
    _check_code(code_weights, dim)
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


# ---------------------------------------------------------------------------------------------- batched
def _padded(rb: RaggedBatch, fill: float) -> torch.Tensor:
    """``rb``'s ``(B, G, ...)`` tensor with padding set to ``fill`` and at least one slot (G = 0 → 1), so
    that gathering index 0 is always legal; the shape is known on the host, so this never syncs."""
    tensor = rb.with_padding(fill).tensor  # (B, G, ...)
    if tensor.shape[1] == 0:
        tensor = torch.full((tensor.shape[0], 1, *tensor.shape[2:]), fill, dtype=tensor.dtype, device=tensor.device)
    return tensor  # (B, max(G, 1), ...)


@fp32
def batched_anchor_head_loss(
    pred_cls: torch.Tensor,
    pred_boxes: torch.Tensor,
    pred_dir: torch.Tensor,
    anchors: torch.Tensor,
    assigned: torch.Tensor,
    gt_boxes: RaggedBatch,
    gt_labels: RaggedBatch,
    *,
    code_weights: Sequence[float],
    dir_offset: float,
    alpha: float = 0.25,
    gamma: float = 2.0,
    beta: float = 1.0 / 9.0,
    dir_limit_offset: float = 0.0,
    num_dir_bins: int = 2,
    pairs: WindowPairs | None = None,
) -> dict[str, torch.Tensor]:
    """The loss for all samples at once, without a host sync: equal to :func:`reference_anchor_head_loss`.

    Args:
        pred_cls: ``(B, A, C)`` logits.
        pred_boxes: ``(B, A, D)`` predicted deltas.
        pred_dir: ``(B, A, num_dir_bins)`` direction logits.
        anchors: ``(A, D)`` shared by all samples.
        assigned: int64 ``(B, A)``: −1 ignore, 0 negative, ``k ≥ 1`` matched to GT ``k − 1``.
        gt_boxes: RaggedBatch ``(B, G, D)``.
        gt_labels: RaggedBatch of ints ``(B, G)`` in ``[0, C)``.
        code_weights: per-dim weights of the ``D``-dim code (a model's ``train_cfg.code_weight``).
        dir_offset: shift of the direction bin edges (a model's ``dir_offset``).
        alpha: focal loss positive weight (mmdet ``FocalLoss``'s 0.25).
        gamma: focal loss exponent (its 2).
        beta: smooth-L1 transition point (``Anchor3DHead``'s 1/9).
        dir_limit_offset: ``limit_period`` offset of the direction target.
        num_dir_bins: direction bins over the full circle.
        pairs: the windowed assignment's pairs of this ``assigned`` (every positive among them with its GT):
            the box and direction terms are then computed on the pairs, if they are fewer than the ``B·A``
            anchors (a shape, known on the host); None: on every anchor.

    Returns:
        ``{"loss_cls", "loss_bbox", "loss_dir"}``, each a ``()`` float32 tensor, unweighted.

    Example:
        >>> terms = batched_anchor_head_loss(
        ...     cls, box, dir, anchors, assigned, gt_boxes, gt_labels, code_weights=(1.0,) * 7, dir_offset=-0.7854
        ... )
    """
    batch, num_anchors, num_classes = pred_cls.shape
    dim = anchors.shape[-1]
    _check_code(code_weights, dim)
    has_gt = (gt_boxes.sizes > 0).unsqueeze(-1)  # (B, 1)
    positive = (assigned > 0) & has_gt  # (B, A)
    negative = (assigned == 0) | ~has_gt  # (B, A): a sample without GT has only negatives
    label_weights = (positive | negative).float()  # (B, A): 0 for ignored anchors
    gt_index = (assigned - 1).clamp(min=0)  # (B, A): ignored and negative anchors read slot 0, masked below
    gt_table = _padded(gt_boxes, 1.0).float()  # (B, G', D): padding 1 keeps the masked-out logs finite
    num_slots = gt_table.shape[1]
    row = (torch.arange(batch, device=assigned.device)[:, None] * num_slots + gt_index).flatten()  # (B·A,)
    label_table = _padded(gt_labels, num_classes).long()  # (B, G')
    labels = torch.where(positive, label_table.flatten().index_select(0, row).view_as(gt_index), num_classes)  # (B, A)
    num_pos = positive.sum(-1)  # (B,) on the device
    avg_factor = num_pos.clamp(min=1).sum().float() + AVG_EPS  # ()
    loss_cls = sigmoid_focal_loss_sum(pred_cls, labels, label_weights, alpha, gamma) / avg_factor  # ()

    if pairs is None or pairs.flat.shape[0] >= batch * num_anchors:  # every anchor: its matched GT (slot 0 for
        # non-positives, masked below); also when the windows overlap so much that they hold more pairs than anchors
        anchor_rows = anchors  # (A, D), broadcast over the batch
        matched = gt_table.flatten(0, 1).index_select(0, row).view(batch, num_anchors, dim)  # (B, A, D)
        box_pred, dir_pred = pred_boxes, pred_dir  # (B, A, D), (B, A, bins)
        # The original selects positives by label again; identical unless a GT label lies outside [0, C).
        box_mask = (labels >= 0) & (labels < num_classes)  # (B, A)
    else:  # the window pairs: every positive is the pair of its anchor and its own GT
        sample = pairs.flat // num_anchors  # (P,)
        pair_row = sample * num_slots + pairs.gt  # (P,)
        anchor_rows = anchors.index_select(0, pairs.flat % num_anchors)  # (P, D)
        matched = gt_table.flatten(0, 1).index_select(0, pair_row)  # (P, D)
        box_pred = pred_boxes.flatten(0, 1).index_select(0, pairs.flat)  # (P, D)
        dir_pred = pred_dir.flatten(0, 1).index_select(0, pairs.flat)  # (P, bins)
        owned = assigned.flatten().index_select(0, pairs.flat) == pairs.gt + 1  # (P,): the anchor's own GT
        pair_label = label_table.flatten().index_select(0, pair_row)  # (P,)
        box_mask = owned & (pair_label >= 0) & (pair_label < num_classes)  # (P,)
    with torch.no_grad():  # targets carry no gradient
        deltas = encode_delta_xyzwlhr(anchor_rows, matched)  # (B, A, D) or (P, D): finite everywhere (padding 1)
        yaw = deltas[..., 6] + anchor_rows[..., 6]  # (B, A) or (P,): the original's target yaw (delta + anchor)
        dir_targets = direction_target(yaw, dir_offset, dir_limit_offset, num_dir_bins)  # (B, A) or (P,)
    weights = constant(tuple(code_weights), dtype=torch.float32, device=pred_boxes.device)  # (D,)
    loss_bbox, loss_dir = _BoxDirSum.apply(box_pred, dir_pred, deltas, dir_targets, box_mask, weights, beta)
    return {"loss_cls": loss_cls, "loss_bbox": loss_bbox / avg_factor, "loss_dir": loss_dir / avg_factor}


class _BoxDirSum(torch.autograd.Function):
    """The masked sums of the box and direction terms over the ``(B, A)`` anchors (or ``(P,)`` window pairs) in a
    few passes, with the gradient in closed form (autograd through the same formulas makes ~3× the passes).

    Forward, per anchor where ``mask``: ``Σ_k c_k SmoothL1_β(d_k)`` with ``d = pred − target`` except
    ``d_6 = sin p_6 cos t_6 − cos p_6 sin t_6`` (:func:`~drivetrain.losses.functional.sine_difference` and
    :func:`~drivetrain.losses.functional.smooth_l1_loss` by the same float32 operations, so the summands agree
    with the reference bit for bit), and ``CE(l, bin) = m + log Σ_j exp(l_j − m) − l_bin`` with ``m = max_j l_j``
    (``F.cross_entropy``'s log-softmax in another order: a few ulps). Anchors outside ``mask`` are selected out
    (``torch.where``), so a non-finite prediction there cannot reach the sums, as in the original, which never
    reads them.

    Backward: ``∂/∂d = d/β`` below β, ``sign(d)`` above, times ``c_k``; slot 6 through ``∂d_6/∂p_6 = cos p cos t +
    sin p sin t``; ``∂CE/∂l = softmax(l) − onehot(bin)``; zero outside ``mask``.
    """

    @staticmethod
    def forward(ctx, pred, logits, target, bins, mask, weights, beta):  # type: ignore[no-untyped-def, override]
        sin_p, cos_p = pred[..., 6].sin(), pred[..., 6].cos()  # (B, A)
        sin_t, cos_t = target[..., 6].sin(), target[..., 6].cos()  # (B, A)
        diff = pred - target  # (B, A, D)
        diff[..., 6] = sin_p * cos_t - cos_p * sin_t  # (B, A): pred_sin − target_sin
        size = diff.abs()  # (B, A, D)
        small = size < beta  # (B, A, D)
        per_entry = torch.where(small, 0.5 * size * size / beta, size - 0.5 * beta).mul_(weights)  # (B, A, D)
        loss_bbox = torch.where(mask, per_entry.sum(-1), 0.0).sum()  # ()
        top = logits.amax(-1, keepdim=True)  # (B, A, 1)
        exp = (logits - top).exp_()  # (B, A, bins)
        total = exp.sum(-1, keepdim=True)  # (B, A, 1)
        ce = (top + total.log()).squeeze(-1) - logits.gather(-1, bins.unsqueeze(-1)).squeeze(-1)  # (B, A)
        loss_dir = torch.where(mask, ce, 0.0).sum()  # ()
        ctx.save_for_backward(diff, small, sin_p, cos_p, sin_t, cos_t, exp.div_(total), bins, mask, weights)
        ctx.beta = beta
        return loss_bbox, loss_dir

    @staticmethod
    def backward(ctx, grad_bbox, grad_dir):  # type: ignore[no-untyped-def, override]
        diff, small, sin_p, cos_p, sin_t, cos_t, softmax, bins, mask, weights = ctx.saved_tensors
        grad_pred = torch.where(small, diff / ctx.beta, diff.sign()).mul_(weights)  # (B, A, D)
        grad_pred[..., 6] *= cos_p * cos_t + sin_p * sin_t  # (B, A)
        grad_pred = torch.where(mask.unsqueeze(-1), grad_pred * grad_bbox, 0.0)  # (B, A, D)
        one = torch.full_like(softmax[..., :1], -1.0)  # (B, A, 1)
        grad_logits = softmax.scatter_add(-1, bins.unsqueeze(-1), one)  # (B, A, bins): softmax − onehot
        grad_logits = torch.where(mask.unsqueeze(-1), grad_logits * grad_dir, 0.0)  # (B, A, bins)
        return grad_pred, grad_logits, None, None, None, None, None


# ---------------------------------------------------------------------------------------------- criterion
class AnchorHeadLoss(torch.nn.Module):
    """Loss of mmdetection3d's ``Anchor3DHead`` (PointPillars, SSN); a model passes its recipe's constants
    (:mod:`drivetrain.models.pointpillars.recipe`), the defaults left are ``Anchor3DHead``'s own.

    Args:
        num_classes: ``C``; label ``C`` is background.
        code_weights: per-dim weights of the box code (its length is ``D``, 7 or 9).
        dir_offset: shift of the direction bin edges.
        weights: the term weights, ``{"loss_cls", "loss_bbox", "loss_dir"}``: exactly these three.
        alpha, gamma: sigmoid focal loss parameters (0.25, 2).
        beta: smooth-L1 transition point (1/9).
        dir_limit_offset, num_dir_bins: direction target (0, 2).
        compile: run the batched path through ``torch.compile``: True (its defaults) or a mapping of its keyword
            arguments; kept in :attr:`compile_options` (None: eager).
    """

    def __init__(
        self,
        num_classes: int,
        *,
        code_weights: Sequence[float],
        dir_offset: float,
        weights: Mapping[str, float],
        alpha: float = 0.25,
        gamma: float = 2.0,
        beta: float = 1.0 / 9.0,
        dir_limit_offset: float = 0.0,
        num_dir_bins: int = 2,
        compile: bool | Mapping[str, Any] = False,
    ) -> None:
        super().__init__()
        _check_code(code_weights, len(code_weights))
        self.compile_options = compile_options(compile)
        if beta <= 0:
            raise ValueError(f"beta: must be > 0 (mmdet's SmoothL1Loss asserts it), got {beta}")
        if set(weights) != set(TERMS):
            raise ValueError(f"weights: expected the terms {TERMS}, got {tuple(weights)}")
        self.num_classes = num_classes
        self.weights = {name: float(weights[name]) for name in TERMS}
        self.options = {
            "code_weights": tuple(float(w) for w in code_weights),
            "alpha": alpha,
            "gamma": gamma,
            "beta": beta,
            "dir_offset": dir_offset,
            "dir_limit_offset": dir_limit_offset,
            "num_dir_bins": num_dir_bins,
        }

    def total(self, terms: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The training objective: the weighted sum of the terms (:func:`~drivetrain.losses.weights.weighted_total`)."""
        return weighted_total(terms, self.weights)

    def forward(
        self,
        pred_cls: torch.Tensor,
        pred_boxes: torch.Tensor,
        pred_dir: torch.Tensor,
        anchors: torch.Tensor,
        assigned: torch.Tensor,
        gt_boxes: RaggedBatch,
        gt_labels: RaggedBatch,
        impl: str = "batched",
        anchor_classes: torch.Tensor | None = None,
        pairs: WindowPairs | None = None,
    ) -> dict[str, torch.Tensor]:
        """The unweighted terms of one batch; shapes as :func:`batched_anchor_head_loss`.

        ``impl="reference"`` splits the batch into samples and runs :func:`reference_anchor_head_loss`, as
        ``ShapeAwareHead`` (per class) when ``anchor_classes`` (int64 ``(A,)``, SSN's contiguous class blocks) is
        given; the batched path gives the same terms either way and does not read it. ``pairs`` (the windowed
        assignment's, batched path only) restricts the box and direction terms to the window pairs.
        """
        batch, num_anchors, num_classes = pred_cls.shape
        dim = anchors.shape[-1]
        expected = {
            "pred_boxes": (batch, num_anchors, dim),
            "pred_dir": (batch, num_anchors, self.options["num_dir_bins"]),
            "anchors": (num_anchors, dim),
            "assigned": (batch, num_anchors),
        }
        for name, tensor in zip(expected, (pred_boxes, pred_dir, anchors, assigned), strict=True):
            if tuple(tensor.shape) != expected[name]:
                raise ValueError(f"{name}: expected shape {expected[name]}, got {tuple(tensor.shape)}")
        if num_classes != self.num_classes:
            raise ValueError(f"pred_cls: {num_classes} classes, the loss was built for {self.num_classes}")
        if impl == "batched":
            if self.compile_options is not None:  # the dense form: one graph whatever the pair count
                gt_boxes, gt_labels = ragged_dynamic(gt_boxes), ragged_dynamic(gt_labels)  # G
                loss = compiled(batched_anchor_head_loss, self.compile_options)
                return loss(pred_cls, pred_boxes, pred_dir, anchors, assigned, gt_boxes, gt_labels, **self.options)
            return batched_anchor_head_loss(
                pred_cls, pred_boxes, pred_dir, anchors, assigned, gt_boxes, gt_labels, **self.options, pairs=pairs
            )
        if impl == "reference":
            return reference_anchor_head_loss(
                list(pred_cls.unbind(0)),
                list(pred_boxes.unbind(0)),
                list(pred_dir.unbind(0)),
                anchors,
                list(assigned.unbind(0)),
                gt_boxes.to_list(),
                gt_labels.to_list(),
                **self.options,
                anchor_classes=anchor_classes,
            )
        raise ValueError(f"impl: expected 'batched' or 'reference', got {impl!r}")
