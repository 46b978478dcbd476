"""Matching costs over padded targets, batched over any leading dims.

Every cost takes predictions ``(..., Q, ·)`` and targets ``(..., G, ·)`` and returns ``(..., Q, G)``;
the leading dims broadcast, so one call builds the cost matrices of all decoder layers × samples (or
cameras) at once. Target padding gives finite garbage that the solver never looks at (it only reads the
first ``num_gt`` columns of each problem). Costs are unweighted; assigners apply the weights.

The pairwise L1 costs use ``torch.cdist(p=1)`` (see :func:`l1_cost`); both paths (reference and batched)
use it, so the per-sample and batched cost matrices are bitwise equal.
"""

from __future__ import annotations

import torch

from drivetrain.geometry import boxes_cxcywh_to_xyxy, giou_pairwise, unnormalize_boxes

__all__ = ["bbox3d_l1_cost", "centre_l1_cost", "focal_cost", "giou_cost", "l1_cost"]


def focal_cost(
    logits: torch.Tensor, labels: torch.Tensor, alpha: float = 0.25, gamma: float = 2.0, eps: float = 1e-12
) -> torch.Tensor:
    """Focal classification cost of predicting each target's class.

    ``cost[q, g] = pos[q, y_g] - neg[q, y_g]`` with ``p = sigmoid(logits)``,
    ``pos = -alpha (1-p)^gamma log(p + eps)`` and ``neg = -(1-alpha) p^gamma log(1-p + eps)``.

    Args:
        logits: ``(..., Q, C)`` class logits.
        labels: int ``(..., G)`` target classes in ``[0, C)`` (padding must hold a valid class, e.g. 0).
        alpha: weight of the positive term (0.25).
        gamma: focusing exponent (2).
        eps: added inside the logarithms.

    Returns:
        ``(..., Q, G)``: float64 for float64 logits, else float32 (half types are computed in fp32).
    """
    prob = (logits if logits.dtype == torch.float64 else logits.float()).sigmoid()  # (..., Q, C)
    neg = -(1 - alpha) * prob.pow(gamma) * (1 - prob + eps).log()  # (..., Q, C)
    pos = -alpha * (1 - prob).pow(gamma) * (prob + eps).log()  # (..., Q, C)
    per_class = pos - neg  # (..., Q, C)
    q = per_class.shape[-2]
    index = labels.long().unsqueeze(-2).expand(*labels.shape[:-1], q, labels.shape[-1])  # (..., Q, G)
    lead = torch.broadcast_shapes(per_class.shape[:-2], index.shape[:-2])
    return torch.gather(per_class.expand(*lead, *per_class.shape[-2:]), -1, index.expand(*lead, *index.shape[-2:]))


def l1_cost(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Pairwise L1 distance: ``(..., Q, D)`` and ``(..., G, D)`` → ``(..., Q, G)`` (leading dims broadcast).

    Uses ``torch.cdist(p=1)``, which computes each pair directly (no matmul trick, so no cancellation),
    is differentiable, and gives bitwise the same value for a pair whether called per sample or on a
    whole batch. Measured here (2-core CPU, torch 2.13) it beats the broadcast form
    ``|a[..., :, None] - b[..., None, :]|.sum(-1)`` by ~4× per sample and ~4× batched.
    """
    lead = torch.broadcast_shapes(pred.shape[:-2], target.shape[:-2])
    dtype = torch.promote_types(pred.dtype, target.dtype)  # torch.result_type breaks a compiled graph
    pred = pred.to(dtype).expand(*lead, *pred.shape[-2:])  # (..., Q, D)
    target = target.to(dtype).expand(*lead, *target.shape[-2:])  # (..., G, D)
    if pred.shape[-1] == 0:
        return pred.new_zeros((*lead, pred.shape[-2], target.shape[-2]))  # (..., Q, G)
    return torch.cdist(pred, target, p=1.0)  # (..., Q, G)


def bbox3d_l1_cost(
    pred_codes: torch.Tensor, gt_codes: torch.Tensor, code_weights: torch.Tensor, dims: int = 8
) -> torch.Tensor:
    """Code-weighted L1 between encoded 3D boxes on their first ``dims`` dims (no velocity by default).

    Args:
        pred_codes: ``(..., Q, D)`` predicted box codes (the model's box code, ``D`` ≥ ``dims``).
        gt_codes: ``(..., G, D')`` encoded targets, ``D'`` ≥ ``dims``.
        code_weights: ``(D,)`` per-dim weights (e.g. 2, 2, 1, 1, 1, 1, 1, 1, 1, 1); both sides are weighted.
        dims: leading dims compared (8: centre, size, yaw; the velocity is left out, as in the original).

    Returns:
        ``(..., Q, G)``.
    """
    w = code_weights[:dims].to(pred_codes.dtype)  # (dims,)
    return l1_cost(pred_codes[..., :dims] * w, gt_codes[..., :dims] * w)  # (..., Q, G)


def giou_cost(
    pred_cxcywh: torch.Tensor, gt_xyxy_pixels: torch.Tensor, image_size: torch.Tensor | tuple[float, float]
) -> torch.Tensor:
    """Negative GIoU in pixels between normalised cxcywh predictions and pixel xyxy targets.

    Args:
        pred_cxcywh: ``(..., Q, 4)`` in [0, 1].
        gt_xyxy_pixels: ``(..., G, 4)`` pixel boxes.
        image_size: ``(W, H)``.

    Returns:
        ``(..., Q, G)`` = ``-GIoU``.
    """
    pred_pixels = unnormalize_boxes(boxes_cxcywh_to_xyxy(pred_cxcywh), image_size)  # (..., Q, 4)
    return -giou_pairwise(pred_pixels, gt_xyxy_pixels)  # (..., Q, G)


def centre_l1_cost(pred_centres: torch.Tensor, gt_centres: torch.Tensor) -> torch.Tensor:
    """Pairwise L1 between normalised 2D centres: ``(..., Q, 2)`` and ``(..., G, 2)`` → ``(..., Q, G)``."""
    return l1_cost(pred_centres, gt_centres)  # (..., Q, G)
