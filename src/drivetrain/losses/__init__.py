"""Detection losses (elementwise, fp32) and average factors."""

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
    "average_factor",
    "gaussian_focal_loss",
    "giou_loss",
    "l1_loss",
    "quality_focal_loss",
    "sigmoid_focal_loss",
    "sigmoid_focal_loss_sum",
    "sine_difference",
    "smooth_l1_loss",
]
