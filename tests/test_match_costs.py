"""Tests for drivetrain.match.costs: focal, L1, 3D box L1, GIoU and centre costs over padded batches."""

from __future__ import annotations

import math

import pytest
import torch

from drivetrain.geometry import boxes_cxcywh_to_xyxy, giou_pairwise, unnormalize_boxes
from drivetrain.match import bbox3d_l1_cost, centre_l1_cost, focal_cost, giou_cost, l1_cost
from drivetrain.models.streampetr.recipe import CODE_WEIGHTS


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(11)


def broadcast_l1(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a[..., :, None, :] - b[..., None, :, :]).abs().sum(-1)


def ref_focal(logit: float, alpha: float, gamma: float, eps: float = 1e-12) -> float:
    """The focal cost formula in Python floats, from the fp32 probability the cost computes with.

    Starting from the fp32 ``sigmoid`` keeps the check tight: ``log(1 - p)`` of a confident logit magnifies
    the rounding of ``p`` itself, which any fp32 implementation shares.
    """
    p = torch.tensor(logit, dtype=torch.float32).sigmoid().item()
    pos = -alpha * (1 - p) ** gamma * math.log(p + eps)
    neg = -(1 - alpha) * p**gamma * math.log(1 - p + eps)
    return pos - neg


# ---------------------------------------------------------------------- focal
@pytest.mark.parametrize(("alpha", "gamma"), [(0.25, 2.0), (0.5, 1.0)])
def test_focal_cost_matches_formula_per_pair(alpha: float, gamma: float, gen: torch.Generator) -> None:
    q, c, g = 6, 5, 4
    logits = torch.randn(q, c, generator=gen) * 3
    labels = torch.tensor([3, 0, 3, 4])
    cost = focal_cost(logits, labels, alpha, gamma)
    assert cost.shape == (q, g)
    for i in range(q):
        for j in range(g):
            expected = ref_focal(logits[i, int(labels[j])].item(), alpha, gamma)
            assert cost[i, j].item() == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_focal_cost_broadcasts_labels_over_layers(gen: torch.Generator) -> None:
    layers, b, q, c, g = 3, 4, 7, 5, 6
    logits = torch.randn(layers, b, q, c, generator=gen)
    labels = torch.randint(0, c, (b, g), generator=gen)
    batched = focal_cost(logits, labels)
    assert batched.shape == (layers, b, q, g)
    for layer in range(layers):
        for i in range(b):
            torch.testing.assert_close(batched[layer, i], focal_cost(logits[layer, i], labels[i]), rtol=1e-6, atol=1e-7)


def test_focal_cost_broadcasts_logits_over_label_dims(gen: torch.Generator) -> None:
    b, n, q, c, g = 2, 3, 5, 4, 3
    logits = torch.randn(b, 1, q, c, generator=gen)
    labels = torch.randint(0, c, (b, n, g), generator=gen)
    batched = focal_cost(logits, labels)
    assert batched.shape == (b, n, q, g)
    for i in range(b):
        for j in range(n):
            torch.testing.assert_close(batched[i, j], focal_cost(logits[i, 0], labels[i, j]), rtol=1e-6, atol=1e-7)


def test_focal_cost_with_no_targets_is_empty(gen: torch.Generator) -> None:
    cost = focal_cost(torch.randn(2, 5, 3, generator=gen), torch.zeros(2, 0, dtype=torch.long))
    assert cost.shape == (2, 5, 0)


def test_focal_cost_of_half_logits_is_computed_in_fp32(gen: torch.Generator) -> None:
    logits = torch.randn(6, 4, generator=gen) * 4
    labels = torch.tensor([0, 1, 3])
    for dtype in (torch.float16, torch.bfloat16):
        half = logits.to(dtype)
        cost = focal_cost(half, labels)
        assert torch.isfinite(cost).all()
        torch.testing.assert_close(cost.float(), focal_cost(half.float(), labels), rtol=1e-6, atol=1e-6)


