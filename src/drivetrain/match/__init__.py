"""Matching: costs over padded targets, batched linear assignment, Hungarian assigners, max-IoU anchor assignment."""

from drivetrain.match.assigners import HungarianAssigner2D, HungarianAssigner3D
from drivetrain.match.costs import bbox3d_l1_cost, centre_l1_cost, focal_cost, giou_cost, l1_cost
from drivetrain.match.max_iou import (
    MaxIoUConfig,
    anchor_thresholds,
    batched_max_iou_assign,
    reference_max_iou_assign,
    reference_max_iou_assign_per_class,
)
from drivetrain.match.solve import (
    BACKENDS,
    gpu_solver_available,
    gpu_solver_shapes,
    gpu_solver_status,
    pairs_from_assignment,
    solve,
    warm_gpu_solver,
    warm_pending,
)

__all__ = [
    "BACKENDS",
    "HungarianAssigner2D",
    "HungarianAssigner3D",
    "MaxIoUConfig",
    "anchor_thresholds",
    "batched_max_iou_assign",
    "bbox3d_l1_cost",
    "centre_l1_cost",
    "focal_cost",
    "giou_cost",
    "gpu_solver_available",
    "gpu_solver_shapes",
    "gpu_solver_status",
    "l1_cost",
    "pairs_from_assignment",
    "reference_max_iou_assign",
    "reference_max_iou_assign_per_class",
    "solve",
    "warm_gpu_solver",
    "warm_pending",
]
