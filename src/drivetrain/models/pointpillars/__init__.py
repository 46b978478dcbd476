"""PointPillars and SSN: lidar detectors after mmdetection3d, in plain PyTorch.

One concept per file: ``voxel_encoder.py`` (HardVFE pillar features), ``backbone.py`` (SECOND + SECONDFPN),
``head.py`` (Anchor3DHead; SSN's ShapeAwareHead), ``anchors.py`` (aligned range anchors, shared and per
class), ``loss.py`` (the anchor-head loss, its reference path in ``loss_reference.py`` and batched path
in ``loss_batched.py``), ``postprocess.py`` (top-k, decode, rotated NMS, direction bins), ``tta.py``
(test-time views merged), ``paths.py`` (the reference, batched and compiled paths, one chosen when a model is
built), ``model.py`` (:class:`PointPillars`, :class:`SSN`: ``forward(batch)`` / ``loss(outputs, batch)`` /
``detect(batch)``), ``recipe.py`` (the published constants: classes, SSN's tasks,
anchors, assigner thresholds, code and loss weights, direction offset, test settings), ``weights.py`` (the
mmdetection3d checkpoints' key map), ``args.py`` (the typed ``model.args``) and ``spec.py`` (the two detectors as
the engine sees them). Shared pieces live where docs/design.md puts them, generic and taking the recipe's
constants as arguments: voxelization and the BEV scatter in :mod:`drivetrain.pipeline.voxelize`, max-IoU
assignment in :mod:`drivetrain.match.max_iou`, nearest-BEV and rotated IoU and rotated NMS and the box delta coder
in :mod:`drivetrain.geometry`, the focal and smooth-L1 terms in :mod:`drivetrain.losses.functional`.
"""

from drivetrain.models.pointpillars.model import SSN, PointPillars
from drivetrain.models.pointpillars.postprocess import DecodeConfig, decode, reference_decode
from drivetrain.models.pointpillars.recipe import SSN_NUS_CLASSES, SSN_NUS_TASKS
from drivetrain.models.pointpillars.tta import TTAConfig, detect_tta

__all__ = [
    "SSN",
    "SSN_NUS_CLASSES",
    "SSN_NUS_TASKS",
    "DecodeConfig",
    "PointPillars",
    "TTAConfig",
    "decode",
    "detect_tta",
    "reference_decode",
]
