"""Tests for drivetrain.match.assigners: batched Hungarian assigners equal their per-sample references."""

from __future__ import annotations

import pytest
import torch

from drivetrain.losses.focal_head import hungarian_2d
from drivetrain.models.streampetr.box_code import encode_boxes
from drivetrain.models.streampetr.loss import hungarian_3d
from drivetrain.ragged import RaggedBatch
from helpers.boxes import random_boxes3d

NUM_CLASSES = 10
IMAGE_SIZE = (800.0, 320.0)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(3)


# ---------------------------------------------------------------------- 3D
def random_gt_boxes3d(m: int, gen: torch.Generator) -> torch.Tensor:
    return random_boxes3d(m, gen)


def predictions3d(
    num_layers: int, gt_boxes: list[torch.Tensor], q: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``(L, B, Q, C)`` and codes ``(L, B, Q, 10)``, some queries near a GT box (as after training)."""
    b = len(gt_boxes)
    logits = torch.randn(num_layers, b, q, NUM_CLASSES, generator=gen) * 2
    codes = torch.randn(num_layers, b, q, 10, generator=gen)
    codes[..., :2] *= 50
    for i, boxes in enumerate(gt_boxes):
        near = min(boxes.shape[0], q // 2)
        if near:
            noise = torch.randn(num_layers, near, 10, generator=gen) * 0.3
            codes[:, i, :near] = encode_boxes(boxes[:near]) + noise
    return logits, codes


def assert_same_pairs(batched: RaggedBatch, reference: list[list[torch.Tensor]]) -> None:
    actual = batched.to_list()
    assert len(actual) == len(reference)
    for i, (row_a, row_r) in enumerate(zip(actual, reference, strict=True)):
        assert len(row_a) == len(row_r)
        for j, (a, r) in enumerate(zip(row_a, row_r, strict=True)):
            assert a.dtype == r.dtype == torch.int64
            assert torch.equal(a, r), f"[{i}][{j}]: {a.tolist()} != {r.tolist()}"


@pytest.mark.parametrize("q", [50, 200])
def test_batched_3d_assigner_matches_per_sample_reference(q: int, gen: torch.Generator) -> None:
    counts = [0, 1, 37, 4, q // 2 if q > 50 else q]  # includes M = Q for Q = 50
    gt_boxes = [random_gt_boxes3d(m, gen) for m in counts]
    gt_labels = [torch.randint(0, NUM_CLASSES, (m,), generator=gen) for m in counts]
    logits, codes = predictions3d(3, gt_boxes, q, gen)
    assigner = hungarian_3d("scipy")
    batched = assigner.batched(
        logits, codes, RaggedBatch.from_list(gt_boxes, fill=float("nan")), RaggedBatch.from_list(gt_labels, fill=-7)
    )
    assert batched.tensor.shape == (3, 5, max(counts), 2)
    assert batched.sizes.tolist() == [counts] * 3
    reference = assigner.reference(logits, codes, gt_boxes, gt_labels)
    assert_same_pairs(batched, reference)
    # Most GT boxes get the query placed next to them: the matching is not arbitrary.
    near = min(counts[2], q // 2)
    for layer in range(3):
        pairs = reference[layer][2][:near]
        assert (pairs[:, 0] == pairs[:, 1]).float().mean() > 0.7


def test_batched_3d_assigner_with_auto_backend_matches_reference(gen: torch.Generator) -> None:
    counts = [3, 0, 8]
    gt_boxes = [random_gt_boxes3d(m, gen) for m in counts]
    gt_labels = [torch.randint(0, NUM_CLASSES, (m,), generator=gen) for m in counts]
    logits, codes = predictions3d(2, gt_boxes, 20, gen)
    assigner = hungarian_3d()
    batched = assigner.batched(logits, codes, RaggedBatch.from_list(gt_boxes), RaggedBatch.from_list(gt_labels))
    assert_same_pairs(batched, assigner.reference(logits, codes, gt_boxes, gt_labels))


def test_3d_assigner_does_not_track_gradients(gen: torch.Generator) -> None:
    counts = [2, 5]
    gt_boxes = [random_gt_boxes3d(m, gen) for m in counts]
    gt_labels = [torch.randint(0, NUM_CLASSES, (m,), generator=gen) for m in counts]
    logits, codes = predictions3d(2, gt_boxes, 12, gen)
    logits.requires_grad_()
    codes.requires_grad_()
    assigner = hungarian_3d("scipy")
    batched = assigner.batched(logits, codes, RaggedBatch.from_list(gt_boxes), RaggedBatch.from_list(gt_labels))
    assert not batched.tensor.requires_grad
    for row in assigner.reference(logits, codes, gt_boxes, gt_labels):
        assert not any(p.requires_grad for p in row)
    assert logits.grad is None and codes.grad is None


def test_3d_assigner_cost_is_weighted_sum_of_focal_and_box_l1(gen: torch.Generator) -> None:
    gt = random_gt_boxes3d(3, gen)
    labels = torch.tensor([1, 4, 1])
    logits, codes = torch.randn(5, NUM_CLASSES, generator=gen), torch.randn(5, 10, generator=gen)
    assigner = hungarian_3d()
    cost = assigner.cost(logits, codes, encode_boxes(gt), labels)
    weights = torch.tensor([2.0, 2.0, 1, 1, 1, 1, 1, 1])
    enc = encode_boxes(gt)
    for q in range(5):
        for g in range(3):
            p = logits[q, labels[g]].sigmoid()
            focal = -0.25 * (1 - p) ** 2 * (p + 1e-12).log() + 0.75 * p**2 * (1 - p + 1e-12).log()
            box = (weights * codes[q, :8] - weights * enc[g, :8]).abs().sum()
            assert cost[q, g].item() == pytest.approx((2.0 * focal + 0.25 * box).item(), rel=1e-5, abs=1e-5)


def test_batched_3d_assigner_with_no_targets_in_any_sample(gen: torch.Generator) -> None:
    gt_boxes = [torch.zeros(0, 9), torch.zeros(0, 9)]
    gt_labels = [torch.zeros(0, dtype=torch.int64)] * 2
    logits, codes = predictions3d(2, gt_boxes, 10, gen)
    assigner = hungarian_3d("scipy")
    batched = assigner.batched(logits, codes, RaggedBatch.from_list(gt_boxes), RaggedBatch.from_list(gt_labels))
    assert_same_pairs(batched, assigner.reference(logits, codes, gt_boxes, gt_labels))


def test_3d_assigner_batch_shape_mismatch_raises(gen: torch.Generator) -> None:
    gt_boxes = [random_gt_boxes3d(m, gen) for m in (2, 3, 1)]
    gt_labels = [torch.zeros(m, dtype=torch.int64) for m in (2, 3, 1)]
    logits, codes = torch.randn(2, 4, 8, NUM_CLASSES), torch.randn(2, 4, 8, 10)
    assigner = hungarian_3d("scipy")
    with pytest.raises(ValueError, match="gt_boxes"):
        assigner.batched(logits, codes, RaggedBatch.from_list(gt_boxes), RaggedBatch.from_list(gt_labels))
    logits, codes = torch.randn(2, 3, 8, NUM_CLASSES), torch.randn(2, 3, 8, 10)
    with pytest.raises(ValueError, match="gt_labels"):
        assigner.batched(logits, codes, RaggedBatch.from_list(gt_boxes), RaggedBatch.from_list(gt_labels[:2]))
    with pytest.raises(TypeError, match="RaggedBatch"):
        assigner.batched(logits, codes, RaggedBatch.from_list(gt_boxes), gt_labels)  # type: ignore[arg-type]


def test_3d_assigner_rejects_plain_list_targets_with_type_error(gen: torch.Generator) -> None:
    gt_boxes = [random_gt_boxes3d(m, gen) for m in (2, 3)]
    gt_labels = RaggedBatch.from_list([torch.zeros(m, dtype=torch.int64) for m in (2, 3)])
    logits, codes = torch.randn(2, 2, 8, NUM_CLASSES), torch.randn(2, 2, 8, 10)
    with pytest.raises(TypeError, match="RaggedBatch"):
        hungarian_3d("scipy").batched(logits, codes, gt_boxes, gt_labels)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- 2D
def random_gt2d(m: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pixel xyxy boxes inside the image, labels and projected centres inside the boxes."""
    w, h = IMAGE_SIZE
    low = torch.rand(m, 2, generator=gen) * torch.tensor([w - 120, h - 80])
    size = 8 + torch.rand(m, 2, generator=gen) * torch.tensor([110.0, 70.0])
    boxes = torch.cat([low, low + size], dim=-1)
    centres = low + size * (0.2 + 0.6 * torch.rand(m, 2, generator=gen))
    labels = torch.randint(0, NUM_CLASSES, (m,), generator=gen)
    return boxes, labels, centres


def predictions2d(b: int, n: int, q: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits = torch.randn(b, n, q, NUM_CLASSES, generator=gen) * 2
    centre = torch.rand(b, n, q, 2, generator=gen)
    size = 0.01 + torch.rand(b, n, q, 2, generator=gen) * 0.3
    boxes = torch.cat([centre, size], dim=-1)
    centres = (centre + torch.randn(b, n, q, 2, generator=gen) * 0.02).clamp(0, 1)
    return logits, boxes, centres


def ragged2d(
    counts: list[list[int]], gen: torch.Generator
) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]], list[list[torch.Tensor]]]:
    per_image = [[random_gt2d(m, gen) for m in row] for row in counts]
    return tuple([[image[k] for image in row] for row in per_image] for k in range(3))  # type: ignore[return-value]


