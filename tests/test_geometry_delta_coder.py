"""The DeltaXYZWLHR anchor code and the direction-bin target (mmdetection3d's coder and get_direction_target)."""

from __future__ import annotations

import math

import pytest
import torch
from tests.helpers.boxes import random_boxes3d

from drivetrain.geometry.delta_coder import (
    decode_delta_xyzwlhr,
    direction_target,
    encode_delta_xyzwlhr,
    limit_period,
)
from drivetrain.models.pointpillars.recipe import NUS_DIR_OFFSET


def _bottom_centre_encode(anchors_bottom: torch.Tensor, gt_bottom: torch.Tensor) -> torch.Tensor:
    """The original's formula, written out on bottom-centre boxes: both z lifted by dz/2 before differencing."""
    za = anchors_bottom[..., 2] + anchors_bottom[..., 5] / 2
    zg = gt_bottom[..., 2] + gt_bottom[..., 5] / 2
    diag = torch.sqrt(anchors_bottom[..., 3] ** 2 + anchors_bottom[..., 4] ** 2)
    cols = [
        (gt_bottom[..., 0] - anchors_bottom[..., 0]) / diag,
        (gt_bottom[..., 1] - anchors_bottom[..., 1]) / diag,
        (zg - za) / anchors_bottom[..., 5],
        *[torch.log(gt_bottom[..., k] / anchors_bottom[..., k]) for k in (3, 4, 5)],
        gt_bottom[..., 6] - anchors_bottom[..., 6],
        *[gt_bottom[..., k] - anchors_bottom[..., k] for k in range(7, gt_bottom.shape[-1])],
    ]
    return torch.stack(cols, dim=-1)


