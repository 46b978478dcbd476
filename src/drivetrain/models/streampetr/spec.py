"""StreamPETR as the engine sees it: :data:`SPEC` (builder, typed ``model.args``, camera input, weight formats)."""

from __future__ import annotations

from drivetrain.detector.spec import LossPath, ModelSpec
from drivetrain.models.streampetr.args import StreamPETRArgs
from drivetrain.models.streampetr.detector import StreamPETR
from drivetrain.models.streampetr.keymap import STREAMPETR_WEIGHTS, TORCHVISION_RESNET50
from drivetrain.models.streampetr.recipe import AUGMENT

__all__ = ["SPEC", "StreamPETRArgs"]


IMPL = LossPath("impl", reference="reference", batched="batched")
"""``model.args.impl``: the loss path (``drivetrain doctor`` advises the batched one)."""

SPEC = ModelSpec(
    "streampetr",
    build=StreamPETR,
    args=StreamPETRArgs,
    modalities=frozenset({"camera"}),
    summary="StreamPETR camera 3D detector",
    weight_formats=(TORCHVISION_RESNET50, STREAMPETR_WEIGHTS),
    augment=AUGMENT,
    loss_path=IMPL,
)
"""The registry's entry for ``model.name: streampetr``."""
