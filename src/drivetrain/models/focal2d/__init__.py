"""The 2D focal detector: ``model`` (:class:`FocalDetector2D`, StreamPETR's 2D focal head on a small backbone, and
its typed arguments :class:`Focal2DArgs`) and ``spec`` (its :data:`~.spec.SPEC`: builder, camera input)."""

from drivetrain.models.focal2d.model import Focal2DArgs, FocalDetector2D

__all__ = ["Focal2DArgs", "FocalDetector2D"]
