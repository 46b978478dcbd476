"""Greedy rotated (BEV) NMS and mmdet3d's multi-class 3D NMS, per sample and for a whole batch at once.

The original: mmcv's ``nms_rotated`` (``mmcv/ops/nms.py``, kernels ``csrc/pytorch/cpu/nms_rotated.cpp`` and
``csrc/common/cuda/nms_rotated_cuda.cuh``) and mmdet3d's ``nms_bev`` / ``box3d_multiclass_nms``
(``mmdet3d/models/layers/box3d_nms.py``). Greedy NMS: visit boxes by descending score; a box not yet
suppressed is kept and suppresses every later box whose rotated IoU with it exceeds the threshold.

Choices where the original is ambiguous or inconsistent (both paths here make the same ones):

- Suppression is ``iou > threshold``, as the CUDA kernel (the one training and evaluation run on); mmcv's
  CPU kernel uses ``>=``. They differ only for IoUs exactly equal to the threshold (e.g. threshold 0 and
  disjoint boxes: ``>`` keeps them).
- Ties in score are broken by index (stable sort); the original's ``sort`` leaves their order unspecified.
- mmdet3d converts the BEV boxes ``(x, y, dx, dy, yaw)`` to ``(x1, y1, x2, y2, yaw)`` and back before
  ``nms_rotated``; that round trip only rounds, and is skipped. The yaw is the lidar counter-clockwise yaw,
  passed unchanged as mmdet3d does (see :mod:`drivetrain.geometry.rotated_iou` for mmcv's convention).

Reference path: the original's steps op for op, per sample and class (``box3d_multiclass_nms``: candidates by
boolean masks, ``nms_bev``, mmcv's ``nms_rotated``: the suppression mask of every pair at once, copied to the host
for the greedy pass, the kept indices copied back). mmcv makes that mask in one CUDA kernel; the reference makes it
with :func:`rotated_bev_iou_pairwise`, a fixed number of ATen ops per call (``benchmarks/originals.py`` counts both).

Batched path: one pairwise IoU matrix per sample, the "i suppresses j" relation as a boolean matrix over
score-sorted positions, then one pass over positions ``k = 0..N-1`` for the whole batch (N steps of two
kernels each, a Python loop over a shape): position ``k`` is kept iff it is valid and no kept earlier position
suppresses it. No host sync.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from drivetrain.geometry.rotated_iou import rotated_bev_iou_pairwise
from drivetrain.ragged import RaggedBatch

__all__ = [
    "BEV_COLUMNS",
    "batched_rotated_nms",
    "multiclass_rotated_nms",
    "reference_multiclass_nms_single",
    "reference_multiclass_rotated_nms",
    "reference_rotated_nms",
]

BEV_COLUMNS = (0, 1, 3, 4, 6)  # (x, y, dx, dy, yaw) of a (x, y, z_c, dx, dy, dz, yaw, ...) box


def reference_rotated_nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """mmcv's ``nms_rotated`` for one set of boxes, as its CUDA implementation runs it (``nms_rotated_cuda``): the
    boxes by descending score (ties by index), which suppresses which for every pair in one pass, that mask to the
    host, the greedy pass there, the kept indices back to the device.

    mmcv computes the mask in one CUDA kernel; here it is :func:`rotated_bev_iou_pairwise` (the IoU primitive both
    paths use), a fixed number of ATen ops per call.

    Args:
        boxes: ``(N, 5)`` float BEV boxes ``(x, y, dx, dy, yaw)``.
        scores: ``(N,)`` float scores.
        iou_threshold: a later box is suppressed when its IoU with a kept box is ``> iou_threshold``.

    Returns:
        int64 ``(K,)`` indices of the kept boxes, by descending score.
    """
    if boxes.dim() != 2 or boxes.shape[-1] != 5 or scores.shape != boxes.shape[:1]:
        raise ValueError(f"boxes, scores: expected (N, 5) and (N,), got {tuple(boxes.shape)}, {tuple(scores.shape)}")
    order = scores.argsort(descending=True, stable=True)  # (N,)
    if order.shape[0] == 0:
        return order
    sorted_boxes = boxes.index_select(0, order)  # (N, 5)
    suppresses = rotated_bev_iou_pairwise(sorted_boxes, sorted_boxes) > iou_threshold  # (N, N) mmcv's mask
    mask = suppresses.cpu().numpy()  # sync: mmcv copies the mask to the host for the greedy pass
    removed = np.zeros(order.shape[0], dtype=bool)
    kept = []
    for i in range(order.shape[0]):
        if not removed[i]:
            kept.append(i)
            removed |= mask[i]
    keep = order[torch.tensor(kept, dtype=torch.long).to(order.device)]  # (K,) sync: the kept positions, copied back
    _ = torch.cat((boxes[keep], scores[keep].reshape(-1, 1)), dim=1)  # mmcv's returned dets (unread), paid as there
    return keep


def _nms_bev(bev: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """mmdet3d's ``nms_bev``: the boxes sorted by score, :func:`reference_rotated_nms` on them, the kept positions
    mapped back (without the original's xyxyr → xywhr round trip, which only rounds); int64 ``(K,)``."""
    order = scores.argsort(descending=True, stable=True)  # (n,)
    keep = reference_rotated_nms(bev[order].contiguous(), scores[order], iou_threshold)  # (K,) positions in order
    return order[keep]  # (K,)


def _greedy_keep(suppresses: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Greedy NMS over score-sorted positions, as the original's host pass: visit ``k = 0..N-1``; a position not
    removed yet is kept and removes every later position it suppresses.

    Two kernels per position (the pass is launch-bound on a GPU): for bools ``a > b`` is ``a & ~b``, so
    ``later[k] > removed[k]`` is "row ``k`` if ``k`` is kept" in one op, and ``|=`` the other. Position ``k`` is
    final when it is visited (only earlier positions reach it).

    Args:
        suppresses: bool ``(..., N, N)``: ``[i, j]`` is True when position ``i`` would suppress ``j``;
            only ``i < j`` is read.
        valid: bool ``(..., N)`` positions taking part.

    Returns:
        bool ``(..., N)`` kept positions.
    """
    num = valid.shape[-1]
    earlier = torch.ones(num, num, dtype=torch.bool, device=valid.device).triu(1)  # (N, N) i < j
    later = suppresses & earlier  # (..., N, N) [i, j]: i would suppress the later j
    removed = ~valid  # (..., N): padding is never kept and never suppresses
    for k in range(num):
        removed |= torch.gt(later[..., k, :], removed[..., k : k + 1])  # (..., N)
    return ~removed


def batched_rotated_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    valid: torch.Tensor,
    iou_threshold: float,
    groups: torch.Tensor | None = None,
) -> torch.Tensor:
    """Greedy rotated NMS of every sample (and group) at once; equal to :func:`reference_rotated_nms` run
    per sample and per group. No host sync.

    Args:
        boxes: ``(B, N, 5)`` float BEV boxes ``(x, y, dx, dy, yaw)``, padded.
        scores: ``(B, N)`` float scores.
        valid: bool ``(B, N)``: False for padding (never kept, never suppresses).
        iou_threshold: suppress when IoU ``> iou_threshold``.
        groups: optional int ``(B, N)`` group (class) ids; boxes of different groups never suppress each
            other.

    Returns:
        bool ``(B, N)`` keep mask in the input order.

    Example:
        >>> boxes = torch.tensor([[[0.0, 0, 2, 1, 0], [0.1, 0, 2, 1, 0], [5, 5, 1, 1, 0]]])
        >>> batched_rotated_nms(boxes, torch.tensor([[0.9, 0.8, 0.7]]), torch.ones(1, 3, dtype=torch.bool), 0.2)
        tensor([[ True, False,  True]])
    """
    if boxes.dim() != 3 or boxes.shape[-1] != 5 or scores.shape != boxes.shape[:2] or valid.shape != scores.shape:
        raise ValueError(
            f"boxes, scores, valid: expected (B, N, 5), (B, N), (B, N); got {tuple(boxes.shape)}, "
            f"{tuple(scores.shape)}, {tuple(valid.shape)}"
        )
    if groups is not None and groups.shape != scores.shape:
        raise ValueError(f"groups: expected shape {tuple(scores.shape)}, got {tuple(groups.shape)}")
    order = _score_order(scores, valid)  # (B, N)
    sorted_boxes = boxes.gather(1, order.unsqueeze(-1).expand(*order.shape, 5))  # (B, N, 5)
    suppresses = rotated_bev_iou_pairwise(sorted_boxes, sorted_boxes) > iou_threshold  # (B, N, N)
    if groups is not None:
        sorted_groups = groups.gather(1, order)  # (B, N)
        suppresses &= sorted_groups.unsqueeze(-1) == sorted_groups.unsqueeze(-2)  # (B, N, N)
    keep_sorted = _greedy_keep(suppresses, valid.gather(1, order))  # (B, N)
    return torch.zeros_like(valid).scatter(1, order, keep_sorted)  # (B, N)


def _score_order(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Positions by descending score along the last dim, ties by index (invalid entries anywhere)."""
    return scores.masked_fill(~valid, float("-inf")).argsort(dim=-1, descending=True, stable=True)  # (..., N)


def multiclass_rotated_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    valid: torch.Tensor,
    score_threshold: float = 0.05,
    iou_threshold: float = 0.2,
    max_num: int = 500,
    *,
    sparse: bool = False,
    max_candidates: int | None = None,
) -> tuple[RaggedBatch, RaggedBatch, RaggedBatch, RaggedBatch]:
    """mmdet3d's ``box3d_multiclass_nms`` (rotated) for a whole batch; no host sync.

    Per class ``c``: candidates are boxes with ``scores[..., c] > score_threshold``; rotated NMS among them
    (on the BEV columns of ``boxes``). Results are concatenated class by class, each class by descending
    score; when a sample keeps more than ``max_num``, all are sorted by descending score and the first
    ``max_num`` kept (otherwise the class-major order stays, as in the original).

    Args:
        boxes: ``(B, N, D)`` float boxes ``(x, y, z_c, dx, dy, dz, yaw, ...)``, ``D >= 7``.
        scores: ``(B, N, C)`` float per-class scores (sigmoid; no background column).
        valid: bool ``(B, N)``: False for padding.
        score_threshold: a box is a class's candidate when its score is ``> score_threshold``.
        iou_threshold: suppress when rotated BEV IoU ``> iou_threshold``.
        max_num: at most this many detections per sample.
        sparse: compute the IoU of nearby pairs only (the same result; one host read, see
            :func:`~drivetrain.geometry.rotated_iou.rotated_bev_iou_pairwise`).
        max_candidates: the largest number of one class's candidates in one sample, when the caller read it on
            the host (compact decoding does): the greedy pass visits that many positions instead of ``N`` (a
            class's candidates sort first; the positions after them are padding in every row). Must not be less
            than the true count; None: ``N``.

    Returns:
        RaggedBatches ``boxes (B, K, D)``, ``scores (B, K)``, int64 ``labels (B, K)`` and int64 ``indices
        (B, K)`` (the box's position in ``N``, to gather e.g. direction scores), with
        ``K = min(max_num, N·C)``.
    """
    _check_multiclass(boxes, scores, valid, max_num)
    num_batch, num, num_classes = scores.shape
    class_scores = scores.transpose(1, 2)  # (B, C, N)
    candidate = valid.unsqueeze(1) & (class_scores > score_threshold)  # (B, C, N)
    order = _score_order(class_scores, candidate)  # (B, C, N)
    bev = boxes[..., list(BEV_COLUMNS)]  # (B, N, 5)
    overlap = rotated_bev_iou_pairwise(bev, bev, sparse=sparse) > iou_threshold  # (B, N, N)
    steps = num if max_candidates is None else max(0, min(int(max_candidates), num))  # S positions a class may hold
    head = order[..., :steps]  # (B, C, S) every candidate of every class
    rows = head.unsqueeze(-1).expand(num_batch, num_classes, steps, num)  # (B, C, S, N)
    suppresses = overlap.unsqueeze(1).expand(-1, num_classes, -1, -1).gather(2, rows)  # (B, C, S, N)
    suppresses = suppresses.gather(3, head.unsqueeze(-2).expand(-1, -1, steps, -1))  # (B, C, S, S) sorted both ways
    keep_head = _greedy_keep(suppresses, candidate.gather(2, head))  # (B, C, S)
    keep_sorted = F.pad(keep_head, (0, num - steps))  # (B, C, N): no position after S is a candidate
    # Class-major order of kept entries: position c·N + rank; padding sorts last (stable).
    flat_keep = keep_sorted.flatten(1)  # (B, C·N)
    class_major = (~flat_keep).to(torch.int8).argsort(dim=1, stable=True)  # (B, C·N)
    kept = flat_keep.gather(1, class_major)  # (B, C·N)
    sorted_scores = class_scores.gather(2, order).flatten(1).gather(1, class_major)  # (B, C·N)
    by_score = sorted_scores.masked_fill(~kept, float("-inf")).argsort(dim=1, descending=True, stable=True)
    num_kept = flat_keep.sum(1)  # (B,)
    final = torch.where((num_kept > max_num).unsqueeze(1), class_major.gather(1, by_score), class_major)
    width = min(max_num, num * num_classes)
    final = final[:, :width]  # (B, K) flat (class, rank) positions
    labels = torch.div(final, num, rounding_mode="floor")  # (B, K)
    indices = order.flatten(1).gather(1, final)  # (B, K) box positions in N
    out_scores = class_scores.flatten(1).gather(1, labels * num + indices)  # (B, K)
    out_boxes = boxes.gather(1, indices.unsqueeze(-1).expand(*indices.shape, boxes.shape[-1]))  # (B, K, D)
    sizes = num_kept.clamp(max=max_num)  # (B,)
    return (
        RaggedBatch(out_boxes, sizes, validate=False),
        RaggedBatch(out_scores, sizes, validate=False),
        RaggedBatch(labels, sizes, validate=False),
        RaggedBatch(indices, sizes, validate=False),
    )


def reference_multiclass_rotated_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    valid: torch.Tensor,
    score_threshold: float = 0.05,
    iou_threshold: float = 0.2,
    max_num: int = 500,
) -> list[dict[str, torch.Tensor]]:
    """The original's per-sample, per-class loop (arguments as :func:`multiclass_rotated_nms`): each sample's valid
    boxes, then :func:`reference_multiclass_nms_single`.

    Returns:
        Per sample ``{"boxes": (K_b, D), "scores": (K_b,), "labels": (K_b,), "indices": (K_b,)}``.
    """
    _check_multiclass(boxes, scores, valid, max_num)
    out = []
    for b in range(boxes.shape[0]):
        sample = valid[b].nonzero()[:, 0]  # (N_b,) sync: the sample's boxes (the original's input has no padding)
        kept = reference_multiclass_nms_single(
            boxes[b][sample], scores[b][sample], score_threshold, iou_threshold, max_num
        )
        kept["indices"] = sample[kept["indices"]]  # (K_b,) positions in N
        out.append(kept)
    return out


