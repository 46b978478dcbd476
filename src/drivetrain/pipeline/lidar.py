"""The lidar model's input: a collated batch's points and boxes, (augmented and) voxelized on its device.

mmdetection3d runs these steps per sample — the BEV augmentation in the loader workers, the voxelization in
the data preprocessor's loop over samples. Here they run once for the whole batch on the device the batch
is on (after ``Batch.to(device)``)::

    Batch (points (B, P, C), gt_boxes (B, G, 9), gt_labels (B, G))   ← FrameDataset (sweep cache) + collate
      └ pipeline.augment.bev: sample_bev_params → apply_bev_aug       (training; no host sync)
        └ pipeline.voxelize: hard_voxelize                            (one count read: V, the output's shape)
          └ LidarInput (voxels (V, T, C), coors (V, 4) (b, z, y, x), num_points (V,), boxes, labels, params)

In training the trainer's augmentation stage (:mod:`.augment.stage`, ``data.augment.lidar``) has augmented the
batch already, in the prefetcher or the loader workers, so the lidar models call :func:`lidar_input` without
``augment``: it only voxelizes. With ``augment`` it composes both steps — the building block for code of one's
own, and what the tests hold against :func:`reference_lidar_input`, which does the same sample by sample with
the per-sample references (``reference_bev_aug``, ``reference_hard_voxelize_batch``) and the same parameters.

Voxelization stays in the model's forward rather than moving ahead into the prefetcher (as a frozen image encoder
can): :func:`~.voxelize.hard_voxelize` reads its voxel count on the host, which on the prefetcher's side stream
would stall the overlap; the padded variant that reads nothing pads every sample to ``max_voxels``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from drivetrain.batch import Batch
from drivetrain.pipeline.augment.bev import (
    BevAugConfig,
    BevAugParams,
    apply_bev_aug,
    reference_bev_aug,
    sample_bev_params,
)
from drivetrain.pipeline.voxelize import VoxelGrid, hard_voxelize, reference_hard_voxelize_batch
from drivetrain.ragged import RaggedBatch

__all__ = ["LidarInput", "lidar_input", "reference_lidar_input"]


@dataclass(frozen=True)
class LidarInput:
    """What a pillar/voxel detector consumes: the batch's voxels and its (augmented) ground truth."""

    voxels: torch.Tensor  # (V, T, C) the points' dtype, zero padded
    coors: torch.Tensor  # (V, 4) int32 (b, z, y, x)
    num_points: torch.Tensor  # (V,) int32
    num_voxels: torch.Tensor  # (B,) int64 voxels per sample
    points: RaggedBatch  # (B, P, C) the augmented points (range-filtered, shuffled)
    gt_boxes: RaggedBatch  # (B, G, 9) (x, y, z_centre, dx, dy, dz, yaw, vx, vy) after augmentation
    gt_labels: RaggedBatch  # (B, G) int64
    params: BevAugParams | None  # the augmentation drawn (None: not augmented), replayable
    num_stored: int | None = None  # Σ num_points on the host (from the voxelization's one read), or None

    @property
    def batch_size(self) -> int:
        """Samples, B."""
        return int(self.num_voxels.shape[0])


def lidar_input(
    batch: Batch,
    grid: VoxelGrid,
    augment: BevAugConfig | None = None,
    generator: torch.Generator | None = None,
    params: BevAugParams | None = None,
) -> LidarInput:
    """Augment (when ``augment`` is given) and voxelize a batch, all samples at once on the batch's device.

    Args:
        batch: a collated batch with ``points`` (``DatasetConfig(load_points=True)``).
        grid: the hard voxel grid (``max_points``, ``max_voxels`` set).
        augment: the BEV augmentation; None for evaluation (points outside the grid are dropped by the
            voxelization, as mmdetection3d's test pipeline does with its range filter).
        generator: draws the augmentation (on the batch's device); needed with ``augment`` unless ``params``.
        params: replay these parameters instead of drawing new ones.

    Raises:
        ValueError: the batch has no points, or ``augment`` without ``generator`` or ``params``.
    """
    if batch.points is None:
        raise ValueError("batch.points: the batch has no lidar points; load them with DatasetConfig(load_points=True)")
    points, boxes, labels = batch.points, batch.gt_boxes, batch.gt_labels
    if augment is not None:
        if params is None:
            if generator is None:
                raise ValueError("generator: augmenting needs a torch.Generator (or params to replay)")
            params = sample_bev_params(points, augment, generator)
        points, boxes, labels = apply_bev_aug(points, boxes, labels, params, augment)
    vox = hard_voxelize(points, grid)
    return LidarInput(
        vox.voxels, vox.coors, vox.num_points, vox.num_voxels, points, boxes, labels, params, vox.num_stored
    )


def reference_lidar_input(
    batch: Batch, grid: VoxelGrid, augment: BevAugConfig | None = None, params: BevAugParams | None = None
) -> LidarInput:
    """:func:`lidar_input` sample by sample with the reference paths and the given ``params``."""
    if batch.points is None:
        raise ValueError("batch.points: the batch has no lidar points")
    clouds, boxes, labels = batch.points.to_list(), batch.gt_boxes.to_list(), batch.gt_labels.to_list()
    if augment is not None:
        if params is None:
            raise ValueError("params: the reference path replays given parameters")
        outs = [
            reference_bev_aug(c, b, lab, params.sample(i), augment)
            for i, (c, b, lab) in enumerate(zip(clouds, boxes, labels, strict=True))
        ]
        clouds, boxes, labels = ([o[k] for o in outs] for k in range(3))
    voxels = reference_hard_voxelize_batch(clouds, grid)
    return LidarInput(
        voxels.voxels,
        voxels.coors,
        voxels.num_points,
        voxels.num_voxels,
        RaggedBatch.from_list(clouds),
        RaggedBatch.from_list(boxes),
        RaggedBatch.from_list(labels),
        params,
    )
