"""The anchor-head loss's batched path (:mod:`.loss`): every sample at once, no host sync, equal to
:func:`~.loss_reference.reference_anchor_head_loss`.

Targets for every anchor of every sample at once by gathering the matched ground truth; non-positive anchors are
switched off with masks (``torch.where``), never selected, so nothing reads a value on the host. The focal term is
:func:`~drivetrain.losses.functional.sigmoid_focal_loss_sum` (the label's entry gathered instead of a one-hot
target, the gradient in closed form) and the box and direction terms one autograd function (:class:`_BoxDirSum`):
a few passes over ``(B, A, ·)`` where autograd through the elementwise formulas makes ~3× as many. Given the
windowed assignment's pairs (:class:`~drivetrain.match.anchor_window.WindowPairs`), the targets and the box and
direction terms are computed on those pairs only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from drivetrain.constants import constant
from drivetrain.geometry.delta_coder import direction_target, encode_delta_xyzwlhr
from drivetrain.losses.functional import fp32, sigmoid_focal_loss_sum
from drivetrain.match.anchor_window import WindowPairs
from drivetrain.models.pointpillars.loss_reference import AVG_EPS, check_code
from drivetrain.ragged import RaggedBatch

__all__ = ["batched_anchor_head_loss"]


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
    check_code(code_weights, dim)
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
