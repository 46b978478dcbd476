"""Preparing batches for the model: host→device transfer, the lidar input (BEV augmentation of points and
boxes, voxelization, the BEV scatter) — more to come: stream prefetch, GPU camera augmentation, DALI."""

from drivetrain.pipeline.augment_bev import BevAugConfig, BevAugParams, apply_bev_aug, sample_bev_params
from drivetrain.pipeline.lidar import LidarInput, lidar_input
from drivetrain.pipeline.transfer import to_device
from drivetrain.pipeline.voxelize import HardVoxels, VoxelGrid, dynamic_voxelize, hard_voxelize, scatter_to_bev

__all__ = [
    "BevAugConfig",
    "BevAugParams",
    "HardVoxels",
    "LidarInput",
    "VoxelGrid",
    "apply_bev_aug",
    "dynamic_voxelize",
    "hard_voxelize",
    "lidar_input",
    "sample_bev_params",
    "scatter_to_bev",
    "to_device",
]
