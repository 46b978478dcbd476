"""The published constants of PointPillars and SSN (the VoxelNet variant shares them): classes and their order,
SSN's tasks, anchors, assigner thresholds, code weights, loss weights, the direction-bin convention and the test
settings, each cited from the mmdetection3d config that publishes it.

The configs (mmdetection3d v1.x names; v0.x: ``configs/_base_/models/hv_pointpillars_fpn_nus.py``,
``configs/ssn/hv_ssn_secfpn_sbn-all_2x16_2x_nus-3d.py``):

* PointPillars: ``configs/_base_/models/pointpillars_hv_fpn_nus.py`` under
  ``configs/pointpillars/pointpillars_hv_secfpn_sbn-all_8xb4-2x_nus-3d.py`` (the SECFPN head, its anchors);
* SSN: ``configs/ssn/ssn_hv_secfpn_sbn-all_16xb2-2x_nus-3d.py`` (on the same base: its ``test_cfg``);
* the Lyft variants: ``configs/_base_/models/pointpillars_hv_fpn_lyft.py``, ``configs/ssn/
  ssn_hv_secfpn_sbn-all_16xb2-2x_lyft-3d.py`` (a 7-dim box code, no velocity).

The generic pieces (:mod:`drivetrain.match.max_iou`, :mod:`drivetrain.geometry.delta_coder`) and the model's
criterion (:mod:`.criterion`) take these as arguments; :class:`~.model.PointPillars` and :class:`~.model.SSN` pass
them. The train pipeline's lidar augmentation (:data:`LIDAR_AUG`, :data:`AUGMENT`) is here too: the specs offer it as
the models' recipe, which the ``data.augment`` sections of a config fill the fields they leave out from. This module
holds data, and :func:`code_weights_for` to pick a table by code size.
"""

from __future__ import annotations

from drivetrain.match.max_iou import MaxIoUConfig
from drivetrain.models.pointpillars.anchors import AnchorConfig
from drivetrain.pipeline.augment.bev import BevAugConfig
from drivetrain.pipeline.augment.stage import AugmentConfig

__all__ = [
    "AUGMENT",
    "LIDAR_AUG",
    "LOSS_WEIGHTS",
    "LYFT_CODE_WEIGHTS",
    "NUS_CODE_WEIGHTS",
    "NUS_DIR_OFFSET",
    "NUS_PP_ANCHORS",
    "NUS_PP_ASSIGNER",
    "NUS_SSN_ANCHORS",
    "NUS_SSN_ASSIGNERS",
    "NUS_SSN_FEATURE_SIZES",
    "NUS_TEST_CFG",
    "PP_NUS_CLASSES",
    "ROTATIONS",
    "SSN_NUS_CLASSES",
    "SSN_NUS_TASKS",
    "code_weights_for",
]

# ------------------------------------------------------------------------------------------------ classes
PP_NUS_CLASSES = (
    "car", "truck", "trailer", "bus", "construction_vehicle",
    "bicycle", "motorcycle", "pedestrian", "traffic_cone", "barrier",
)  # fmt: skip
"""``class_names`` of mmdetection3d's ``configs/_base_/datasets/nus-3d.py``: the published PointPillars' class
channels (our PointPillars takes the dataset's order; :mod:`.weights` reorders a checkpoint's)."""

SSN_NUS_CLASSES = (
    "bicycle", "motorcycle", "pedestrian", "traffic_cone", "barrier",
    "car", "truck", "trailer", "bus", "construction_vehicle",
)  # fmt: skip
"""SSN's class order (its config's ``class_names``): the order of its anchors, tasks and assigners."""

