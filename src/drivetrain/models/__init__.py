"""Reference detectors that follow the engine protocol (``forward(batch)``, ``loss(outputs, batch)``)."""

from drivetrain.models.focal2d import FocalDetector2D
from drivetrain.models.pointpillars import SSN, PointPillars
from drivetrain.models.streampetr import StreamPETR

__all__ = ["SSN", "FocalDetector2D", "PointPillars", "StreamPETR"]
