"""Detection losses, elementwise and unreduced: the caller sums and divides by an explicit average factor.

All functions compute in fp32, also under autocast (half inputs are upcast and autocast is disabled
inside), because focal terms underflow in fp16. Shapes broadcast; empty inputs give empty outputs, so a
sum over them is an exact zero with zero gradients.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F

from drivetrain.geometry import giou_aligned

__all__ = [
    "class_mask",
    "gaussian_focal_loss",
    "giou_loss",
    "l1_loss",
    "quality_focal_loss",
    "sigmoid_focal_loss",
    "sigmoid_focal_loss_sum",
    "sine_difference",
    "smooth_l1_loss",
]

Fn = TypeVar("Fn", bound=Callable[..., torch.Tensor])


def class_mask(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Bool one-hot ``(..., C)`` of int ``labels`` ``(...)``; labels outside ``[0, C)`` (background) are all
    False. A comparison, so unlike ``F.one_hot`` it never checks label ranges with a device sync."""
    return labels.unsqueeze(-1) == torch.arange(num_classes, device=labels.device)  # (..., C)


def fp32(fn: Fn) -> Fn:
    """Run ``fn`` with autocast off and floating tensor arguments upcast to fp32."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        def up(x):  # type: ignore[no-untyped-def]
            return x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x

        device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        with torch.autocast(device_type=device, enabled=False):
            return fn(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()})

    return wrapper  # type: ignore[return-value]


@fp32
def sigmoid_focal_loss(
    logits: torch.Tensor, targets: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0
) -> torch.Tensor:
    """Sigmoid focal loss per element (RetinaNet / mmdet ``FocalLoss``).

    ``BCE(s, t) · (α t + (1−α)(1−t)) · ((1−p) t + p (1−t))^γ`` with ``p = sigmoid(s)``.

    Args:
        logits: ``(..., C)``.
        targets: ``(..., C)`` one-hot (or soft) targets in [0, 1], broadcastable to ``logits``.
        alpha: weight of the positive term (0.25); the negative term gets ``1 − α``.
        gamma: focusing exponent (2).

    Returns:
        ``(..., C)`` fp32.
    """
    logits, targets = torch.broadcast_tensors(logits, targets)  # targets may broadcast, e.g. over layers
    prob = logits.sigmoid()  # (..., C)
    pt = (1 - prob) * targets + prob * (1 - targets)  # (..., C)
    weight = (alpha * targets + (1 - alpha) * (1 - targets)) * pt.pow(gamma)  # (..., C)
    return F.binary_cross_entropy_with_logits(logits, targets, reduction="none") * weight  # (..., C)


class _FocalSum(torch.autograd.Function):
    """``Σ_a w_a Σ_c FL(s_ac, [label_a = c])`` with its gradient in closed form (see :func:`sigmoid_focal_loss_sum`)."""

    @staticmethod
    def forward(ctx, logits, labels, weights, alpha, gamma):  # type: ignore[no-untyped-def, override]
        num_classes = logits.shape[-1]
        valid = (labels >= 0) & (labels < num_classes)  # (N,)
        index = labels.clamp(0, num_classes - 1).unsqueeze(-1)  # (N, 1)
        prob = logits.sigmoid()  # (N, C)
        soft = F.softplus(logits)  # (N, C) = BCE(s, 0)
        neg = prob.pow(gamma).mul_(soft)  # (N, C): FL(s, 0) / (1 − α)
        kept = neg.gather(-1, index)  # (N, 1)
        neg.scatter_(-1, index, torch.where(valid.unsqueeze(-1), 0.0, kept))  # (N, C): the label's entry dropped
        x = logits.gather(-1, index)  # (N, 1)
        prob_t, soft_t = torch.sigmoid(-x), F.softplus(-x)  # (N, 1): sigmoid and BCE(s, 1) at the label
        pos = torch.where(valid.unsqueeze(-1), prob_t.pow(gamma) * soft_t, 0.0).squeeze(-1)  # (N,) FL(s, 1) / α
        total = (1 - alpha) * (neg.sum(-1) * weights).sum() + alpha * (pos * weights).sum()  # ()
        ctx.save_for_backward(logits, prob, soft, weights, valid, index, prob_t, soft_t)
        ctx.alpha, ctx.gamma = alpha, gamma
        return total

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        logits, prob, soft, weights, valid, index, prob_t, soft_t = ctx.saved_tensors
        alpha, gamma = ctx.alpha, ctx.gamma
        # d/ds [σ(s)^γ softplus(s)] = σ(s)^γ (γ σ(−s) softplus(s) + σ(s)): every term ≥ 0, no cancellation, and
        # σ(−s) is computed as such (1 − σ(s) would lose its digits for s ≫ 0)
        scale = (grad * (1 - alpha) * weights).unsqueeze(-1)  # (N, 1)
        out = torch.sigmoid(-logits).mul_(soft).mul_(gamma).add_(prob).mul_(prob.pow(gamma)).mul_(scale)  # (N, C)
        # the label's entry: FL(s, 1) = α σ(−s)^γ softplus(−s),
        # so d/ds = −α σ(−s)^γ (γ σ(s) softplus(−s) + σ(−s))
        label = prob.gather(-1, index) * soft_t * gamma + prob_t  # (N, 1)
        label = -(grad * alpha * weights).unsqueeze(-1) * prob_t.pow(gamma) * label  # (N, 1)
        out.scatter_(-1, index, torch.where(valid.unsqueeze(-1), label, out.gather(-1, index)))  # (N, C)
        return out, None, None, None, None


@fp32
def sigmoid_focal_loss_sum(
    logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0
) -> torch.Tensor:
    """``Σ_a w_a Σ_c FL(s_ac, t_ac)`` for one-hot targets given by their labels: :func:`sigmoid_focal_loss`
    summed, in fewer passes over the ``(..., C)`` logits, with a closed-form backward.

    Every entry is a negative ``(1 − α) σ(s)^γ softplus(s)`` except the label's, which is
    ``α σ(−s)^γ softplus(−s)`` (``1 − σ(s) = σ(−s)``, ``BCE(s, 1) = softplus(−s)``); the label's entry is computed
    at the gathered logit, so nothing is added and subtracted. The values equal :func:`sigmoid_focal_loss`'s up
    to rounding (a different but equally accurate formula per element: a few ulps), and so does the gradient
    (``σ(s)^γ (γ σ(−s) softplus(s) + σ(s))``, a sum of non-negative terms, with ``σ(−s)`` computed as such):
    more accurate than autograd through the elementwise formula, whose ``1 − σ(s)`` loses digits for ``s ≫ 0``.

    Args:
        logits: ``(..., C)``.
        labels: int ``(...)``; a label outside ``[0, C)`` (background) makes every class a negative.
        weights: ``(...)`` per-row weights (0 drops a row); no gradient flows to them.
        alpha: weight of the positive term (0.25); the negative term gets ``1 − α``.
        gamma: focusing exponent (2).

    Returns:
        ``()`` fp32; differentiable in ``logits``.
    """
    num_classes = logits.shape[-1]
    flat = logits.reshape(-1, num_classes)  # (N, C)
    return _FocalSum.apply(flat, labels.reshape(-1), weights.reshape(-1).detach(), float(alpha), float(gamma))


@fp32
def quality_focal_loss(
    logits: torch.Tensor, labels: torch.Tensor, scores: torch.Tensor, beta: float = 2.0
) -> torch.Tensor:
    """Quality focal loss per element (GFL): the positive class is trained towards an IoU score.

    Every class of every query is a negative ``BCE(s, 0) · sigmoid(s)^β``, except a positive query's own
    class: ``BCE(s, score) · |score − sigmoid(s)|^β``.

    Args:
        logits: ``(..., C)``.
        labels: int ``(...)``; ``C`` (or any value outside ``[0, C)``) means background.
        scores: ``(...)`` quality targets (IoU) in [0, 1] for positives; ignored for background.
        beta: exponent of the modulating factor (2).

    Returns:
        ``(..., C)`` fp32.
    """
    prob = logits.sigmoid()  # (..., C)
    negative = F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits), reduction="none") * prob.pow(beta)
    one_hot = class_mask(labels, logits.shape[-1])  # (..., C)
    # Background scores are unused; zero them so that NaN padding cannot reach the gradient through where().
    score = torch.where(one_hot.any(-1), scores, 0.0).unsqueeze(-1).expand_as(logits)  # (..., C)
    positive = F.binary_cross_entropy_with_logits(logits, score, reduction="none") * (score - prob).abs().pow(beta)
    return torch.where(one_hot, positive, negative)  # (..., C)


@fp32
def gaussian_focal_loss(
    pred: torch.Tensor, target: torch.Tensor, alpha: float = 2.0, gamma: float = 4.0, eps: float = 1e-12
) -> torch.Tensor:
    """Gaussian focal loss per element (CenterNet heatmaps) on probabilities.

    ``−log(p+ε)(1−p)^α`` where the target is 1, ``−log(1−p+ε) p^α (1−t)^γ`` everywhere.

    Args:
        pred: ``(...)`` probabilities (already through sigmoid and clamped by the caller).
        target: ``(...)`` Gaussian heatmap in [0, 1].
        alpha: exponent of the prediction factor (2).
        gamma: exponent of the ``(1 − t)`` down-weighting of negatives near a peak (4).
        eps: added inside the logarithms.

    Returns:
        ``(...)`` fp32.
    """
    pos = -(pred + eps).log() * (1 - pred).pow(alpha) * target.eq(1)  # (...)
    neg = -(1 - pred + eps).log() * pred.pow(alpha) * (1 - target).pow(gamma)  # (...)
    return pos + neg  # (...)


@fp32
def l1_loss(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """``|pred − target| · weight`` per element."""
    loss = (pred - target).abs()
    return loss if weight is None else loss * weight


@fp32
def smooth_l1_loss(
    pred: torch.Tensor, target: torch.Tensor, beta: float = 1.0 / 9.0, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Smooth L1 per element: ``0.5 d² / β`` below ``β``, ``d − 0.5 β`` above (``β = 0`` is plain L1)."""
    diff = (pred - target).abs()
    loss = diff if beta <= 0 else torch.where(diff < beta, 0.5 * diff * diff / beta, diff - 0.5 * beta)
    return loss if weight is None else loss * weight


def sine_difference(pred: torch.Tensor, target: torch.Tensor, dim: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace the yaw entries so that their difference is ``sin(yaw_p − yaw_t)`` (mmdetection3d's
    ``Anchor3DHead.add_sin_difference``).

    Returns ``pred`` with ``sin(p) cos(t)`` and ``target`` with ``cos(p) sin(t)`` at ``[..., dim]``; the
    regression loss on them then penalises the angle modulo π (direction comes from a separate classifier).
    """
    p, t = pred[..., dim : dim + 1], target[..., dim : dim + 1]
    new_pred = torch.cat([pred[..., :dim], p.sin() * t.cos(), pred[..., dim + 1 :]], dim=-1)
    new_target = torch.cat([target[..., :dim], p.cos() * t.sin(), target[..., dim + 1 :]], dim=-1)
    return new_pred, new_target


@fp32
def giou_loss(pred_xyxy: torch.Tensor, target_xyxy: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``1 − GIoU`` of corresponding boxes: ``(..., 4)`` and ``(..., 4)`` → ``(...)``."""
    return 1 - giou_aligned(pred_xyxy, target_xyxy, eps)