def test_focal_cost_keeps_float64_logits_in_float64(gen: torch.Generator) -> None:
    logits = torch.randn(5, 3, generator=gen, dtype=torch.float64) * 3
    labels = torch.tensor([0, 2])
    cost = focal_cost(logits, labels)
    assert cost.dtype == torch.float64
    for i in range(5):
        for j in range(2):
            x = logits[i, int(labels[j])].item()
            p = 1 / (1 + math.exp(-x))
            expected = -0.25 * (1 - p) ** 2 * math.log(p + 1e-12) + 0.75 * p**2 * math.log(1 - p + 1e-12)
            assert cost[i, j].item() == pytest.approx(expected, rel=1e-10, abs=1e-12)


# ---------------------------------------------------------------------- L1
def test_l1_cost_matches_broadcast_form(gen: torch.Generator) -> None:
    pred, target = torch.randn(3, 4, 20, 7, generator=gen), torch.randn(3, 4, 9, 7, generator=gen)
    cost = l1_cost(pred, target)
    assert cost.shape == (3, 4, 20, 9) and cost.dtype == torch.float32
    torch.testing.assert_close(cost, broadcast_l1(pred, target), rtol=1e-5, atol=1e-5)


def test_l1_cost_batched_is_bitwise_equal_to_per_slice_calls(gen: torch.Generator) -> None:
    layers, b, q, g, d = 3, 4, 13, 6, 8
    pred, target = torch.randn(layers, b, q, d, generator=gen), torch.randn(b, g, d, generator=gen)
    batched = l1_cost(pred, target)
    assert batched.shape == (layers, b, q, g)
    for layer in range(layers):
        for i in range(b):
            assert torch.equal(batched[layer, i], l1_cost(pred[layer, i], target[i]))


def test_l1_cost_with_grad_is_differentiable_like_broadcast_form(gen: torch.Generator) -> None:
    pred = torch.randn(2, 5, 4, generator=gen, requires_grad=True)
    target = torch.randn(2, 3, 4, generator=gen, requires_grad=True)
    upstream = torch.randn(2, 5, 3, generator=gen)
    cost = l1_cost(pred, target)
    assert cost.requires_grad
    got = torch.autograd.grad((cost * upstream).sum(), [pred, target])
    ref_pred, ref_target = pred.detach().clone().requires_grad_(), target.detach().clone().requires_grad_()
    ref = broadcast_l1(ref_pred, ref_target)
    torch.testing.assert_close(cost.detach(), ref.detach(), rtol=1e-5, atol=1e-5)
    want = torch.autograd.grad((ref * upstream).sum(), [ref_pred, ref_target])
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


def test_l1_cost_with_grad_on_one_side_only_tracks_that_side(gen: torch.Generator) -> None:
    pred = torch.randn(5, 4, generator=gen)
    target = torch.randn(3, 4, generator=gen, requires_grad=True)
    cost = l1_cost(pred, target)
    (grad,) = torch.autograd.grad(cost.sum(), [target])
    ref_target = target.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad(broadcast_l1(pred, ref_target).sum(), [ref_target])
    torch.testing.assert_close(grad, want)


def test_l1_cost_under_no_grad_does_not_track(gen: torch.Generator) -> None:
    pred = torch.randn(5, 4, generator=gen, requires_grad=True)
    target = torch.randn(3, 4, generator=gen)
    with torch.no_grad():
        cost = l1_cost(pred, target)
    assert not cost.requires_grad
    torch.testing.assert_close(cost, broadcast_l1(pred.detach(), target), rtol=1e-5, atol=1e-5)


def test_l1_cost_empty_shapes(gen: torch.Generator) -> None:
    assert l1_cost(torch.randn(2, 5, 3, generator=gen), torch.randn(2, 0, 3)).shape == (2, 5, 0)
    assert l1_cost(torch.randn(2, 0, 3), torch.randn(2, 4, 3, generator=gen)).shape == (2, 0, 4)
    zero_dim = l1_cost(torch.randn(2, 5, 0), torch.randn(2, 4, 0))
    assert torch.equal(zero_dim, torch.zeros(2, 5, 4))


def test_l1_cost_promotes_mixed_dtypes(gen: torch.Generator) -> None:
    pred, target = torch.randn(4, 3, generator=gen), torch.randn(2, 3, generator=gen, dtype=torch.float64)
    cost = l1_cost(pred, target)
    assert cost.dtype == torch.float64
    torch.testing.assert_close(cost, broadcast_l1(pred.double(), target))


