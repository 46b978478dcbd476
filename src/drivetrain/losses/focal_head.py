"""StreamPETR's 2D auxiliary (focal head) loss over every image of the batch: QFL, L1, GIoU, centres, heatmap.

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

Terms are unweighted; :attr:`FocalHeadLoss.weights` holds the published weights (2, 5, 2, 10, 1).
``reference`` loops over images as the original; ``batched`` treats all images at once; ``compile=True`` runs
the batched path through ``torch.compile`` in one graph, the solver inside it as a custom operator and the
ground-truth dim dynamic (:mod:`drivetrain.compiled`).
"""

from __future__ import annotations

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
from drivetrain.heatmap import draw_gaussians, focal_head_radius, reference_draw_gaussians
from drivetrain.losses.functional import gaussian_focal_loss, giou_loss, l1_loss, quality_focal_loss
from drivetrain.losses.inputs import field
from drivetrain.losses.normalize import average_factor
from drivetrain.losses.weights import resolve_weights, weighted_total
from drivetrain.match import HungarianAssigner2D
from drivetrain.ragged import RaggedBatch

__all__ = ["WEIGHTS", "FocalHeadLoss"]

# The published weights of StreamPETR's focal head (its config's loss_cls / loss_bbox / loss_iou /
# loss_centers2d / loss_centerness): the one place they are declared.
WEIGHTS = {
    "enc_loss_cls": 2.0,
    "enc_loss_bbox": 5.0,
    "enc_loss_iou": 2.0,
    "centers2d_loss": 10.0,
    "centerness_loss": 1.0,
}


