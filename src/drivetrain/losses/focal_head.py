"""The 2D focal head's loss over every image of the batch: QFL, L1, GIoU, centres, heatmap.

The focal head is StreamPETR's 2D auxiliary head; its loss is model-neutral (any model whose head gives these
outputs per image and feature token: StreamPETR's focal head, the 2D focal detector), so it lives here with its
published weights and matching costs (:data:`FOCAL_HEAD_WEIGHTS`, :data:`FOCAL_HEAD_MATCH_COSTS`) and
:func:`focal_head_loss`, which builds it from them.

Per image (``B × N`` cameras, ``Q`` feature tokens each) the 2D Hungarian assigner matches tokens to the
image's 2D ground truth; then, with ``N⁺`` the number of ground truths of the batch on this rank, ``N̄⁺`` its
mean over the ranks of the process group and ``f`` the image size ``(W, H, W, H)``:

- ``enc_loss_cls = Σ QFL(logits, label, IoU) / max(N⁺, 1)`` with the matched token's IoU target;
- ``enc_loss_bbox = Σ_pos |pred_cxcywh − cxcywh(gt / f)| / max(N̄⁺, 1)``;
- ``enc_loss_iou = Σ_pos (1 − GIoU(pred · f, gt)) / max(N⁺, 1)`` in pixels;
- ``centers2d_loss = Σ_pos |pred_c2d − c2d / (W, H)| / max(N̄⁺, 1)``;
- ``centerness_loss = Σ GaussianFocal(clamp(σ(centerness)), heatmap) / max(N̄⁺, 1)`` with each ground
  truth drawn at ``int(c2d / stride)`` with radius ``max(1, ceil(min edge distance / stride))``.

The local counts are the original's: with ``sync_cls_avg_factor`` False (its published value) the
classification term divides by this rank's count, and ``enc_loss_iou`` always does, because the original
divides it before the count is all-reduced; ``sync_cls_avg_factor=True`` averages the classification count
over ranks, as the original's option does.

An image with more ground truths than tokens (``M > Q``) is matched as the original matches it: every token
gets one ground truth, the other ``M − Q`` stay unassigned and are not counted in ``N⁺`` (the original counts
assigned tokens); they are still drawn in the centerness heatmap, as in the original.
:attr:`FocalHeadLoss.counts` holds their number in the last call (``unassigned_gt_2d``, a device tensor the
trainer logs per step), and the first such batch gives one warning.

Terms are unweighted; :attr:`FocalHeadLoss.weights` holds the weights it was given (StreamPETR and the 2D focal
detector pass the published ones, :func:`focal_head_loss`).
Two paths of one specification (docs/design.md, "The two paths"), two methods: :meth:`FocalHeadLoss.reference`
loops over images as the original; calling the loss (``forward``) runs the batched path, all images at once; a loss
built with ``compile=True`` runs that path through ``torch.compile`` in one graph, the solver inside it as a custom
operator and the ground-truth dim dynamic (:mod:`drivetrain.compiled`). A model picks its path once, when it is
built.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch

from drivetrain import ragged
from drivetrain.compiled import compile_options, compiled, ragged_dynamic, region
from drivetrain.constants import constant
from drivetrain.geometry import (
    boxes_cxcywh_to_xyxy,
    boxes_xyxy_to_cxcywh,
    iou_aligned,
    normalize_boxes,
    unnormalize_boxes,
)
from drivetrain.geometry.heatmap import draw_gaussians, focal_head_radius, reference_draw_gaussian
from drivetrain.losses.functional import gaussian_focal_loss, giou_loss, l1_loss, quality_focal_loss
from drivetrain.losses.inputs import Targets, field
from drivetrain.losses.normalize import average_factor
from drivetrain.losses.sampling import assigned_from_pairs, pseudo_sample
from drivetrain.losses.term_weights import resolve_weights
from drivetrain.match import HungarianAssigner2D
from drivetrain.match.solve import num_assigned, num_unassigned
from drivetrain.ragged import RaggedBatch

__all__ = [
    "FOCAL_HEAD_MATCH_COSTS",
    "FOCAL_HEAD_WEIGHTS",
    "NUM_CLASSES",
    "STRIDE",
    "TERMS",
    "FocalHeadLoss",
    "focal_head_loss",
    "hungarian_2d",
]

TERMS = ("enc_loss_cls", "enc_loss_bbox", "enc_loss_iou", "centers2d_loss", "centerness_loss")
"""The loss's terms, each of which takes a weight (the published ones: :data:`FOCAL_HEAD_WEIGHTS`)."""