def test_centre_l1_cost_equals_l1_cost(gen: torch.Generator) -> None:
    pred, target = torch.rand(2, 3, 8, 2, generator=gen), torch.rand(2, 3, 4, 2, generator=gen)
    assert torch.equal(centre_l1_cost(pred, target), l1_cost(pred, target))


# ---------------------------------------------------------------------- 3D box L1
def test_bbox3d_l1_cost_uses_first_8_dims_with_code_weights(gen: torch.Generator) -> None:
    weights = torch.tensor(CODE_WEIGHTS)
    pred, gt = torch.randn(2, 6, 10, generator=gen), torch.randn(2, 4, 10, generator=gen)
    cost = bbox3d_l1_cost(pred, gt, weights)
    assert cost.shape == (2, 6, 4)
    expected = torch.zeros(2, 6, 4)
    for b in range(2):
        for q in range(6):
            for g in range(4):
                expected[b, q, g] = sum(
                    abs(weights[k].item() * pred[b, q, k].item() - weights[k].item() * gt[b, g, k].item())
                    for k in range(8)
                )
    torch.testing.assert_close(cost, expected, rtol=1e-5, atol=1e-5)


def test_bbox3d_l1_cost_ignores_velocity_dims(gen: torch.Generator) -> None:
    weights = torch.tensor(CODE_WEIGHTS)
    pred, gt = torch.randn(6, 10, generator=gen), torch.randn(4, 10, generator=gen)
    cost = bbox3d_l1_cost(pred, gt, weights)
    pred2, gt2 = pred.clone(), gt.clone()
    pred2[:, 8:] = torch.randn(6, 2, generator=gen) * 100
    gt2[:, 8:] = torch.randn(4, 2, generator=gen) * 100
    assert torch.equal(bbox3d_l1_cost(pred2, gt2, weights), cost)
    # A velocity-less target code (8 dims) gives the same cost.
    assert torch.equal(bbox3d_l1_cost(pred, gt[:, :8], weights), cost)


def test_bbox3d_l1_cost_depends_on_code_weights(gen: torch.Generator) -> None:
    pred, gt = torch.randn(6, 10, generator=gen), torch.randn(4, 10, generator=gen)
    ones = bbox3d_l1_cost(pred, gt, torch.ones(10))
    weighted = bbox3d_l1_cost(pred, gt, torch.tensor(CODE_WEIGHTS))
    xy = broadcast_l1(pred[:, :2], gt[:, :2])
    torch.testing.assert_close(weighted - ones, xy, rtol=1e-5, atol=1e-5)


def test_bbox3d_l1_cost_with_more_dims(gen: torch.Generator) -> None:
    pred, gt = torch.randn(6, 10, generator=gen), torch.randn(4, 10, generator=gen)
    weights = torch.tensor(CODE_WEIGHTS)
    torch.testing.assert_close(bbox3d_l1_cost(pred, gt, weights, dims=10), broadcast_l1(pred * weights, gt * weights))


# ---------------------------------------------------------------------- GIoU
def test_giou_cost_is_negative_pixel_giou(gen: torch.Generator) -> None:
    image_size = (800.0, 320.0)
    centre = torch.rand(2, 3, 7, 2, generator=gen) * 0.8 + 0.1
    size = torch.rand(2, 3, 7, 2, generator=gen) * 0.3 + 0.01
    pred = torch.cat([centre, size], dim=-1)
    low = torch.rand(2, 3, 4, 2, generator=gen) * torch.tensor([600.0, 250.0])
    gt = torch.cat([low, low + 5 + torch.rand(2, 3, 4, 2, generator=gen) * 100], dim=-1)
    cost = giou_cost(pred, gt, image_size)
    assert cost.shape == (2, 3, 7, 4)
    expected = -giou_pairwise(unnormalize_boxes(boxes_cxcywh_to_xyxy(pred), image_size), gt)
    torch.testing.assert_close(cost, expected, rtol=0, atol=0)
    assert ((cost >= -1) & (cost <= 1)).all()


def test_giou_cost_of_a_prediction_equal_to_its_target_is_minus_one() -> None:
    gt = torch.tensor([[80.0, 32.0, 240.0, 96.0]])
    pred = torch.tensor([[0.2, 0.2, 0.2, 0.2]])  # cxcywh normalised by (800, 320): the same box
    assert giou_cost(pred, gt, (800.0, 320.0)).item() == pytest.approx(-1.0, abs=1e-6)
