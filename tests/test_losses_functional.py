"""losses/functional.py: the elementwise detection losses against their formulas, fp32 for half inputs and under
autocast, exact zeros for empty inputs."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from drivetrain.geometry import giou_aligned
from drivetrain.losses import (
    gaussian_focal_loss,
    giou_loss,
    l1_loss,
    quality_focal_loss,
    sigmoid_focal_loss,
    sigmoid_focal_loss_sum,
    sine_difference,
    smooth_l1_loss,
)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(17)


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def bce(logit: float, target: float) -> float:
    """Binary cross entropy with logits, written out."""
    p = sigmoid(logit)
    return -(target * math.log(p) + (1 - target) * math.log(1 - p))


def random_xyxy(n: int, gen: torch.Generator) -> torch.Tensor:
    low = torch.rand(n, 2, generator=gen) * 50
    return torch.cat([low, low + 1 + torch.rand(n, 2, generator=gen) * 30], dim=-1)


# ---------------------------------------------------------------------- focal losses
@pytest.mark.parametrize(("alpha", "gamma"), [(0.25, 2.0), (0.5, 1.5)])
def test_sigmoid_focal_loss_matches_torchvision_formula(alpha: float, gamma: float, gen: torch.Generator) -> None:
    logits = torch.randn(6, 4, generator=gen, dtype=torch.float64) * 3
    targets = (torch.rand(6, 4, generator=gen) < 0.3).double()
    targets[0] = torch.tensor([0.0, 0.3, 0.7, 1.0])  # soft targets too
    loss = sigmoid_focal_loss(logits, targets, alpha, gamma)
    assert loss.shape == (6, 4) and loss.dtype == torch.float32
    for i in range(6):
        for c in range(4):
            x, t = logits[i, c].item(), targets[i, c].item()
            p = sigmoid(x)
            p_t = p * t + (1 - p) * (1 - t)
            alpha_t = alpha * t + (1 - alpha) * (1 - t)
            expected = alpha_t * bce(x, t) * (1 - p_t) ** gamma
            assert loss[i, c].item() == pytest.approx(expected, rel=1e-4, abs=1e-6)


def _focal64(logits: torch.Tensor, targets: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    """The focal loss per element in float64, written out (the ``fp32`` wrapper keeps the library's in float32)."""
    prob = logits.sigmoid()
    pt = (1 - prob) * targets + prob * (1 - targets)
    weight = (alpha * targets + (1 - alpha) * (1 - targets)) * pt.pow(gamma)
    return F.binary_cross_entropy_with_logits(logits, targets, reduction="none") * weight


@pytest.mark.parametrize(("alpha", "gamma"), [(0.25, 2.0), (0.5, 1.5)])
@pytest.mark.parametrize("scale", [1.0, 8.0, 30.0])
def test_focal_loss_sum_equals_the_elementwise_loss_summed(
    alpha: float, gamma: float, scale: float, gen: torch.Generator
) -> None:
    # Rows: labels in [0, C), background (C), a negative label (background too), zero and fractional weights.
    rows, classes = 600, 7
    logits = (torch.randn(rows, classes, generator=gen) * scale).requires_grad_()
    labels = torch.randint(0, classes, (rows,), generator=gen)
    labels[::3], labels[1::7] = classes, -1
    weights = torch.rand(rows, generator=gen).round()
    weights[::5] = 0.5
    one_hot = (labels[:, None] == torch.arange(classes)).float()
    summed = (sigmoid_focal_loss(logits, one_hot, alpha, gamma) * weights[:, None]).sum()
    fused = sigmoid_focal_loss_sum(logits, labels, weights, alpha, gamma)
    (want,) = torch.autograd.grad(summed, logits)
    (got,) = torch.autograd.grad(fused, logits)
    # Two formulas per element, ≤ ~16 u apart (u = 2^-24), and sums in another order (≤ ⌈log2 4200⌉ eps): 1e-5.
    torch.testing.assert_close(fused, summed, rtol=1e-5, atol=0.0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-9)
    # and against float64: the value within the sum's rounding (⌈log2 4200⌉ + 1 eps), every gradient entry within
    # 16 u (a handful of roundings) of it — down to 1e-20, below which float32 sigmoids of |s| > 25 lose digits
    x64 = logits.detach().double().requires_grad_()
    exact = (_focal64(x64, one_hot.double(), alpha, gamma) * weights[:, None].double()).sum()
    (grad64,) = torch.autograd.grad(exact, x64)
    assert abs(float(fused.detach()) - float(exact)) <= 14 * 2**-23 * float(exact)
    assert bool(((got.double() - grad64).abs() <= 16 * 2**-24 * grad64.abs() + 1e-20).all())


def test_focal_loss_sum_broadcasts_leading_dims_and_keeps_the_weights_out_of_autograd(gen: torch.Generator) -> None:
    logits = torch.randn(2, 5, 3, generator=gen).requires_grad_()
    labels = torch.tensor([[0, 3, 2, 1, 3], [3, 3, 0, 0, 2]])
    weights = torch.ones(2, 5, requires_grad=True)
    flat = sigmoid_focal_loss_sum(logits.reshape(10, 3), labels.reshape(10), weights.detach().reshape(10))
    total = sigmoid_focal_loss_sum(logits, labels, weights)
    assert float(total) == float(flat)
    total.backward()
    assert weights.grad is None and logits.grad is not None and bool(logits.grad.ne(0).all())


def test_sigmoid_focal_loss_broadcasts_targets_over_layers(gen: torch.Generator) -> None:
    logits = torch.randn(3, 5, 4, generator=gen)
    targets = (torch.rand(5, 4, generator=gen) < 0.4).float()
    loss = sigmoid_focal_loss(logits, targets)
    assert loss.shape == (3, 5, 4)
    for layer in range(3):
        torch.testing.assert_close(loss[layer], sigmoid_focal_loss(logits[layer], targets), rtol=0, atol=0)


def test_quality_focal_loss_matches_per_element_loop(gen: torch.Generator) -> None:
    n, c, beta = 8, 5, 2.0
    logits = torch.randn(n, c, generator=gen) * 2
    labels = torch.tensor([0, 5, 3, 5, 4, -1, 1, 3])  # 5 (== C) and -1 are background
    scores = torch.rand(n, generator=gen)
    loss = quality_focal_loss(logits, labels, scores, beta)
    assert loss.shape == (n, c) and loss.dtype == torch.float32
    for i in range(n):
        for k in range(c):
            x, p = logits[i, k].item(), sigmoid(logits[i, k].item())
            if 0 <= labels[i] < c and k == labels[i]:
                s = scores[i].item()
                expected = bce(x, s) * abs(s - p) ** beta
            else:
                expected = bce(x, 0.0) * p**beta
            assert loss[i, k].item() == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_quality_focal_loss_background_rows_are_negative_terms_only(gen: torch.Generator) -> None:
    logits = torch.randn(2, 3, 7, generator=gen)
    labels = torch.full((2, 3), 7)
    scores = torch.rand(2, 3, generator=gen)
    loss = quality_focal_loss(logits, labels, scores)
    expected = F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits), reduction="none")
    torch.testing.assert_close(loss, expected * logits.sigmoid().pow(2))
    # Background scores play no part.
    torch.testing.assert_close(quality_focal_loss(logits, labels, torch.rand(2, 3, generator=gen)), loss)


