"""PointPillars (and, to come, SSN): lidar detectors after mmdetection3d, in plain PyTorch.

One concept per file: ``voxel_encoder.py`` (HardVFE pillar features), ``backbone.py`` (SECOND + SECONDFPN),
``head.py`` (Anchor3DHead; SSN's ShapeAwareHead), ``anchors.py`` (aligned range anchors, shared and per
class), ``model.py`` (:class:`PointPillars`: ``forward(batch)`` / ``loss(outputs, batch)``). Shared pieces
live where DESIGN.md puts them: voxelization and the BEV scatter in :mod:`drivetrain.pipeline.voxelize`,
max-IoU assignment in :mod:`drivetrain.match.max_iou`, nearest-BEV and rotated IoU and rotated NMS in
:mod:`drivetrain.geometry`, the losses in :mod:`drivetrain.losses.anchor_head`. Still to come: decoding
with NMS (``postprocess.py``), the SSN detector, evaluation, configs and benchmarks (issue 13).
"""

from drivetrain.models.pointpillars.model import SSN, PointPillars

__all__ = ["SSN", "PointPillars"]