# The published focal head, cited from the config of the StreamPETR repository (``exiawsh/StreamPETR`` at commit
# 95f6470, ``projects/configs/StreamPETR/stream_petr_r50_flash_704_bs2_seq_24e.py``).
FOCAL_HEAD_WEIGHTS = {
    "enc_loss_cls": 2.0,
    "enc_loss_bbox": 5.0,
    "enc_loss_iou": 2.0,
    "centers2d_loss": 10.0,
    "centerness_loss": 1.0,
}
"""``img_roi_head``'s ``loss_cls2d`` (quality focal), ``loss_bbox2d`` (L1), ``loss_iou2d`` (GIoU),
``loss_centers2d`` (L1) and ``loss_centerness`` (Gaussian focal) weights, by the names of :data:`TERMS`."""

FOCAL_HEAD_MATCH_COSTS = {"cls_weight": 2.0, "box_weight": 5.0, "giou_weight": 2.0, "centre_weight": 10.0}
"""``img_roi_head.train_cfg.assigner2d`` (``HungarianAssigner2D``): ``cls_cost``, ``reg_cost`` (xywh L1),
``iou_cost`` (GIoU) and ``centers2d_cost`` weights."""

STRIDE = 16
"""The feature stride the published focal head reads (``FocalHead``'s ``stride=16`` default, which the config
leaves as is)."""

NUM_CLASSES = 10
"""The published head's class channels: nuScenes' ten detection classes."""


