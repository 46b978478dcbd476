"""PointPillars: lidar points → pillars → BEV canvas → SECOND + SECONDFPN → anchor head, trained with
max-IoU anchor assignment and the anchor-head losses, through the engine's protocol (``forward(batch)``,
``loss(outputs, batch)``).

The data flow of mmdetection3d's ``MVXFasterRCNN`` with the nuScenes PointPillars SECFPN config
(``configs/pointpillars/pointpillars_hv_secfpn_sbn-all_8xb4-2x_nus-3d.py``): the data preprocessor's hard
voxelization, ``HardVFE``, ``PointPillarsScatter``, ``SECOND``, ``SECONDFPN``, ``Anchor3DHead`` with the
class-agnostic ``Max3DIoUAssigner`` (BEV nearest IoU) and its losses. The BEV augmentation of the loader's
pipeline (``GlobalRotScaleTrans``, ``RandomFlip3D``, range filters, ``PointShuffle``) is not the model's: the
trainer's augmentation stage (``data.augment.lidar``, :mod:`drivetrain.pipeline.augment.stage`) hands the model
augmented batches, and :meth:`PointPillars.loss` reads the ground truth from the batch it is given.

The model takes its arguments as one :class:`~.args.PointPillarsArgs` (SSN: :class:`~.args.SSNArgs`), where each
is declared. Its path — ``impl: reference``, the assignment and the losses per sample as the originals do;
``batched``, all samples at once (the same assignments and terms; see :mod:`drivetrain.match.max_iou`,
:mod:`.loss`); ``compile_loss``, the batched assignment and loss through ``torch.compile`` in one graph — is chosen
once, when it is built: an object of :mod:`.paths` (:attr:`PointPillars.path`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from drivetrain.batch import Batch
from drivetrain.data.formats.registry import FORMATS
from drivetrain.detector.spec import changed
from drivetrain.match.anchor_window import WindowedAnchors
from drivetrain.match.max_iou import MaxIoUConfig, anchor_thresholds
from drivetrain.models.pointpillars.anchors import (
    AnchorConfig,
    grid_anchors,
    grid_layout,
    per_class_anchors,
    per_class_layout,
)
from drivetrain.models.pointpillars.args import PointPillarsArgs, SSNArgs
from drivetrain.models.pointpillars.backbone import SECOND, SECONDFPN
from drivetrain.models.pointpillars.head import Anchor3DHead, ShapeAwareHead
from drivetrain.models.pointpillars.loss import AnchorHeadLoss
from drivetrain.models.pointpillars.middle import DenseMiddleEncoder, scatter_to_volume
from drivetrain.models.pointpillars.paths import BatchedPath, model_path
from drivetrain.models.pointpillars.postprocess import DecodeConfig
from drivetrain.models.pointpillars.recipe import (
    LOSS_WEIGHTS,
    NUS_DIR_OFFSET,
    NUS_PP_ANCHORS,
    NUS_PP_ASSIGNER,
    code_weights_for,
)
from drivetrain.models.pointpillars.static import (
    Buckets,
    StaticPillarStep,
    StaticShapes,
    static_loss,
    window_pairs_per_target,
)
from drivetrain.models.pointpillars.tta import TTAConfig, detect_tta
from drivetrain.models.pointpillars.voxel_encoder import HardVFE
from drivetrain.pipeline.augment.bev import bev_aug_bounds
from drivetrain.pipeline.augment.stage import AugmentConfig, AugmentParams
from drivetrain.pipeline.lidar import lidar_input
from drivetrain.pipeline.voxelize import VoxelGrid, scatter_to_bev
from drivetrain.profile import region
from drivetrain.ragged import RaggedBatch

__all__ = ["SSN", "PointPillars", "dataset_class_names"]


def dataset_class_names(classes: str | Sequence[str]) -> tuple[str, ...]:
    """The class names a dataset's labels index: a format's name (``"nuscenes"``, ``"lyft"``: its record's
    classes, :data:`~drivetrain.data.formats.registry.FORMATS`) or the names themselves."""
    if isinstance(classes, str):
        if classes not in FORMATS:
            raise ValueError(f"dataset_classes: expected one of {sorted(FORMATS)} or a list of names, got {classes!r}")
        return tuple(FORMATS[classes].classes)
    return tuple(str(c) for c in classes)


def _triple(cfg: MaxIoUConfig) -> tuple[Any, float, float]:
    """A recipe's assigner as the ``(pos_iou_thr, neg_iou_thr, min_pos_iou)`` the ``assigner`` argument takes."""
    return (cfg.pos_iou_thr, cfg.neg_iou_thr, cfg.min_pos_iou)