def test_quality_focal_loss_with_zero_score_equals_negative_term_on_own_class(gen: torch.Generator) -> None:
    logits = torch.randn(4, 3, generator=gen)
    labels = torch.tensor([0, 1, 2, 3])
    loss = quality_focal_loss(logits, labels, torch.zeros(4))
    background = quality_focal_loss(logits, torch.full((4,), 3), torch.zeros(4))
    torch.testing.assert_close(loss, background)


def test_quality_focal_loss_gradient_ignores_background_scores(gen: torch.Generator) -> None:
    logits = torch.randn(4, 3, generator=gen, requires_grad=True)
    labels = torch.tensor([0, 3, 3, 1])
    scores = torch.tensor([0.5, float("nan"), float("nan"), 0.3])
    loss = quality_focal_loss(logits, labels, scores)
    assert torch.isfinite(loss).all()
    (grad,) = torch.autograd.grad(loss.sum(), [logits])
    assert torch.isfinite(grad).all(), grad


@pytest.mark.parametrize(("alpha", "gamma"), [(2.0, 4.0), (1.0, 2.0)])
def test_gaussian_focal_loss_matches_pos_and_neg_terms(alpha: float, gamma: float, gen: torch.Generator) -> None:
    pred = torch.rand(5, 6, generator=gen).clamp(1e-4, 1 - 1e-4)
    target = torch.rand(5, 6, generator=gen)
    target[torch.rand(5, 6, generator=gen) < 0.2] = 1.0
    target[0, 0], target[0, 1] = 1.0, 0.0
    loss = gaussian_focal_loss(pred, target, alpha, gamma)
    assert loss.dtype == torch.float32
    for i in range(5):
        for j in range(6):
            p, t = pred[i, j].item(), target[i, j].item()
            pos = -math.log(p + 1e-12) * (1 - p) ** alpha if t == 1 else 0.0
            neg = -math.log(1 - p + 1e-12) * p**alpha * (1 - t) ** gamma
            assert loss[i, j].item() == pytest.approx(pos + neg, rel=1e-4, abs=1e-7)


