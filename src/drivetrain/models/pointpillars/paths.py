"""The path a PointPillars / SSN model runs, chosen once when it is built: :func:`model_path` reads the model's
``impl``, ``window``, ``chunk`` and ``compile_loss`` (:class:`~.args.PointPillarsArgs`) — the one place that does —
and returns the object the model calls for its pillar features, assignment, loss, decoding and test-time merge.

- :class:`ReferencePath` (``impl: reference``): as the originals, per sample: HardVFE on the original's ``(V, T)``
  slot layout, the max-IoU assignment per sample (SSN: per class), the anchor-head targets and losses per sample
  (:func:`~.loss_reference.reference_anchor_head_loss`), the decoding and the test-time merge per sample.
- :class:`BatchedPath` (``impl: batched``, the default): every sample at once, the same assignments and terms:
  HardVFE on the stored points only, the assignment over the anchor windows each ground truth reaches
  (:func:`~drivetrain.match.anchor_window.windowed_max_iou_assign_with_pairs`; with ``window: false`` the dense
  :func:`~drivetrain.match.max_iou.batched_max_iou_assign`), the loss on the window pairs
  (:func:`~.loss_batched.batched_anchor_head_loss`), the decoding with ``compact=True`` and the merge at once.
- :class:`CompiledPath` (``impl: batched`` with ``compile_loss``): the batched path with the dense assignment and
  the loss through ``torch.compile`` in one graph, the ground-truth dim dynamic (:mod:`drivetrain.compiled`).

Each path's ``assign`` returns ``(assigned, pairs)``: the int64 ``(B, A)`` assignment (−1 ignore, 0 negative,
``k ≥ 1`` GT ``k − 1``) and the windowed assignment's pairs, or None (every path but the windowed one).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

from drivetrain.compiled import compile_options, compiled, ragged_dynamic
from drivetrain.match.anchor_window import WindowPairs, windowed_max_iou_assign_with_pairs
from drivetrain.match.max_iou import (
    AnchorThresholds,
    batched_max_iou_assign,
    reference_max_iou_assign,
    reference_max_iou_assign_per_class,
)
from drivetrain.models.pointpillars.loss_batched import batched_anchor_head_loss
from drivetrain.models.pointpillars.postprocess import DecodeConfig, decode, reference_decode
from drivetrain.models.pointpillars.tta import merge, reference_merge
from drivetrain.profile import region
from drivetrain.ragged import RaggedBatch

if TYPE_CHECKING:
    from drivetrain.models.pointpillars.args import PointPillarsArgs
    from drivetrain.models.pointpillars.model import PointPillars

__all__ = ["BatchedPath", "CompiledPath", "ReferencePath", "model_path"]

Detections = tuple[RaggedBatch, RaggedBatch, RaggedBatch]  # boxes (B, K, D), scores (B, K), labels (B, K)


def model_path(args: PointPillarsArgs) -> ReferencePath | BatchedPath | CompiledPath:
    """The path of a model built with ``args``; ValueError naming ``impl`` for a value other than the two."""
    options = compile_options(args.compile_loss)  # a TypeError for a value of neither form, whatever the path
    if args.impl == "reference":
        return ReferencePath()
    if args.impl != "batched":
        raise ValueError(f"impl: expected 'batched' or 'reference', got {args.impl!r}")
    if options is not None:
        return CompiledPath(bool(args.window), args.chunk, options)
    return BatchedPath(bool(args.window), args.chunk)


def _head(outputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The head outputs the loss reads: ``cls_logits (B, A, C)``, ``box_preds (B, A, D)``, ``dir_logits (B, A, 2)``,
    ``anchors (A, D)``."""
    return outputs["cls_logits"], outputs["box_preds"], outputs["dir_logits"], outputs["anchors"]


