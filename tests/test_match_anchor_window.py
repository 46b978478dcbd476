"""Tests for drivetrain.match.anchor_window: the windowed assignment equals the dense batched one (and so the
per-sample original) exactly, including ties, GTs that overlap no anchor, GTs outside the grid and thresholds
at or below zero; the layouts address every anchor once; the assignment reads the host once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drivetrain.geometry.bev_iou import nearest_bev_boxes
from drivetrain.match.anchor_window import (
    window_pair_total,
    windowed_max_iou_assign,
    windowed_max_iou_assign_with_pairs,
)
from drivetrain.match.max_iou import (
    MaxIoUConfig,
    anchor_thresholds,
    batched_max_iou_assign,
    reference_max_iou_assign,
)
from drivetrain.models.pointpillars.anchors import (
    AnchorConfig,
    grid_anchors,
    grid_layout,
    per_class_anchors,
    per_class_layout,
)
from drivetrain.models.pointpillars.recipe import (
    NUS_PP_ANCHORS,
    NUS_PP_ASSIGNER,
    NUS_SSN_ANCHORS,
    NUS_SSN_ASSIGNERS,
    NUS_SSN_FEATURE_SIZES,
)
from helpers.nosync import count_host_syncs
from test_match_max_iou import PER_CLASS_SIZES, SSN_CFGS, TINY, batch_of, box, scene

ROTATED = AnchorConfig(  # an odd rotation and different ranges per size: cell origins and extents per type
    ranges=((-10, -8, -1.8, 10, 8, -1.8), (-12, -12, -1.6, 12, 12, -1.6)),
    sizes=((4.0, 1.5, 1.5), (0.8, 0.6, 1.7)),
    rotations=(0.0, 0.9, 1.57, -2.5),
)
CONFIGS = [
    NUS_PP_ASSIGNER,
    MaxIoUConfig(0.5, (0.1, 0.4), 0.2),
    MaxIoUConfig(0.5, 0.3, 0.0),  # min_pos_iou 0: a GT overlapping nothing ties with every anchor at 0
    MaxIoUConfig(0.0, (-1.0, 0.0), 0.0),  # thresholds at 0: the zero-IoU anchors are positive / never negative
    MaxIoUConfig(0.6, 0.3, 0.3, match_low_quality=False),
]


def _layout_checks(anchors: torch.Tensor, grid) -> None:
    seen = torch.zeros(anchors.shape[0], dtype=torch.long)
    rect = nearest_bev_boxes(anchors)  # (A, 4)
    for t in range(grid.num_types):
        iy, ix = torch.meshgrid(torch.arange(grid.ny[t]), torch.arange(grid.nx[t]), indexing="ij")
        index = (grid.base[t] + iy * grid.stride_y[t] + ix * grid.stride_x[t]).flatten()
        seen.index_add_(0, index, torch.ones_like(index))
        centre_x = grid.x0[t] + ix.flatten() * grid.step_x[t]
        centre_y = grid.y0[t] + iy.flatten() * grid.step_y[t]
        torch.testing.assert_close(anchors[index, 0], centre_x.float(), rtol=0, atol=1e-4)
        torch.testing.assert_close(anchors[index, 1], centre_y.float(), rtol=0, atol=1e-4)
        half = (rect[index, 2:] - rect[index, :2]) / 2  # (n, 2)
        torch.testing.assert_close(half[:, 0], torch.full_like(half[:, 0], grid.half_x[t]), rtol=0, atol=1e-5)
        torch.testing.assert_close(half[:, 1], torch.full_like(half[:, 1], grid.half_y[t]), rtol=0, atol=1e-5)
    assert seen.eq(1).all(), "every anchor is addressed by exactly one (type, cell)"
    assert grid.num_anchors == anchors.shape[0]


@pytest.mark.parametrize("cfg", [TINY, ROTATED])
def test_grid_layout_addresses_every_anchor_once_at_its_cell(cfg):
    _layout_checks(grid_anchors(cfg, (6, 5)), grid_layout(cfg, (6, 5)))


def test_per_class_layout_addresses_every_anchor_once_at_its_cell():
    anchors, classes = per_class_anchors(TINY, PER_CLASS_SIZES)
    grid = per_class_layout(TINY, PER_CLASS_SIZES)
    _layout_checks(anchors, grid)
    for t in range(grid.num_types):  # each type's anchors are of its class
        assert classes[grid.base[t]] == grid.group[t]


def _awkward(anchors: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """GTs that stress the windows: a huge one, one far outside the grid, a tiny one between anchors, one
    exactly on an anchor, an across-the-axes one (yaw π/2)."""
    boxes = torch.tensor(
        [
            box(0.3, -0.2, 14.0, 3.0, 0.2),  # wider than any anchor: a large window
            box(80.0, -70.0, 2.0, 1.0),  # outside the grid: overlaps nothing
            box(0.05, 0.05, 0.01, 0.01),  # tiny: a small best IoU
            box(3.0, 3.0, 4.0, 1.0, 1.5708),  # across the axes
        ]
    )
    exact = anchors[torch.randint(0, anchors.shape[0], (1,), generator=gen)]  # (1, 9): IoU 1 with an anchor
    boxes = torch.cat([boxes, exact])
    return boxes, torch.randint(0, 3, (boxes.shape[0],), generator=gen)


@pytest.mark.parametrize("num_gts", [[5], [0], [7, 0, 12], [3, 3, 1]])
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("anchor_cfg", [TINY, ROTATED])
def test_class_agnostic_windows_equal_the_dense_assignment(num_gts, cfg, anchor_cfg, gen):
    anchors = grid_anchors(anchor_cfg, (8, 8))
    samples = [scene(anchors, n, 3, gen) for n in num_gts] + [_awkward(anchors, gen)]
    gt_boxes, gt_labels = batch_of(samples)
    th = anchor_thresholds(cfg, num_anchors=anchors.shape[0])
    expected = batched_max_iou_assign(anchors, gt_boxes, gt_labels, th)
    got = windowed_max_iou_assign(anchors, grid_layout(anchor_cfg, (8, 8)), gt_boxes, gt_labels, th)
    assert got.dtype == torch.long and torch.equal(got, expected)
    if cfg is NUS_PP_ASSIGNER:  # and the original, per sample
        for b, (boxes, labels) in enumerate(samples):
            assert torch.equal(got[b], reference_max_iou_assign(anchors, boxes, labels, cfg))


@pytest.mark.parametrize("num_gts", [[6], [9, 0, 4], [0, 0]])
@pytest.mark.parametrize("zero_min_pos", [False, True])
def test_per_class_windows_equal_the_dense_assignment(num_gts, zero_min_pos, gen):
    anchors, classes = per_class_anchors(TINY, PER_CLASS_SIZES)
    samples = [scene(anchors, n, 3, gen) for n in num_gts] + [_awkward(anchors, gen)]
    gt_boxes, gt_labels = batch_of(samples)
    cfgs = tuple(MaxIoUConfig(c.pos_iou_thr, c.neg_iou_thr, 0.0) for c in SSN_CFGS) if zero_min_pos else SSN_CFGS
    th = anchor_thresholds(cfgs, anchor_classes=classes)
    expected = batched_max_iou_assign(anchors, gt_boxes, gt_labels, th, anchor_classes=classes)
    grid = per_class_layout(TINY, PER_CLASS_SIZES)
    got = windowed_max_iou_assign(anchors, grid, gt_boxes, gt_labels, th, anchor_classes=classes)
    assert torch.equal(got, expected)


def test_ties_follow_the_loop_order_in_windows():
    anchors = grid_anchors(TINY, (4, 4))
    square = anchors[2 * 2 : 2 * 2 + 2]
    gt = torch.stack([square[0], square[0], anchors[10]])
    labels = torch.zeros(3, dtype=torch.long)
    gt_boxes, gt_labels = batch_of([(gt, labels)])
    for cfg in (NUS_PP_ASSIGNER, MaxIoUConfig(0.6, 0.3, 0.3, match_low_quality=False)):
        th = anchor_thresholds(cfg, num_anchors=anchors.shape[0])
        expected = reference_max_iou_assign(anchors, gt, labels, cfg)
        got = windowed_max_iou_assign(anchors, grid_layout(TINY, (4, 4)), gt_boxes, gt_labels, th)
        assert torch.equal(got[0], expected)


@pytest.mark.slow  # ~4 s; windows equal the dense assignment: the tests above, at a small grid
def test_nuscenes_scale_windows_equal_the_dense_assignment(gen):
    """The published anchor sets (560k and 500k anchors) with nuScenes-like scenes of 30 GTs."""
    anchors = grid_anchors(NUS_PP_ANCHORS, (200, 200))
    samples = [scene(anchors, n, 10, gen) for n in (30, 0, 12)]
    gt_boxes, gt_labels = batch_of(samples)
    th = anchor_thresholds(NUS_PP_ASSIGNER, num_anchors=anchors.shape[0])
    expected = batched_max_iou_assign(anchors, gt_boxes, gt_labels, th, chunk=65536)
    got = windowed_max_iou_assign(anchors, grid_layout(NUS_PP_ANCHORS, (200, 200)), gt_boxes, gt_labels, th)
    assert torch.equal(got, expected) and (got > 0).sum() > 30

    anchors, classes = per_class_anchors(NUS_SSN_ANCHORS, NUS_SSN_FEATURE_SIZES)
    samples = [scene(anchors, n, 10, gen) for n in (30, 5)]
    gt_boxes, gt_labels = batch_of(samples)
    th = anchor_thresholds(NUS_SSN_ASSIGNERS, anchor_classes=classes)
    expected = batched_max_iou_assign(anchors, gt_boxes, gt_labels, th, anchor_classes=classes, chunk=65536)
    grid = per_class_layout(NUS_SSN_ANCHORS, NUS_SSN_FEATURE_SIZES)
    got = windowed_max_iou_assign(anchors, grid, gt_boxes, gt_labels, th, anchor_classes=classes)
    assert torch.equal(got, expected) and (got > 0).sum() > 20


def test_the_windows_read_the_host_once(gen):
    anchors, classes = per_class_anchors(TINY, PER_CLASS_SIZES)
    gt_boxes, gt_labels = batch_of([scene(anchors, n, 3, gen) for n in (4, 0, 7)])
    th = anchor_thresholds(SSN_CFGS, anchor_classes=classes)
    grid = per_class_layout(TINY, PER_CLASS_SIZES)
    _ = gt_boxes.mask
    grid.index(anchors.device), grid.reach(anchors.device)  # once per device
    with count_host_syncs() as calls:
        windowed_max_iou_assign(anchors, grid, gt_boxes, gt_labels, th, anchor_classes=classes)
    assert calls == ["__int__"]  # the number of window pairs, which sizes the pair tensors


def test_a_grid_of_other_anchors_is_refused(gen):
    anchors = grid_anchors(TINY, (4, 4))
    gt_boxes, gt_labels = batch_of([scene(anchors, 3, 3, gen)])
    th = anchor_thresholds(NUS_PP_ASSIGNER, num_anchors=anchors.shape[0])
    with pytest.raises(ValueError, match="grid: addresses"):
        windowed_max_iou_assign(anchors, grid_layout(TINY, (4, 5)), gt_boxes, gt_labels, th)


def _pair_set(pairs) -> set[tuple[int, int]]:
    return set(zip(pairs.flat.tolist(), pairs.gt.tolist(), strict=True))


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("num_gts", [[5, 0, 9], [0, 0]])
def test_window_pairs_hold_every_positive_with_its_gt(cfg, num_gts, gen):
    """The loss sums the box terms over the pairs: every positive must be the pair of its anchor and its GT —
    unless an anchor can be positive at IoU 0, when the assignment returns no pairs."""
    anchors = grid_anchors(ROTATED, (8, 8))
    samples = [scene(anchors, n, 3, gen) for n in num_gts] + [_awkward(anchors, gen)]
    gt_boxes, gt_labels = batch_of(samples)
    th = anchor_thresholds(cfg, num_anchors=anchors.shape[0])
    grid = grid_layout(ROTATED, (8, 8))
    got, pairs = windowed_max_iou_assign_with_pairs(anchors, grid, gt_boxes, gt_labels, th)
    assert torch.equal(got, windowed_max_iou_assign(anchors, grid, gt_boxes, gt_labels, th))
    zero_positive = cfg.pos_iou_thr <= 0 or (cfg.min_pos_iou <= 0 and cfg.match_low_quality)
    assert th.zero_iou_positive == zero_positive
    if zero_positive:
        assert pairs is None
        return
    b, a = torch.nonzero(got > 0, as_tuple=True)
    positives = set(zip((b * anchors.shape[0] + a).tolist(), (got[b, a] - 1).tolist(), strict=True))
    assert positives and positives <= _pair_set(pairs)
    assert pairs.flat.shape == pairs.gt.shape and pairs.flat.dtype == pairs.gt.dtype == torch.long


def test_per_class_window_pairs_hold_every_positive_and_the_host_is_read_once(gen):
    anchors, classes = per_class_anchors(TINY, PER_CLASS_SIZES)
    gt_boxes, gt_labels = batch_of([scene(anchors, n, 3, gen) for n in (8, 0, 6)])
    th = anchor_thresholds(SSN_CFGS, anchor_classes=classes)
    grid = per_class_layout(TINY, PER_CLASS_SIZES)
    _ = gt_boxes.mask
    grid.index(anchors.device), grid.reach(anchors.device)
    with count_host_syncs() as calls:
        got, pairs = windowed_max_iou_assign_with_pairs(anchors, grid, gt_boxes, gt_labels, th, anchor_classes=classes)
    assert calls == ["__int__"]
    b, a = torch.nonzero(got > 0, as_tuple=True)
    positives = set(zip((b * anchors.shape[0] + a).tolist(), (got[b, a] - 1).tolist(), strict=True))
    assert positives and positives <= _pair_set(pairs)
    # no GT: no pairs, and an empty list rather than None
    empty_boxes, empty_labels = batch_of([scene(anchors, 0, 3, gen)] * 2)
    got, pairs = windowed_max_iou_assign_with_pairs(
        anchors, grid, empty_boxes, empty_labels, th, anchor_classes=classes
    )
    assert not bool(got.any()) and pairs is not None and pairs.flat.numel() == 0


@pytest.mark.parametrize("cfg", CONFIGS)
def test_static_pair_slots_give_the_same_assignment_and_pairs_then_unused_slots(cfg, gen):
    """``num_pairs`` at or above :func:`window_pair_total`: the host path's assignment, its pairs first in their
    order, the unused slots on the spare anchor ``B·A``; and no host read."""
    anchors = grid_anchors(ROTATED, (8, 8))
    gt_boxes, gt_labels = batch_of([scene(anchors, n, 3, gen) for n in (5, 0, 9)] + [_awkward(anchors, gen)])
    th = anchor_thresholds(cfg, num_anchors=anchors.shape[0])
    grid = grid_layout(ROTATED, (8, 8))
    want, want_pairs = windowed_max_iou_assign_with_pairs(anchors, grid, gt_boxes, gt_labels, th)
    total = window_pair_total(anchors, grid, gt_boxes, gt_labels, th)
    spare = gt_boxes.shape[0] * anchors.shape[0]
    for extra in (0, 37):
        slots = int(total) + extra
        with count_host_syncs() as calls:
            got, pairs = windowed_max_iou_assign_with_pairs(anchors, grid, gt_boxes, gt_labels, th, num_pairs=slots)
        assert calls == [] and torch.equal(got, want)
        assert torch.equal(windowed_max_iou_assign(anchors, grid, gt_boxes, gt_labels, th, num_pairs=int(total)), want)
        if want_pairs is None:
            assert pairs is None
            continue
        assert int(total) == want_pairs.flat.numel() > 0 and pairs.flat.numel() == int(total) + extra
        assert torch.equal(pairs.flat[: int(total)], want_pairs.flat) and torch.equal(
            pairs.gt[: int(total)], want_pairs.gt
        )
        assert (pairs.flat[int(total) :] == spare).all()


def test_a_threshold_that_rounds_to_zero_in_float32_counts_as_zero():
    assert anchor_thresholds(MaxIoUConfig(1e-50, 0.3, 0.3), num_anchors=4).zero_iou_positive
    assert not anchor_thresholds(
        MaxIoUConfig(0.6, 0.3, 1e-50, match_low_quality=False), num_anchors=4
    ).zero_iou_positive
    assert anchor_thresholds(MaxIoUConfig(0.6, 0.3, 1e-50), num_anchors=4).zero_iou_positive


@pytest.mark.parametrize("cfg", CONFIGS)
def test_windows_keep_pairs_that_overlap_by_an_ulp(cfg):
    """The window bound's margin is an eighth of a cell plus 2^-16 of the coordinates: GTs slid ulp by ulp
    across the edge of an anchor (no overlap, exactly touching, overlapping by a few float32 ulps), on every
    side, at the grid's border and inside it, give the dense assignment — a missed tiny overlap would change
    a GT's best IoU from ~1e-7 to 0 and so its low-quality matches."""
    anchors = grid_anchors(ROTATED, (8, 8))
    rect = nearest_bev_boxes(anchors)  # (A, 4) x_lo, y_lo, x_hi, y_hi
    boxes = []
    for a in (0, 5, 37, anchors.shape[0] - 1):  # a border cell, inner cells, the last anchor
        for side in range(4):  # the GT's edge slides across the anchor's side: x_lo, y_lo, x_hi, y_hi
            axis, edge = side % 2, float(rect[a, side])
            toward = np.float32(np.inf if side < 2 else -np.inf)  # inward across the anchor's edge
            value = np.float32(edge)
            for _ in range(6):
                value = np.nextafter(value, -toward)  # start 6 ulps outside
            for _ in range(12):
                gt = anchors[a].clone()
                size = 1.0  # a power of two: the GT rectangle's half size is exact
                centre = float(value) + (-size / 2 if side < 2 else size / 2)  # GT edge at `value`
                gt[axis] = centre
                gt[3 + axis], gt[4 - axis], gt[6] = size, 0.5, 0.0
                boxes.append(gt)
                value = np.nextafter(value, toward)
    samples = [(b[None], torch.zeros(1, dtype=torch.long)) for b in boxes]
    gt_boxes, gt_labels = batch_of(samples)
    th = anchor_thresholds(cfg, num_anchors=anchors.shape[0])
    expected = batched_max_iou_assign(anchors, gt_boxes, gt_labels, th)
    got = windowed_max_iou_assign(anchors, grid_layout(ROTATED, (8, 8)), gt_boxes, gt_labels, th)
    assert torch.equal(got, expected)