SSN_NUS_TASKS = (
    (2, (64, 64), (1, 1)),  # bicycle, motorcycle
    (1, (64, 64), (1, 1)),  # pedestrian
    (2, (64, 64), (1, 1)),  # traffic cone, barrier
    (1, (64, 64, 64), (2, 1, 1)),  # car
    (4, (64, 64, 64), (2, 1, 1)),  # truck, trailer, bus, construction vehicle
)
"""SSN's nuScenes head (``ShapeAwareHead.tasks``): ``(classes, shared conv channels, shared conv strides)`` per
task."""

# ------------------------------------------------------------------------------------------------ anchors
ROTATIONS = (0.0, 1.57)
"""Anchor yaws of every nuScenes and Lyft config (``anchor_generator.rotations=[0, 1.57]``)."""

NUS_PP_ANCHORS = AnchorConfig(
    ranges=tuple(
        (-49.6, -49.6, z, 49.6, 49.6, z)
        for z in (-1.80032795, -1.74440365, -1.68526504, -1.67339111, -1.61785072, -1.80984986, -1.763965)
    ),
    sizes=(
        (4.60718145, 1.95017717, 1.72270761),  # car
        (6.73778078, 2.4560939, 2.73004906),  # truck
        (12.01320693, 2.87427237, 3.81509561),  # trailer
        (1.68452161, 0.60058911, 1.27192197),  # bicycle
        (0.7256437, 0.66344886, 1.75748069),  # pedestrian
        (0.40359262, 0.39694519, 1.06232151),  # traffic cone
        (0.48578221, 2.49008838, 0.98297065),  # barrier
    ),
    rotations=ROTATIONS,
)
"""nuScenes PointPillars (SECFPN, ``AlignedAnchor3DRangeGenerator``): 7 sizes × 2 rotations on the 200×200 map,
560,000 anchors."""

NUS_SSN_ANCHORS = AnchorConfig(
    ranges=tuple(
        (-50.0, -50.0, z, 50.0, 50.0, z)
        for z in (
            -1.67339111,
            -1.71396371,
            -1.61785072,
            -1.80984986,
            -1.76396500,
            -1.80032795,
            -1.74440365,
            -1.68526504,
            -1.80673031,
            -1.64824291,
        )
    ),
    sizes=(
        (1.68452161, 0.60058911, 1.27192197),  # bicycle
        (2.09973778, 0.76279481, 1.44403034),  # motorcycle
        (0.72564370, 0.66344886, 1.75748069),  # pedestrian
        (0.40359262, 0.39694519, 1.06232151),  # traffic cone
        (0.48578221, 2.49008838, 0.98297065),  # barrier
        (4.60718145, 1.95017717, 1.72270761),  # car
        (6.73778078, 2.45609390, 2.73004906),  # truck
        (12.01320693, 2.87427237, 3.81509561),  # trailer
        (11.1885991, 2.94046906, 3.47030982),  # bus
        (6.38352896, 2.73050468, 3.13312415),  # construction vehicle
    ),
    rotations=ROTATIONS,
)
"""nuScenes SSN (``AlignedAnchor3DRangeGeneratorPerCls``): one size per class in SSN's class order."""

NUS_SSN_FEATURE_SIZES = ((200, 200),) * 5 + ((100, 100),) * 5
"""SSN's feature map per class on the 200×200 neck map: small classes at stride 1, car and the large vehicles
at stride 2 (100×100), as :data:`SSN_NUS_TASKS`' strides make them."""

# ---------------------------------------------------------------------------------------------- assigners
NUS_PP_ASSIGNER = MaxIoUConfig(pos_iou_thr=0.6, neg_iou_thr=0.3, min_pos_iou=0.3)
"""nuScenes PointPillars ``train_cfg.pts.assigner``: one class-agnostic ``Max3DIoUAssigner``."""

