"""StreamPETR as the engine sees it: :data:`SPEC` (builder, typed ``model.args``, camera input, weight formats)."""

from __future__ import annotations

from collections.abc import Collection

from drivetrain.model_spec import ModelSpec, WeightFormat
from drivetrain.models.published import map_streampetr, map_torchvision_resnet50
from drivetrain.models.streampetr.detector import StreamPETR

__all__ = ["SPEC", "STREAMPETR_WEIGHTS", "TORCHVISION_RESNET50"]

_STREAMPETR_PREFIXES = ("img_backbone.", "img_neck.", "img_roi_head.", "pts_bbox_head.transformer.")


def _is_streampetr(names: Collection[str]) -> bool:
    return any(name.startswith(_STREAMPETR_PREFIXES) for name in names)


def _is_torchvision_resnet50(names: Collection[str]) -> bool:
    return "conv1.weight" in names and "layer1.0.conv1.weight" in names


TORCHVISION_RESNET50 = WeightFormat(
    "torchvision-resnet50",
    "a torchvision ResNet-50 state dict, into the model's ResNet-50 trunk (the published backbone initialisation)",
    _is_torchvision_resnet50,
    map_torchvision_resnet50,
)
STREAMPETR_WEIGHTS = WeightFormat(
    "streampetr", "a StreamPETR-repository checkpoint (the state_dict of Petr3D)", _is_streampetr, map_streampetr
)

SPEC = ModelSpec(
    "streampetr",
    build=StreamPETR,
    args=None,
    modalities=frozenset({"camera"}),
    summary="StreamPETR camera 3D detector",
    weight_formats=(TORCHVISION_RESNET50, STREAMPETR_WEIGHTS),
)
"""The registry's entry for ``model.name: streampetr``."""
