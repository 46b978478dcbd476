"""The 2D focal detector as the engine sees it: :data:`SPEC` (builder, typed ``model.args``, camera input)."""

from __future__ import annotations

from drivetrain.detector.spec import LossPath, ModelSpec
from drivetrain.models.focal2d.model import Focal2DArgs, FocalDetector2D

__all__ = ["SPEC", "Focal2DArgs"]


IMPL = LossPath("impl", reference="reference", batched="batched")
"""``model.args.impl``: the loss path (``drivetrain doctor`` advises the batched one)."""

SPEC = ModelSpec(
    "focal2d",
    build=FocalDetector2D,
    args=Focal2DArgs,
    modalities=frozenset({"camera"}),
    summary="a small 2D detector with StreamPETR's focal head",
    loss_path=IMPL,
)
"""The registry's entry for ``model.name: focal2d``."""
