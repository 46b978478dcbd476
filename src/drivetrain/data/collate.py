"""Collating loaded samples into a :class:`~drivetrain.batch.Batch` (the type lives in :mod:`drivetrain.batch`,
below the data, pipeline, models and losses that read it). Glossary: ``B`` samples, ``N`` cameras, ``G`` max GT
boxes (3D: per sample; 2D: per image), ``P`` max points.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from drivetrain.batch import Batch
from drivetrain.data.dataset import Sample, Skipped
from drivetrain.data.errors import DataError
from drivetrain.ragged import RaggedBatch

__all__ = ["collate"]


def collate(samples: Sequence[Sample | Skipped]) -> Batch:
    """Stack samples into a :class:`Batch` (images copied once, into ``(B, N, 3, H, W)``)."""
    skipped = tuple(s.token for s in samples if isinstance(s, Skipped))
    kept = [s for s in samples if isinstance(s, Sample)]
    if not kept:
        reasons = "; ".join(s.reason for s in samples if isinstance(s, Skipped))
        raise DataError(f"every sample of the batch was unreadable: {reasons}")
    first = kept[0]
    for s in kept[1:]:
        if s.image_size != first.image_size or len(s.intrinsics) != len(first.intrinsics):
            raise DataError(
                f"frame {s.index}: image size {s.image_size} or camera count differs from frame {first.index}"
            )
    images = None
    if first.images is not None:
        n, h, w, _ = first.images.shape
        images = torch.empty((len(kept), n, 3, h, w), dtype=torch.uint8)  # (B, N, 3, H, W)
        for b, s in enumerate(kept):
            images[b].copy_(torch.from_numpy(s.images).permute(0, 3, 1, 2))
    ego_pose = np.stack([s.ego_pose for s in kept])  # (B, 4, 4) float64
    ego_inv = np.linalg.inv(ego_pose)

    def stack(name: str) -> torch.Tensor:
        return torch.from_numpy(np.stack([getattr(s, name) for s in kept]))

    per_cam = [[b2d for b2d in s.boxes_2d] for s in kept]
    return Batch(
        images=images,
        intrinsics=stack("intrinsics"),
        lidar2img=stack("lidar2img"),
        cam2ego=stack("cam2ego"),
        lidar2ego=stack("lidar2ego"),
        ego_pose=torch.from_numpy(ego_pose.astype(np.float32)),
        ego_pose_inv=torch.from_numpy(ego_inv.astype(np.float32)),
        timestamps=torch.tensor([s.timestamp for s in kept], dtype=torch.float64),
        prev_exists=torch.tensor([s.prev_exists for s in kept], dtype=torch.bool),
        gt_boxes=RaggedBatch.from_list([s.gt_boxes for s in kept]),
        gt_labels=RaggedBatch.from_list([s.gt_labels for s in kept]),
        gt_boxes_2d=RaggedBatch.from_list([[c.boxes for c in cams] for cams in per_cam]),
        gt_labels_2d=RaggedBatch.from_list(
            [[s.gt_labels[c.index] for c in cams] for s, cams in zip(kept, per_cam, strict=True)]
        ),
        centers_2d=RaggedBatch.from_list([[c.centers for c in cams] for cams in per_cam]),
        depths_2d=RaggedBatch.from_list([[c.depths for c in cams] for cams in per_cam]),
        gt_index_2d=RaggedBatch.from_list([[c.index for c in cams] for cams in per_cam]),
        points=RaggedBatch.from_list([s.points for s in kept]) if first.points is not None else None,
        image_size=first.image_size,
        sample_tokens=tuple(s.token for s in kept),
        frame_index=torch.tensor([s.index for s in kept], dtype=torch.int64),
        skipped=skipped,
    )