def _conv_out(size: int, strides: Sequence[int]) -> int:
    """Length of a map after 3×3 convolutions with padding 1 and these strides."""
    for stride in strides:
        size = (size - 1) // stride + 1
    return size


class PointPillars(nn.Module):
    """The PointPillars detector, built from its arguments: one :class:`~.args.PointPillarsArgs` (each argument's
    type, default and meaning are declared there; defaults: the published nuScenes SECFPN configuration, its
    constants in :mod:`.recipe`), keyword arguments replacing its fields (``PointPillars(max_voxels=100)``; an
    unknown name is a TypeError naming it). The model keeps them as :attr:`args` and its path (reference, batched
    or compiled: :mod:`.paths`) as :attr:`path`.

    ``input_modalities``: the sensors it reads (``("lidar",)``), written to a submission's ``meta`` block.

    With ``tasks`` it is SSN instead (see :class:`SSN`): a ``ShapeAwareHead`` with one branch per task, one
    anchor size per class on its task's map, and one assigner per class.
    """

    input_modalities: tuple[str, ...] = ("lidar",)

    def __init__(self, args: PointPillarsArgs = PointPillarsArgs(), **changes: Any) -> None:  # noqa: B008 (frozen)
        super().__init__()
        args = changed(args, **changes)
        self.args = args
        self.path = model_path(args)  # ValueError for an unknown impl, before anything is built
        anchor_ranges, anchor_sizes, assigner = args.anchor_ranges, args.anchor_sizes, args.assigner
        if anchor_ranges is None or anchor_sizes is None:
            anchor_ranges, anchor_sizes = NUS_PP_ANCHORS.ranges, NUS_PP_ANCHORS.sizes
        if assigner is None:
            assigner = _triple(NUS_PP_ASSIGNER)
        self.code_size, self.num_classes = args.code_size, args.num_classes
        grid = tuple(args.point_cloud_range), tuple(args.voxel_size), args.max_points
        self.grid = VoxelGrid(*grid, args.max_voxels)  # type: ignore[arg-type]
        self.grid_test = VoxelGrid(*grid, args.max_voxels_test)  # type: ignore[arg-type]
        self.anchor_config = AnchorConfig(
            ranges=tuple(tuple(float(v) for v in r) for r in anchor_ranges),
            sizes=tuple(tuple(float(v) for v in s) for s in anchor_sizes),
            rotations=tuple(float(r) for r in args.rotations),
            custom_values=(0.0, 0.0) if args.code_size == 9 else (),
        )
        self._set_classes(args.classes, args.dataset_classes)
        tasks = args.tasks
        self.tasks = None if tasks is None else tuple((int(n), tuple(ch), tuple(st)) for n, ch, st in tasks)
        self.assigners = self._assigners(assigner)
        self.decode_config = DecodeConfig(**(args.decode or {}))
        self.tta_config = TTAConfig(**args.tta) if args.tta is not None else None
        vfe_channels = tuple(args.vfe_channels)
        self.vfe = HardVFE(args.point_dims, vfe_channels, self.grid)
        self.middle = None
        bev_channels = vfe_channels[-1]
        if args.middle is not None:  # a dense 3D middle encoder over a voxel grid with several cells along z
            self.middle = DenseMiddleEncoder(vfe_channels[-1], self.grid.grid_size[2], **args.middle)
            bev_channels = self.middle.out_channels
        backbone_channels = tuple(args.backbone_channels)
        self.backbone = SECOND(bev_channels, backbone_channels, tuple(args.layer_nums), tuple(args.layer_strides))
        self.neck = SECONDFPN(backbone_channels, tuple(args.neck_channels), tuple(args.upsample_strides))
        if self.tasks is None:
            num_anchors = len(anchor_sizes) * len(args.rotations)
            self.head: nn.Module = Anchor3DHead(self.neck.out_channels, num_anchors, self.num_classes, self.code_size)
        else:
            if len(anchor_sizes) != self.num_classes:
                raise ValueError(
                    f"anchor_sizes: SSN needs one size per class ({self.num_classes}), got {len(anchor_sizes)}"
                )
            self.head = ShapeAwareHead(
                self.neck.out_channels, self.tasks, self.num_classes, self.code_size, len(args.rotations)
            )
        self.criterion = AnchorHeadLoss(
            self.num_classes,
            code_weights=code_weights_for(self.code_size),
            dir_offset=NUS_DIR_OFFSET,
            weights=LOSS_WEIGHTS,
        )
        self._anchors: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor | None, Any]] = {}
        self._windows: dict[tuple[Any, ...], WindowedAnchors] = {}

    def set_path(self, **changes: Any) -> None:
        """Run another path from now on, as if built with ``changes`` to :attr:`args`: any of ``impl``, ``window``,
        ``chunk``, ``compile_loss`` (the benchmarks and tests run the paths on copies of one model)."""
        others = sorted(set(changes) - {"impl", "window", "chunk", "compile_loss"})
        if others:
            raise TypeError(
                f"set_path: {others[0]!r} is not an argument of the path (impl, window, chunk, compile_loss)"
            )
        args = changed(self.args, **changes)
        self.path = model_path(args)
        self.args = args

    # ------------------------------------------------------------------------------------------ classes
    def _set_classes(self, classes: Sequence[str] | None, dataset_classes: str | Sequence[str]) -> None:
        """The label maps between the dataset's class indices and the model's."""
        data_names = dataset_class_names(dataset_classes)
        names = tuple(classes) if classes is not None else data_names
        if len(names) != self.num_classes or sorted(names) != sorted(data_names):
            raise ValueError(
                f"classes: the model's {self.num_classes} classes must be the dataset's {data_names} in some order, "
                f"got {names}"
            )
        self.class_names = names
        to_model = torch.tensor([names.index(n) for n in data_names], dtype=torch.int64)  # data label → model
        self.register_buffer("_to_model", to_model, persistent=False)
        self.register_buffer("_to_data", to_model.argsort(), persistent=False)

    def _assigners(self, assigner: Sequence[Any]) -> tuple[MaxIoUConfig, ...]:
        if self.tasks is None:
            if len(assigner) != 3 or not all(isinstance(v, (int, float)) for v in assigner):
                raise ValueError(f"assigner: expected (pos_iou_thr, neg_iou_thr, min_pos_iou), got {assigner!r}")
            rows = [assigner]
        else:
            rows = list(assigner)
            if len(rows) != self.num_classes or any(len(r) != 3 for r in rows):
                raise ValueError(f"assigner: SSN needs one (pos, neg, min_pos) triple per class, got {assigner!r}")
        return tuple(MaxIoUConfig(pos_iou_thr=r[0], neg_iou_thr=r[1], min_pos_iou=r[2]) for r in rows)

    # -------------------------------------------------------------------------------------------- forward
    def anchor_set(self, feature_size: tuple[int, int], device: torch.device) -> tuple[torch.Tensor, Any, Any]:
        """Anchors for a ``feature_size`` neck map (cached per size and device).

        Returns:
            ``anchors (A, D)`` in the head's output order, ``anchor_classes (A,)`` (SSN; None for
            PointPillars) and the assigner thresholds per anchor.
        """
        key = (feature_size, str(device))
        if key not in self._anchors:
            if self.tasks is None:
                anchors, classes = grid_anchors(self.anchor_config, feature_size, device), None
                thresholds = anchor_thresholds(self.assigners[0], num_anchors=anchors.shape[0], device=device)
            else:
                anchors, classes = per_class_anchors(
                    self.anchor_config, self._class_feature_sizes(feature_size), device
                )
                thresholds = anchor_thresholds(self.assigners, classes)
            self._anchors[key] = (anchors[:, : self.code_size], classes, thresholds)
        return self._anchors[key]

    def _class_feature_sizes(self, feature_size: tuple[int, int]) -> tuple[tuple[int, int], ...]:
        """SSN: each class's anchor map size on a ``feature_size`` neck map (its task's strides)."""
        sizes: list[tuple[int, int]] = []
        for n, _, strides in self.tasks or ():
            sizes += [(_conv_out(feature_size[0], strides), _conv_out(feature_size[1], strides))] * n
        return tuple(sizes)

    def windowed_anchors(self, feature_size: tuple[int, int], device: torch.device) -> WindowedAnchors:
        """The anchors of :meth:`anchor_set` prepared for the windowed assignment (cached per size and device)."""
        key = (feature_size, str(device))
        if key not in self._windows:
            anchors, classes, thresholds = self.anchor_set(feature_size, device)
            if self.tasks is None:
                layout = grid_layout(self.anchor_config, feature_size)
            else:
                layout = per_class_layout(self.anchor_config, self._class_feature_sizes(feature_size))
            self._windows[key] = WindowedAnchors.build(anchors, layout, thresholds, classes)
        return self._windows[key]

    def anchors(self, feature_size: tuple[int, int], device: torch.device) -> torch.Tensor:
        """The ``(A, D)`` anchors of a ``feature_size`` neck map, in the head's output order."""
        return self.anchor_set(feature_size, device)[0]

    def forward(self, batch: Batch) -> dict[str, Any]:
        """Voxelize the batch's points (augmented already in training, by the trainer's stage) and run the network.

        Returns:
            ``cls_logits (B, A, C)``, ``box_preds (B, A, D)``, ``dir_logits (B, A, 2)``, ``anchors (A, D)`` and
            ``feature_size``; the ground truth stays in the batch (:meth:`gt_targets`).
        """
        grid = self.grid if self.training else self.grid_test
        with region("input"):  # voxelization
            x = lidar_input(batch, grid)  # a ValueError naming batch.points when the batch has none
        device = x.voxels.device
        with region("encoder"):
            # the batched path runs HardVFE on the stored points only (its compact path); the reference, the original
            stored = x.num_stored if self.path.compact_vfe else None
            feats = self.vfe(x.voxels, x.num_points, x.coors, num_stored=stored)  # (V, C)
            if self.middle is None:
                canvas = scatter_to_bev(feats, x.coors, x.batch_size, grid)  # (B, C, ny, nx)
            else:
                canvas = self.middle(scatter_to_volume(feats, x.coors, x.batch_size, grid.grid_size))  # (B, C', ny, nx)
        with region("backbone + neck"):
            neck = self.neck(self.backbone(canvas))  # (B, ΣC, H, W)
        with region("head"):
            out = self.head(neck)
        out["feature_size"] = (neck.shape[2], neck.shape[3])
        out["anchors"] = self.anchors(out["feature_size"], device)  # (A, D)
        return out

    def gt_targets(self, batch: Batch) -> tuple[RaggedBatch, RaggedBatch]:
        """The batch's ground truth as the loss uses it: boxes cut to the model's code size and labels in the
        model's class order.

        Args:
            batch: with ``gt_boxes`` float RaggedBatch ``(B, G, 9)`` and ``gt_labels`` int64 ``(B, G)`` in the
                dataset's class order (augmented by the trainer's stage in training).

        Returns:
            ``gt_boxes`` ``(B, G, D)`` and ``gt_labels`` ``(B, G)`` (model order) RaggedBatches.
        """
        gt_boxes = batch.gt_boxes.apply(lambda t: t[..., : self.code_size])  # (B, G, D)
        gt_labels = batch.gt_labels.apply(lambda t: self._to_model[t.clamp(min=0)])  # (B, G) model order
        return gt_boxes, gt_labels

    # ----------------------------------------------------------------------------------------------- loss
    @property
    def loss_weights(self) -> dict[str, float]:
        """The published weights of the terms (a run config's ``model.loss_weights`` overrides them)."""
        return dict(self.criterion.weights)

    def assign(self, feature_size: tuple[int, int], gt_boxes: RaggedBatch, gt_labels: RaggedBatch) -> torch.Tensor:
        """``(B, A)`` anchor assignment (−1 ignore, 0 negative, k ≥ 1 GT k−1), on the model's path."""
        return self.path.assign(self, feature_size, gt_boxes, gt_labels)[0]

    def loss(self, outputs: dict[str, Any], batch: Batch) -> dict[str, torch.Tensor]:
        """The unweighted terms ``loss_cls``, ``loss_bbox``, ``loss_dir``, on the model's path."""
        gt_boxes, gt_labels = self.gt_targets(batch)
        return self.path.loss(self, outputs, gt_boxes, gt_labels)

    # -------------------------------------------------------------------------------------- compiled step
    def _static_step(self) -> StaticPillarStep:
        """The static step (:mod:`.static`) at :meth:`~.static.Buckets.for_compiled_step`'s buckets, windowed as the
        path assigns (:class:`~.paths.BatchedPath` with ``window``); rebuilt when the path changes. A ValueError
        naming ``model.args.middle`` for a model with a dense middle encoder."""
        if self.middle is not None:
            raise ValueError(
                "model.args.middle: the static step covers PointPillars' BEV scatter, not a dense middle encoder"
            )
        windowed = isinstance(self.path, BatchedPath) and self.path.window
        step = self.__dict__.get("_static")
        if step is None or step.windowed != windowed:
            per_target = window_pairs_per_target(self) if windowed else 0
            buckets = Buckets.for_compiled_step(self.args, self.grid, per_target)
            step = StaticPillarStep(self, buckets, windowed=windowed)
            self.__dict__["_static"] = step  # not a submodule: it holds this model
        return step

    def step_buckets(self, batch_size: int) -> tuple[StaticShapes, ...]:
        """Every bucket of the static training step for batches of ``batch_size`` samples (what ``speed.compile_step``
        compiles before step 1), one chain (:mod:`.static`): each voxel bucket of the ladder (≤ 25 % apart from
        ``max_voxels / 4``; ``step_voxels``, when set, alone) with ground truth 64, ``max_targets`` at the largest,
        and with the windowed assignment the pair slots tied to the ground truth's bucket, then the overflow pair
        buckets."""
        step = self._static_step()
        return step.buckets.all_shapes(batch_size, step.windowed)

    def step_shapes(self, batch: Batch) -> StaticShapes:
        """The bucket of ``batch``: the first of :meth:`step_buckets` that holds it; one host read (the largest voxel
        count and the pair count; ``# sync:`` in :meth:`~.static.StaticPillarStep.shapes`), none with one voxel bucket
        at ``max_voxels`` and the dense assignment; a ValueError naming ``model.args.max_points_per_sample``,
        ``model.args.max_targets``, ``model.args.step_voxels`` or ``model.args.window`` for a batch beyond the
        largest."""
        return self._static_step().shapes(batch)

    def step_shapes_on_host(self, batch: Batch) -> StaticShapes:
        """:meth:`step_shapes` of the loader's batch on the host (CPU tensors, augmented already): the same counts
        by the same arithmetic, read from host tensors — no device read (``speed.compile_step`` with a batch stream of
        host batches, :class:`~drivetrain.engine.protocol.HostShapes`); the step's graph guards on the device that
        the bucket holds the batch."""
        return self._static_step().shapes(batch)

    def step_shapes_augmented(
        self, batch: Batch, params: AugmentParams, config: AugmentConfig, roundoff: float
    ) -> StaticShapes | None:
        """A bucket holding what the device's lidar augmentation makes of the host batch ``batch`` with ``params``
        (:class:`~drivetrain.engine.protocol.AugmentedHostShapes`): the host replays the augmentation's geometry and
        bounds how far the device's float products may land from it (:func:`~drivetrain.pipeline.augment.bev.
        bev_aug_bounds`, :meth:`~.static.StaticPillarStep.bound_shapes`); no device read. None where no cheap bound
        exists."""
        step = self._static_step()
        if params.lidar is None or config.lidar is None or not step.counts_needed:  # shapes only, or as loaded
            return step.shapes(batch)
        if batch.points is None:
            return None
        bounds = bev_aug_bounds(batch.points, batch.gt_boxes, params.lidar, config.lidar, roundoff)
        return step.bound_shapes(batch, bounds)

    def step_inputs(
        self, batch: Batch | None, shapes: StaticShapes, batch_size: int, device: torch.device
    ) -> tuple[Any, ...]:
        """The arguments of :meth:`step_loss` for ``batch`` padded to ``shapes``, or for an empty batch of
        ``batch_size`` samples at ``shapes`` (None: for compiling the bucket before the first step)."""
        return self._static_step().inputs(batch, shapes, batch_size, device)

    def step_loss(self, *inputs: Any) -> dict[str, torch.Tensor]:
        """The training forward and the unweighted loss terms at static shapes (:func:`~.static.static_loss`): one
        graph without a break, the same terms as :meth:`forward` then :meth:`loss`."""
        return static_loss(self, *inputs)

    # --------------------------------------------------------------------------------------------- detect
    def enable_tta(self) -> None:
        """Test-time augmentation on in :meth:`detect`: the views of ``tta``, else :class:`~.tta.TTAConfig`'s."""
        self.tta_config = self.tta_config or TTAConfig()

    @torch.no_grad()
    def detect(self, batch: Batch, tta: bool | None = None) -> tuple[RaggedBatch, RaggedBatch, RaggedBatch]:
        """Detections of a batch: boxes ``(B, K, 9)`` ``(x, y, z_centre, dx, dy, dz, yaw, vx, vy)`` in the lidar
        frame (zero velocity when ``code_size`` is 7), scores, and labels in the dataset's class order; decoded
        as :mod:`.postprocess` on the model's path (the batched one with ``compact=True``: one host read, NMS over
        the candidates only). With ``tta`` (default: whether the model
        has a ``tta_config``) the views of :mod:`.tta` are detected and merged."""
        if tta is None:
            tta = self.tta_config is not None
        if tta:
            return detect_tta(self, batch, self.tta_config or TTAConfig())
        was_training = self.training
        self.eval()
        try:
            out = self.forward(batch)
        finally:
            self.train(was_training)
        args = (out["cls_logits"].float(), out["box_preds"].float(), out["dir_logits"].float(), out["anchors"])
        boxes, scores, labels = self.path.decode(*args, self.decode_config)
        if self.code_size == 7:
            boxes = boxes.apply(lambda t: torch.cat([t, t.new_zeros(*t.shape[:-1], 2)], dim=-1))  # (B, K, 9)
        return boxes, scores, labels.apply(lambda t: self._to_data[t])


class SSN(PointPillars):
    """SSN (shape signature networks): PointPillars' encoder and BEV network with a ``ShapeAwareHead``, one
    anchor size per class on its task's map, and one assigner per class; built from one :class:`~.args.SSNArgs`
    (the published nuScenes configuration's defaults, ``configs/ssn/ssn_hv_secfpn_sbn-all_16xb2-2x_nus-3d.py``: 20
    points per pillar, the classes in SSN's order; its constants in :mod:`.recipe`), keyword arguments replacing
    its fields, as :class:`PointPillars`."""

    def __init__(self, args: SSNArgs = SSNArgs(), **changes: Any) -> None:  # noqa: B008 (frozen)
        super().__init__(args, **changes)
