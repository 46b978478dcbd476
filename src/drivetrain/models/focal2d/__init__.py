"""The 2D focal detector: ``model`` (:class:`FocalDetector2D`, StreamPETR's 2D focal head on a small backbone) and
``spec`` (its :data:`~.spec.SPEC`: builder, typed ``model.args``, camera input)."""

from drivetrain.models.focal2d.model import FocalDetector2D

__all__ = ["FocalDetector2D"]
