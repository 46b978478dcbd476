"""Tests for drivetrain.match.max_iou: the batched max-IoU assigner equals the per-sample (per-class) reference."""

from __future__ import annotations

import pytest
import torch

from drivetrain.match.max_iou import (
    MaxIoUConfig,
    anchor_thresholds,
    batched_max_iou_assign,
    reference_max_iou_assign,
    reference_max_iou_assign_per_class,
)
from drivetrain.models.pointpillars.anchors import AnchorConfig, grid_anchors, per_class_anchors
from drivetrain.models.pointpillars.recipe import NUS_PP_ANCHORS, NUS_PP_ASSIGNER, NUS_SSN_ASSIGNERS
from drivetrain.ragged import RaggedBatch
from helpers.nosync import no_host_sync

# sizes: a car, a pedestrian and a square (its two rotations tie exactly against any GT)
TINY = AnchorConfig(
    ranges=((-16, -16, -1.8, 16, 16, -1.8), (-16, -16, -1.6, 16, 16, -1.6), (-16, -16, -1.7, 16, 16, -1.7)),
    sizes=((3.9, 1.6, 1.56), (0.8, 0.6, 1.73), (1.0, 1.0, 1.0)),
)
SSN_CFGS = (NUS_SSN_ASSIGNERS[5], NUS_SSN_ASSIGNERS[2], NUS_SSN_ASSIGNERS[0])  # car, pedestrian, bicycle
PER_CLASS_SIZES = ((8, 8), (8, 6), (4, 4))


def box(x: float, y: float, dx: float, dy: float, yaw: float = 0.0) -> list[float]:
    return [x, y, -1.0, dx, dy, 1.5, yaw, 0.0, 0.0]


def scene(anchors: torch.Tensor, num_gt: int, num_classes: int, gen: torch.Generator):
    """GTs near anchors (jittered copies), exact anchor copies, a duplicate GT and a few stray boxes."""
    if num_gt == 0:
        return torch.zeros(0, 9), torch.zeros(0, dtype=torch.long)
    picks = anchors[torch.randint(0, anchors.shape[0], (num_gt,), generator=gen)].clone()
    jitter = torch.randn(num_gt, 7, generator=gen) * torch.tensor([0.4, 0.4, 0.1, 0.3, 0.2, 0.1, 0.3])
    boxes = picks.clone()
    boxes[:, :7] += jitter
    boxes[:, 3:6] = boxes[:, 3:6].abs() + 0.1
    exact = torch.rand(num_gt, generator=gen) < 0.3
    boxes[exact] = picks[exact]  # anchors equal to a GT: IoU 1, ties with square anchors' other rotation
    if num_gt >= 3:
        boxes[2] = boxes[0]  # duplicate GT: ties across GTs (argmax takes the first, step 4 the last)
        boxes[-1, :2] = torch.rand(2, generator=gen) * 60 - 30  # a stray box, maybe outside the range
    labels = torch.randint(0, num_classes, (num_gt,), generator=gen)
    labels[2 % num_gt] = labels[0]
    return boxes, labels


def batch_of(samples):
    boxes = RaggedBatch.from_list([s[0] for s in samples])
    labels = RaggedBatch.from_list([s[1] for s in samples])
    return boxes, labels


# ---------------------------------------------------------------------- reference by hand
def test_reference_hand_worked_steps():
    cfg = MaxIoUConfig(0.6, 0.3, 0.3)
    anchors = torch.tensor([box(0, 0, 4, 2), box(1, 0, 4, 2), box(2, 0, 4, 2), box(3, 0, 4, 2), box(10, 0, 4, 2)])
    gt = torch.tensor([box(0, 0, 4, 2), box(20, 0, 4, 2), box(2.5, 0, 4, 2)])
    # IoU GT0: 1, 0.6, 1/3, 1/7, 0. GT2: 3/13, 5/11, 7/9, 7/9, 0 → anchors 2 and 3 tie on GT2's best.
    assigned = reference_max_iou_assign(anchors, gt, torch.zeros(3, dtype=torch.long), cfg)
    assert assigned.tolist() == [1, 1, 3, 3, 0]


