"""The 2D focal detector as the engine sees it: :data:`SPEC` (builder, typed ``model.args``, camera input)."""

from __future__ import annotations

from dataclasses import dataclass

from drivetrain.model_spec import LossPath, ModelSpec
from drivetrain.models.focal2d.model import FocalDetector2D
from drivetrain.models.streampetr.recipe import CLASSES, STRIDE

__all__ = ["SPEC", "Focal2DArgs"]


@dataclass(frozen=True)
class Focal2DArgs:
    """``model.args`` of ``model.name: focal2d``: :class:`~.model.FocalDetector2D`'s keyword arguments, with its
    defaults."""

    num_classes: int = len(CLASSES)  # C: class channels, the dataset's classes
    width: int = 32  # channels of the first stage (later stages double it once)
    stride: int = STRIDE  # feature stride, a power of two ≥ 2 (16, as StreamPETR's focal head)
    impl: str = "batched"  # batched or reference path of the loss
    sync_cls_avg_factor: bool = False  # average the classification count over ranks (False, as published)


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