def test_batched_2d_assigner_matches_per_image_reference(gen: torch.Generator) -> None:
    counts = [[0, 5, 1], [12, 0, 30]]
    boxes, labels, centres = ragged2d(counts, gen)
    logits, pred_boxes, pred_centres = predictions2d(2, 3, 40, gen)
    assigner = hungarian_2d("scipy")
    batched = assigner.batched(
        logits,
        pred_boxes,
        pred_centres,
        RaggedBatch.from_list(boxes, fill=float("nan")),
        RaggedBatch.from_list(labels, fill=-3),
        RaggedBatch.from_list(centres, fill=float("nan")),
        IMAGE_SIZE,
    )
    assert batched.tensor.shape == (2, 3, 30, 2)
    assert batched.sizes.tolist() == counts
    reference = assigner.reference(logits, pred_boxes, pred_centres, boxes, labels, centres, IMAGE_SIZE)
    assert_same_pairs(batched, reference)


def test_2d_assigner_does_not_track_gradients(gen: torch.Generator) -> None:
    counts = [[2, 0], [1, 4]]
    boxes, labels, centres = ragged2d(counts, gen)
    preds = [t.requires_grad_() for t in predictions2d(2, 2, 8, gen)]
    assigner = hungarian_2d("scipy")
    batched = assigner.batched(
        *preds,
        RaggedBatch.from_list(boxes),
        RaggedBatch.from_list(labels),
        RaggedBatch.from_list(centres),
        IMAGE_SIZE,
    )
    assert not batched.tensor.requires_grad
    assert_same_pairs(batched, assigner.reference(*preds, boxes, labels, centres, IMAGE_SIZE))


