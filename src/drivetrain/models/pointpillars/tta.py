"""Test-time augmentation of the lidar detectors: detect on flipped / scaled / rotated copies of each frame, map
the boxes back, merge with class-wise rotated NMS.

After mmdetection3d's test-time path for these models (``MultiScaleFlipAug3D`` in the test pipeline, the
detector's ``aug_test`` and ``merge_aug_bboxes_3d`` / ``bbox3d_mapping_back`` in
``mmdet3d/models/test_time_augs/merge_augs.py``): every view's detections (the usual decoding, with its own
NMS) are mapped back to the original frame (flips undone, sizes and centres divided by the scale), pooled, and
per predicted label the pooled boxes go through rotated BEV NMS at the decoding's ``nms_threshold``; the
survivors are sorted by score and the best ``max_num`` kept. The original undoes flips and scale only; rotations
are added here (undone with the inverse of the view's transform, as the scale), since the issue's TTA asks for
them; with ``rotations=(0,)`` (the default) it is the original.

Views are ``rotations × scales × flips`` in that nested order, each a :class:`~drivetrain.pipeline.augment.bev.
BevAugParams` applied to the points exactly as the training augmentation is (rotate, scale, flip y then x); the
lidar points outside the grid are dropped by the voxelization. :func:`merge` does all samples at once on the
device; :func:`reference_merge` is the original's per-sample, per-label loop.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from drivetrain.batch import Batch
from drivetrain.geometry.rotated_nms import BEV_COLUMNS, multiclass_rotated_nms, reference_rotated_nms
from drivetrain.pipeline.augment.bev import BevAugConfig, BevAugParams, apply_bev_aug, make_bev_params
from drivetrain.ragged import RaggedBatch

__all__ = ["TTAConfig", "detect_tta", "map_boxes_back", "merge", "reference_merge", "views"]

_NO_FILTERS = BevAugConfig(point_range=None, object_range=None, shuffle=False)


@dataclass(frozen=True)
class TTAConfig:
    """The views of test-time augmentation.

    Attributes:
        flips: ``(horizontal: y → −y, vertical: x → −x)`` pairs; the default is mmdet3d's ``flip=True`` with
            both BEV directions (four views).
        scales: point-cloud scale factors (``pts_scale_ratio``).
        rotations: yaws in radians about +z.
    """

    flips: tuple[tuple[bool, bool], ...] = ((False, False), (True, False), (False, True), (True, True))
    scales: tuple[float, ...] = (1.0,)
    rotations: tuple[float, ...] = (0.0,)

    def __post_init__(self) -> None:
        if not self.flips or not self.scales or not self.rotations:
            raise ValueError("flips, scales, rotations: each needs at least one entry")
        if any(not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0) for s in self.scales):
            raise ValueError(f"scales: must be finite and > 0, got {self.scales}")
        if any(len(f) != 2 for f in self.flips):
            raise ValueError(f"flips: expected (horizontal, vertical) pairs, got {self.flips}")
        object.__setattr__(self, "flips", tuple((bool(h), bool(v)) for h, v in self.flips))


def views(cfg: TTAConfig, batch_size: int, num_points: int, device: torch.device) -> list[BevAugParams]:
    """One :class:`BevAugParams` per view (``rotations × scales × flips``), the same for every sample."""

    def full(value: float | bool, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.full((batch_size,), value, dtype=dtype, device=device)  # (B,)

    zeros_t, zeros_keys = torch.zeros(batch_size, 3, device=device), torch.zeros(batch_size, num_points, device=device)
    out = []
    for angle in cfg.rotations:
        for scale in cfg.scales:
            for flip_h, flip_v in cfg.flips:
                flips = full(flip_h, torch.bool), full(flip_v, torch.bool)
                out.append(make_bev_params(full(angle), full(scale), zeros_t, *flips, zeros_keys))
    return out


def map_boxes_back(boxes: torch.Tensor, params: BevAugParams) -> torch.Tensor:
    """Boxes detected in a view, in the original frame: the inverse of :func:`apply_bev_aug` on boxes.

    Args:
        boxes: ``(B, K, 7 or 9)`` boxes ``(x, y, z_centre, dx, dy, dz, yaw[, vx, vy])`` of the view.
        params: the view's parameters (``B`` samples).

    Returns:
        ``(B, K, D)``: centres and velocities through the inverse matrix, sizes divided by the scale, the flips'
        yaw changes undone (vertical first), then the rotation.
    """
    inverse = torch.linalg.inv(params.matrix.double()).to(boxes.dtype)  # (B, 4, 4)
    linear_t = inverse[:, :3, :3].transpose(1, 2)  # (B, 3, 3) row-vector form
    centre = torch.baddbmm(inverse[:, :3, 3].unsqueeze(1), boxes[..., :3], linear_t)  # (B, K, 3)
    dims = boxes[..., 3:6] / params.scale.to(boxes.dtype)[:, None, None]  # (B, K, 3)
    yaw = boxes[..., 6]
    yaw = torch.where(params.flip_v[:, None], math.pi - yaw, yaw)  # (B, K)
    yaw = torch.where(params.flip_h[:, None], -yaw, yaw)  # (B, K)
    yaw = yaw - params.angle.to(boxes.dtype)[:, None]  # (B, K)
    parts = [centre, dims, yaw.unsqueeze(-1)]
    if boxes.shape[-1] == 9:
        parts.append(torch.bmm(boxes[..., 7:9], linear_t[:, :2, :2]))  # (B, K, 2)
    return torch.cat(parts, dim=-1)  # (B, K, D)


def _pooled(
    per_view: list[tuple[RaggedBatch, RaggedBatch, RaggedBatch]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The views' (already mapped back) detections of each sample pooled in view order, padding cut: boxes,
    scores, labels, valid ``(B, N, ·)`` with ``N`` the largest pooled count."""
    boxes = torch.cat([b.tensor for b, _, _ in per_view], dim=1)  # (B, V·K, D)
    scores = torch.cat([s.tensor for _, s, _ in per_view], dim=1)  # (B, V·K)
    labels = torch.cat([lab.tensor for _, _, lab in per_view], dim=1)  # (B, V·K)
    valid = torch.cat([b.mask for b, _, _ in per_view], dim=1)  # (B, V·K)
    # sync: the largest pooled count sizes the merge (test-time only; each view pads to max_num)
    width = max(int(valid.sum(dim=1).max()), 1)
    order = (~valid).to(torch.int8).argsort(dim=1, stable=True)[:, :width]  # (B, N) detections first, in order
    return (
        _gather_rows(boxes, order), _gather_rows(scores, order), _gather_rows(labels, order),
        _gather_rows(valid, order),
    )  # fmt: skip


