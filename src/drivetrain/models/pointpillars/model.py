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

``impl="reference"`` runs the assignment and the losses per sample as the originals do; ``"batched"`` all
samples at once (the same assignments and terms; see :mod:`drivetrain.match.max_iou`,
:mod:`.loss`); ``compile_loss`` runs the batched assignment and loss through
``torch.compile`` in one graph, the ground-truth dim dynamic (:mod:`drivetrain.compiled`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from drivetrain.batch import Batch
from drivetrain.compiled import compile_options, compiled, ragged_dynamic
from drivetrain.data.formats.registry import FORMATS
from drivetrain.match.anchor_window import WindowedAnchors, WindowPairs, windowed_max_iou_assign
from drivetrain.match.max_iou import (
    AnchorThresholds,
    MaxIoUConfig,
    anchor_thresholds,
    batched_max_iou_assign,
    reference_max_iou_assign,
    reference_max_iou_assign_per_class,
)
from drivetrain.models.pointpillars.anchors import (
    AnchorConfig,
    grid_anchors,
    grid_layout,
    per_class_anchors,
    per_class_layout,
)
from drivetrain.models.pointpillars.backbone import SECOND, SECONDFPN
from drivetrain.models.pointpillars.loss import AnchorHeadLoss, batched_anchor_head_loss
from drivetrain.models.pointpillars.head import Anchor3DHead, ShapeAwareHead
from drivetrain.models.pointpillars.middle import DenseMiddleEncoder, scatter_to_volume
from drivetrain.models.pointpillars.postprocess import DecodeConfig, decode, reference_decode
from drivetrain.models.pointpillars.recipe import (
    LOSS_WEIGHTS,
    NUS_DIR_OFFSET,
    NUS_PP_ANCHORS,
    NUS_PP_ASSIGNER,
    NUS_SSN_ANCHORS,
    NUS_SSN_ASSIGNERS,
    ROTATIONS,
    SSN_NUS_CLASSES,
    SSN_NUS_TASKS,
    code_weights_for,
)
from drivetrain.models.pointpillars.tta import TTAConfig, detect_tta
from drivetrain.models.pointpillars.voxel_encoder import HardVFE
from drivetrain.pipeline.lidar import lidar_input
from drivetrain.pipeline.voxelize import VoxelGrid, scatter_to_bev
from drivetrain.profile import region
from drivetrain.ragged import RaggedBatch

__all__ = ["SSN", "SSN_DEFAULTS", "PointPillars", "dataset_class_names"]


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
    """The PointPillars detector; defaults are the published nuScenes SECFPN configuration (its constants in
    :mod:`.recipe`).

    ``input_modalities``: the sensors it reads (``("lidar",)``), written to a submission's ``meta`` block.

    With ``tasks`` it is SSN instead (see :class:`SSN`): a ``ShapeAwareHead`` with one branch per task, one
    anchor size per class on its task's map, and one assigner per class.

    Args:
        point_cloud_range: ``(x_min, y_min, z_min, x_max, y_max, z_max)`` of the voxel grid.
        voxel_size: pillar size ``(vx, vy, vz)``.
        max_points: points kept per pillar.
        max_voxels: pillars kept per sample in training (``max_voxels_test`` in evaluation).
        max_voxels_test: pillars kept per sample in evaluation.
        point_dims: point features C (x, y, z, Δt: 4).
        vfe_channels: ``HardVFE`` layer widths.
        backbone_channels, layer_nums, layer_strides: ``SECOND``.
        neck_channels, upsample_strides: ``SECONDFPN``.
        anchor_ranges: per anchor size ``(x_lo, y_lo, z_lo, x_hi, y_hi, z_hi)`` (z: the anchor's bottom); None:
            :data:`~.recipe.NUS_PP_ANCHORS`' (with ``anchor_sizes``).
        anchor_sizes: ``(dx, dy, dz)`` per size (SSN: per class, in ``classes`` order).
        rotations: anchor yaws.
        num_classes: C.
        code_size: 9 (with velocity) or 7.
        assigner: ``(pos_iou_thr, neg_iou_thr, min_pos_iou)``; SSN: one triple per class. None:
            :data:`~.recipe.NUS_PP_ASSIGNER`.
        classes: the model's class order (its anchors' and outputs'); None: the dataset's.
        dataset_classes: what the batch's labels index: ``nuscenes``, ``lyft`` or names.
        tasks: SSN's head, ``(classes, shared channels, shared strides)`` per task; None: ``Anchor3DHead``.
        decode: :class:`~.postprocess.DecodeConfig` fields for :meth:`detect`.
        tta: :class:`~.tta.TTAConfig` fields: :meth:`detect` merges flipped / scaled / rotated views (None: off).
        impl: ``batched`` or ``reference`` assignment, losses and decoding.
        chunk: anchors per IoU slice in the dense batched assignment (None: all at once; with ``window=False``).
        window: the batched assignment compares each GT only with the anchor windows it can reach
            (:mod:`drivetrain.match.anchor_window`; the same assignments, one host read per step to size the
            windows); False: the dense ``(B, A, G)`` IoU with no host read (:func:`~drivetrain.match.max_iou.
            batched_max_iou_assign`).
        middle: :class:`~.middle.DenseMiddleEncoder` arguments (``base_channels``, ``blocks``): a dense 3D
            convolutional middle encoder between the voxel encoder and the BEV backbone (the voxel size must cut
            z into several cells); None: PointPillars' BEV scatter.
        compile_loss: run the batched assignment and loss through ``torch.compile`` in one graph: True (its
            defaults) or a mapping of its keyword arguments; kept in :attr:`compile_loss` (None: eager).
    """

    input_modalities: tuple[str, ...] = ("lidar",)

    def __init__(
        self,
        point_cloud_range: Sequence[float] = (-50.0, -50.0, -5.0, 50.0, 50.0, 3.0),
        voxel_size: Sequence[float] = (0.25, 0.25, 8.0),
        max_points: int = 64,
        max_voxels: int = 30000,
        max_voxels_test: int = 40000,
        point_dims: int = 4,
        vfe_channels: Sequence[int] = (64, 64),
        backbone_channels: Sequence[int] = (64, 128, 256),
        layer_nums: Sequence[int] = (3, 5, 5),
        layer_strides: Sequence[int] = (2, 2, 2),
        neck_channels: Sequence[int] = (128, 128, 128),
        upsample_strides: Sequence[float] = (1, 2, 4),
        anchor_ranges: Sequence[Sequence[float]] | None = None,
        anchor_sizes: Sequence[Sequence[float]] | None = None,
        rotations: Sequence[float] = ROTATIONS,
        num_classes: int = 10,
        code_size: int = 9,
        assigner: Sequence[float] | Sequence[Sequence[float]] | None = None,
        classes: Sequence[str] | None = None,
        dataset_classes: str | Sequence[str] = "nuscenes",
        tasks: Sequence[Sequence[Any]] | None = None,
        decode: dict[str, Any] | None = None,
        tta: dict[str, Any] | None = None,
        impl: str = "batched",
        chunk: int | None = None,
        window: bool = True,
        middle: dict[str, Any] | None = None,
        compile_loss: bool | dict[str, Any] = False,
    ) -> None:
        super().__init__()
        if impl not in ("batched", "reference"):
            raise ValueError(f"impl: expected 'batched' or 'reference', got {impl!r}")
        self.compile_loss = compile_options(compile_loss)
        if anchor_ranges is None or anchor_sizes is None:
            anchor_ranges, anchor_sizes = NUS_PP_ANCHORS.ranges, NUS_PP_ANCHORS.sizes
        if assigner is None:
            assigner = _triple(NUS_PP_ASSIGNER)
        self.impl, self.chunk, self.code_size, self.num_classes = impl, chunk, code_size, num_classes
        self.window = bool(window)
        self.grid = VoxelGrid(tuple(point_cloud_range), tuple(voxel_size), max_points, max_voxels)  # type: ignore[arg-type]
        self.grid_test = VoxelGrid(tuple(point_cloud_range), tuple(voxel_size), max_points, max_voxels_test)  # type: ignore[arg-type]
        self.anchor_config = AnchorConfig(
            ranges=tuple(tuple(float(v) for v in r) for r in anchor_ranges),
            sizes=tuple(tuple(float(v) for v in s) for s in anchor_sizes),
            rotations=tuple(float(r) for r in rotations),
            custom_values=(0.0, 0.0) if code_size == 9 else (),
        )
        self._set_classes(classes, dataset_classes)
        self.tasks = None if tasks is None else tuple((int(n), tuple(ch), tuple(st)) for n, ch, st in tasks)
        self.assigners = self._assigners(assigner)
        self.decode_config = DecodeConfig(**(decode or {}))
        self.tta_config = TTAConfig(**tta) if tta is not None else None
        self.vfe = HardVFE(point_dims, tuple(vfe_channels), self.grid)
        self.middle = None
        bev_channels = vfe_channels[-1]
        if middle is not None:  # a dense 3D middle encoder over a voxel grid with several cells along z
            self.middle = DenseMiddleEncoder(vfe_channels[-1], self.grid.grid_size[2], **middle)
            bev_channels = self.middle.out_channels
        self.backbone = SECOND(bev_channels, tuple(backbone_channels), tuple(layer_nums), tuple(layer_strides))
        self.neck = SECONDFPN(tuple(backbone_channels), tuple(neck_channels), tuple(upsample_strides))
        if self.tasks is None:
            num_anchors = len(anchor_sizes) * len(rotations)
            self.head: nn.Module = Anchor3DHead(self.neck.out_channels, num_anchors, num_classes, code_size)
        else:
            if len(anchor_sizes) != num_classes:
                raise ValueError(f"anchor_sizes: SSN needs one size per class ({num_classes}), got {len(anchor_sizes)}")
            self.head = ShapeAwareHead(self.neck.out_channels, self.tasks, num_classes, code_size, len(rotations))
        self.criterion = AnchorHeadLoss(
            num_classes, code_weights=code_weights_for(code_size), dir_offset=NUS_DIR_OFFSET, weights=LOSS_WEIGHTS
        )
        self._anchors: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor | None, Any]] = {}
        self._windows: dict[tuple[Any, ...], WindowedAnchors] = {}

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
            stored = x.num_stored if self.impl == "batched" else None
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
        """``(B, A)`` anchor assignment (−1 ignore, 0 negative, k ≥ 1 GT k−1), batched or per sample."""
        return self.assign_with_pairs(feature_size, gt_boxes, gt_labels)[0]

    def assign_with_pairs(
        self, feature_size: tuple[int, int], gt_boxes: RaggedBatch, gt_labels: RaggedBatch
    ) -> tuple[torch.Tensor, WindowPairs | None]:
        """:meth:`assign` and, from the windowed assignment, the pairs that hold every positive (else None), which
        the loss's batched path reads (:class:`~drivetrain.match.anchor_window.WindowPairs`)."""
        anchors, classes, thresholds = self.anchor_set(feature_size, gt_boxes.device)
        with torch.no_grad():
            if self.impl == "batched" and self.window:
                prepared = self.windowed_anchors(feature_size, gt_boxes.device)
                return windowed_max_iou_assign(
                    anchors,
                    prepared.grid,
                    gt_boxes,
                    gt_labels,
                    thresholds,
                    anchor_classes=classes,
                    prepared=prepared,
                    with_pairs=True,
                )
            if self.impl == "batched":
                dense = batched_max_iou_assign(
                    anchors, gt_boxes, gt_labels, thresholds, anchor_classes=classes, chunk=self.chunk
                )
                return dense, None
            boxes, labels = gt_boxes.to_list(), gt_labels.to_list()
            rows = [
                reference_max_iou_assign(anchors, b, lab, self.assigners[0])
                if classes is None
                else reference_max_iou_assign_per_class(anchors, classes, b, lab, self.assigners)
                for b, lab in zip(boxes, labels, strict=True)
            ]
            return torch.stack(rows), None  # (B, A)

    def loss(self, outputs: dict[str, Any], batch: Batch) -> dict[str, torch.Tensor]:
        """The unweighted terms ``loss_cls``, ``loss_bbox``, ``loss_dir``."""
        gt_boxes, gt_labels = self.gt_targets(batch)
        if self.impl == "batched" and self.compile_loss is not None:  # one graph, timed as a whole by the caller
            _, classes, thresholds = self.anchor_set(outputs["feature_size"], gt_boxes.device)
            head = (outputs["cls_logits"], outputs["box_preds"], outputs["dir_logits"], outputs["anchors"])
            gt = (ragged_dynamic(gt_boxes), ragged_dynamic(gt_labels))  # G
            return compiled(_assign_and_loss, self.compile_loss)(
                *head, *gt, thresholds, classes, self.chunk, self.criterion.options
            )
        with region("assignment"):
            assigned, pairs = self.assign_with_pairs(outputs["feature_size"], gt_boxes, gt_labels)
        with region("targets + loss"):
            return self.criterion(
                outputs["cls_logits"],
                outputs["box_preds"],
                outputs["dir_logits"],
                outputs["anchors"],
                assigned,
                gt_boxes,
                gt_labels,
                impl=self.impl,
                anchor_classes=self.anchor_set(outputs["feature_size"], gt_boxes.device)[1],  # SSN: per class
                pairs=pairs,
            )

    # --------------------------------------------------------------------------------------------- detect
    def enable_tta(self) -> None:
        """Test-time augmentation on in :meth:`detect`: the views of ``tta``, else :class:`~.tta.TTAConfig`'s."""
        self.tta_config = self.tta_config or TTAConfig()

    @torch.no_grad()
    def detect(self, batch: Batch, tta: bool | None = None) -> tuple[RaggedBatch, RaggedBatch, RaggedBatch]:
        """Detections of a batch: boxes ``(B, K, 9)`` ``(x, y, z_centre, dx, dy, dz, yaw, vx, vy)`` in the lidar
        frame (zero velocity when ``code_size`` is 7), scores, and labels in the dataset's class order; decoded
        as :mod:`.postprocess` (``impl`` picks the batched or per-sample path; the batched one with
        ``compact=True``: one host read, NMS over the candidates only). With ``tta`` (default: whether the model
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
        if self.impl == "batched":
            boxes, scores, labels = decode(*args, self.decode_config, compact=True)
        else:
            per_sample = reference_decode(*args, self.decode_config)
            boxes = RaggedBatch.from_list([d["boxes"] for d in per_sample])
            scores = RaggedBatch.from_list([d["scores"] for d in per_sample])
            labels = RaggedBatch.from_list([d["labels"] for d in per_sample])
        if self.code_size == 7:
            boxes = boxes.apply(lambda t: torch.cat([t, t.new_zeros(*t.shape[:-1], 2)], dim=-1))  # (B, K, 9)
        return boxes, scores, labels.apply(lambda t: self._to_data[t])


def _assign_and_loss(
    pred_cls: torch.Tensor,
    pred_boxes: torch.Tensor,
    pred_dir: torch.Tensor,
    anchors: torch.Tensor,
    gt_boxes: RaggedBatch,
    gt_labels: RaggedBatch,
    thresholds: AnchorThresholds,
    anchor_classes: torch.Tensor | None,
    chunk: int | None,
    options: dict[str, Any],
) -> dict[str, torch.Tensor]:
    """The batched assignment and loss of :meth:`PointPillars.loss` as one function, which ``compile_loss``
    compiles (shapes as :func:`~.loss_batched.batched_anchor_head_loss`)."""
    assigned = batched_max_iou_assign(
        anchors, gt_boxes, gt_labels, thresholds, anchor_classes=anchor_classes, chunk=chunk
    )  # (B, A)
    return batched_anchor_head_loss(pred_cls, pred_boxes, pred_dir, anchors, assigned, gt_boxes, gt_labels, **options)


SSN_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "max_points": 20,
        "anchor_ranges": NUS_SSN_ANCHORS.ranges,
        "anchor_sizes": NUS_SSN_ANCHORS.sizes,
        "assigner": tuple(_triple(c) for c in NUS_SSN_ASSIGNERS),
        "classes": SSN_NUS_CLASSES,
        "tasks": SSN_NUS_TASKS,
    }
)
"""SSN's keyword arguments where they differ from :class:`PointPillars`' (the published nuScenes SSN's; the typed
form of all of them: :class:`~.args.SSNArgs`)."""


class SSN(PointPillars):
    """SSN (shape signature networks): PointPillars' encoder and BEV network with a ``ShapeAwareHead``, one
    anchor size per class on its task's map, and one assigner per class; defaults are the published nuScenes
    configuration (``configs/ssn/ssn_hv_secfpn_sbn-all_16xb2-2x_nus-3d.py``: 20 points per pillar, the
    classes in SSN's order; its constants in :mod:`.recipe`). Arguments as :class:`PointPillars`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{**SSN_DEFAULTS, **kwargs})
