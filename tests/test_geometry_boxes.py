"""geometry/boxes2d.py: 2D box formats, IoU and GIoU."""

from __future__ import annotations

import pytest
import torch

from drivetrain.geometry import (
    boxes_cxcywh_to_xyxy,
    boxes_xyxy_to_cxcywh,
    giou_aligned,
    giou_pairwise,
    iou_aligned,
    iou_pairwise,
    normalize_boxes,
    unnormalize_boxes,
)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(7)


def random_xyxy(shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """xyxy boxes ``(*shape, 4)`` with positive sizes in a 0..100 square, many of them overlapping."""
    low = torch.rand((*shape, 2), generator=gen, dtype=torch.float64) * 80
    size = 1 + torch.rand((*shape, 2), generator=gen, dtype=torch.float64) * 40
    return torch.cat([low, low + size], dim=-1).to(dtype)


# ---------------------------------------------------------------------- plain-float references
def ref_iou_giou(a: list[float], b: list[float], eps: float = 1e-6) -> tuple[float, float]:
    """IoU and GIoU of two xyxy boxes, written out with Python floats."""
    ax1, ay1, ax2, ay2 = a
    bx1, by1, bx2, by2 = b
    area_a = max(ax2 - ax1, 0.0) * max(ay2 - ay1, 0.0)
    area_b = max(bx2 - bx1, 0.0) * max(by2 - by1, 0.0)
    iw = max(min(ax2, bx2) - max(ax1, bx1), 0.0)
    ih = max(min(ay2, by2) - max(ay1, by1), 0.0)
    inter = iw * ih
    union = max(area_a + area_b - inter, eps)
    hw = max(max(ax2, bx2) - min(ax1, bx1), 0.0)
    hh = max(max(ay2, by2) - min(ay1, by1), 0.0)
    hull = max(hw * hh, eps)
    iou = inter / union
    return iou, iou - (hull - union) / hull


# ---------------------------------------------------------------------- 2D formats
def test_xyxy_cxcywh_round_trip(gen: torch.Generator) -> None:
    boxes = random_xyxy((2, 3, 7), gen)
    cxcywh = boxes_xyxy_to_cxcywh(boxes)
    torch.testing.assert_close(cxcywh[..., :2], (boxes[..., :2] + boxes[..., 2:]) / 2)
    torch.testing.assert_close(cxcywh[..., 2:], boxes[..., 2:] - boxes[..., :2])
    torch.testing.assert_close(boxes_cxcywh_to_xyxy(cxcywh), boxes, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(boxes_xyxy_to_cxcywh(boxes_cxcywh_to_xyxy(cxcywh)), cxcywh, rtol=1e-12, atol=1e-12)


def test_normalize_unnormalize_round_trip(gen: torch.Generator) -> None:
    boxes = random_xyxy((3, 5), gen)
    size = (800.0, 320.0)
    norm = normalize_boxes(boxes, size)
    torch.testing.assert_close(norm[..., 0::2], boxes[..., 0::2] / 800.0)
    torch.testing.assert_close(norm[..., 1::2], boxes[..., 1::2] / 320.0)
    torch.testing.assert_close(unnormalize_boxes(norm, size), boxes, rtol=1e-12, atol=1e-12)


def test_normalize_with_per_image_sizes_equals_per_image_calls(gen: torch.Generator) -> None:
    boxes = random_xyxy((3, 5), gen)
    sizes = torch.tensor([[800.0, 320.0], [640.0, 480.0], [100.0, 50.0]], dtype=torch.float64)
    batched = normalize_boxes(boxes, sizes[:, None, :])
    for i in range(3):
        expected = normalize_boxes(boxes[i], tuple(sizes[i].tolist()))
        torch.testing.assert_close(batched[i], expected, rtol=0, atol=0)
    torch.testing.assert_close(unnormalize_boxes(batched, sizes[:, None, :]), boxes, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "fn",
    [boxes_cxcywh_to_xyxy, boxes_xyxy_to_cxcywh, lambda b: normalize_boxes(b, (2.0, 2.0))],
    ids=["cxcywh_to_xyxy", "xyxy_to_cxcywh", "normalize"],
)
def test_box_format_functions_reject_bad_last_dim(fn) -> None:
    with pytest.raises(ValueError, match="last dim must be 4"):
        fn(torch.zeros(2, 5))


@pytest.mark.parametrize("fn", [iou_aligned, giou_aligned, iou_pairwise, giou_pairwise])
def test_iou_functions_reject_bad_last_dim(fn) -> None:
    with pytest.raises(ValueError, match="last dim must be 4"):
        fn(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="last dim must be 4"):
        fn(torch.zeros(2, 4), torch.zeros(2, 5))


# ---------------------------------------------------------------------- IoU / GIoU
def test_pairwise_iou_giou_match_plain_float_loop(gen: torch.Generator) -> None:
    a, b = random_xyxy((9,), gen), random_xyxy((7,), gen)
    iou, giou = iou_pairwise(a, b), giou_pairwise(a, b)
    assert iou.shape == giou.shape == (9, 7)
    for q in range(9):
        for g in range(7):
            ref_iou, ref_giou = ref_iou_giou(a[q].tolist(), b[g].tolist())
            assert iou[q, g].item() == pytest.approx(ref_iou, rel=1e-12, abs=1e-12)
            assert giou[q, g].item() == pytest.approx(ref_giou, rel=1e-12, abs=1e-12)
    # The random boxes overlap often enough for the check to mean something.
    assert (iou > 0).sum() >= 10 and (iou == 0).sum() >= 1


def test_aligned_iou_giou_match_plain_float_loop_in_float32(gen: torch.Generator) -> None:
    a, b = random_xyxy((40,), gen, torch.float32), random_xyxy((40,), gen, torch.float32)
    iou, giou = iou_aligned(a, b), giou_aligned(a, b)
    assert iou.dtype == giou.dtype == torch.float32
    for i in range(40):
        ref_iou, ref_giou = ref_iou_giou(a[i].tolist(), b[i].tolist())
        assert iou[i].item() == pytest.approx(ref_iou, abs=1e-5)
        assert giou[i].item() == pytest.approx(ref_giou, abs=1e-5)


def test_identical_boxes_have_iou_and_giou_one(gen: torch.Generator) -> None:
    boxes = random_xyxy((2, 6), gen)
    assert torch.equal(iou_aligned(boxes, boxes), torch.ones(2, 6, dtype=boxes.dtype))
    assert torch.equal(giou_aligned(boxes, boxes), torch.ones(2, 6, dtype=boxes.dtype))
    assert torch.equal(iou_pairwise(boxes, boxes).diagonal(dim1=-2, dim2=-1), torch.ones(2, 6, dtype=boxes.dtype))
    assert torch.equal(giou_pairwise(boxes, boxes).diagonal(dim1=-2, dim2=-1), torch.ones(2, 6, dtype=boxes.dtype))


def test_disjoint_far_boxes_have_zero_iou_and_negative_giou() -> None:
    a = torch.tensor([[0.0, 0.0, 1.0, 1.0], [10.0, 10.0, 12.0, 13.0]])
    b = torch.tensor([[100.0, 100.0, 101.0, 101.0], [-50.0, -40.0, -45.0, -38.0]])
    assert torch.equal(iou_aligned(a, b), torch.zeros(2))
    giou = giou_aligned(a, b)
    assert (giou < 0).all() and (giou >= -1).all()
    # Unit boxes 100 apart: the hull is 101², the union 2, so GIoU ≈ -1.
    assert giou[0].item() == pytest.approx(-(101.0**2 - 2) / 101.0**2, rel=1e-6)


def test_pairwise_with_leading_dims_equals_stacked_per_image_results(gen: torch.Generator) -> None:
    a, b = random_xyxy((2, 3, 5), gen), random_xyxy((2, 3, 4), gen)
    for fn in (iou_pairwise, giou_pairwise):
        batched = fn(a, b)
        assert batched.shape == (2, 3, 5, 4)
        stacked = torch.stack([torch.stack([fn(a[i, j], b[i, j]) for j in range(3)]) for i in range(2)])
        torch.testing.assert_close(batched, stacked, rtol=0, atol=0)


def test_pairwise_broadcasts_leading_dims(gen: torch.Generator) -> None:
    a, b = random_xyxy((3, 5), gen), random_xyxy((4,), gen)
    out = giou_pairwise(a, b)
    assert out.shape == (3, 5, 4)
    for i in range(3):
        torch.testing.assert_close(out[i], giou_pairwise(a[i], b), rtol=0, atol=0)


def test_aligned_equals_diagonal_of_pairwise(gen: torch.Generator) -> None:
    a, b = random_xyxy((2, 3, 6), gen), random_xyxy((2, 3, 6), gen)
    torch.testing.assert_close(iou_aligned(a, b), iou_pairwise(a, b).diagonal(dim1=-2, dim2=-1), rtol=0, atol=0)
    torch.testing.assert_close(giou_aligned(a, b), giou_pairwise(a, b).diagonal(dim1=-2, dim2=-1), rtol=0, atol=0)


def test_iou_is_symmetric_and_bounded(gen: torch.Generator) -> None:
    a, b = random_xyxy((8,), gen), random_xyxy((6,), gen)
    torch.testing.assert_close(iou_pairwise(a, b), iou_pairwise(b, a).T, rtol=0, atol=1e-15)
    torch.testing.assert_close(giou_pairwise(a, b), giou_pairwise(b, a).T, rtol=0, atol=1e-15)
    iou, giou = iou_pairwise(a, b), giou_pairwise(a, b)
    assert ((iou >= 0) & (iou <= 1)).all()
    assert ((giou >= -1) & (giou <= iou)).all()


def test_degenerate_zero_area_boxes_give_finite_values() -> None:
    zero = torch.zeros(3, 4)
    boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [5.0, 5.0, 5.0, 5.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.isfinite(iou_pairwise(boxes, zero)).all()
    assert torch.isfinite(giou_pairwise(boxes, zero)).all()
