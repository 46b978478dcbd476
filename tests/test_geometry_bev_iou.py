"""Tests for drivetrain.geometry.bev_iou: nearest-BEV IoU as mmdetection3d's BboxOverlapsNearest3D."""

from __future__ import annotations

import math

import pytest
import torch

from drivetrain.geometry.bev_iou import limit_period, nearest_bev_boxes, nearest_bev_iou
from helpers.boxes import random_boxes3d


def box(x: float, y: float, dx: float, dy: float, yaw: float = 0.0, z: float = 0.0, dz: float = 1.5) -> list[float]:
    return [x, y, z, dx, dy, dz, yaw, 0.0, 0.0]


def original_style_iou(gt: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """The original's steps for one pair of lists: nearest BEV (rows, then corners), (G, A, 2) corner tensors."""

    def bev(b: torch.Tensor) -> torch.Tensor:
        b = b.float()[:, [0, 1, 3, 4, 6]]
        rot = torch.abs(b[:, -1] - torch.floor(b[:, -1] / math.pi + 0.5) * math.pi)
        xywh = torch.where((rot > math.pi / 4)[..., None], b[:, [0, 1, 3, 2]], b[:, :4])
        return torch.cat([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], dim=-1)

    b1, b2 = bev(gt), bev(anchors)
    area1 = (b1[..., 2] - b1[..., 0]) * (b1[..., 3] - b1[..., 1])
    area2 = (b2[..., 2] - b2[..., 0]) * (b2[..., 3] - b2[..., 1])
    lt = torch.max(b1[..., :, None, :2], b2[..., None, :, :2])
    rb = torch.min(b1[..., :, None, 2:], b2[..., None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[..., 0] * wh[..., 1]
    union = torch.max(area1[..., None] + area2[..., None, :] - overlap, overlap.new_tensor([1e-6]))
    return overlap / union


def test_rotation_by_half_pi_swaps_dims():
    a = torch.tensor([box(0, 0, 4, 2)])
    b = torch.tensor([box(0, 0, 4, 2, yaw=math.pi / 2)])
    assert nearest_bev_boxes(b).tolist() == [[-1.0, -2.0, 1.0, 2.0]]
    assert nearest_bev_iou(a, b).item() == pytest.approx(4 / 12)  # 2×2 overlap, 8 + 8 − 4 union


@pytest.mark.parametrize(
    ("yaw", "swapped"),
    [
        (0.0, False),
        (0.7, False),  # below π/4
        (0.9, True),  # above π/4
        (3 * math.pi / 4 - 0.1, True),  # folds to −π/4 − 0.1: magnitude above π/4
        (3 * math.pi / 4 + 0.1, False),  # folds to −π/4 + 0.1
        (math.pi, False),  # folds to 0
        (-math.pi / 2, True),  # folds to −π/2
        (1.57, True),  # the anchors' second rotation
    ],
)
def test_yaw_folding_rule(yaw: float, swapped: bool):
    rect = nearest_bev_boxes(torch.tensor([box(0, 0, 4, 2, yaw=yaw)]))
    expected = [-1.0, -2.0, 1.0, 2.0] if swapped else [-2.0, -1.0, 2.0, 1.0]
    assert rect.tolist() == [expected]


def test_limit_period_range():
    values = torch.linspace(-10, 10, 101)
    folded = limit_period(values, 0.5, math.pi)
    assert (folded >= -math.pi / 2 - 1e-6).all() and (folded < math.pi / 2 + 1e-6).all()
    turns = (values - folded) / math.pi  # whole half-turns removed
    assert torch.allclose(turns, turns.round(), atol=1e-4)


def test_hand_worked_values():
    a = torch.tensor([box(0, 0, 4, 2)])
    b = torch.tensor([box(0, 0, 4, 2, z=5, dz=9), box(1, 0, 4, 2), box(2.5, 0, 4, 2), box(10, 0, 4, 2)])
    iou = nearest_bev_iou(a, b)
    assert iou.tolist()[0][0] == 1.0  # z and dz play no part
    assert iou[0, 1].item() == pytest.approx(6 / 10)
    assert iou[0, 2].item() == pytest.approx(3 / 13)
    assert iou[0, 3].item() == 0.0


def test_degenerate_boxes_give_zero_not_nan():
    a = torch.tensor([box(0, 0, 0, 0)])
    assert nearest_bev_iou(a, a).item() == 0.0


def test_equals_original_steps_bit_for_bit_and_is_symmetric(gen):
    gt = random_boxes3d(17, gen, yaw_turns=1.0)
    anchors = random_boxes3d(300, gen, yaw_turns=1.0)
    anchors[:, :2] = gt[torch.randint(0, 17, (300,), generator=gen), :2] + torch.randn(300, 2, generator=gen)
    iou = nearest_bev_iou(gt, anchors)
    assert iou.shape == (17, 300) and iou.dtype == torch.float32
    assert torch.equal(iou, original_style_iou(gt, anchors))
    assert torch.equal(nearest_bev_iou(anchors, gt), iou.T)
    assert (iou > 0.3).any()


def test_batched_over_leading_dims_equals_loop(gen):
    anchors = random_boxes3d(50, gen)
    gt = random_boxes3d((3, 6), gen)
    gt[..., :2] = anchors[:18, :2].reshape(3, 6, 2) + 0.5
    batched = nearest_bev_iou(anchors, gt)  # (3, 50, 6)
    assert batched.shape == (3, 50, 6)
    for b in range(3):
        assert torch.equal(batched[b], nearest_bev_iou(anchors, gt[b]))


def test_rejects_short_boxes():
    with pytest.raises(ValueError, match="at least 7"):
        nearest_bev_iou(torch.zeros(2, 6), torch.zeros(3, 6))
