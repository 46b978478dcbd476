"""The typed ``model.args`` of PointPillars and SSN: :class:`PointPillarsArgs`, :class:`SSNArgs`.

The builders (:class:`~.model.PointPillars`, :class:`~.model.SSN`) take an instance (keyword arguments replace its
fields); each field is declared here only. A config's ``model.args`` is checked against it when the config loads
(an unknown key or a wrong type is one line naming ``model.args.KEY``). Sequences are tuples here (a YAML list is
read as one); where a field takes either of two forms (``assigner``: one triple or one per class;
``dataset_classes``: a format's name or the names), the value is read as the first form it fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from drivetrain.models.pointpillars.recipe import (
    NUS_SSN_ANCHORS,
    NUS_SSN_ASSIGNERS,
    ROTATIONS,
    SSN_NUS_CLASSES,
    SSN_NUS_TASKS,
)

__all__ = ["PointPillarsArgs", "SSNArgs"]


@dataclass(frozen=True)
class PointPillarsArgs:
    """``model.args`` of ``model.name: pointpillars``, and the builder's arguments (:class:`~.model.PointPillars`):
    each one's type, default and meaning, declared here only (defaults: the published nuScenes SECFPN
    configuration, its constants in :mod:`.recipe`)."""

    point_cloud_range: tuple[float, ...] = (-50.0, -50.0, -5.0, 50.0, 50.0, 3.0)  # voxel grid (x/y/z min, x/y/z max)
    voxel_size: tuple[float, ...] = (0.25, 0.25, 8.0)  # pillar size (vx, vy, vz)
    max_points: int = 64  # points kept per pillar
    max_voxels: int = 30000  # pillars kept per sample in training
    max_voxels_test: int = 40000  # pillars kept per sample in evaluation
    point_dims: int = 4  # point features C (x, y, z, Δt)
    vfe_channels: tuple[int, ...] = (64, 64)  # HardVFE layer widths
    backbone_channels: tuple[int, ...] = (64, 128, 256)  # SECOND stage widths
    layer_nums: tuple[int, ...] = (3, 5, 5)  # SECOND convolutions per stage
    layer_strides: tuple[int, ...] = (2, 2, 2)  # SECOND stage strides
    neck_channels: tuple[int, ...] = (128, 128, 128)  # SECONDFPN output widths per stage
    upsample_strides: tuple[float, ...] = (1, 2, 4)  # SECONDFPN upsampling per stage
    # per anchor size (x/y/z lo, x/y/z hi), z the anchor's bottom; None (or anchor_sizes None): NUS_PP_ANCHORS'
    anchor_ranges: tuple[tuple[float, ...], ...] | None = None
    anchor_sizes: tuple[tuple[float, ...], ...] | None = None  # (dx, dy, dz) per size (SSN: per class, classes order)
    rotations: tuple[float, ...] = ROTATIONS  # anchor yaws
    num_classes: int = 10  # C
    code_size: int = 9  # box code: 9 (with velocity) or 7
    # (pos_iou_thr, neg_iou_thr, min_pos_iou); SSN: one triple per class; None: NUS_PP_ASSIGNER
    assigner: tuple[float, ...] | tuple[tuple[float, ...], ...] | None = None
    classes: tuple[str, ...] | None = None  # the model's class order (its anchors' and outputs'); None: the dataset's
    dataset_classes: str | tuple[str, ...] = "nuscenes"  # what the batch's labels index: nuscenes, lyft or the names
    tasks: tuple[tuple[Any, ...], ...] | None = None  # SSN's (classes, channels, strides) per task; None: Anchor3DHead
    decode: dict[str, Any] | None = None  # DecodeConfig fields for detect
    tta: dict[str, Any] | None = None  # TTAConfig fields: detect merges flipped / scaled / rotated views; None: off
    impl: Literal["batched", "reference"] = "batched"  # the path of assignment, losses and decoding (see .paths)
    chunk: int | None = None  # anchors per IoU slice of the dense batched assignment (window false); None: all at once
    # the batched assignment over the anchor windows each GT reaches (one host read per step); false: the dense
    # (B, A, G) IoU, no host read
    window: bool = True
    # DenseMiddleEncoder arguments (base_channels, blocks): a dense 3D middle encoder before the BEV backbone (the
    # voxel size must cut z into several cells); None: PointPillars' BEV scatter
    middle: dict[str, Any] | None = None
    # the batched assignment and loss through torch.compile in one graph: true (its defaults) or its arguments
    compile_loss: bool | dict[str, Any] = False
    # the compiled training step (speed.compile_step, .static): the points of a sample it pads to (0: every pillar
    # full, max_voxels·max_points), its voxel slots per sample (0: a ladder ≤ 25 % apart from max_voxels/4 up to
    # max_voxels; else this one bucket), the most ground truths of a sample (buckets 64 and this); a sample beyond
    # one is an error naming it
    max_points_per_sample: int = 0
    step_voxels: int = 0
    max_targets: int = 256


@dataclass(frozen=True)
class SSNArgs(PointPillarsArgs):
    """``model.args`` of ``model.name: ssn``, and the builder's arguments (:class:`~.model.SSN`):
    :class:`PointPillarsArgs` with the published nuScenes SSN's defaults where they differ
    (``configs/ssn/ssn_hv_secfpn_sbn-all_16xb2-2x_nus-3d.py``)."""

    max_points: int = 20  # points kept per pillar
    anchor_ranges: tuple[tuple[float, ...], ...] | None = NUS_SSN_ANCHORS.ranges  # per class (x/y/z lo, x/y/z hi)
    anchor_sizes: tuple[tuple[float, ...], ...] | None = NUS_SSN_ANCHORS.sizes  # (dx, dy, dz) per class
    assigner: tuple[float, ...] | tuple[tuple[float, ...], ...] | None = tuple(
        (c.pos_iou_thr, c.neg_iou_thr, c.min_pos_iou) for c in NUS_SSN_ASSIGNERS
    )  # (pos, neg, min_pos) per class
    classes: tuple[str, ...] | None = SSN_NUS_CLASSES  # the model's class order (SSN's)
    tasks: tuple[tuple[Any, ...], ...] | None = SSN_NUS_TASKS  # (classes, shared channels, shared strides) per task