class _Path(ABC):
    """What every path does the same way: the loss as the assignment, then the targets and terms."""

    @abstractmethod
    def assign(
        self, model: PointPillars, feature_size: tuple[int, int], gt_boxes: RaggedBatch, gt_labels: RaggedBatch
    ) -> tuple[torch.Tensor, WindowPairs | None]:
        """``(assigned, pairs)`` of a batch's ground truth on the anchors of a ``feature_size`` map."""

    @abstractmethod
    def terms(
        self,
        model: PointPillars,
        outputs: dict[str, Any],
        assigned: torch.Tensor,
        pairs: WindowPairs | None,
        gt_boxes: RaggedBatch,
        gt_labels: RaggedBatch,
    ) -> dict[str, torch.Tensor]:
        """The unweighted terms of an assignment."""

    def loss(
        self, model: PointPillars, outputs: dict[str, Any], gt_boxes: RaggedBatch, gt_labels: RaggedBatch
    ) -> dict[str, torch.Tensor]:
        """The assignment, then the targets and losses (two regions of the profile)."""
        with region("assignment"):
            assigned, pairs = self.assign(model, outputs["feature_size"], gt_boxes, gt_labels)
        with region("targets + loss"):
            return self.terms(model, outputs, assigned, pairs, gt_boxes, gt_labels)


class ReferencePath(_Path):
    """The originals' per-sample loops (see the module docstring)."""

    compact_vfe = False  # HardVFE on the original's (V, T) slot layout

    @torch.no_grad()
    def assign(
        self, model: PointPillars, feature_size: tuple[int, int], gt_boxes: RaggedBatch, gt_labels: RaggedBatch
    ) -> tuple[torch.Tensor, WindowPairs | None]:
        """Per sample: ``reference_max_iou_assign`` (SSN: ``reference_max_iou_assign_per_class``); no pairs."""
        anchors, classes, _ = model.anchor_set(feature_size, gt_boxes.device)
        rows = [
            reference_max_iou_assign(anchors, boxes, labels, model.assigners[0])
            if classes is None
            else reference_max_iou_assign_per_class(anchors, classes, boxes, labels, model.assigners)
            for boxes, labels in zip(gt_boxes.to_list(), gt_labels.to_list(), strict=True)
        ]
        return torch.stack(rows), None  # (B, A)

    def terms(
        self,
        model: PointPillars,
        outputs: dict[str, Any],
        assigned: torch.Tensor,
        pairs: WindowPairs | None,
        gt_boxes: RaggedBatch,
        gt_labels: RaggedBatch,
    ) -> dict[str, torch.Tensor]:
        """The unweighted terms of an assignment: :meth:`~.loss.AnchorHeadLoss.reference` (SSN: per class)."""
        classes = model.anchor_set(outputs["feature_size"], gt_boxes.device)[1]
        return model.criterion.reference(*_head(outputs), assigned, gt_boxes, gt_labels, anchor_classes=classes)

    def decode(
        self, cls: torch.Tensor, box: torch.Tensor, direction: torch.Tensor, anchors: torch.Tensor, cfg: DecodeConfig
    ) -> Detections:
        """:func:`~.postprocess.reference_decode`, per sample, as RaggedBatches."""
        per_sample = reference_decode(cls, box, direction, anchors, cfg)
        return tuple(RaggedBatch.from_list([d[key] for d in per_sample]) for key in ("boxes", "scores", "labels"))  # type: ignore[return-value]

    def merge(self, per_view: list[Detections], num_classes: int, nms_threshold: float, max_num: int) -> Detections:
        """:func:`~.tta.reference_merge`, per sample, as RaggedBatches."""
        merged = reference_merge(per_view, num_classes, nms_threshold, max_num)
        return tuple(RaggedBatch.from_list([m[key] for m in merged]) for key in ("boxes", "scores", "labels"))  # type: ignore[return-value]