def test_reference_low_quality_overrides_best_gt():
    cfg = MaxIoUConfig(0.6, 0.3, 0.3)
    anchors = torch.tensor([box(0, 0, 4, 2), box(0.2, 0, 4, 2)])
    gt = torch.tensor([box(0, 0, 4, 2), box(0.9, 0, 4, 2)])
    # anchor 1: IoU 0.905 with GT0 (its best, step 3) but GT1's best anchor (0.702): step 4 gives it GT1
    assert reference_max_iou_assign(anchors, gt, torch.zeros(2, dtype=torch.long), cfg).tolist() == [1, 2]
    first_only = MaxIoUConfig(0.6, 0.3, 0.3, gt_max_assign_all=False)
    assert reference_max_iou_assign(anchors, gt, torch.zeros(2, dtype=torch.long), first_only).tolist() == [1, 2]
    no_low = MaxIoUConfig(0.6, 0.3, 0.3, match_low_quality=False)
    assert reference_max_iou_assign(anchors, gt, torch.zeros(2, dtype=torch.long), no_low).tolist() == [1, 1]


def test_reference_zero_gt_is_all_negative():
    anchors = grid_anchors(TINY, (2, 2))
    out = reference_max_iou_assign(anchors, torch.zeros(0, 9), torch.zeros(0, dtype=torch.long), NUS_PP_ASSIGNER)
    assert out.tolist() == [0] * anchors.shape[0]


def test_per_class_reference_maps_to_sample_gt_index():
    anchors = torch.tensor([box(0, 0, 4, 2), box(10, 0, 4, 2), box(0, 0, 4, 2)])
    classes = torch.tensor([0, 0, 1])
    gt = torch.tensor([box(10, 0, 4, 2), box(0, 0, 4, 2)])
    labels = torch.tensor([1, 0])  # GT1 is class 0: anchors of class 0 only see it
    cfgs = (MaxIoUConfig(0.6, 0.3, 0.3), MaxIoUConfig(0.6, 0.3, 0.3))
    out = reference_max_iou_assign_per_class(anchors, classes, gt, labels, cfgs)
    assert out.tolist() == [2, 0, 0]  # anchor 2 (class 1) vs GT0 (class 1, 10 m away): negative


def test_config_forms():
    assert MaxIoUConfig(0.6, 0).neg_range == (0.0, 0.0)
    assert isinstance(MaxIoUConfig(0.6, 0).neg_iou_thr, float)  # the original would skip step 2 for an int
    assert MaxIoUConfig(0.6, (0.1, 0.3)).neg_range == (0.1, 0.3)
    with pytest.raises(ValueError):
        MaxIoUConfig(0.6, (0.1, 0.2, 0.3))
    table = [(c.pos_iou_thr, c.neg_iou_thr, c.min_pos_iou) for c in NUS_SSN_ASSIGNERS]
    assert table == [
        (0.5, 0.35, 0.35),
        (0.5, 0.3, 0.3),
        (0.6, 0.4, 0.4),
        (0.6, 0.4, 0.4),
        (0.55, 0.4, 0.4),
        (0.6, 0.45, 0.45),
        (0.55, 0.4, 0.4),
        (0.5, 0.35, 0.35),
        (0.55, 0.4, 0.4),
        (0.5, 0.35, 0.35),
    ]


# ---------------------------------------------------------------------- batched == reference
@pytest.mark.parametrize("num_gts", [[5], [0], [7, 0, 12], [3, 3, 1]])
@pytest.mark.parametrize("cfg", [NUS_PP_ASSIGNER, MaxIoUConfig(0.5, (0.1, 0.4), 0.2)])
def test_class_agnostic_batched_equals_reference(num_gts, cfg, gen):
    anchors = grid_anchors(TINY, (8, 8))  # (384, 9)
    samples = [scene(anchors, n, 3, gen) for n in num_gts]
    gt_boxes, gt_labels = batch_of(samples)
    th = anchor_thresholds(cfg, num_anchors=anchors.shape[0])
    expected = torch.stack([reference_max_iou_assign(anchors, b, lab, cfg) for b, lab in samples])
    got = batched_max_iou_assign(anchors, gt_boxes, gt_labels, th)
    assert got.shape == (len(num_gts), anchors.shape[0]) and got.dtype == torch.long
    assert torch.equal(got, expected)
    for chunk in (37, 384, 1000):
        assert torch.equal(batched_max_iou_assign(anchors, gt_boxes, gt_labels, th, chunk=chunk), expected)
    if sum(num_gts):
        assert (expected > 0).any() and (expected == 0).any()


@pytest.mark.parametrize("num_gts", [[6], [9, 0, 4], [0, 0]])
def test_per_class_batched_equals_reference(num_gts, gen):
    anchors, classes = per_class_anchors(TINY, PER_CLASS_SIZES)
    samples = [scene(anchors, n, 3, gen) for n in num_gts]
    gt_boxes, gt_labels = batch_of(samples)
    th = anchor_thresholds(SSN_CFGS, anchor_classes=classes)
    expected = torch.stack(
        [reference_max_iou_assign_per_class(anchors, classes, b, lab, SSN_CFGS) for b, lab in samples]
    )
    got = batched_max_iou_assign(anchors, gt_boxes, gt_labels, th, anchor_classes=classes)
    assert torch.equal(got, expected)
    for chunk in (13, 257):
        chunked = batched_max_iou_assign(anchors, gt_boxes, gt_labels, th, anchor_classes=classes, chunk=chunk)
        assert torch.equal(chunked, expected)


