"""Rotated NMS: the batched paths equal the per-sample (per-class) references of mmcv / mmdet3d."""

from __future__ import annotations

import math

import pytest
import torch

from drivetrain.geometry.rotated_iou import rotated_bev_iou_pairwise
from drivetrain.geometry.rotated_nms import (
    batched_rotated_nms,
    multiclass_rotated_nms,
    reference_multiclass_rotated_nms,
    reference_rotated_nms,
)
from helpers.nosync import no_host_sync


def _scene(gen: torch.Generator, batch: int, num: int, spread: float = 8.0, dtype=torch.float64) -> torch.Tensor:
    """``(B, N, 5)`` BEV boxes crowded enough that many overlap."""
    centre = torch.rand(batch, num, 2, generator=gen, dtype=dtype) * spread  # (B, N, 2)
    size = torch.rand(batch, num, 2, generator=gen, dtype=dtype) * 3 + 0.3  # (B, N, 2)
    yaw = (torch.rand(batch, num, 1, generator=gen, dtype=dtype) - 0.5) * 2 * math.pi  # (B, N, 1)
    return torch.cat([centre, size, yaw], dim=-1)  # (B, N, 5)


def _tie_free_scores(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Distinct scores in (0, 1): a random permutation of a grid."""
    count = math.prod(shape)
    return ((torch.randperm(count, generator=gen).double() + 1) / (count + 1)).view(*shape)


def _reference_mask(boxes, scores, valid, threshold, groups=None) -> torch.Tensor:
    """Per sample and per group: reference_rotated_nms on the valid boxes, as a (B, N) keep mask."""
    keep = torch.zeros_like(valid)
    for b in range(boxes.shape[0]):
        group_ids = groups[b] if groups is not None else torch.zeros_like(scores[b], dtype=torch.int64)
        for g in group_ids[valid[b]].unique().tolist():
            members = (valid[b] & (group_ids == g)).nonzero()[:, 0]  # (n,)
            keep[b, members[reference_rotated_nms(boxes[b, members], scores[b, members], threshold)]] = True
    return keep


def test_reference_keeps_the_best_of_an_overlapping_pair():
    boxes = torch.tensor([[0.0, 0, 2, 1, 0], [0.1, 0, 2, 1, 0], [5, 5, 1, 1, 0], [0, 0, 2, 1, math.pi / 2]])
    scores = torch.tensor([0.8, 0.9, 0.7, 0.6])
    # Box 1 (best) suppresses box 0 (IoU 0.9); box 3 (the same box turned by 90°) has IoU ~0.33 with box 1.
    assert reference_rotated_nms(boxes, scores, 0.2).tolist() == [1, 2]
    assert reference_rotated_nms(boxes, scores, 0.5).tolist() == [1, 2, 3]
    assert reference_rotated_nms(boxes[:0], scores[:0], 0.5).shape == (0,)


def test_reference_suppression_is_strictly_greater_than_threshold():
    boxes = torch.tensor([[0.0, 0, 2, 1, 0], [0.5, 0, 2, 1, 0]], dtype=torch.float64)  # IoU 1.5 / 2.5 = 0.6
    scores = torch.tensor([0.9, 0.8], dtype=torch.float64)
    iou = rotated_bev_iou_pairwise(boxes, boxes)[0, 1].item()
    assert reference_rotated_nms(boxes, scores, iou).tolist() == [0, 1]  # equal IoU is not suppressed
    assert reference_rotated_nms(boxes, scores, iou - 1e-9).tolist() == [0]


@pytest.mark.parametrize("threshold", [0.0, 0.1, 0.2, 0.5, 1.0])
def test_batched_equals_per_sample_reference(gen, threshold):
    boxes = _scene(gen, 4, 40)  # (4, 40, 5)
    scores = _tie_free_scores(gen, 4, 40)  # (4, 40)
    valid = torch.rand(4, 40, generator=gen) < 0.8  # (4, 40)
    valid[2] = False  # an empty sample
    keep = batched_rotated_nms(boxes, scores, valid, threshold)  # (4, 40)
    assert torch.equal(keep, _reference_mask(boxes, scores, valid, threshold))
    assert not keep[2].any()
    if threshold == 1.0:
        assert torch.equal(keep, valid)  # IoU never exceeds 1
    elif threshold <= 0.2:
        assert (keep.sum(1) < valid.sum(1))[[0, 1, 3]].all()  # the scene is crowded enough to suppress


def test_groups_never_suppress_each_other(gen):
    boxes = _scene(gen, 3, 50)  # (3, 50, 5)
    scores = _tie_free_scores(gen, 3, 50)
    valid = torch.ones(3, 50, dtype=torch.bool)
    groups = torch.randint(0, 4, (3, 50), generator=gen)
    keep = batched_rotated_nms(boxes, scores, valid, 0.2, groups)  # (3, 50)
    assert torch.equal(keep, _reference_mask(boxes, scores, valid, 0.2, groups))
    # Identical boxes in different groups all survive; in one group only the best one does.
    same = boxes[:, :1].expand(3, 4, 5).clone()  # (3, 4, 5)
    four = torch.ones(3, 4, dtype=torch.bool)
    s4 = torch.tensor([[0.1, 0.4, 0.3, 0.2]]).expand(3, 4)
    assert batched_rotated_nms(same, s4, four, 0.5, torch.arange(4).expand(3, 4)).all()
    assert batched_rotated_nms(same, s4, four, 0.5).eq(torch.tensor([False, True, False, False])).all()


def test_all_but_one_suppressed_and_float32(gen):
    base = torch.tensor([1.0, 2.0, 3.0, 1.5, 0.4])
    boxes = (base + 0.01 * torch.randn(2, 30, 5, generator=gen)).float()  # (2, 30, 5) nearly identical
    scores = _tie_free_scores(gen, 2, 30).float()
    valid = torch.ones(2, 30, dtype=torch.bool)
    keep = batched_rotated_nms(boxes, scores, valid, 0.5)
    assert torch.equal(keep.sum(1), torch.tensor([1, 1]))
    assert torch.equal(keep, scores == scores.max(1, keepdim=True).values)
    assert torch.equal(keep, _reference_mask(boxes, scores, valid, 0.5))


def test_batched_has_no_host_sync(gen):
    boxes = _scene(gen, 2, 20)
    scores = _tie_free_scores(gen, 2, 20)
    valid = torch.ones(2, 20, dtype=torch.bool)
    groups = torch.randint(0, 3, (2, 20), generator=gen)
    three = torch.rand(2, 20, 3, generator=gen, dtype=torch.float64)
    full = torch.cat(
        [boxes[..., :2], torch.zeros_like(boxes[..., :1]), boxes[..., 2:4], boxes[..., 2:3], boxes[..., 4:]], -1
    )
    batched_rotated_nms(boxes, scores, valid, 0.2, groups)  # warm the cached constants
    with no_host_sync():
        batched_rotated_nms(boxes, scores, valid, 0.2, groups)
        multiclass_rotated_nms(full, three, valid, 0.3, 0.2, 5)


def _lidar_scene(gen: torch.Generator, batch: int, num: int, num_classes: int):
    bev = _scene(gen, batch, num)  # (B, N, 5)
    z = torch.rand(batch, num, 1, generator=gen, dtype=torch.float64)  # (B, N, 1)
    dz = torch.rand(batch, num, 1, generator=gen, dtype=torch.float64) + 1  # (B, N, 1)
    velo = torch.randn(batch, num, 2, generator=gen, dtype=torch.float64)  # (B, N, 2)
    boxes = torch.cat([bev[..., :2], z, bev[..., 2:4], dz, bev[..., 4:], velo], dim=-1)  # (B, N, 9)
    scores = _tie_free_scores(gen, batch, num, num_classes)  # (B, N, C)
    return boxes, scores


@pytest.mark.parametrize(
    ("score_threshold", "iou_threshold", "max_num"), [(0.05, 0.2, 500), (0.3, 0.0, 7), (0.5, 1.0, 20)]
)
def test_multiclass_equals_reference(gen, score_threshold, iou_threshold, max_num):
    boxes, scores = _lidar_scene(gen, 4, 50, 5)  # (4, 50, 9), (4, 50, 5)
    valid = torch.rand(4, 50, generator=gen) < 0.9
    valid[1] = False  # an empty sample
    scores[3, :, 2] = 0.01  # a class with no candidate in one sample
    out_boxes, out_scores, out_labels, out_indices = multiclass_rotated_nms(
        boxes, scores, valid, score_threshold, iou_threshold, max_num
    )
    expected = reference_multiclass_rotated_nms(boxes, scores, valid, score_threshold, iou_threshold, max_num)
    assert out_boxes.tensor.shape == (4, min(max_num, 250), 9)
    for b, ref in enumerate(expected):
        n = int(out_boxes.sizes[b])
        assert n == ref["boxes"].shape[0]
        assert torch.equal(out_indices.tensor[b, :n], ref["indices"])
        assert torch.equal(out_labels.tensor[b, :n], ref["labels"])
        assert torch.equal(out_scores.tensor[b, :n], ref["scores"])
        assert torch.equal(out_boxes.tensor[b, :n], ref["boxes"])
    assert out_boxes.sizes[1] == 0
    assert (out_scores.sizes <= max_num).all()


@pytest.mark.parametrize(("score_threshold", "iou_threshold"), [(0.05, 0.2), (0.5, 0.0)])
def test_a_greedy_pass_as_long_as_the_largest_class_equals_the_full_pass(gen, score_threshold, iou_threshold):
    boxes, scores = _lidar_scene(gen, 3, 60, 4)  # (3, 60, 9), (3, 60, 4)
    valid = torch.rand(3, 60, generator=gen) < 0.8
    candidates = (scores > score_threshold) & valid.unsqueeze(-1)  # (B, N, C)
    steps = int(candidates.sum(dim=1).max())
    assert 0 < steps < 60  # the shortened pass is shorter
    full = multiclass_rotated_nms(boxes, scores, valid, score_threshold, iou_threshold, 500)
    for given in (steps, steps + 5, 1000):
        short = multiclass_rotated_nms(boxes, scores, valid, score_threshold, iou_threshold, 500, max_candidates=given)
        for a, b in zip(full, short, strict=True):
            assert torch.equal(a.sizes, b.sizes) and torch.equal(a.tensor, b.tensor)
    # the count matters: with nothing suppressed (IoU is never > 1), one position fewer drops the last candidate
    # of the largest class
    every = multiclass_rotated_nms(boxes, scores, valid, score_threshold, 1.0, 500)
    cut = multiclass_rotated_nms(boxes, scores, valid, score_threshold, 1.0, 500, max_candidates=steps - 1)
    assert int(every[1].sizes.sum()) == int(candidates.sum())
    assert int(cut[1].sizes.sum()) < int(every[1].sizes.sum())


def test_multiclass_order_is_class_major_unless_truncated(gen):
    boxes, scores = _lidar_scene(gen, 1, 60, 3)
    valid = torch.ones(1, 60, dtype=torch.bool)
    _, out_scores, labels, _ = multiclass_rotated_nms(boxes, scores, valid, 0.05, 0.2, 500)
    n = int(out_scores.sizes[0])
    lab, sc = labels.tensor[0, :n], out_scores.tensor[0, :n]
    assert (lab[1:] >= lab[:-1]).all()  # class by class
    for c in range(3):
        assert (sc[lab == c].diff() < 0).all()  # each class by descending score
    _, top_scores, _, _ = multiclass_rotated_nms(boxes, scores, valid, 0.05, 0.2, n - 1)
    assert (top_scores.tensor[0].diff() < 0).all()  # truncated: one global descending order
    assert torch.equal(top_scores.tensor[0], sc.sort(descending=True).values[: n - 1])


def test_multiclass_same_box_kept_once_per_class(gen):
    boxes, _ = _lidar_scene(gen, 1, 1, 2)
    boxes = boxes.expand(1, 3, 9).clone()  # three copies of one box
    scores = torch.tensor([[[0.9, 0.2], [0.8, 0.7], [0.1, 0.6]]], dtype=torch.float64)
    valid = torch.ones(1, 3, dtype=torch.bool)
    _, out_scores, labels, indices = multiclass_rotated_nms(boxes, scores, valid, 0.05, 0.2, 500)
    assert labels.tensor[0].tolist()[:2] == [0, 1]
    assert indices.tensor[0].tolist()[:2] == [0, 1]
    assert out_scores.sizes.tolist() == [2]


def test_multiclass_rejects_bad_input():
    with pytest.raises(ValueError, match="D>=7"):
        multiclass_rotated_nms(torch.zeros(1, 3, 5), torch.zeros(1, 3, 2), torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="valid"):
        multiclass_rotated_nms(torch.zeros(1, 3, 7), torch.zeros(1, 3, 2), torch.ones(1, 3))
    with pytest.raises(ValueError, match="max_num"):
        multiclass_rotated_nms(
            torch.zeros(1, 3, 7), torch.zeros(1, 3, 2), torch.ones(1, 3, dtype=torch.bool), max_num=0
        )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_reference(gen):
    boxes, scores = _lidar_scene(gen, 2, 200, 4)
    valid = torch.ones(2, 200, dtype=torch.bool)
    out = multiclass_rotated_nms(boxes.cuda(), scores.cuda(), valid.cuda(), 0.05, 0.2, 100)
    expected = reference_multiclass_rotated_nms(boxes, scores, valid, 0.05, 0.2, 100)
    for b, ref in enumerate(expected):
        n = int(out[0].sizes[b])
        assert torch.equal(out[3].tensor[b, :n].cpu(), ref["indices"])
        assert torch.equal(out[2].tensor[b, :n].cpu(), ref["labels"])


@pytest.mark.slow
def test_multiclass_equals_reference_at_published_size(gen):
    # nms_pre 1000 boxes, 10 classes, IoU 0.2, score 0.05, max 500 (PointPillars nuScenes test config).
    boxes, scores = _lidar_scene(gen, 2, 1000, 10)
    boxes[..., :2] *= 8  # spread to ~64 m so the density is nuScenes-like
    scores = scores**4  # most scores small, as after a sigmoid
    valid = torch.ones(2, 1000, dtype=torch.bool)
    out_boxes, out_scores, out_labels, out_indices = multiclass_rotated_nms(boxes, scores, valid)
    for b, ref in enumerate(reference_multiclass_rotated_nms(boxes, scores, valid)):
        n = int(out_boxes.sizes[b])
        assert torch.equal(out_indices.tensor[b, :n], ref["indices"])
        assert torch.equal(out_labels.tensor[b, :n], ref["labels"])
        assert torch.equal(out_scores.tensor[b, :n], ref["scores"])
