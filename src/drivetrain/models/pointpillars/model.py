"""PointPillars: lidar points → pillars → BEV canvas → SECOND + SECONDFPN → anchor head, trained with
max-IoU anchor assignment and the anchor-head losses, through the engine's protocol (``forward(batch)``,
``loss(outputs, batch)``).

The data flow of mmdetection3d's ``MVXFasterRCNN`` with the nuScenes PointPillars SECFPN config
(``configs/pointpillars/pointpillars_hv_secfpn_sbn-all_8xb4-2x_nus-3d.py``): the data preprocessor's hard
voxelization, ``HardVFE``, ``PointPillarsScatter``, ``SECOND``, ``SECONDFPN``, ``Anchor3DHead`` with the
class-agnostic ``Max3DIoUAssigner`` (BEV nearest IoU) and its losses. Here the BEV augmentation of the
loader's pipeline (``GlobalRotScaleTrans``, ``RandomFlip3D``, range filters, ``PointShuffle``) runs at the
start of ``forward`` in training, batched on the batch's device (:func:`drivetrain.pipeline.lidar_input`),
from the model's own generator, whose state is saved with the model (exact resume).

``impl="reference"`` runs the assignment and the losses per sample as the originals do; ``"batched"`` all
samples at once (the same assignments and terms; see :mod:`drivetrain.match.max_iou`,
:mod:`drivetrain.losses.anchor_head`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from drivetrain.losses.anchor_head import AnchorHeadLoss
from drivetrain.match.max_iou import (
    MaxIoUConfig,
    anchor_thresholds,
    batched_max_iou_assign,
    reference_max_iou_assign,
)
from drivetrain.models.pointpillars.anchors import AnchorConfig, grid_anchors
from drivetrain.models.pointpillars.backbone import SECOND, SECONDFPN
from drivetrain.models.pointpillars.head import Anchor3DHead
from drivetrain.models.pointpillars.voxel_encoder import HardVFE
from drivetrain.pipeline.augment_bev import BevAugConfig
from drivetrain.pipeline.lidar import lidar_input
from drivetrain.pipeline.voxelize import VoxelGrid, scatter_to_bev

__all__ = ["PointPillars"]


class PointPillars(nn.Module):
    """The PointPillars detector; defaults are the published nuScenes SECFPN configuration.

    Args:
        point_cloud_range: ``(x_min, y_min, z_min, x_max, y_max, z_max)`` of the voxel grid.
        voxel_size: pillar size ``(vx, vy, vz)``.
        max_points: points kept per pillar.
        max_voxels: pillars kept per sample in training (``max_voxels_test`` in evaluation).
        max_voxels_test: pillars kept per sample in evaluation.
        point_dims: point features C (x, y, z, Δt: 4).
        vfe_channels: ``HardVFE`` layer widths.
        backbone_channels, layer_nums, layer_strides: ``SECOND``.
        neck_channels, upsample_strides: ``SECONDFPN``.
        anchor_ranges: per anchor size ``(x_lo, y_lo, z_lo, x_hi, y_hi, z_hi)`` (z: the anchor's bottom).
        anchor_sizes: ``(dx, dy, dz)`` per size.
        rotations: anchor yaws.
        num_classes: C.
        code_size: 9 (with velocity) or 7.
        assigner: ``(pos_iou_thr, neg_iou_thr, min_pos_iou)``.
        augment: ``BevAugConfig`` fields for training (None: no augmentation).
        seed: seed of the augmentation generator.
        impl: ``batched`` or ``reference`` assignment and losses.
        chunk: anchors per IoU slice in the batched assignment (None: all at once).
    """

    def __init__(
        self,
        point_cloud_range: Sequence[float] = (-50.0, -50.0, -5.0, 50.0, 50.0, 3.0),
        voxel_size: Sequence[float] = (0.25, 0.25, 8.0),
        max_points: int = 64,
        max_voxels: int = 30000,
        max_voxels_test: int = 40000,
        point_dims: int = 4,
        vfe_channels: Sequence[int] = (64, 64),
        backbone_channels: Sequence[int] = (64, 128, 256),
        layer_nums: Sequence[int] = (3, 5, 5),
        layer_strides: Sequence[int] = (2, 2, 2),
        neck_channels: Sequence[int] = (128, 128, 128),
        upsample_strides: Sequence[float] = (1, 2, 4),
        anchor_ranges: Sequence[Sequence[float]] | None = None,
        anchor_sizes: Sequence[Sequence[float]] | None = None,
        rotations: Sequence[float] = (0.0, 1.57),
        num_classes: int = 10,
        code_size: int = 9,
        assigner: Sequence[float] = (0.6, 0.3, 0.3),
        augment: dict[str, Any] | None = None,
        seed: int = 0,
        impl: str = "batched",
        chunk: int | None = None,
    ) -> None:
        super().__init__()
        if impl not in ("batched", "reference"):
            raise ValueError(f"impl: expected 'batched' or 'reference', got {impl!r}")
        if anchor_ranges is None or anchor_sizes is None:
            from drivetrain.models.pointpillars.anchors import NUS_PP_ANCHORS

            anchor_ranges, anchor_sizes = NUS_PP_ANCHORS.ranges, NUS_PP_ANCHORS.sizes
        self.impl, self.chunk, self.code_size, self.num_classes = impl, chunk, code_size, num_classes
        self.grid = VoxelGrid(tuple(point_cloud_range), tuple(voxel_size), max_points, max_voxels)  # type: ignore[arg-type]
        self.grid_test = VoxelGrid(tuple(point_cloud_range), tuple(voxel_size), max_points, max_voxels_test)  # type: ignore[arg-type]
        self.anchor_config = AnchorConfig(
            ranges=tuple(tuple(float(v) for v in r) for r in anchor_ranges),
            sizes=tuple(tuple(float(v) for v in s) for s in anchor_sizes),
            rotations=tuple(float(r) for r in rotations),
            custom_values=(0.0, 0.0) if code_size == 9 else (),
        )
        self.assigner = MaxIoUConfig(pos_iou_thr=assigner[0], neg_iou_thr=assigner[1], min_pos_iou=assigner[2])
        self.augment = BevAugConfig(**augment) if augment is not None else None
        self.seed = seed
        self._generator: torch.Generator | None = None
        self._generator_state: torch.Tensor | None = None
        self.vfe = HardVFE(point_dims, tuple(vfe_channels), self.grid)
        self.backbone = SECOND(vfe_channels[-1], tuple(backbone_channels), tuple(layer_nums), tuple(layer_strides))
        self.neck = SECONDFPN(tuple(backbone_channels), tuple(neck_channels), tuple(upsample_strides))
        num_anchors = len(anchor_sizes) * len(rotations)
        self.head = Anchor3DHead(self.neck.out_channels, num_anchors, num_classes, code_size)
        self.criterion = AnchorHeadLoss(num_classes=num_classes, code_weights=[1.0] * 7 + [0.2] * (code_size - 7))
        self._anchors: dict[tuple[Any, ...], torch.Tensor] = {}

    # -------------------------------------------------------------------------------------------- forward
    def _aug_generator(self, device: torch.device) -> torch.Generator:
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self.seed)
            if self._generator_state is not None:
                self._generator.set_state(self._generator_state)
                self._generator_state = None
        return self._generator

    def anchors(self, feature_size: tuple[int, int], device: torch.device) -> torch.Tensor:
        """The ``(H·W·A, D)`` anchors of a ``feature_size`` map (cached per size and device)."""
        key = (feature_size, str(device))
        if key not in self._anchors:
            self._anchors[key] = grid_anchors(self.anchor_config, feature_size, device)[:, : self.code_size]
        return self._anchors[key]

    def forward(self, batch: Any) -> dict[str, Any]:
        """Voxelize (after the BEV augmentation in training) and run the network.

        Returns:
            ``cls_logits (B, A, C)``, ``box_preds (B, A, D)``, ``dir_logits (B, A, 2)``, ``anchors (A, D)``, and
            the ground truth the loss must use, ``gt_boxes`` / ``gt_labels`` (augmented in training).
        """
        device = batch.points.device
        training = self.training and self.augment is not None
        grid = self.grid if self.training else self.grid_test
        generator = self._aug_generator(device) if training else None
        x = lidar_input(batch, grid, self.augment if training else None, generator)
        feats = self.vfe(x.voxels, x.num_points, x.coors)  # (V, C)
        canvas = scatter_to_bev(feats, x.coors, x.batch_size, grid)  # (B, C, ny, nx)
        neck = self.neck(self.backbone(canvas))  # (B, ΣC, H, W)
        out = self.head(neck)
        out["anchors"] = self.anchors((neck.shape[2], neck.shape[3]), device)  # (A, D)
        out["gt_boxes"] = x.gt_boxes.apply(lambda t: t[..., : self.code_size])  # (B, G, D)
        out["gt_labels"] = x.gt_labels  # (B, G)
        return out

    # ----------------------------------------------------------------------------------------------- loss
    @property
    def loss_weights(self) -> dict[str, float]:
        """The published weights of the terms (a run config's ``model.loss_weights`` overrides them)."""
        return dict(self.criterion.weights)

    def assign(self, anchors: torch.Tensor, gt_boxes: Any, gt_labels: Any) -> torch.Tensor:
        """``(B, A)`` anchor assignment (−1 ignore, 0 negative, k ≥ 1 GT k−1), batched or per sample."""
        with torch.no_grad():
            if self.impl == "batched":
                thresholds = anchor_thresholds(self.assigner, num_anchors=anchors.shape[0], device=anchors.device)
                return batched_max_iou_assign(anchors, gt_boxes, gt_labels, thresholds, chunk=self.chunk)
            boxes, labels = gt_boxes.to_list(), gt_labels.to_list()
            return torch.stack(
                [reference_max_iou_assign(anchors, b, lab, self.assigner) for b, lab in zip(boxes, labels, strict=True)]
            )  # (B, A)

    def loss(self, outputs: dict[str, Any], batch: Any) -> dict[str, torch.Tensor]:
        """The unweighted terms ``loss_cls``, ``loss_bbox``, ``loss_dir``."""
        anchors, gt_boxes, gt_labels = outputs["anchors"], outputs["gt_boxes"], outputs["gt_labels"]
        assigned = self.assign(anchors, gt_boxes, gt_labels)
        return self.criterion(
            outputs["cls_logits"],
            outputs["box_preds"],
            outputs["dir_logits"],
            anchors,
            assigned,
            gt_boxes,
            gt_labels,
            impl=self.impl,
        )

    # ------------------------------------------------------------------------------------ exact resume
    def get_extra_state(self) -> dict[str, Any]:
        """The augmentation generator's state, so a resumed run draws what the uninterrupted one draws."""
        if self._generator is not None:
            return {"generator": self._generator.get_state()}
        return {"generator": self._generator_state}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_extra_state` (applied when the generator is next created or now)."""
        self._generator_state = state.get("generator")
        if self._generator is not None and self._generator_state is not None:
            self._generator.set_state(self._generator_state)
            self._generator_state = None
