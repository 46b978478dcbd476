"""Preparing batches for the model: host→device transfer (per tensor, or packed), the side-stream prefetcher,
the training augmentation — one stage for camera and lidar, a whole batch on its device (and its per-sample
reference for the loader workers) — and the lidar input (voxelization, the BEV scatter)."""

from drivetrain.pipeline.augment.bev import BevAugConfig, BevAugParams, apply_bev_aug, sample_bev_params
from drivetrain.pipeline.augment.camera import CameraAugConfig, CameraAugParams
from drivetrain.pipeline.augment.image_ops import (
    ImageAugConfig,
    ImageAugParams,
    ida_matrix,
    sample_image_params,
    warp_images,
)
from drivetrain.pipeline.augment.stage import Augmentation, AugmentConfig, AugmentParams
from drivetrain.pipeline.lidar import LidarInput, lidar_input
from drivetrain.pipeline.prefetch import DevicePrefetcher
from drivetrain.pipeline.transfer import PackedCopier, to_device
from drivetrain.pipeline.voxelize import HardVoxels, VoxelGrid, dynamic_voxelize, hard_voxelize, scatter_to_bev

__all__ = [
    "AugmentConfig",
    "AugmentParams",
    "Augmentation",
    "BevAugConfig",
    "BevAugParams",
    "CameraAugConfig",
    "CameraAugParams",
    "DevicePrefetcher",
    "HardVoxels",
    "ImageAugConfig",
    "ImageAugParams",
    "LidarInput",
    "PackedCopier",
    "VoxelGrid",
    "apply_bev_aug",
    "dynamic_voxelize",
    "hard_voxelize",
    "ida_matrix",
    "lidar_input",
    "sample_bev_params",
    "sample_image_params",
    "scatter_to_bev",
    "to_device",
    "warp_images",
]
