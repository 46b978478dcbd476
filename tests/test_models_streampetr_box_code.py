"""models/streampetr/box_code.py: StreamPETR's 3D box code (encode, decode)."""

from __future__ import annotations

import math

import pytest
import torch

from drivetrain.models.streampetr.box_code import decode_boxes, encode_boxes
from helpers.boxes import random_boxes3d as shared_boxes3d


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(7)


def random_boxes3d(shape: tuple[int, ...], gen: torch.Generator, *, velocity: bool = True) -> torch.Tensor:
    """float64 boxes with yaw in ±3π, so the encoding's wrap-around is exercised."""
    return shared_boxes3d(shape, gen, dtype=torch.float64, velocity=velocity, yaw_turns=1.5)


def wrap_angle(a: torch.Tensor) -> torch.Tensor:
    """Angle difference to (-π, π]."""
    return torch.atan2(torch.sin(a), torch.cos(a))


# ---------------------------------------------------------------------- 3D encodings
@pytest.mark.parametrize("velocity", [True, False], ids=["9dim", "7dim"])
def test_encode_decode_round_trip_wraps_yaw(velocity: bool, gen: torch.Generator) -> None:
    boxes = random_boxes3d((4, 6), gen, velocity=velocity)
    codes = encode_boxes(boxes)
    assert codes.shape == (4, 6, 10 if velocity else 8)
    decoded = decode_boxes(codes)
    assert decoded.shape == boxes.shape
    yaw_dim = 6
    other = [d for d in range(boxes.shape[-1]) if d != yaw_dim]
    torch.testing.assert_close(decoded[..., other], boxes[..., other], rtol=1e-12, atol=1e-12)
    yaw = decoded[..., yaw_dim]
    assert ((yaw > -math.pi) & (yaw <= math.pi)).all()
    assert wrap_angle(yaw - boxes[..., yaw_dim]).abs().max() < 1e-12


@pytest.mark.parametrize("velocity", [True, False], ids=["9dim", "7dim"])
def test_encode_writes_log_sizes_and_yaw_sin_cos(velocity: bool, gen: torch.Generator) -> None:
    boxes = random_boxes3d((5,), gen, velocity=velocity)
    codes = encode_boxes(boxes)
    torch.testing.assert_close(codes[..., :3], boxes[..., :3], rtol=0, atol=0)
    torch.testing.assert_close(codes[..., 3:6], boxes[..., 3:6].log())
    torch.testing.assert_close(codes[..., 6], boxes[..., 6].sin())
    torch.testing.assert_close(codes[..., 7], boxes[..., 6].cos())
    if velocity:
        torch.testing.assert_close(codes[..., 8:], boxes[..., 7:], rtol=0, atol=0)


def test_decode_yaw_of_pi_stays_pi() -> None:
    codes = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]], dtype=torch.float64)
    assert decode_boxes(codes)[0, 6] == math.pi


@pytest.mark.parametrize("dim", [0, 6, 8, 10])
def test_encode_rejects_bad_last_dim(dim: int) -> None:
    with pytest.raises(ValueError, match="last dim"):
        encode_boxes(torch.zeros(3, dim))


@pytest.mark.parametrize("dim", [0, 7, 9, 11])
def test_decode_rejects_bad_last_dim(dim: int) -> None:
    with pytest.raises(ValueError, match="last dim"):
        decode_boxes(torch.zeros(3, dim))