NUS_SSN_ASSIGNERS = tuple(
    MaxIoUConfig(pos_iou_thr=pos, neg_iou_thr=neg, min_pos_iou=neg)
    for pos, neg in (
        (0.5, 0.35),  # bicycle
        (0.5, 0.3),  # motorcycle
        (0.6, 0.4),  # pedestrian
        (0.6, 0.4),  # traffic cone
        (0.55, 0.4),  # barrier
        (0.6, 0.45),  # car
        (0.55, 0.4),  # truck
        (0.5, 0.35),  # trailer
        (0.55, 0.4),  # bus
        (0.5, 0.35),  # construction vehicle
    )
)
"""nuScenes SSN ``train_cfg.pts.assigner``: one assigner per class, in SSN's class order (that of
:data:`NUS_SSN_ANCHORS`)."""

# --------------------------------------------------------------------------------------------- the losses
NUS_CODE_WEIGHTS = (1.0,) * 7 + (0.2, 0.2)
"""``train_cfg.pts.code_weight`` of the nuScenes configs, PointPillars and SSN alike (code size 9)."""

LYFT_CODE_WEIGHTS = (1.0,) * 7
"""The Lyft configs' code weights (code size 7, no velocity)."""

LOSS_WEIGHTS = {"loss_cls": 1.0, "loss_bbox": 1.0, "loss_dir": 0.2}
"""``loss_weight`` of the head's ``loss_cls`` (sigmoid focal, α 0.25, γ 2), ``loss_bbox`` (smooth-L1, β 1/9) and
``loss_dir`` (cross-entropy) in the nuScenes and Lyft configs of both models."""

# The nuScenes configs write ``dir_offset=-0.7854`` (their comment: -pi / 4), not -π/4 itself; the literal is kept
# so that yaws within 1e-5 of a bin edge get the original's bin (``dir_limit_offset=0``).
NUS_DIR_OFFSET = -0.7854

# ------------------------------------------------------------------------------------------------- testing
NUS_TEST_CFG = {"nms_pre": 1000, "score_threshold": 0.05, "nms_threshold": 0.2, "max_num": 500}
"""``test_cfg.pts`` of ``pointpillars_hv_fpn_nus.py`` (SSN inherits it): ``nms_pre``, ``score_thr``,
``nms_thr``, ``max_num`` (rotated NMS, ``use_rotate_nms=True``), by :class:`~.postprocess.DecodeConfig`'s
field names."""


# ------------------------------------------------------------------------------------------- augmentation
LIDAR_AUG = BevAugConfig(
    rot_range=(-0.3925, 0.3925), scale_range=(0.95, 1.05), translation_std=(0.0, 0.0, 0.0),
    flip_horizontal=0.5, flip_vertical=0.0, point_range=(-50.0, -50.0, -5.0, 50.0, 50.0, 3.0),
    object_range=(-50.0, -50.0, 50.0, 50.0), shuffle=True,
)  # fmt: skip
"""The nuScenes PointPillars train pipeline (``pointpillars_hv_secfpn_sbn-all_8xb4-2x_nus-3d.py``):
``GlobalRotScaleTrans`` (rotation ±0.3925 rad, scale 0.95–1.05, no translation), ``RandomFlip3D`` (horizontal
0.5), ``PointsRangeFilter`` and ``ObjectRangeFilter`` on the point cloud range, ``PointShuffle``. SSN's spec offers
the same (its published config flips vertically with 0.5 too: set ``data.augment.lidar.flip_vertical``)."""

AUGMENT = AugmentConfig(lidar=LIDAR_AUG)
"""The models' training augmentation (``data.augment``: the lidar section; no camera section)."""


def code_weights_for(code_size: int) -> tuple[float, ...]:
    """The published code weights of a box code: :data:`NUS_CODE_WEIGHTS` (9) or :data:`LYFT_CODE_WEIGHTS` (7).

    Raises:
        ValueError: naming ``code_size`` when it is neither.
    """
    if code_size == 9:
        return NUS_CODE_WEIGHTS
    if code_size == 7:
        return LYFT_CODE_WEIGHTS
    raise ValueError(f"code_size: expected 9 (nuScenes, with velocity) or 7 (Lyft), got {code_size}")