def reference_multiclass_nms_single(
    boxes: torch.Tensor, scores: torch.Tensor, score_threshold: float, iou_threshold: float, max_num: int
) -> dict[str, torch.Tensor]:
    """mmdet3d's ``box3d_multiclass_nms`` for one sample, op for op: per class the candidates by a boolean mask
    (``any`` read on the host, then boolean indexing), :func:`_nms_bev` on them, the kept boxes, scores, labels and
    positions; concatenated class by class, cut to ``max_num`` by score when more were kept.

    Args:
        boxes: ``(N, D)`` float boxes ``(x, y, z_c, dx, dy, dz, yaw, ...)``.
        scores: ``(N, C)`` float per-class scores.
        score_threshold: a box is a class's candidate when its score is ``> score_threshold``.
        iou_threshold: suppress when rotated BEV IoU ``> iou_threshold``.
        max_num: at most this many detections.

    Returns:
        ``{"boxes": (K, D), "scores": (K,), "labels": (K,), "indices": (K,)}`` (``indices``: positions in ``N``, the
        original's per-class gather of its direction scores).
    """
    bev = boxes[:, list(BEV_COLUMNS)]  # (N, 5)
    positions = torch.arange(boxes.shape[0], device=boxes.device)  # (N,)
    kept_boxes, kept_scores, kept_labels, kept_idx = [], [], [], []
    for c in range(scores.shape[-1]):
        candidate = scores[:, c] > score_threshold  # (N,)
        if not candidate.any():  # sync: the original reads whether the class has candidates
            continue
        class_scores = scores[candidate, c]  # (n,) sync: boolean indexing
        selected = _nms_bev(bev[candidate, :], class_scores, iou_threshold)  # (k,)
        kept_boxes.append(boxes[candidate, :][selected])
        kept_scores.append(class_scores[selected])
        kept_labels.append(boxes.new_full((len(selected),), c, dtype=torch.long))
        kept_idx.append(positions[candidate][selected])  # the original's dir scores of the class, gathered
    if not kept_boxes:
        return {
            "boxes": scores.new_zeros((0, boxes.shape[-1])),
            "scores": scores.new_zeros((0,)),
            "labels": scores.new_zeros((0,), dtype=torch.long),
            "indices": scores.new_zeros((0,), dtype=torch.long),
        }
    out_boxes, out_scores = torch.cat(kept_boxes), torch.cat(kept_scores)  # (K, D), (K,)
    labels, indices = torch.cat(kept_labels), torch.cat(kept_idx)  # (K,), (K,)
    if out_boxes.shape[0] > max_num:
        top = out_scores.argsort(descending=True, stable=True)[:max_num]  # (max_num,)
        out_boxes, labels, out_scores, indices = out_boxes[top, :], labels[top], out_scores[top], indices[top]
    return {"boxes": out_boxes, "scores": out_scores, "labels": labels, "indices": indices}


def _check_multiclass(boxes: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor, max_num: int) -> None:
    if boxes.dim() != 3 or boxes.shape[-1] < 7 or scores.dim() != 3 or scores.shape[:2] != boxes.shape[:2]:
        raise ValueError(
            f"boxes, scores: expected (B, N, D>=7) and (B, N, C), got {tuple(boxes.shape)}, {tuple(scores.shape)}"
        )
    if valid.shape != boxes.shape[:2] or valid.dtype != torch.bool:
        raise ValueError(f"valid: expected bool {tuple(boxes.shape[:2])}, got {valid.dtype} {tuple(valid.shape)}")
    if max_num < 1:
        raise ValueError(f"max_num: must be >= 1, got {max_num}")