def test_batched_2d_assigner_with_no_targets_in_any_image(gen: torch.Generator) -> None:
    boxes, labels, centres = ragged2d([[0, 0], [0, 0]], gen)
    preds = predictions2d(2, 2, 8, gen)
    assigner = hungarian_2d("scipy")
    batched = assigner.batched(
        *preds,
        RaggedBatch.from_list(boxes),
        RaggedBatch.from_list(labels),
        RaggedBatch.from_list(centres),
        IMAGE_SIZE,
    )
    assert_same_pairs(batched, assigner.reference(*preds, boxes, labels, centres, IMAGE_SIZE))


def test_2d_assigner_batch_shape_mismatch_raises(gen: torch.Generator) -> None:
    boxes, labels, centres = ragged2d([[1, 2], [3, 0]], gen)
    preds = predictions2d(2, 3, 8, gen)
    assigner = hungarian_2d("scipy")
    with pytest.raises(ValueError, match="batch shape"):
        assigner.batched(
            *preds,
            RaggedBatch.from_list(boxes),
            RaggedBatch.from_list(labels),
            RaggedBatch.from_list(centres),
            IMAGE_SIZE,
        )
    preds = predictions2d(2, 2, 8, gen)
    with pytest.raises(ValueError, match="gt_centres"):
        assigner.batched(
            *preds,
            RaggedBatch.from_list(boxes),
            RaggedBatch.from_list(labels),
            RaggedBatch.from_list(centres[:1]),
            IMAGE_SIZE,
        )