def test_ties_follow_the_loop_order():
    """Square anchors tie across rotations; duplicate GTs tie: argmax takes the first GT, step 4 the last."""
    anchors = grid_anchors(TINY, (4, 4))
    square = anchors[2 * 2 : 2 * 2 + 2]  # cell (0, 0), size 2, both rotations
    gt = torch.stack([square[0], square[0], anchors[10]])  # GT0 == GT1 == both square anchors' footprint
    labels = torch.zeros(3, dtype=torch.long)
    expected = reference_max_iou_assign(anchors, gt, labels, NUS_PP_ASSIGNER)
    assert expected[4].item() == 2 and expected[5].item() == 2  # both rotations, the later duplicate
    gt_boxes, gt_labels = batch_of([(gt, labels)])
    th = anchor_thresholds(NUS_PP_ASSIGNER, num_anchors=anchors.shape[0])
    assert torch.equal(batched_max_iou_assign(anchors, gt_boxes, gt_labels, th)[0], expected)
    no_low = MaxIoUConfig(0.6, 0.3, 0.3, match_low_quality=False)
    expected = reference_max_iou_assign(anchors, gt, labels, no_low)
    assert expected[4].item() == 1  # step 3 alone: the first of the tied GTs
    th = anchor_thresholds(no_low, num_anchors=anchors.shape[0])
    for chunk in (1, 5):
        assert torch.equal(batched_max_iou_assign(anchors, gt_boxes, gt_labels, th, chunk=chunk)[0], expected)


def test_all_samples_without_gt():
    anchors = grid_anchors(TINY, (2, 2))
    gt_boxes, gt_labels = batch_of([(torch.zeros(0, 9), torch.zeros(0, dtype=torch.long))] * 2)
    th = anchor_thresholds(NUS_PP_ASSIGNER, num_anchors=anchors.shape[0])
    assert batched_max_iou_assign(anchors, gt_boxes, gt_labels, th).tolist() == [[0] * 24] * 2


def test_batched_makes_no_host_sync(gen):
    anchors, classes = per_class_anchors(TINY, PER_CLASS_SIZES)
    gt_boxes, gt_labels = batch_of([scene(anchors, n, 3, gen) for n in (4, 0, 7)])
    th = anchor_thresholds(SSN_CFGS, anchor_classes=classes)
    th_agnostic = anchor_thresholds(NUS_PP_ASSIGNER, num_anchors=anchors.shape[0])
    _ = gt_boxes.mask
    with no_host_sync():
        batched_max_iou_assign(anchors, gt_boxes, gt_labels, th, anchor_classes=classes, chunk=100)
        batched_max_iou_assign(anchors, gt_boxes, gt_labels, th_agnostic)


def test_input_checks():
    anchors = grid_anchors(TINY, (2, 2))
    gt_boxes, gt_labels = batch_of([(torch.zeros(1, 9), torch.zeros(1, dtype=torch.long))])
    th = anchor_thresholds(NUS_PP_ASSIGNER, num_anchors=5)
    with pytest.raises(ValueError, match="thresholds"):
        batched_max_iou_assign(anchors, gt_boxes, gt_labels, th)
    with pytest.raises(ValueError, match="gt_max_assign_all"):
        anchor_thresholds(MaxIoUConfig(0.6, 0.3, gt_max_assign_all=False), num_anchors=5)
    with pytest.raises(ValueError, match="anchor_classes"):
        anchor_thresholds(SSN_CFGS, num_anchors=5)


@pytest.mark.slow
def test_nuscenes_scale_chunked_equals_reference(gen):
    anchors = grid_anchors(NUS_PP_ANCHORS, (200, 200))
    samples = [scene(anchors, n, 10, gen) for n in (30, 0)]
    gt_boxes, gt_labels = batch_of(samples)
    th = anchor_thresholds(NUS_PP_ASSIGNER, num_anchors=anchors.shape[0])
    expected = torch.stack([reference_max_iou_assign(anchors, b, lab, NUS_PP_ASSIGNER) for b, lab in samples])
    assert torch.equal(batched_max_iou_assign(anchors, gt_boxes, gt_labels, th, chunk=65536), expected)
