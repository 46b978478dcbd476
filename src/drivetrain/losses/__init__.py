"""Detection losses (elementwise, fp32) and average factors."""

from drivetrain.losses.anchor_head import AnchorHeadLoss, batched_anchor_head_loss, reference_anchor_head_loss
from drivetrain.losses.functional import (
    gaussian_focal_loss,
    giou_loss,
    l1_loss,
    quality_focal_loss,
    sigmoid_focal_loss,
    sigmoid_focal_loss_sum,
    sine_difference,
    smooth_l1_loss,
)
from drivetrain.losses.normalize import average_factor

__all__ = [
    "AnchorHeadLoss",
    "average_factor",
    "batched_anchor_head_loss",
    "gaussian_focal_loss",
    "giou_loss",
    "l1_loss",
    "quality_focal_loss",
    "reference_anchor_head_loss",
    "sigmoid_focal_loss",
    "sigmoid_focal_loss_sum",
    "sine_difference",
    "smooth_l1_loss",
]