# ---------------------------------------------------------------------- regression losses
def test_l1_loss_with_and_without_weight(gen: torch.Generator) -> None:
    pred, target, weight = (torch.randn(4, 10, generator=gen) for _ in range(3))
    assert torch.equal(l1_loss(pred, target), (pred - target).abs())
    assert torch.equal(l1_loss(pred, target, weight), (pred - target).abs() * weight)


@pytest.mark.parametrize("beta", [1.0 / 9.0, 0.5, 1.0])
def test_smooth_l1_loss_matches_torch(beta: float, gen: torch.Generator) -> None:
    pred, target = torch.randn(200, generator=gen), torch.randn(200, generator=gen)
    expected = F.smooth_l1_loss(pred, target, beta=beta, reduction="none")
    torch.testing.assert_close(smooth_l1_loss(pred, target, beta), expected)
    weight = torch.rand(200, generator=gen)
    torch.testing.assert_close(smooth_l1_loss(pred, target, beta, weight), expected * weight)


@pytest.mark.parametrize("beta", [0.25, 1.0])
def test_smooth_l1_loss_at_and_around_beta(beta: float) -> None:
    diffs = torch.tensor([0.0, beta / 2, beta * (1 - 1e-3), beta, beta * (1 + 1e-3), 2 * beta, -beta, -3 * beta])
    loss = smooth_l1_loss(diffs, torch.zeros_like(diffs), beta)
    d = diffs.abs()
    expected = torch.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta)
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    assert loss[3].item() == pytest.approx(0.5 * beta) and loss[6].item() == pytest.approx(0.5 * beta)
    # Continuous at beta: just below and just above agree with the value at beta.
    assert loss[2].item() == pytest.approx(loss[3].item(), abs=2e-3 * beta)
    assert loss[4].item() == pytest.approx(loss[3].item(), abs=2e-3 * beta)


def test_smooth_l1_loss_with_zero_beta_is_l1(gen: torch.Generator) -> None:
    pred, target = torch.randn(50, generator=gen), torch.randn(50, generator=gen)
    assert torch.equal(smooth_l1_loss(pred, target, beta=0.0), l1_loss(pred, target))


@pytest.mark.parametrize("dim", [6, 2])
def test_sine_difference_gives_sin_of_angle_difference(dim: int, gen: torch.Generator) -> None:
    pred = torch.randn(3, 7, 10, generator=gen, dtype=torch.float64) * 3
    target = torch.randn(3, 7, 10, generator=gen, dtype=torch.float64) * 3
    new_pred, new_target = sine_difference(pred, target, dim=dim)
    assert new_pred.shape == pred.shape and new_target.shape == target.shape
    torch.testing.assert_close(new_pred[..., dim] - new_target[..., dim], torch.sin(pred[..., dim] - target[..., dim]))
    other = [d for d in range(10) if d != dim]
    assert torch.equal(new_pred[..., other], pred[..., other])
    assert torch.equal(new_target[..., other], target[..., other])


def test_sine_difference_penalises_angle_modulo_pi(gen: torch.Generator) -> None:
    pred = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    target = pred.clone()
    target[:, 6] += math.pi
    new_pred, new_target = sine_difference(pred, target)
    torch.testing.assert_close(new_pred[:, 6] - new_target[:, 6], torch.zeros(5, dtype=torch.float64))


def test_giou_loss_is_one_minus_giou(gen: torch.Generator) -> None:
    a, b = random_xyxy(30, gen), random_xyxy(30, gen)
    assert torch.equal(giou_loss(a, b), 1 - giou_aligned(a, b))
    assert torch.equal(giou_loss(a, a), torch.zeros(30))
    assert ((giou_loss(a, b) >= 0) & (giou_loss(a, b) <= 2)).all()


