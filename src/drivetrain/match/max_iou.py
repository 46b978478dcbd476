"""Max-IoU anchor assignment, class-agnostic or one assigner per class, reference and batched.

Assignment codes, per anchor: ``-1`` ignored, ``0`` negative, ``k ≥ 1`` positive for ground truth ``k − 1``
(an index into the sample's full GT list, also in the per-class variant).

``reference_*`` mirrors mmdetection3d's ``Max3DIoUAssigner`` (mmdet's ``MaxIoUAssigner.assign_wrt_overlaps``)
one sample (and, per class, one class) at a time, on the IoU matrix ``(G, A)`` of GTs against anchors:
    1. every anchor starts ignored (−1);
    2. anchors with ``neg_lo ≤ max IoU < neg_hi`` become negative (0); a number ``t`` means ``[0, t)``;
    3. anchors with ``max IoU ≥ pos_iou_thr`` take their best GT (first on ties);
    4. low-quality matches: for each GT ``i`` in order whose best IoU ``m_i ≥ min_pos_iou``, every anchor
       whose IoU with ``i`` equals ``m_i`` takes ``i`` (later GTs overwrite earlier ones and step 3);
with no GT (in the sample, or, per class, of the anchor's class) every anchor is negative. Per-class assignment
(mmdetection3d's ``assign_per_class``) runs one assigner per class: anchors of class ``c`` against the GTs labelled
``c``, with that class's thresholds; the per-class results are concatenated in anchor order, and the class-local GT
index maps back to the sample's GT list.

``batched_max_iou_assign`` does all samples and classes at once on padded GTs: one masked IoU tensor
``(B, A, G)`` (−1 at padding and, per class, where the anchor's class differs from the GT's), per-anchor
threshold vectors, and step 4 as ``(iou == m[:, None, :]) & (m ≥ min_pos) & valid`` reduced to the **last**
matching GT, which is the loop's overwrite order. With ``chunk`` the anchors go in slices: a first pass
takes each GT's best IoU ``m`` over all slices, a second recomputes each slice's IoU (bit-identical) and
assigns it, so the full ``(B, A, G)`` tensor never exists at once. No host sync.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from drivetrain.geometry.bev_iou import nearest_bev_iou
from drivetrain.ragged import RaggedBatch

__all__ = [
    "AnchorThresholds",
    "MaxIoUConfig",
    "anchor_thresholds",
    "batched_max_iou_assign",
    "reference_max_iou_assign",
    "reference_max_iou_assign_per_class",
]


@dataclass(frozen=True)
class MaxIoUConfig:
    """Thresholds of one max-IoU assigner (``Max3DIoUAssigner`` with ``BboxOverlapsNearest3D``).

    Args:
        pos_iou_thr: anchors whose best IoU reaches this are positive.
        neg_iou_thr: anchors whose best IoU lies in ``[0, t)`` (a number) or ``[lo, hi)`` (a pair) are negative.
            Integers count as floats (the original tests ``isinstance(t, float)`` and would skip step 2).
        min_pos_iou: a GT takes its best anchors in step 4 only if its best IoU reaches this.
        match_low_quality: run step 4.
        gt_max_assign_all: step 4 gives a GT every anchor tied at its best IoU (True, the default and the only
            mode of the batched path) or only the first such anchor.
    """

    pos_iou_thr: float
    neg_iou_thr: float | tuple[float, float]
    min_pos_iou: float = 0.0
    match_low_quality: bool = True
    gt_max_assign_all: bool = True

    def __post_init__(self) -> None:
        neg = self.neg_iou_thr
        if isinstance(neg, (tuple, list)):
            if len(neg) != 2:
                raise ValueError(f"neg_iou_thr: a pair (lo, hi) or a number, got {neg!r}")
            neg = (float(neg[0]), float(neg[1]))
        else:
            neg = float(neg)
        object.__setattr__(self, "neg_iou_thr", neg)

    @property
    def neg_range(self) -> tuple[float, float]:
        """``(lo, hi)``: best IoUs in ``[lo, hi)`` are negative."""
        return self.neg_iou_thr if isinstance(self.neg_iou_thr, tuple) else (0.0, self.neg_iou_thr)


# ---------------------------------------------------------------------- reference
def _assign_wrt_overlaps(overlaps: torch.Tensor, gt_labels: torch.Tensor | None, cfg: MaxIoUConfig) -> torch.Tensor:
    """Steps 1–4 on one ``(G, A)`` IoU matrix, as ``MaxIoUAssigner.assign_wrt_overlaps``, op for op; int64 ``(A,)``.

    With ``gt_labels`` the original also writes each anchor's label (read by nothing downstream); it is computed
    here all the same, because the reference's job is to cost what the original costs.
    """
    num_gts, num_anchors = overlaps.shape
    assigned = overlaps.new_full((num_anchors,), -1, dtype=torch.long)  # (A,)
    if num_gts == 0 or num_anchors == 0:
        overlaps.new_zeros((num_anchors,))  # the original's max_overlaps (unread)
        if num_gts == 0:
            assigned[:] = 0
        if gt_labels is not None:
            overlaps.new_full((num_anchors,), -1, dtype=torch.long)  # its labels (unread)
        return assigned
    max_overlaps, argmax_overlaps = overlaps.max(dim=0)  # (A,), (A,)
    gt_max_overlaps, gt_argmax_overlaps = overlaps.max(dim=1)  # (G,), (G,)
    neg_lo, neg_hi = cfg.neg_range
    assigned[(max_overlaps >= neg_lo) & (max_overlaps < neg_hi)] = 0
    pos = max_overlaps >= cfg.pos_iou_thr  # (A,)
    assigned[pos] = argmax_overlaps[pos] + 1
    if cfg.match_low_quality:
        for i in range(num_gts):
            if gt_max_overlaps[i] >= cfg.min_pos_iou:  # sync: the original's per-GT loop tests each GT on the host
                if cfg.gt_max_assign_all:
                    assigned[overlaps[i, :] == gt_max_overlaps[i]] = i + 1
                else:
                    assigned[gt_argmax_overlaps[i]] = i + 1
    if gt_labels is not None:  # the original's assigned labels (unread downstream)
        labels = assigned.new_full((num_anchors,), -1)  # (A,)
        pos_inds = torch.nonzero(assigned > 0, as_tuple=False).squeeze()  # sync: (P,) as the original's
        if pos_inds.numel() > 0:
            labels[pos_inds] = gt_labels[assigned[pos_inds] - 1]
    return assigned


@torch.no_grad()
def reference_max_iou_assign(
    anchors: torch.Tensor, gt_boxes: torch.Tensor, gt_labels: torch.Tensor, cfg: MaxIoUConfig
) -> torch.Tensor:
    """One sample, class-agnostic, as the original.

    Args:
        anchors: ``(A, ≥7)`` anchors (x, y, z, dx, dy, dz, yaw, ...).
        gt_boxes: ``(G, ≥7)`` ground-truth boxes of the sample.
        gt_labels: ``(G,)`` int classes; not used by the class-agnostic assignment (the label of a positive
            is its GT's), taken so that both reference assigners share one signature.
        cfg: thresholds.

    Returns:
        int64 ``(A,)``: −1 ignored, 0 negative, ``k ≥ 1`` GT ``k − 1``.
    """
    if gt_labels.shape != gt_boxes.shape[:1]:
        raise ValueError(f"gt_labels: shape {tuple(gt_labels.shape)} does not match gt_boxes {tuple(gt_boxes.shape)}")
    if gt_boxes.shape[0] == 0:  # the original does not call its assigner then: every anchor is a negative
        return anchors.new_zeros(anchors.shape[0], dtype=torch.long)  # (A,)
    overlaps = nearest_bev_iou(gt_boxes, anchors)  # (G, A): GTs first, as the original calls the calculator
    return _assign_wrt_overlaps(overlaps, gt_labels, cfg)  # (A,)


@torch.no_grad()
def reference_max_iou_assign_per_class(
    anchors: torch.Tensor,
    anchor_classes: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_labels: torch.Tensor,
    cfgs: Sequence[MaxIoUConfig],
) -> torch.Tensor:
    """One sample, one assigner per class (mmdetection3d's ``assign_per_class``), as the original's class loop.

    Args:
        anchors: ``(A, ≥7)`` anchors of all classes.
        anchor_classes: int ``(A,)`` class of each anchor (contiguous blocks in the original; any order works).
        gt_boxes: ``(G, ≥7)`` ground-truth boxes of the sample.
        gt_labels: int ``(G,)`` their classes.
        cfgs: thresholds per class, indexed by class.

    Returns:
        int64 ``(A,)``: −1 ignored, 0 negative, ``k ≥ 1`` GT ``k − 1`` of the sample (not of the class);
        anchors of a class without a config stay −1.
    """
    assigned = torch.full((anchors.shape[0],), -1, dtype=torch.long, device=anchors.device)  # (A,)
    for c, cfg in enumerate(cfgs):
        in_class = anchor_classes == c  # (A,)
        gt_in_class = gt_labels == c  # (G,)
        gt_index = torch.nonzero(gt_in_class).squeeze(1)  # (G_c,): sync: the original selects each class's GTs
        class_anchors = anchors[in_class]  # (A_c, ≥7)
        if gt_index.numel() == 0:  # the original skips the assigner: every anchor of the class is negative
            local = torch.zeros(class_anchors.shape[0], dtype=torch.long, device=anchors.device)  # (A_c,)
        else:
            local = reference_max_iou_assign(class_anchors, gt_boxes[gt_index], gt_labels[gt_index], cfg)  # (A_c,)
            local = torch.where(local > 0, gt_index[(local - 1).clamp(min=0)] + 1, local)  # (A_c,): sample GT index
        assigned[in_class] = local
    return assigned


# ---------------------------------------------------------------------- batched
@dataclass(frozen=True)
class AnchorThresholds:
    """Per-anchor assigner thresholds for :func:`batched_max_iou_assign` (build with :func:`anchor_thresholds`).

    Args:
        pos: float32 ``(A,)`` positive threshold.
        neg_low: float32 ``(A,)`` best IoUs in ``[neg_low, neg_high)`` are negative.
        neg_high: float32 ``(A,)``.
        min_pos: float32 ``(A,)`` low-quality threshold of the GT (constant within a class).
        low_quality: bool ``(A,)`` whether step 4 runs for the anchor's assigner.
        zero_iou_positive: whether an anchor may be positive at best IoU 0 — some ``pos ≤ 0``, or ``min_pos ≤ 0``
            with low-quality matches (a GT that overlaps nothing then claims anchors); known on the host from
            the configs (True, the safe answer, unless :func:`anchor_thresholds` worked it out).
    """

    pos: torch.Tensor
    neg_low: torch.Tensor
    neg_high: torch.Tensor
    min_pos: torch.Tensor
    low_quality: torch.Tensor
    zero_iou_positive: bool = True


def anchor_thresholds(
    cfgs: MaxIoUConfig | Sequence[MaxIoUConfig],
    anchor_classes: torch.Tensor | None = None,
    num_anchors: int | None = None,
    device: torch.device | str = "cpu",
) -> AnchorThresholds:
    """Spread assigner thresholds over anchors: one config for all, or one per class through ``anchor_classes``.

    Args:
        cfgs: a config (class-agnostic) or one per class.
        anchor_classes: int ``(A,)`` class per anchor; required with several configs.
        num_anchors: ``A`` for a single config without ``anchor_classes``.
        device: where the thresholds live (that of ``anchor_classes`` when given).

    Returns:
        :class:`AnchorThresholds` of ``(A,)`` tensors. Build once per anchor set; float32 thresholds compare
        as the original's Python floats do (PyTorch casts the scalar to the tensor's float32).
    """
    if isinstance(cfgs, MaxIoUConfig):
        cfgs = [cfgs]
    if any(not cfg.gt_max_assign_all for cfg in cfgs):
        raise ValueError("cfgs: the batched assigner supports gt_max_assign_all=True only (as every config uses)")
    rows = [(c.pos_iou_thr, *c.neg_range, c.min_pos_iou, float(c.match_low_quality)) for c in cfgs]
    if anchor_classes is not None:
        device = anchor_classes.device
    table = torch.tensor(rows, dtype=torch.float32, device=device)  # (C, 5)
    if anchor_classes is not None:
        per_anchor = table[anchor_classes]  # (A, 5)
    elif len(rows) == 1 and num_anchors is not None:
        per_anchor = table.expand(num_anchors, 5)  # (A, 5)
    else:
        raise ValueError("anchor_classes: needed with one config per class; num_anchors: needed with one config")
    pos, neg_low, neg_high, min_pos, low_quality = per_anchor.unbind(-1)  # 5 × (A,)
    # compared as float32, as the tensors hold them (a tiny positive threshold may round to 0)
    zero = any(np.float32(c.pos_iou_thr) <= 0 or (np.float32(c.min_pos_iou) <= 0 and c.match_low_quality) for c in cfgs)
    return AnchorThresholds(pos, neg_low, neg_high, min_pos, low_quality > 0, zero_iou_positive=bool(zero))


def _check_inputs(
    anchors: torch.Tensor,
    gt_boxes: RaggedBatch,
    gt_labels: RaggedBatch,
    thresholds: AnchorThresholds,
    anchor_classes: torch.Tensor | None,
) -> None:
    if not isinstance(gt_boxes, RaggedBatch) or gt_boxes.num_batch_dims != 1 or gt_boxes.tensor.dim() != 3:
        raise ValueError("gt_boxes: expected a RaggedBatch (B, G, ≥7) with one batch dim")
    if not isinstance(gt_labels, RaggedBatch) or tuple(gt_labels.shape) != tuple(gt_boxes.shape[:2]):
        raise ValueError(f"gt_labels: expected a RaggedBatch (B, G) matching gt_boxes {tuple(gt_boxes.shape)}")
    num_anchors = anchors.shape[0]
    for name in ("pos", "neg_low", "neg_high", "min_pos", "low_quality"):
        if getattr(thresholds, name).shape != (num_anchors,):
            raise ValueError(f"thresholds.{name}: expected shape ({num_anchors},) (one per anchor)")
    if anchor_classes is not None and anchor_classes.shape != (num_anchors,):
        raise ValueError(f"anchor_classes: expected shape ({num_anchors},), got {tuple(anchor_classes.shape)}")


@torch.no_grad()
def batched_max_iou_assign(
    anchors: torch.Tensor,
    gt_boxes: RaggedBatch,
    gt_labels: RaggedBatch,
    thresholds: AnchorThresholds,
    *,
    anchor_classes: torch.Tensor | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Assign the anchors of every sample at once; per class when ``anchor_classes`` is given.

    Args:
        anchors: ``(A, ≥7)`` anchors shared by the samples.
        gt_boxes: RaggedBatch ``(B, G, ≥7)`` padded ground-truth boxes.
        gt_labels: RaggedBatch ``(B, G)`` int classes, the sizes of ``gt_boxes``.
        thresholds: per-anchor thresholds (:func:`anchor_thresholds`).
        anchor_classes: int ``(A,)`` class per anchor for per-class assignment; None: class-agnostic.
        chunk: anchors per slice (None: all at once); bounds the IoU tensor to ``(B, chunk, G)``.

    Returns:
        int64 ``(B, A)``: −1 ignored, 0 negative, ``k ≥ 1`` GT ``k − 1`` of the sample; equal to the reference
        assigners run per sample.

    Example:
        >>> cfg = MaxIoUConfig(pos_iou_thr=0.6, neg_iou_thr=0.3, min_pos_iou=0.3)  # a model's recipe passes its own
        >>> th = anchor_thresholds(cfg, num_anchors=anchors.shape[0])
        >>> assigned = batched_max_iou_assign(anchors, gt_boxes, gt_labels, th, chunk=65536)  # (B, A)
    """
    _check_inputs(anchors, gt_boxes, gt_labels, thresholds, anchor_classes)
    num_samples, num_gts = gt_boxes.shape[:2]
    num_anchors = anchors.shape[0]
    if num_gts == 0 or num_anchors == 0:  # shapes, not values: every anchor negative (or none at all)
        return torch.zeros(num_samples, num_anchors, dtype=torch.long, device=anchors.device)  # (B, A)
    step = num_anchors if chunk is None else max(int(chunk), 1)
    slices = [slice(start, min(start + step, num_anchors)) for start in range(0, num_anchors, step)]
    boxes, valid = gt_boxes.tensor, gt_boxes.mask  # (B, G, ≥7), (B, G)
    labels = gt_labels.tensor if anchor_classes is not None else None  # (B, G)

    def masked_iou(part: slice) -> tuple[torch.Tensor, torch.Tensor]:
        pair_valid = valid[:, None, :]  # (B, 1, G)
        if labels is not None:
            pair_valid = pair_valid & (anchor_classes[part, None] == labels[:, None, :])  # (B, a, G)
        iou = nearest_bev_iou(anchors[part], boxes)  # (B, a, G)
        return iou.masked_fill_(~pair_valid, -1.0), pair_valid.expand_as(iou)  # (B, a, G), (B, a, G)

    if len(slices) == 1:
        iou, pair_valid = masked_iou(slices[0])  # (B, A, G)
        gt_max = iou.amax(dim=1)  # (B, G)
        return _assign_slice(iou, pair_valid, gt_max, thresholds, slices[0])  # (B, A)
    gt_max = torch.full((num_samples, num_gts), -1.0, device=anchors.device)  # (B, G)
    for part in slices:  # pass 1: each GT's best IoU over all anchors
        gt_max = torch.maximum(gt_max, masked_iou(part)[0].amax(dim=1))  # (B, G)
    out = [_assign_slice(*masked_iou(part), gt_max, thresholds, part) for part in slices]  # pass 2
    return torch.cat(out, dim=1)  # (B, A)


def _assign_slice(
    iou: torch.Tensor, pair_valid: torch.Tensor, gt_max: torch.Tensor, th: AnchorThresholds, part: slice
) -> torch.Tensor:
    """Steps 1–4 for a slice of anchors given every GT's best IoU ``gt_max`` over all anchors; int64 ``(B, a)``."""
    num_gts = iou.shape[-1]
    max_iou, argmax = iou.max(dim=-1)  # (B, a), (B, a): first best GT, as the original
    assigned = torch.full_like(argmax, -1)  # (B, a)
    negative = (max_iou >= th.neg_low[part]) & (max_iou < th.neg_high[part])  # (B, a)
    assigned = torch.where(negative, 0, assigned)  # (B, a)
    assigned = torch.where(max_iou >= th.pos[part], argmax + 1, assigned)  # (B, a)
    low = (iou == gt_max[:, None, :]) & pair_valid  # (B, a, G)
    low &= gt_max[:, None, :] >= th.min_pos[part, None]  # (B, a, G)
    low &= th.low_quality[part, None]  # (B, a, G)
    gt_number = torch.arange(1, num_gts + 1, dtype=torch.int32, device=iou.device)  # (G,)
    last = torch.where(low, gt_number, 0).amax(dim=-1).long()  # (B, a): the loop's last writer wins
    assigned = torch.where(last > 0, last, assigned)  # (B, a)
    return torch.where(pair_valid.any(dim=-1), assigned, 0)  # (B, a): no GT (of the class): negative
