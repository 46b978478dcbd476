"""StreamPETR as the engine sees it: :data:`SPEC` (builder, typed ``model.args``, camera input, weight formats)."""

from __future__ import annotations

from drivetrain.detector.spec import ModelSpec
from drivetrain.models.streampetr.args import StreamPETRArgs
from drivetrain.models.streampetr.detector import StreamPETR
from drivetrain.models.streampetr.keymap import STREAMPETR_WEIGHTS, TORCHVISION_RESNET50

__all__ = ["SPEC", "StreamPETRArgs"]


SPEC = ModelSpec(
    "streampetr",
    build=StreamPETR,
    args=StreamPETRArgs,
    modalities=frozenset({"camera"}),
    summary="StreamPETR camera 3D detector",
    weight_formats=(TORCHVISION_RESNET50, STREAMPETR_WEIGHTS),
)
"""The registry's entry for ``model.name: streampetr``."""