class BatchedPath(_Path):
    """Every sample at once (see the module docstring).

    Args:
        window: assign over the anchor windows each GT reaches (one host read per step); False: the dense IoU.
        chunk: anchors per IoU slice of the dense assignment (None: all at once).
    """

    compact_vfe = True  # HardVFE on the stored points only

    def __init__(self, window: bool = True, chunk: int | None = None) -> None:
        self.window, self.chunk = window, chunk

    @torch.no_grad()
    def assign(
        self, model: PointPillars, feature_size: tuple[int, int], gt_boxes: RaggedBatch, gt_labels: RaggedBatch
    ) -> tuple[torch.Tensor, WindowPairs | None]:
        """The windowed assignment and its pairs, or the dense one (``window=False``) and None."""
        anchors, classes, thresholds = model.anchor_set(feature_size, gt_boxes.device)
        if not self.window:
            dense = batched_max_iou_assign(
                anchors, gt_boxes, gt_labels, thresholds, anchor_classes=classes, chunk=self.chunk
            )
            return dense, None
        prepared = model.windowed_anchors(feature_size, gt_boxes.device)
        return windowed_max_iou_assign_with_pairs(
            anchors, prepared.grid, gt_boxes, gt_labels, thresholds, anchor_classes=classes, prepared=prepared
        )

    def terms(
        self,
        model: PointPillars,
        outputs: dict[str, Any],
        assigned: torch.Tensor,
        pairs: WindowPairs | None,
        gt_boxes: RaggedBatch,
        gt_labels: RaggedBatch,
    ) -> dict[str, torch.Tensor]:
        """The unweighted terms of an assignment: :meth:`~.loss.AnchorHeadLoss.batched`, on ``pairs`` if given."""
        return model.criterion.batched(*_head(outputs), assigned, gt_boxes, gt_labels, pairs=pairs)

    def decode(
        self, cls: torch.Tensor, box: torch.Tensor, direction: torch.Tensor, anchors: torch.Tensor, cfg: DecodeConfig
    ) -> Detections:
        """:func:`~.postprocess.decode` with ``compact=True`` (one host read, NMS over the candidates only)."""
        return decode(cls, box, direction, anchors, cfg, compact=True)

    def merge(self, per_view: list[Detections], num_classes: int, nms_threshold: float, max_num: int) -> Detections:
        """:func:`~.tta.merge`, every sample at once."""
        return merge(per_view, num_classes, nms_threshold, max_num)


class CompiledPath(BatchedPath):
    """:class:`BatchedPath` with the dense assignment and the loss through ``torch.compile`` in one graph.

    Args:
        window, chunk: as :class:`BatchedPath` (``window`` applies to :meth:`assign` alone; the compiled loss
            assigns densely, ``chunk`` anchors per IoU slice).
        options: ``torch.compile``'s keyword arguments (:func:`~drivetrain.compiled.compile_options`).
    """

    def __init__(self, window: bool, chunk: int | None, options: dict[str, Any]) -> None:
        super().__init__(window, chunk)
        self.compile_options = options

    def loss(
        self, model: PointPillars, outputs: dict[str, Any], gt_boxes: RaggedBatch, gt_labels: RaggedBatch
    ) -> dict[str, torch.Tensor]:
        """One graph, timed as a whole by the caller: the dense assignment and the batched loss."""
        _, classes, thresholds = model.anchor_set(outputs["feature_size"], gt_boxes.device)
        gt = (ragged_dynamic(gt_boxes), ragged_dynamic(gt_labels))  # G
        return compiled(_assign_and_loss, self.compile_options)(
            *_head(outputs), *gt, thresholds, classes, self.chunk, model.criterion.options
        )


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
    """The batched assignment and loss of :meth:`CompiledPath.loss` as one function, which it compiles (shapes as
    :func:`~.loss_batched.batched_anchor_head_loss`)."""
    assigned = batched_max_iou_assign(
        anchors, gt_boxes, gt_labels, thresholds, anchor_classes=anchor_classes, chunk=chunk
    )  # (B, A)
    return batched_anchor_head_loss(pred_cls, pred_boxes, pred_dir, anchors, assigned, gt_boxes, gt_labels, **options)