class FocalHeadLoss(torch.nn.Module):
    """2D auxiliary loss of StreamPETR's focal head.

    Args:
        num_classes: ``C``; label ``C`` is background.
        stride: feature stride in pixels (required, keyword).
        weights: the weight of every term of :data:`TERMS`, by name (required, keyword).
        assigner: the 2D matcher (required, keyword).
        beta: QFL exponent (2: the default of the original's ``QualityFocalLoss``).
        sync_cls_avg_factor: average the classification count over ranks as well (the original's option of
            that name; False, its published value, divides ``enc_loss_cls`` by this rank's count).
        compile: run the batched path through ``torch.compile``: True (its defaults) or a mapping of its keyword
            arguments; kept in :attr:`compile_options` (None: eager).

    Attributes:
        counts: device counters of the last call, ``{"unassigned_gt_2d": int64 ()}``: 2D ground truths of the
            batch left unassigned because their image holds more of them than there are tokens (empty before
            the first call).
    """

    def __init__(
        self,
        num_classes: int,
        *,
        stride: int,
        weights: Mapping[str, float],
        assigner: HungarianAssigner2D,
        beta: float = 2.0,
        sync_cls_avg_factor: bool = False,
        compile: bool | Mapping[str, Any] = False,
    ) -> None:
        super().__init__()
        self.num_classes, self.stride, self.beta = num_classes, stride, beta
        self.compile_options = compile_options(compile)
        self.sync_cls_avg_factor = sync_cls_avg_factor
        self.assigner = assigner
        missing = [term for term in TERMS if term not in weights]
        if missing:
            raise KeyError(f"weights: no weight for {missing[0]}; the terms are {list(TERMS)}")
        self.weights = resolve_weights(dict.fromkeys(TERMS, 0.0), weights)
        self.counts: dict[str, torch.Tensor] = {}
        self._warned_unassigned = False

    def forward(self, outputs: Mapping[str, Any], targets: Targets) -> dict[str, torch.Tensor]:
        """The unweighted loss terms of one batch by the batched path: every image at once (compiled when the loss
        was built with ``compile``).

        Args:
            outputs: ``cls_logits`` ``(B, N, Q, C)``, ``boxes`` ``(B, N, Q, 4)`` normalised cxcywh, ``centres``
                ``(B, N, Q, 2)`` normalised, ``centerness`` ``(B, N, Hf, Wf)`` logits (``Q = Hf·Wf``).
            targets: ``gt_boxes_2d`` RaggedBatch ``(B, N, G, 4)`` pixel xyxy, ``gt_labels_2d`` ``(B, N, G)``,
                ``centers_2d`` ``(B, N, G, 2)`` pixels (projected 3D centres), ``image_size`` ``(W, H)``; a
                mapping or an object with these attributes (e.g. a data ``Batch``).

        Returns:
            ``{term: () float32}`` for the five terms of :data:`TERMS`.
        """
        args = self._inputs(outputs, targets)
        if self.compile_options is None:
            return self._batched(*args)
        logits, boxes, centres, centerness, gt_boxes, gt_labels, gt_centres, image_size = args
        gt = (ragged_dynamic(gt_boxes), ragged_dynamic(gt_labels), ragged_dynamic(gt_centres))  # G
        batched = compiled(FocalHeadLoss._batched, self.compile_options)  # unbound: self is an argument
        return batched(self, logits, boxes, centres, centerness, *gt, image_size)

    def reference(self, outputs: Mapping[str, Any], targets: Targets) -> dict[str, torch.Tensor]:
        """The same terms by the reference path: per image, as the original (arguments and result as
        :meth:`forward`'s)."""
        return {k: torch.nan_to_num(v) for k, v in self._reference(*self._inputs(outputs, targets)).items()}

    def _inputs(self, outputs: Mapping[str, Any], targets: Targets) -> tuple[Any, ...]:
        """Both paths' arguments, checked; sets :attr:`counts`."""
        logits, boxes, centres = field(outputs, "cls_logits"), field(outputs, "boxes"), field(outputs, "centres")
        centerness = field(outputs, "centerness")
        gt_boxes, gt_labels = field(targets, "gt_boxes_2d"), field(targets, "gt_labels_2d")
        gt_centres, image_size = field(targets, "centers_2d"), tuple(float(v) for v in field(targets, "image_size"))
        batch, cams, num_tokens, _ = logits.shape
        if boxes.shape != (batch, cams, num_tokens, 4) or centres.shape != (batch, cams, num_tokens, 2):
            raise ValueError(
                f"boxes/centres: expected {(batch, cams, num_tokens, 4)} and {(batch, cams, num_tokens, 2)}, "
                f"got {tuple(boxes.shape)} and {tuple(centres.shape)}"
            )
        if centerness.dim() != 4 or centerness.shape[:2] != (batch, cams) or centerness[0, 0].numel() != num_tokens:
            raise ValueError(
                f"centerness: expected (B, N, Hf, Wf) with Hf·Wf = {num_tokens}, got {tuple(centerness.shape)}"
            )
        self._count_unassigned(gt_boxes, num_tokens)
        return logits, boxes, centres, centerness, gt_boxes, gt_labels, gt_centres, image_size

    def _count_unassigned(self, gt_boxes: RaggedBatch, num_tokens: int) -> None:
        """Set :attr:`counts` (no sync) and warn once when an image may hold more ground truths than tokens."""
        if not isinstance(gt_boxes, RaggedBatch):
            raise TypeError(f"gt_boxes_2d: expected a RaggedBatch (B, N, G, 4), got {type(gt_boxes).__name__}")
        padded = gt_boxes.max_size  # the shape, known on the host: no image holds more
        self.counts = {"unassigned_gt_2d": num_unassigned(gt_boxes.sizes, num_tokens, padded)}
        # not while dynamo traces a whole step (the padded length is then a bucket, a bound; the count stays exact)
        if padded > num_tokens and not self._warned_unassigned and not torch.compiler.is_compiling():
            self._warned_unassigned = True
            warnings.warn(
                f"gt_boxes_2d: a batch holds up to {padded} 2D ground truths per image, more than the {num_tokens} "
                "feature tokens; as in the original, each token is matched to one and the rest stay unassigned "
                "(counted per step as count/unassigned_gt_2d in metrics.jsonl; warned once)",
                RuntimeWarning,
                stacklevel=4,
            )

    # ------------------------------------------------------------------ batched
    def _batched(
        self,
        logits: torch.Tensor,
        boxes: torch.Tensor,
        centres: torch.Tensor,
        centerness: torch.Tensor,
        gt_boxes: RaggedBatch,
        gt_labels: RaggedBatch,
        gt_centres: RaggedBatch,
        image_size: tuple[float, float],
    ) -> dict[str, torch.Tensor]:
        batch, cams, num_tokens, num_classes = logits.shape
        pairs = self.assigner.batched(
            logits.detach(), boxes.detach(), centres.detach(), gt_boxes, gt_labels, gt_centres, image_size
        )  # (B, N, G, 2)
        with region("targets"):
            token_index = pairs.apply(lambda t: t[..., 0])  # (B, N, G)
            gt_index = pairs.apply(lambda t: t[..., 1])  # (B, N, G)
            count = num_assigned(gt_boxes.sizes, num_tokens, gt_boxes.max_size).sum()  # () on the device: the pairs
            cls_factor = average_factor(count, across_ranks=self.sync_cls_avg_factor)  # ()
            iou_factor = average_factor(count, across_ranks=False)  # ()
            num_pos = average_factor(count)  # ()
            matched_boxes = ragged.gather(boxes, token_index).tensor.float()  # (B, N, G, 4)
            matched_centres = ragged.gather(centres, token_index).tensor.float()  # (B, N, G, 2)
            target_xyxy = ragged.gather(gt_boxes, gt_index).tensor.float()  # (B, N, G, 4) pixels
            target_centres = ragged.gather(gt_centres, gt_index).tensor.float()  # (B, N, G, 2) pixels
            target_labels = ragged.gather(gt_labels.apply(lambda t: t.long()), gt_index)  # (B, N, G)
            valid = token_index.mask.unsqueeze(-1)  # (B, N, G, 1)
            pred_xyxy = unnormalize_boxes(boxes_cxcywh_to_xyxy(matched_boxes), image_size)  # (B, N, G, 4)
            iou = iou_aligned(target_xyxy, pred_xyxy.detach())  # (B, N, G)
            background = torch.full((batch, cams, num_tokens), num_classes, device=logits.device)
            labels = ragged.write(background, token_index, target_labels.tensor)  # (B, N, Q)
            scores = ragged.scatter(token_index.with_tensor(iou), token_index, num_tokens)  # (B, N, Q)
            box_target = boxes_xyxy_to_cxcywh(normalize_boxes(target_xyxy, image_size))  # (B, N, G, 4)
            target_pixels = unnormalize_boxes(boxes_cxcywh_to_xyxy(box_target), image_size)  # as the original
            wh = constant(image_size, dtype=torch.float32, device=logits.device)  # (2,)
        with region("heatmap"):
            cells = gt_centres.apply(lambda t: (t / self.stride).long())  # (B, N, G, 2)
            radii = gt_centres.with_tensor(focal_head_radius(gt_centres.tensor, gt_boxes.tensor, self.stride))
            heatmap = draw_gaussians(
                torch.zeros(centerness.shape, device=logits.device), cells, radii
            )  # (B, N, Hf, Wf)
        with region("losses"):
            loss_cls = quality_focal_loss(logits, labels, scores, self.beta).sum() / cls_factor
            loss_bbox = torch.where(valid, l1_loss(matched_boxes, box_target), 0.0).sum() / num_pos
            loss_iou = torch.where(valid[..., 0], giou_loss(pred_xyxy, target_pixels), 0.0).sum() / iou_factor
            loss_c2d = torch.where(valid, l1_loss(matched_centres, target_centres / wh), 0.0).sum() / num_pos
            pred_heat = centerness.float().sigmoid().clamp(1e-4, 1 - 1e-4)
            loss_centerness = gaussian_focal_loss(pred_heat, heatmap).sum() / num_pos
        terms = {
            "enc_loss_cls": loss_cls,
            "enc_loss_bbox": loss_bbox,
            "enc_loss_iou": loss_iou,
            "centers2d_loss": loss_c2d,
            "centerness_loss": loss_centerness,
        }
        return {k: torch.nan_to_num(v) for k, v in terms.items()}

    # ------------------------------------------------------------------ reference
    def _reference(
        self,
        logits: torch.Tensor,
        boxes: torch.Tensor,
        centres: torch.Tensor,
        centerness: torch.Tensor,
        gt_boxes: RaggedBatch,
        gt_labels: RaggedBatch,
        gt_centres: RaggedBatch,
        image_size: tuple[float, float],
    ) -> dict[str, torch.Tensor]:
        """As the original's ``FocalHead.loss_single`` (StreamPETR ``models/dense_heads/focal_head.py``), op for op
        per image and ground truth: per image the assigner, its result per token, mmdet's pseudo sampler and the
        targets of every token (``_get_target_single``); the targets concatenated and the box scale repeated per
        image; the centerness heatmap per image, one drawing per ground truth (``_get_heatmap_single``); then the
        five terms over every token, the box terms weighted by the positives' mask as there."""
        batch, cams, num_tokens, num_classes = logits.shape
        boxes_list, labels_list, centres_list = gt_boxes.to_list(), gt_labels.to_list(), gt_centres.to_list()
        matches = self.assigner.reference(
            logits.detach(), boxes.detach(), centres.detach(), boxes_list, labels_list, centres_list, image_size
        )
        width, height = image_size
        with region("targets"):
            factor = torch.tensor((width, height, width, height), dtype=torch.float32, device=logits.device)  # (4,)
            targets, count = [], 0
            for b in range(batch):
                for n in range(cams):
                    gt_xyxy, gt_label = boxes_list[b][n].float(), labels_list[b][n].long()  # (M, 4), (M,)
                    targets.append(
                        self._reference_targets(
                            matches[b][n], boxes[b, n], gt_xyxy, gt_label, centres_list[b][n], factor
                        )
                    )  # 5 × (Q, ·)
                    count += min(gt_xyxy.shape[0], num_tokens)  # the positives (matched tokens)
            labels, label_weights, box_targets, box_weights, centre_targets = (
                torch.cat([t[i] for t in targets]) for i in range(5)
            )  # (B·N·Q,), (B·N·Q,), (B·N·Q, 4), (B·N·Q, 4), (B·N·Q, 2)
            factors = torch.cat([factor.unsqueeze(0).repeat(num_tokens, 1) for _ in targets])  # (B·N·Q, 4)
            flat_boxes = boxes.reshape(-1, 4).float()  # (B·N·Q, 4) normalised cxcywh
            pred_xyxy = boxes_cxcywh_to_xyxy(flat_boxes) * factors  # (B·N·Q, 4) pixels
            target_xyxy = boxes_cxcywh_to_xyxy(box_targets) * factors  # (B·N·Q, 4) pixels, zeros off the positives
            scores = iou_aligned(target_xyxy, pred_xyxy.detach())  # (B·N·Q,) used at the positives only
            on = logits.device  # the counts made there, as the original's cls_scores.new_tensor (NCCL: no CPU tensor)
            cls_factor = average_factor(float(count), across_ranks=self.sync_cls_avg_factor, device=on)  # ()
            iou_factor = average_factor(float(count), across_ranks=False, device=on)  # ()
            num_pos = average_factor(float(count), device=on)  # ()
        with region("heatmap"):
            heat_shape = tuple(centerness.shape[-2:])
            heatmap = torch.stack(
                [
                    self._reference_heatmap(centres_list[b][n].float(), boxes_list[b][n].float(), heat_shape)
                    for b in range(batch)
                    for n in range(cams)
                ]
            ).view(centerness.shape)  # (B, N, Hf, Wf)
        with region("losses"):
            flat_logits = logits.reshape(-1, num_classes)  # (B·N·Q, C)
            qfl = quality_focal_loss(flat_logits, labels, scores, self.beta)  # (B·N·Q, C)
            loss_cls = (qfl.sum(-1) * label_weights).sum()  # ()
            loss_iou = (giou_loss(pred_xyxy, target_xyxy) * box_weights.mean(-1)).sum()  # ()
            loss_bbox = l1_loss(flat_boxes, box_targets, box_weights).sum()  # ()
            flat_centres = centres.reshape(-1, 2).float()  # (B·N·Q, 2)
            loss_c2d = l1_loss(flat_centres, centre_targets, box_weights[:, 0:2]).sum()  # ()
            pred_heat = centerness.float().sigmoid().clamp(1e-4, 1 - 1e-4)  # (B, N, Hf, Wf)
            loss_centerness = gaussian_focal_loss(pred_heat, heatmap).sum()  # ()
        return {
            "enc_loss_cls": loss_cls / cls_factor,
            "enc_loss_bbox": loss_bbox / num_pos,
            "enc_loss_iou": loss_iou / iou_factor,
            "centers2d_loss": loss_c2d / num_pos,
            "centerness_loss": loss_centerness / num_pos,
        }

    def _reference_targets(
        self,
        pairs: torch.Tensor,
        pred_boxes: torch.Tensor,
        gt_xyxy: torch.Tensor,
        gt_label: torch.Tensor,
        gt_centres: torch.Tensor,
        factor: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """One image's targets as the original's ``_get_target_single``, after its assigner's matching.

        Args:
            pairs: int64 ``(K, 2)`` (token, ground truth) pairs.
            pred_boxes: ``(Q, 4)`` the image's predicted boxes (normalised cxcywh).
            gt_xyxy: ``(M, 4)`` pixel boxes.
            gt_label: int64 ``(M,)``.
            gt_centres: ``(M, 2)`` pixel centres.
            factor: ``(4,)`` ``(W, H, W, H)``.

        Returns:
            ``labels`` int64 ``(Q,)`` (background ``C``), ``label_weights`` ``(Q,)``, ``box_targets`` ``(Q, 4)``
            normalised cxcywh, ``box_weights`` ``(Q, 4)`` (1 at the positives), ``centre_targets`` ``(Q, 2)``.
        """
        num_tokens, num_gts = pred_boxes.shape[0], gt_xyxy.shape[0]
        assigned, assigned_labels = assigned_from_pairs(pairs, num_tokens, num_gts, gt_label)  # (Q,), (Q,)
        sampled = pseudo_sample(assigned, assigned_labels, pred_boxes, gt_xyxy)
        pos = sampled.pos_inds  # (P,)
        labels = gt_xyxy.new_full((num_tokens,), self.num_classes, dtype=torch.long)  # (Q,) background = C
        labels[pos] = gt_label[sampled.pos_assigned_gt_inds]
        label_weights = gt_xyxy.new_ones(num_tokens)  # (Q,)
        box_targets = torch.zeros_like(pred_boxes, dtype=torch.float32)  # (Q, 4)
        box_weights = torch.zeros_like(pred_boxes, dtype=torch.float32)  # (Q, 4)
        box_weights[pos] = 1.0
        box_targets[pos] = boxes_xyxy_to_cxcywh(sampled.pos_gt_bboxes / factor)  # (P, 4) normalised cxcywh
        centre_targets = pred_boxes.new_full((num_tokens, 2), 0.0, dtype=torch.float32)  # (Q, 2)
        if num_gts == 0:
            matched_centres = gt_centres.new_empty((0, 2), dtype=torch.float32)  # (0, 2) as the original's empty_like
        else:
            matched_centres = gt_centres[sampled.pos_assigned_gt_inds].float()  # (P, 2)
        centre_targets[pos] = matched_centres / factor[0:2]
        return labels, label_weights, box_targets, box_weights, centre_targets

    def _reference_heatmap(
        self, gt_centres: torch.Tensor, gt_xyxy: torch.Tensor, shape: tuple[int, int]
    ) -> torch.Tensor:
        """One image's centerness target as the original's ``_get_heatmap_single``: each ground truth drawn at
        ``int(c2d / stride)`` with radius ``max(1, ceil(min edge distance / stride))``, one drawing per box.

        Args:
            gt_centres: ``(M, 2)`` pixel centres.
            gt_xyxy: ``(M, 4)`` pixel boxes.
            shape: ``(Hf, Wf)``.

        Returns:
            ``(Hf, Wf)`` float32.
        """
        heatmap = torch.zeros(shape, device=gt_centres.device)  # (Hf, Wf)
        if gt_centres.shape[0] != 0:
            radii = focal_head_radius(gt_centres, gt_xyxy, self.stride).tolist()  # sync: as the original's .cpu()
            for centre, radius in zip(gt_centres, radii, strict=True):
                reference_draw_gaussian(heatmap, centre / self.stride, radius)
        return heatmap


def hungarian_2d(backend: str = "auto") -> HungarianAssigner2D:
    """The published focal head's matcher: :data:`FOCAL_HEAD_MATCH_COSTS`.

    Args:
        backend: solver backend of the batched path (:func:`drivetrain.match.solve`).
    """
    return HungarianAssigner2D(**FOCAL_HEAD_MATCH_COSTS, backend=backend)


def focal_head_loss(
    num_classes: int = NUM_CLASSES,
    *,
    stride: int = STRIDE,
    backend: str = "auto",
    sync_cls_avg_factor: bool = False,
    compile: bool | Mapping[str, Any] = False,
) -> FocalHeadLoss:
    """The focal head's loss with the published weights and matcher, in one call::

        >>> from drivetrain.losses.focal_head import focal_head_loss
        >>> focal_head_loss().weights["centers2d_loss"]
        10.0

    Args:
        num_classes: ``C`` (:data:`NUM_CLASSES`).
        stride: the feature stride in pixels (:data:`STRIDE`).
        backend: the matcher's solver backend.
        sync_cls_avg_factor: as :class:`FocalHeadLoss`'s.
        compile: as :class:`FocalHeadLoss`'s.
    """
    return FocalHeadLoss(
        num_classes,
        stride=stride,
        weights=FOCAL_HEAD_WEIGHTS,
        assigner=hungarian_2d(backend),
        sync_cls_avg_factor=sync_cls_avg_factor,
        compile=compile,
    )