def _gather_rows(values: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``values[b, order[b]]`` for ``(B, N, ...)`` values and ``(B, M)`` indices."""
    index = order.view(*order.shape, *[1] * (values.dim() - 2)).expand(*order.shape, *values.shape[2:])
    return values.gather(1, index)


def merge(
    per_view: list[tuple[RaggedBatch, RaggedBatch, RaggedBatch]],
    num_classes: int,
    nms_threshold: float,
    max_num: int,
) -> tuple[RaggedBatch, RaggedBatch, RaggedBatch]:
    """Merge the views of every sample at once: per label rotated NMS, then the best ``max_num`` by score.

    Args:
        per_view: per view ``(boxes (B, K, D), scores (B, K), labels (B, K))`` RaggedBatches, mapped back.
        num_classes: C (labels are in ``[0, C)``).
        nms_threshold: suppress when the rotated BEV IoU is ``> nms_threshold``.
        max_num: detections kept per sample.

    Returns:
        ``boxes (B, K', D)``, ``scores``, ``labels`` RaggedBatches by descending score (two host reads: the
        pooled count, and the nearby pairs of the NMS).
    """
    boxes, scores, labels, valid = _pooled(per_view)
    one_hot = torch.nn.functional.one_hot(labels.clamp(0, num_classes - 1), num_classes).bool()  # (B, N, C)
    class_scores = torch.where(one_hot & valid.unsqueeze(-1), scores.unsqueeze(-1), 0.0)  # (B, N, C)
    # Every pooled detection scored > 0 (the decoding's threshold), so "> 0" selects exactly its own label.
    kept_boxes, kept_scores, kept_labels, _ = multiclass_rotated_nms(
        boxes, class_scores, valid, score_threshold=0.0, iou_threshold=nms_threshold, max_num=max_num, sparse=True
    )
    ranked = kept_scores.tensor.masked_fill(~kept_scores.mask, -math.inf)  # (B, K')
    order = ranked.argsort(dim=1, descending=True, stable=True)  # (B, K'): by score, padding last
    return tuple(rb.with_tensor(_gather_rows(rb.tensor, order)) for rb in (kept_boxes, kept_scores, kept_labels))  # type: ignore[return-value]


def reference_merge(
    per_view: list[tuple[RaggedBatch, RaggedBatch, RaggedBatch]],
    num_classes: int,
    nms_threshold: float,
    max_num: int,
) -> list[dict[str, torch.Tensor]]:
    """``merge_aug_bboxes_3d`` one sample at a time (arguments as :func:`merge`).

    Returns:
        Per sample ``{"boxes", "scores", "labels"}`` by descending score (ties by pooled order).
    """
    boxes, scores, labels, valid = _pooled(per_view)
    out = []
    for b in range(boxes.shape[0]):
        rows = valid[b].nonzero()[:, 0]  # (N_b,)
        sample_boxes, sample_scores, sample_labels = boxes[b][rows], scores[b][rows], labels[b][rows]
        kept = []
        for c in range(num_classes):
            members = (sample_labels == c).nonzero()[:, 0]  # (n,)
            if members.numel() == 0:
                continue
            bev = sample_boxes[members][:, list(BEV_COLUMNS)]
            kept.append(members[reference_rotated_nms(bev, sample_scores[members], nms_threshold)])
        idx = torch.cat(kept) if kept else torch.zeros(0, dtype=torch.int64, device=boxes.device)
        idx = idx[sample_scores[idx].argsort(descending=True, stable=True)][:max_num]
        out.append({"boxes": sample_boxes[idx], "scores": sample_scores[idx], "labels": sample_labels[idx]})
    return out


@torch.no_grad()
def detect_tta(model: torch.nn.Module, batch: Batch, cfg: TTAConfig) -> tuple[RaggedBatch, RaggedBatch, RaggedBatch]:
    """A lidar detector's ``detect`` on every view of ``batch``, mapped back and merged (see the module docstring).

    Args:
        model: a :class:`~drivetrain.models.pointpillars.PointPillars` (or SSN); its path (:mod:`.paths`) decodes
            and merges (batched or per sample), its decode config gives the NMS threshold and ``max_num``.
        batch: a collated batch with points.
        cfg: the views.

    Returns:
        ``boxes (B, K, 9)``, ``scores``, ``labels`` (dataset class order) RaggedBatches.
    """
    points = batch.points
    per_view = []
    for params in views(cfg, points.tensor.shape[0], points.tensor.shape[1], points.device):
        moved, _, _ = apply_bev_aug(points, batch.gt_boxes, batch.gt_labels, params, _NO_FILTERS)
        boxes, scores, labels = model.detect(dataclasses.replace(batch, points=moved), tta=False)
        per_view.append((boxes.with_tensor(map_boxes_back(boxes.tensor, params)), scores, labels))
    decode = model.decode_config
    return model.path.merge(per_view, model.num_classes, decode.nms_threshold, decode.max_num)