class FocalHeadLoss(torch.nn.Module):
    """2D auxiliary loss of StreamPETR's focal head.

    Args:
        num_classes: ``C``; label ``C`` is background.
        stride: feature stride in pixels (16).
        beta: QFL exponent (2).
        weights: overrides of the published weights (:data:`WEIGHTS`: cls 2, bbox 5, iou 2, centers2d 10,
            centerness 1), by term name.
        assigner: the 2D matcher (default: published HungarianAssigner2D, ``auto`` solver backend).
        sync_cls_avg_factor: average the classification count over ranks as well (the original's option of
            that name; False, its published value, divides ``enc_loss_cls`` by this rank's count).
        compile: run the batched path through ``torch.compile``: True (its defaults) or a mapping of its keyword
            arguments; kept in :attr:`compile_options` (None: eager).
    """

    def __init__(
        self,
        num_classes: int = 10,
        stride: int = 16,
        beta: float = 2.0,
        weights: Mapping[str, float] | None = None,
        assigner: HungarianAssigner2D | None = None,
        sync_cls_avg_factor: bool = False,
        compile: bool | Mapping[str, Any] = False,
    ) -> None:
        super().__init__()
        self.num_classes, self.stride, self.beta = num_classes, stride, beta
        self.compile_options = compile_options(compile)
        self.sync_cls_avg_factor = sync_cls_avg_factor
        self.assigner = assigner or HungarianAssigner2D()
        self.weights = resolve_weights(WEIGHTS, weights or {})

    def total(self, terms: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The weighted sum of the terms (:func:`~drivetrain.losses.weights.weighted_total`)."""
        return weighted_total(terms, self.weights)

    def forward(self, outputs: Mapping[str, Any], targets: Any, impl: str = "batched") -> dict[str, torch.Tensor]:
        """The unweighted loss terms of one batch.

        Args:
            outputs: ``cls_logits`` ``(B, N, Q, C)``, ``boxes`` ``(B, N, Q, 4)`` normalised cxcywh, ``centres``
                ``(B, N, Q, 2)`` normalised, ``centerness`` ``(B, N, Hf, Wf)`` logits (``Q = Hf·Wf``).
            targets: ``gt_boxes_2d`` RaggedBatch ``(B, N, G, 4)`` pixel xyxy, ``gt_labels_2d`` ``(B, N, G)``,
                ``centers_2d`` ``(B, N, G, 2)`` pixels (projected 3D centres), ``image_size`` ``(W, H)``; a
                mapping or an object with these attributes (e.g. a data ``Batch``).
            impl: ``batched`` (every image at once) or ``reference`` (per image, as the original).

        Returns:
            ``{term: () float32}`` for the five terms of :data:`WEIGHTS`.
        """
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
        args = (logits, boxes, centres, centerness, gt_boxes, gt_labels, gt_centres, image_size)
        if impl == "reference":
            return {k: torch.nan_to_num(v) for k, v in self._reference(*args).items()}
        if impl != "batched":
            raise ValueError(f"impl: expected 'batched' or 'reference', got {impl!r}")
        if self.compile_options is None:
            return self._batched(*args)
        gt = (ragged_dynamic(gt_boxes), ragged_dynamic(gt_labels), ragged_dynamic(gt_centres))  # G
        batched = compiled(FocalHeadLoss._batched, self.compile_options)  # unbound: self is an argument
        return batched(self, logits, boxes, centres, centerness, *gt, image_size)

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
            count = gt_boxes.sizes.sum()  # () on the device: every ground truth is matched
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
        batch, cams, num_tokens, num_classes = logits.shape
        boxes_list, labels_list, centres_list = gt_boxes.to_list(), gt_labels.to_list(), gt_centres.to_list()
        matches = self.assigner.reference(
            logits.detach(), boxes.detach(), centres.detach(), boxes_list, labels_list, centres_list, image_size
        )
        with region("targets"):
            wh = torch.tensor(image_size, dtype=torch.float32, device=logits.device)  # (2,)
            labels_all, scores_all, pos_pred, pos_target, pos_centre, pos_centre_target = [], [], [], [], [], []
            heat_centres, heat_radii = [], []
            for b in range(batch):
                for n in range(cams):
                    tokens, gts = matches[b][n][:, 0], matches[b][n][:, 1]  # (M,), (M,): matched token and target
                    gt_xyxy = boxes_list[b][n][gts].float()  # (M, 4) pixels
                    pred_xyxy = unnormalize_boxes(
                        boxes_cxcywh_to_xyxy(boxes[b, n][tokens].float()), image_size
                    )  # (M, 4) pixels
                    label = torch.full(
                        (num_tokens,), num_classes, dtype=torch.long, device=logits.device
                    )  # (Q,) background = C
                    label[tokens] = labels_list[b][n][gts].long()
                    score = torch.zeros(num_tokens, device=logits.device)  # (Q,)
                    score[tokens] = iou_aligned(gt_xyxy, pred_xyxy.detach())
                    labels_all.append(label)
                    scores_all.append(score)
                    pos_pred.append(boxes[b, n][tokens].float())
                    pos_target.append(boxes_xyxy_to_cxcywh(normalize_boxes(gt_xyxy, image_size)))
                    pos_centre.append(centres[b, n][tokens].float())
                    pos_centre_target.append(centres_list[b][n][gts].float() / wh)
                    image_centres = centres_list[b][n].float()  # (G_i, 2) pixels
                    heat_centres.append((image_centres / self.stride).long())
                    heat_radii.append(focal_head_radius(image_centres, boxes_list[b][n].float(), self.stride))
            count = float(sum(len(m) for row in matches for m in row))
            cls_factor = average_factor(count, across_ranks=self.sync_cls_avg_factor)  # ()
            iou_factor = average_factor(count, across_ranks=False)  # ()
            num_pos = average_factor(count)  # ()
        with region("heatmap"):
            heat_shape = centerness.shape[-2:]
            heatmap = reference_draw_gaussians(
                torch.zeros(batch * cams, *heat_shape, device=logits.device), heat_centres, heat_radii
            ).view(centerness.shape)  # (B, N, Hf, Wf)
        with region("losses"):
            flat_logits = logits.reshape(-1, num_classes)  # (B*N*Q, C)
            labels_flat, scores_flat = torch.cat(labels_all), torch.cat(scores_all)  # (B*N*Q,), (B*N*Q,)
            loss_cls = quality_focal_loss(flat_logits, labels_flat, scores_flat, self.beta).sum()
            pred, target = torch.cat(pos_pred), torch.cat(pos_target)  # (ΣM, 4) normalised cxcywh each
            loss_bbox = l1_loss(pred, target).sum()  # ()
            pred_pixels = unnormalize_boxes(boxes_cxcywh_to_xyxy(pred), image_size)  # (ΣM, 4) pixel xyxy
            loss_iou = giou_loss(pred_pixels, unnormalize_boxes(boxes_cxcywh_to_xyxy(target), image_size)).sum()  # ()
            loss_c2d = l1_loss(torch.cat(pos_centre), torch.cat(pos_centre_target)).sum()  # ()
            pred_heat = centerness.float().sigmoid().clamp(1e-4, 1 - 1e-4)  # (B, N, Hf, Wf)
            loss_centerness = gaussian_focal_loss(pred_heat, heatmap).sum()  # ()
        return {
            "enc_loss_cls": loss_cls / cls_factor,
            "enc_loss_bbox": loss_bbox / num_pos,
            "enc_loss_iou": loss_iou / iou_factor,
            "centers2d_loss": loss_c2d / num_pos,
            "centerness_loss": loss_centerness / num_pos,
        }