def _bottom_centre_decode(anchors_bottom: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
    """The original's decode on bottom-centre boxes: lift the anchor, decode, drop the result by dz_g/2."""
    za = anchors_bottom[..., 2] + anchors_bottom[..., 5] / 2
    diag = torch.sqrt(anchors_bottom[..., 3] ** 2 + anchors_bottom[..., 4] ** 2)
    dz = torch.exp(deltas[..., 5]) * anchors_bottom[..., 5]
    cols = [
        deltas[..., 0] * diag + anchors_bottom[..., 0],
        deltas[..., 1] * diag + anchors_bottom[..., 1],
        deltas[..., 2] * anchors_bottom[..., 5] + za - dz / 2,
        torch.exp(deltas[..., 3]) * anchors_bottom[..., 3],
        torch.exp(deltas[..., 4]) * anchors_bottom[..., 4],
        dz,
        deltas[..., 6] + anchors_bottom[..., 6],
        *[deltas[..., k] + anchors_bottom[..., k] for k in range(7, deltas.shape[-1])],
    ]
    return torch.stack(cols, dim=-1)


def _to_bottom(boxes: torch.Tensor) -> torch.Tensor:
    out = boxes.clone()
    out[..., 2] = boxes[..., 2] - boxes[..., 5] / 2
    return out


def test_encode_matches_hand_computed_deltas() -> None:
    anchor = torch.tensor([0.0, 0.0, -1.0, 3.0, 4.0, 2.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    gt = torch.tensor([1.5, -2.5, 0.0, 6.0, 2.0, 1.0, 0.5, 1.0, -2.0], dtype=torch.float64)
    # diagonal 5; z: (0 − (−1)) / 2; sizes 6/3, 2/4, 1/2; yaw 0.5; velocity gt − anchor.
    expected = [0.3, -0.5, 0.5, math.log(2), -math.log(2), -math.log(2), 0.5, 1.0, -2.0]
    torch.testing.assert_close(encode_delta_xyzwlhr(anchor, gt), torch.tensor(expected, dtype=torch.float64))
    without_velocity = encode_delta_xyzwlhr(anchor[:7], gt[:7])
    torch.testing.assert_close(without_velocity, torch.tensor(expected[:7], dtype=torch.float64))


@pytest.mark.parametrize("dim", [7, 9])
def test_centre_z_code_equals_original_bottom_centre_formula(dim: int) -> None:
    gen = torch.Generator().manual_seed(0)
    anchors = random_boxes3d(200, gen, dtype=torch.float64, velocity=dim == 9)
    gt = random_boxes3d(200, gen, dtype=torch.float64, velocity=dim == 9)
    deltas = encode_delta_xyzwlhr(anchors, gt)
    torch.testing.assert_close(deltas, _bottom_centre_encode(_to_bottom(anchors), _to_bottom(gt)))
    decoded_bottom = _bottom_centre_decode(_to_bottom(anchors), deltas)
    torch.testing.assert_close(_to_bottom(decode_delta_xyzwlhr(anchors, deltas)), decoded_bottom)


@pytest.mark.parametrize("dim", [7, 9])
def test_decode_inverts_encode(dim: int) -> None:
    gen = torch.Generator().manual_seed(1)
    anchors = random_boxes3d(64, gen, velocity=dim == 9)
    gt = random_boxes3d((3, 64), gen, velocity=dim == 9)
    deltas = encode_delta_xyzwlhr(anchors, gt)  # anchors broadcast over the batch dim
    assert deltas.shape == (3, 64, dim)
    torch.testing.assert_close(decode_delta_xyzwlhr(anchors, deltas), gt, rtol=1e-5, atol=1e-4)
    round_trip = encode_delta_xyzwlhr(anchors, decode_delta_xyzwlhr(anchors, deltas))
    torch.testing.assert_close(round_trip, deltas, rtol=1e-4, atol=1e-5)


def test_coder_rejects_mismatched_code_sizes() -> None:
    with pytest.raises(ValueError, match="last dim"):
        encode_delta_xyzwlhr(torch.ones(4, 9), torch.ones(4, 7))
    with pytest.raises(ValueError, match="7 or 9"):
        decode_delta_xyzwlhr(torch.ones(4, 8), torch.ones(4, 8))


def test_limit_period_wraps_into_the_period() -> None:
    values = torch.tensor([-7.0, -math.pi, 0.0, 3.0, 10.0], dtype=torch.float64)
    wrapped = limit_period(values, 0.0, 2 * math.pi)
    assert bool(((wrapped >= 0) & (wrapped < 2 * math.pi)).all())
    torch.testing.assert_close(torch.remainder(values, 2 * math.pi), wrapped)


def test_direction_bins_at_their_edges() -> None:
    # Bin edges with dir_offset −0.7854 (the config's literal) sit at yaw = −0.7854 and π − 0.7854 (mod 2π).
    tiny = 1e-6
    edge0, edge1 = NUS_DIR_OFFSET, math.pi + NUS_DIR_OFFSET
    yaw = torch.tensor(
        [edge0, edge0 + tiny, edge0 - tiny, edge1 - tiny, edge1 + tiny, edge0 + 2 * math.pi + tiny, 0.0, math.pi],
        dtype=torch.float64,
    )
    assert direction_target(yaw, NUS_DIR_OFFSET).tolist() == [0, 0, 1, 0, 1, 0, 0, 1]
    assert direction_target(yaw, NUS_DIR_OFFSET).dtype == torch.int64


def test_direction_bins_follow_the_shifted_half_circle() -> None:
    yaw = torch.linspace(-3 * math.pi, 3 * math.pi, 1001, dtype=torch.float64)
    expected = (torch.remainder(yaw - NUS_DIR_OFFSET, 2 * math.pi) >= math.pi).long()
    assert torch.equal(direction_target(yaw, NUS_DIR_OFFSET), expected)
    four = direction_target(yaw, dir_offset=0.0, num_bins=4)
    assert torch.equal(four, torch.floor(torch.remainder(yaw, 2 * math.pi) / (math.pi / 2)).long().clamp(0, 3))


def test_direction_bin_clamps_a_rounded_full_turn() -> None:
    # A float32 yaw just below 0 wraps to −1e-9 + 2π, which rounds to float32(2π): floor(·/π) is 2, the clamp
    # keeps it in the last bin (where the yaw belongs).
    yaw = torch.tensor([-1e-9], dtype=torch.float32)
    unclamped = torch.floor(limit_period(yaw, 0.0, 2 * math.pi) / math.pi).long()
    assert unclamped.tolist() == [2]
    assert direction_target(yaw, dir_offset=0.0).tolist() == [1]
