"""The per-sample target steps the original heads share, for the ``reference`` paths: the assigner's result per
prediction and mmdet's ``PseudoSampler``.

The reference paths mirror the originals' operations per sample (docs/design.md, "Two paths"), so that "reference →
batched" is a ratio over the original. Every original head here builds its targets one sample (or image) at a
time through the same two mmdet steps, and so do the reference paths, op for op:

1. the assigner's result per prediction (StreamPETR's ``HungarianAssigner2D/3D.assign``, steps 1 and 4:
   ``assigned_gt_inds`` −1, then 0, then ``k + 1`` at the matched predictions, and their labels);
2. ``PseudoSampler.sample`` and the ``SamplingResult`` it builds (mmdet 2.x
   ``core/bbox/samplers/pseudo_sampler.py``, ``sampling_result.py``): positives and negatives by ``nonzero`` and
   ``unique`` (two host syncs each), the positives' boxes, matched ground truths and labels.

The sampler also gathers what its callers never read (the negatives' boxes, ``pos_is_gt``), and the original
assigners compute labels nobody reads: they are computed here all the same, because the reference's job is to cost
what the original costs. ``benchmarks/_originals/`` ports the originals (one module each),
``benchmarks/originals.py`` counts them, and ``tests/test_reference_costs.py`` holds the two counts in their stated
relation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SamplingResult", "assigned_from_pairs", "pseudo_sample"]


def assigned_from_pairs(
    pairs: torch.Tensor, num_predictions: int, num_gts: int, gt_labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Hungarian assigner's result per prediction, as StreamPETR's assigners write it (steps 1 and 4).

    Args:
        pairs: int64 ``(K, 2)`` (prediction, ground truth) pairs of one sample.
        num_predictions: ``Q``.
        num_gts: ``M``, the sample's ground truths (``K = min(M, Q)``).
        gt_labels: int64 ``(M,)``.

    Returns:
        ``assigned_gt_inds`` int64 ``(Q,)`` (0 background, ``k + 1`` matched to ground truth ``k``) and
        ``assigned_labels`` int64 ``(Q,)`` (−1 where unmatched).
    """
    assigned_gt_inds = pairs.new_full((num_predictions,), -1, dtype=torch.long)  # (Q,)
    assigned_labels = pairs.new_full((num_predictions,), -1, dtype=torch.long)  # (Q,)
    assigned_gt_inds[:] = 0
    if num_gts == 0:  # the original returns here, before the cost
        return assigned_gt_inds, assigned_labels
    rows, cols = pairs[:, 0], pairs[:, 1]  # (K,), (K,)
    assigned_gt_inds[rows] = cols + 1
    assigned_labels[rows] = gt_labels[cols]
    return assigned_gt_inds, assigned_labels


@dataclass(frozen=True)
class SamplingResult:
    """What the callers read of mmdet's ``SamplingResult``.

    Attributes:
        pos_inds: int64 ``(P,)`` positive predictions, sorted.
        neg_inds: int64 ``(N,)`` negative predictions, sorted.
        pos_bboxes: ``(P, ·)`` the positives' predictions (or anchors).
        pos_assigned_gt_inds: int64 ``(P,)`` the positives' ground truths.
        pos_gt_bboxes: ``(P, D)`` their boxes.
        pos_gt_labels: int64 ``(P,)`` their labels (None without labels).
    """

    pos_inds: torch.Tensor
    neg_inds: torch.Tensor
    pos_bboxes: torch.Tensor
    pos_assigned_gt_inds: torch.Tensor
    pos_gt_bboxes: torch.Tensor
    pos_gt_labels: torch.Tensor | None


def pseudo_sample(
    assigned_gt_inds: torch.Tensor,
    assigned_labels: torch.Tensor | None,
    bboxes: torch.Tensor,
    gt_bboxes: torch.Tensor,
) -> SamplingResult:
    """mmdet's ``PseudoSampler.sample``: every positive and negative, and the ``SamplingResult`` of them.

    Args:
        assigned_gt_inds: int64 ``(Q,)``: −1 ignored, 0 negative, ``k + 1`` ground truth ``k``.
        assigned_labels: int64 ``(Q,)`` or None.
        bboxes: ``(Q, ·)`` the predictions (or anchors).
        gt_bboxes: ``(M, D)`` the sample's ground truth.

    Returns:
        :class:`SamplingResult`.
    """
    # sync: positives and negatives by nonzero and unique, as the original (two host syncs each)
    pos_inds = torch.nonzero(assigned_gt_inds > 0, as_tuple=False).squeeze(-1).unique()  # (P,)
    neg_inds = torch.nonzero(assigned_gt_inds == 0, as_tuple=False).squeeze(-1).unique()  # (N,)
    gt_flags = bboxes.new_zeros(bboxes.shape[0], dtype=torch.uint8)  # (Q,)
    pos_bboxes = bboxes[pos_inds]  # (P, ·)
    _ = bboxes[neg_inds], gt_flags[pos_inds]  # neg_bboxes and pos_is_gt: unread, paid as there
    pos_assigned_gt_inds = assigned_gt_inds[pos_inds] - 1  # (P,)
    if gt_bboxes.numel() == 0:
        pos_gt_bboxes = torch.empty_like(gt_bboxes).view(0, gt_bboxes.shape[-1])  # (0, D)
    else:
        pos_gt_bboxes = gt_bboxes[pos_assigned_gt_inds, :]  # (P, D)
    pos_gt_labels = assigned_labels[pos_inds] if assigned_labels is not None else None  # (P,)
    return SamplingResult(pos_inds, neg_inds, pos_bboxes, pos_assigned_gt_inds, pos_gt_bboxes, pos_gt_labels)