# ---------------------------------------------------------------------- fp32 and autocast
def loss_cases(gen: torch.Generator) -> dict[str, tuple]:
    logits = torch.randn(6, 4, generator=gen) * 3
    onehot = (torch.rand(6, 4, generator=gen) < 0.3).float()
    labels = torch.tensor([0, 4, 2, 4, 1, 3])
    scores = torch.rand(6, generator=gen)
    prob = torch.rand(6, 4, generator=gen).clamp(1e-3, 1 - 1e-3)
    heat = torch.rand(6, 4, generator=gen)
    heat[0, 0] = 1.0
    pred, target = torch.randn(6, 10, generator=gen), torch.randn(6, 10, generator=gen)
    boxes_a, boxes_b = random_xyxy(6, gen), random_xyxy(6, gen)
    return {
        "sigmoid_focal": (sigmoid_focal_loss, (logits, onehot)),
        "quality_focal": (quality_focal_loss, (logits, labels, scores)),
        "gaussian_focal": (gaussian_focal_loss, (prob, heat)),
        "l1": (l1_loss, (pred, target)),
        "smooth_l1": (smooth_l1_loss, (pred, target)),
        "giou": (giou_loss, (boxes_a, boxes_b)),
    }


CASE_NAMES = ["sigmoid_focal", "quality_focal", "gaussian_focal", "l1", "smooth_l1", "giou"]


def to_dtype(args: tuple, dtype: torch.dtype) -> tuple:
    return tuple(a.to(dtype) if a.is_floating_point() else a for a in args)


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_half_inputs_are_computed_in_fp32(name: str, dtype: torch.dtype, gen: torch.Generator) -> None:
    fn, args = loss_cases(gen)[name]
    half = to_dtype(args, dtype)
    out = fn(*half)
    assert out.dtype == torch.float32
    # Same (rounded) inputs upcast by hand: the result is the fp32 computation.
    torch.testing.assert_close(out, fn(*to_dtype(half, torch.float32)), rtol=1e-3, atol=1e-3)
    # And close to the fp32 result of the unrounded inputs.
    reference = fn(*args)
    scale = reference.abs().max().clamp(min=1).item()
    assert (out - reference).abs().max().item() <= 0.05 * scale


@pytest.mark.parametrize("name", CASE_NAMES)
def test_half_keyword_arguments_are_upcast(name: str, gen: torch.Generator) -> None:
    fn, args = loss_cases(gen)[name]
    names = {
        "sigmoid_focal": ("logits", "targets"),
        "quality_focal": ("logits", "labels", "scores"),
        "gaussian_focal": ("pred", "target"),
        "l1": ("pred", "target"),
        "smooth_l1": ("pred", "target"),
        "giou": ("pred_xyxy", "target_xyxy"),
    }[name]
    half = to_dtype(args, torch.bfloat16)
    out = fn(half[0], **dict(zip(names[1:], half[1:], strict=True)))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, fn(*half))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_losses_under_cpu_autocast_are_fp32(name: str, gen: torch.Generator) -> None:
    fn, args = loss_cases(gen)[name]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(*args)
        out_half = fn(*to_dtype(args, torch.bfloat16))
    assert out.dtype == out_half.dtype == torch.float32
    torch.testing.assert_close(out, fn(*args), rtol=0, atol=0)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_empty_inputs_give_exact_zero_sum_and_zero_gradient(name: str, gen: torch.Generator) -> None:
    fn, args = loss_cases(gen)[name]
    empty = tuple(a[:0].detach().clone().requires_grad_(a.is_floating_point()) for a in args)
    total = fn(*empty).sum()
    assert total.dtype == torch.float32
    assert total.item() == 0.0
    floats = [a for a in empty if a.is_floating_point()]
    for grad, a in zip(torch.autograd.grad(total, floats), floats, strict=True):
        assert grad.shape == a.shape
        assert torch.equal(grad, torch.zeros_like(a))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_loss_gradients_are_finite(name: str, gen: torch.Generator) -> None:
    fn, args = loss_cases(gen)[name]
    leaves = tuple(a.detach().clone().requires_grad_(a.is_floating_point()) for a in args)
    total = fn(*leaves).sum()
    for grad in torch.autograd.grad(total, [a for a in leaves if a.requires_grad], allow_unused=True):
        assert grad is None or torch.isfinite(grad).all()
