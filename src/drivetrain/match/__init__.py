"""Matching: costs over padded targets, batched linear assignment, Hungarian assigners."""

from drivetrain.match.assigners import HungarianAssigner2D, HungarianAssigner3D
from drivetrain.match.costs import bbox3d_l1_cost, centre_l1_cost, focal_cost, giou_cost, l1_cost
from drivetrain.match.solve import BACKENDS, gpu_solver_available, pairs_from_assignment, solve

__all__ = [
    "BACKENDS",
    "HungarianAssigner2D",
    "HungarianAssigner3D",
    "bbox3d_l1_cost",
    "centre_l1_cost",
    "focal_cost",
    "giou_cost",
    "gpu_solver_available",
    "l1_cost",
    "pairs_from_assignment",
    "solve",
]
