"""PointPillars and SSN (shape signature networks), lidar detectors after mmdetection3d, in plain PyTorch.

Plan, one concept per file: ``voxel_encoder.py`` (HardVFE pillar features), ``backbone.py`` (SECOND +
SECONDFPN), ``head.py`` (Anchor3DHead, ShapeAwareHead), ``anchors.py`` (aligned range anchors, shared
and per class); to come: the BEV scatter, ``postprocess.py`` (decode and rotated NMS) and ``model.py``
(wiring ``forward(batch)`` / ``loss(outputs, batch)``), which will export ``PointPillars`` and ``SSN``.
Anchor assignment lives in :mod:`drivetrain.match.max_iou`, nearest-BEV IoU in :mod:`drivetrain.geometry`.
"""

__all__ = []
