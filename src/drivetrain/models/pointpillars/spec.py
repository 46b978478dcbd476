"""PointPillars and SSN as the engine sees them: :data:`POINTPILLARS`, :data:`SSN` (builder, typed ``model.args``,
which the builder takes as one instance, lidar input, the mmdetection3d weight format)."""

from __future__ import annotations

import re
from collections.abc import Collection

from drivetrain.detector.spec import LossPath, ModelSpec, WeightFormat
from drivetrain.models.pointpillars.args import PointPillarsArgs, SSNArgs
from drivetrain.models.pointpillars.keymap import map_mmdet3d
from drivetrain.models.pointpillars.model import SSN as SSNModel
from drivetrain.models.pointpillars.model import PointPillars
from drivetrain.models.pointpillars.recipe import AUGMENT

__all__ = ["MMDET3D", "POINTPILLARS", "SSN", "PointPillarsArgs", "SSNArgs"]

_MMDET3D_NAME = re.compile(r"(pts_)?(voxel_encoder\.vfe_layers|bbox_head\.(conv_cls|heads\.\d))")


def _is_mmdet3d(names: Collection[str]) -> bool:
    return any(_MMDET3D_NAME.match(name) for name in names)


MMDET3D = WeightFormat("mmdet3d", "an mmdetection3d PointPillars / SSN checkpoint", _is_mmdet3d, map_mmdet3d)

IMPL = LossPath("impl", reference="reference", batched="batched")
"""``model.args.impl``: the loss path (``drivetrain doctor`` advises the batched one)."""

POINTPILLARS = ModelSpec(
    "pointpillars",
    build=PointPillars,
    args=PointPillarsArgs,
    modalities=frozenset({"lidar"}),
    summary="PointPillars lidar 3D detector",
    weight_formats=(MMDET3D,),
    augment=AUGMENT,
    loss_path=IMPL,
)
"""The registry's entry for ``model.name: pointpillars``."""
SSN = ModelSpec(
    "ssn",
    build=SSNModel,
    args=SSNArgs,
    modalities=frozenset({"lidar"}),
    summary="SSN (shape signature network) lidar 3D detector",
    weight_formats=(MMDET3D,),
    augment=AUGMENT,
    loss_path=IMPL,
)
"""The registry's entry for ``model.name: ssn``."""
