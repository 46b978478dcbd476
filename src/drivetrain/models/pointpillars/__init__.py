"""PointPillars and SSN (shape signature networks), lidar detectors after mmdetection3d, in plain PyTorch.

Plan, one concept per file: ``anchors.py`` (aligned range anchors, shared and per class; present now),
then ``pillars.py`` (pillar feature net and BEV scatter), ``backbone.py`` (SECOND + SECONDFPN),
``head.py`` (Anchor3DHead, ShapeAwareHead), ``postprocess.py`` (decode and rotated NMS) and ``model.py``
(wiring ``forward(batch)`` / ``loss(outputs, batch)``), which will export ``PointPillars`` and ``SSN``.
Anchor assignment lives in :mod:`drivetrain.match.max_iou`, nearest-BEV IoU in :mod:`drivetrain.geometry`.
"""

__all__ = []
