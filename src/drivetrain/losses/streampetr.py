"""StreamPETR's main-head loss: Hungarian-matched focal + L1 over all decoder layers, plus denoising groups.

Two implementations of one specification (see DESIGN.md, "The two paths"):

``reference``: as the original head: the assigner runs once per decoder layer and sample, targets are
    built per sample (labels, boxes, weights over all ``Q`` queries), concatenated, and each layer's
    losses are computed on its own; the denoising (DN) targets are assembled per sample and group.
``batched``: one assignment call for all layers × samples (one host transfer), targets by ragged ops
    (``map_pairs``/``gather``) for all layers at once, one reduction per term.

Both return the same dict of **unweighted** terms (the published weights live in :attr:`weights` and
are applied by :meth:`total`). Per layer ``l`` of ``L`` the names are ``loss_cls``, ``loss_bbox``,
``dn_loss_cls``, ``dn_loss_bbox``, prefixed ``d{l}.`` for every layer but the last:

- ``loss_cls = Σ FL(logits, one_hot(label)) / max(N⁺, 1)`` over every query and class.
- ``loss_bbox = Σ_{matched, finite} Σ_k w_k |pred_k − enc(gt)_k| / max(N̄⁺, 1)``.
- ``dn_loss_cls = Σ FL / max(G·T · 3.14159/6 · split³, 1)`` over the ``G·T`` DN queries (``T`` ground
  truths, ``G`` groups; background where the noise left the ``split`` ball).
- ``dn_loss_bbox = Σ_{finite} Σ_k w_k |pred_k − enc(clean gt)_k| / max(G̅·̅T̅, 1)`` over all DN queries.

Normalisation across ranks follows the original's ``sync_cls_avg_factor`` (False in the published config):
the classification terms divide by this rank's count (``N⁺``, ``G·T``), the box terms by the count averaged
over the ranks of the process group (``N̄⁺``, ``G̅·̅T̅``; :func:`average_factor`, on the device). With
``sync_cls_avg_factor=True`` the classification counts are averaged over ranks too. Each term goes through
``nan_to_num`` as in the original. A batch without any ground truth gives exact zeros for the box and DN
terms; the original logs other values under the DN names then (its main losses). Kept on purpose: with no
target there is no denoising signal, and zeros leave the gradient unchanged.

``compile=True`` (or a mapping of ``torch.compile`` arguments) runs the batched path through ``torch.compile``
(:mod:`drivetrain.compiled`): assignment, targets and losses in one graph, the solver inside it as a custom
operator, the ground-truth dim and the DN query dim dynamic (a new ground-truth count does not compile again).
The input checks and the reference path stay eager.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from drivetrain import ragged
from drivetrain.compiled import compile_options, compiled, dense, dynamic, ragged_dynamic, region
from drivetrain.geometry import CODE_WEIGHTS, encode_boxes_streampetr
from drivetrain.losses.functional import class_mask, l1_loss, sigmoid_focal_loss
from drivetrain.losses.inputs import field
from drivetrain.losses.normalize import average_factor
from drivetrain.losses.weights import weighted_total
from drivetrain.match import HungarianAssigner3D
from drivetrain.ragged import RaggedBatch

__all__ = ["StreamPETRLoss"]

DN_BALL_FRACTION = 3.14159 / 6  # the original's π/6 (volume of the unit ball over the cube it sits in)


def _layer_name(layer: int, num_layers: int, term: str) -> str:
    return term if layer == num_layers - 1 else f"d{layer}.{term}"


class StreamPETRLoss(torch.nn.Module):
    """Loss of StreamPETR's 3D head over ``L`` decoder layers, with optional denoising queries.

    Args:
        num_classes: ``C`` (10); label ``C`` is background.
        cls_weight, bbox_weight: published term weights (2.0, 0.25); ``dn_weight`` scales the DN terms.
        alpha, gamma: focal loss parameters (0.25, 2).
        code_weights: per-dim weights of the 10-dim box code (2, 2, 1, …).
        dn_split: noise radius beyond which a DN query is background (0.75).
        assigner: the matcher (default: published HungarianAssigner3D on the ``auto`` solver backend).
        sync_cls_avg_factor: average the classification counts over ranks as well (the original's option of
            that name; False, its published value, divides them by this rank's count).
        compile: run the batched path through ``torch.compile``: True (its defaults) or a mapping of its keyword
            arguments (e.g. ``{"mode": "reduce-overhead"}``); kept in :attr:`compile_options` (None: eager).
    """

    def __init__(
        self,
        num_classes: int = 10,
        cls_weight: float = 2.0,
        bbox_weight: float = 0.25,
        dn_weight: float = 1.0,
        alpha: float = 0.25,
        gamma: float = 2.0,
        code_weights: tuple[float, ...] = CODE_WEIGHTS,
        dn_split: float = 0.75,
        assigner: HungarianAssigner3D | None = None,
        sync_cls_avg_factor: bool = False,
        compile: bool | Mapping[str, Any] = False,
    ) -> None:
        super().__init__()
        self.num_classes, self.sync_cls_avg_factor = num_classes, sync_cls_avg_factor
        self.compile_options = compile_options(compile)
        self.alpha, self.gamma, self.dn_split = alpha, gamma, dn_split
        self.assigner = assigner or HungarianAssigner3D()
        self.register_buffer("code_weights", torch.tensor(code_weights, dtype=torch.float32), persistent=False)
        self.weights = {
            "loss_cls": cls_weight,
            "loss_bbox": bbox_weight,
            "dn_loss_cls": cls_weight * dn_weight,
            "dn_loss_bbox": bbox_weight * dn_weight,
        }

    def total(self, terms: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The training objective: the weighted sum of the terms (:func:`~drivetrain.losses.weights.weighted_total`)."""
        return weighted_total(terms, self.weights)

    def forward(self, outputs: Mapping[str, Any], targets: Any, impl: str = "batched") -> dict[str, torch.Tensor]:
        """The unweighted loss terms of one batch, per decoder layer.

        Args:
            outputs: ``cls_logits`` ``(L, B, Q, C)``, ``box_codes`` ``(L, B, Q, 10)``; for denoising also
                ``dn_cls_logits`` ``(L, B, P, C)``, ``dn_box_codes`` ``(L, B, P, 10)``, ``dn_background`` bool
                ``(B, P)`` and ``dn_groups`` (int): DN query ``g · S + i`` (``S = P / groups``) of sample ``b``
                denoises ground truth ``i`` of ``b`` and exists while ``i < M_b``.
            targets: ``gt_boxes`` RaggedBatch ``(B, G, 9)`` (gravity centre, lidar frame), ``gt_labels``
                RaggedBatch ``(B, G)``; a mapping or an object with these attributes (e.g. a data ``Batch``).
            impl: ``batched`` (all layers and samples at once) or ``reference`` (per layer and sample).

        Returns:
            ``{term: () float32}``: ``loss_cls``, ``loss_bbox`` (and ``dn_loss_cls``, ``dn_loss_bbox``) of the
            last layer, ``d{l}.``-prefixed copies for the earlier layers.
        """
        gt_boxes, gt_labels = field(targets, "gt_boxes"), field(targets, "gt_labels")
        cls_logits, box_codes = field(outputs, "cls_logits"), field(outputs, "box_codes")
        if cls_logits.dim() != 4 or box_codes.shape[:3] != cls_logits.shape[:3]:
            raise ValueError(
                f"cls_logits/box_codes: expected (L, B, Q, C) and (L, B, Q, 10), got {tuple(cls_logits.shape)} "
                f"and {tuple(box_codes.shape)}"
            )
        if cls_logits.shape[-1] != self.num_classes:
            raise ValueError(f"cls_logits: {cls_logits.shape[-1]} classes, the loss was built for {self.num_classes}")
        if impl not in ("batched", "reference"):
            raise ValueError(f"impl: expected 'batched' or 'reference', got {impl!r}")
        dn = None
        if isinstance(outputs, Mapping) and "dn_cls_logits" in outputs:
            dn = (outputs["dn_cls_logits"], outputs["dn_box_codes"], outputs["dn_background"], outputs["dn_groups"])
            self._check_dn(*dn, cls_logits.shape[0], gt_boxes)
        if impl == "reference":
            terms = self._reference_main(cls_logits, box_codes, gt_boxes, gt_labels)
            if dn is not None:
                terms.update(self._reference_dn(*dn, gt_boxes, gt_labels))
            return {k: torch.nan_to_num(v) for k, v in terms.items()}
        if self.compile_options is None:
            return self._batched(cls_logits, box_codes, gt_boxes, gt_labels, dn)
        gt_boxes, gt_labels = ragged_dynamic(gt_boxes), ragged_dynamic(gt_labels)  # G
        if dn is not None:  # P = groups · G
            dn = (dynamic(dn[0], 2), dynamic(dn[1], 2), dynamic(dn[2], 1), dn[3])
        # The model slices the main queries out of one (L, B, P+Q, ·) tensor: their strides would hold P.
        cls_logits, box_codes = dense(cls_logits), dense(box_codes)
        batched = compiled(StreamPETRLoss._batched, self.compile_options)  # unbound: self is an argument
        return batched(self, cls_logits, box_codes, gt_boxes, gt_labels, dn)

    # ------------------------------------------------------------------ batched
    def _batched(
        self,
        cls_logits: torch.Tensor,
        box_codes: torch.Tensor,
        gt_boxes: RaggedBatch,
        gt_labels: RaggedBatch,
        dn: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None,
    ) -> dict[str, torch.Tensor]:
        """The batched path after the input checks: the main terms, then the DN terms (``dn`` as in forward)."""
        terms = self._batched_main(cls_logits, box_codes, gt_boxes, gt_labels)
        if dn is not None:
            terms.update(self._batched_dn(*dn, gt_boxes, gt_labels))
        return {k: torch.nan_to_num(v) for k, v in terms.items()}

    def _batched_main(
        self, cls_logits: torch.Tensor, box_codes: torch.Tensor, gt_boxes: RaggedBatch, gt_labels: RaggedBatch
    ) -> dict[str, torch.Tensor]:
        num_layers, batch, num_queries, num_classes = cls_logits.shape
        pairs = self.assigner.batched(cls_logits.detach(), box_codes.detach(), gt_boxes, gt_labels)  # (L, B, G, 2)
        with region("targets"):
            pred_index = pairs.apply(lambda t: t[..., 0])  # (L, B, G)
            gt_index = pairs.apply(lambda t: t[..., 1])  # (L, B, G)
            background = torch.full((num_layers, batch, num_queries), num_classes, device=cls_logits.device)
            gt_labels_layers = gt_labels.expand_batch(num_layers, batch).apply(lambda t: t.long())  # (L, B, G)
            labels = ragged.map_pairs(gt_labels_layers, gt_index, pred_index, background)  # (L, B, Q)
            one_hot = class_mask(labels, num_classes).float()  # (L, B, Q, C)
            num_pos = gt_boxes.sizes.sum()  # () on the device: every target is matched in every layer
            cls_factor = average_factor(num_pos, across_ranks=self.sync_cls_avg_factor)  # ()
            box_factor = average_factor(num_pos)  # ()
            matched_pred = ragged.gather(box_codes, pred_index)  # (L, B, G, 10)
            gt_layers = gt_boxes.expand_batch(num_layers, batch)  # (L, B, G, 9)
            matched_gt = encode_boxes_streampetr(ragged.gather(gt_layers, gt_index, fill=1.0).tensor)  # (L, B, G, 10)
            keep = torch.isfinite(matched_gt).all(-1) & pred_index.mask  # (L, B, G)
        with region("losses"):
            focal = sigmoid_focal_loss(cls_logits, one_hot, self.alpha, self.gamma)  # (L, B, Q, C)
            loss_cls = focal.sum((1, 2, 3)) / cls_factor  # (L,)
            per_entry = l1_loss(matched_pred.tensor, matched_gt, self.code_weights)  # (L, B, G, 10)
            loss_bbox = torch.where(keep.unsqueeze(-1), per_entry, 0.0).sum((1, 2, 3)) / box_factor  # (L,)
        return self._per_layer({"loss_cls": loss_cls, "loss_bbox": loss_bbox})

    def _batched_dn(
        self,
        dn_logits: torch.Tensor,
        dn_codes: torch.Tensor,
        dn_background: torch.Tensor,
        groups: int,
        gt_boxes: RaggedBatch,
        gt_labels: RaggedBatch,
    ) -> dict[str, torch.Tensor]:
        _, batch, num_dn, num_classes = dn_logits.shape
        with region("targets"):
            per_group = num_dn // groups
            slot = torch.arange(num_dn, device=dn_logits.device) % per_group  # (P,): GT index of each DN query
            exists = slot.unsqueeze(0) < gt_boxes.sizes.unsqueeze(1)  # (B, P)
            slot_index = slot.expand(batch, num_dn)  # (B, P)
            labels = gt_labels.tensor.long().gather(1, slot_index)  # (B, P)
            labels = labels.masked_fill(dn_background, num_classes)  # (B, P)
            one_hot = class_mask(labels, num_classes).float()  # (B, P, C)
            boxes = gt_boxes.with_padding(1.0).tensor.gather(1, slot_index.unsqueeze(-1).expand(batch, num_dn, 9))
            target = encode_boxes_streampetr(boxes)  # (B, P, 10)
            keep = exists & torch.isfinite(target).all(-1)  # (B, P)
            num_targets = gt_boxes.sizes.sum() * groups  # G·T on the device
            cls_factor = average_factor(
                num_targets * DN_BALL_FRACTION * self.dn_split**3, across_ranks=self.sync_cls_avg_factor
            )  # ()
            box_factor = average_factor(num_targets)  # ()
        with region("losses"):
            focal = sigmoid_focal_loss(dn_logits, one_hot.unsqueeze(0), self.alpha, self.gamma)  # (L, B, P, C)
            loss_cls = torch.where(exists[..., None], focal, 0.0).sum((1, 2, 3)) / cls_factor  # (L,)
            per_entry = l1_loss(dn_codes, target.unsqueeze(0), self.code_weights)  # (L, B, P, 10)
            loss_bbox = torch.where(keep[..., None], per_entry, 0.0).sum((1, 2, 3)) / box_factor  # (L,)
        return self._per_layer({"dn_loss_cls": loss_cls, "dn_loss_bbox": loss_bbox})

    @staticmethod
    def _per_layer(stacked: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        num_layers = next(iter(stacked.values())).shape[0]
        return {_layer_name(layer, num_layers, k): v[layer] for layer in range(num_layers) for k, v in stacked.items()}

    # ------------------------------------------------------------------ reference
    def _reference_main(
        self, cls_logits: torch.Tensor, box_codes: torch.Tensor, gt_boxes: RaggedBatch, gt_labels: RaggedBatch
    ) -> dict[str, torch.Tensor]:
        num_layers, _, num_queries, num_classes = cls_logits.shape
        boxes_list, labels_list = gt_boxes.to_list(), [t.long() for t in gt_labels.to_list()]
        matches = self.assigner.reference(cls_logits.detach(), box_codes.detach(), boxes_list, labels_list)
        terms = {}
        for layer in range(num_layers):
            with region("targets"):
                labels, box_targets, box_weights = [], [], []
                for b, (boxes, sample_labels) in enumerate(zip(boxes_list, labels_list, strict=True)):
                    pred_i, gt_i = (
                        matches[layer][b][:, 0],
                        matches[layer][b][:, 1],
                    )  # (M_b,), (M_b,): matched query and target
                    label = torch.full(
                        (num_queries,), num_classes, dtype=torch.long, device=cls_logits.device
                    )  # (Q,) background = C
                    label[pred_i] = sample_labels[gt_i]
                    box_target = box_codes.new_zeros(num_queries, 9, dtype=torch.float32)  # (Q, 9)
                    box_target[pred_i] = boxes[gt_i].float()
                    weight = box_codes.new_zeros(num_queries, 10, dtype=torch.float32)  # (Q, 10)
                    weight[pred_i] = 1.0
                    labels.append(label)
                    box_targets.append(box_target)
                    box_weights.append(weight)
                label_all, target_all, weight_all = (
                    torch.cat(labels),
                    torch.cat(box_targets),
                    torch.cat(box_weights),
                )  # (B*Q,), (B*Q, 9), (B*Q, 10)
                num_pos = float(sum(len(m) for m in matches[layer]))
                cls_factor = average_factor(num_pos, across_ranks=self.sync_cls_avg_factor)  # ()
                box_factor = average_factor(num_pos)  # ()
                one_hot = class_mask(label_all, num_classes).float()  # (B*Q, C)
                normalized = encode_boxes_streampetr(target_all)  # (B*Q, 10): unmatched rows hold -inf
                finite = torch.isfinite(normalized).all(-1)  # (B*Q,)
            with region("losses"):
                logits = cls_logits[layer].reshape(-1, num_classes)  # (B*Q, C)
                loss_cls = sigmoid_focal_loss(logits, one_hot, self.alpha, self.gamma).sum() / cls_factor  # ()
                preds = box_codes[layer].reshape(-1, 10)  # (B*Q, 10)
                weights = weight_all * self.code_weights  # (B*Q, 10)
                loss_bbox = l1_loss(preds[finite], normalized[finite], weights[finite]).sum() / box_factor  # ()
            terms[_layer_name(layer, num_layers, "loss_cls")] = loss_cls
            terms[_layer_name(layer, num_layers, "loss_bbox")] = loss_bbox
        return terms

    def _reference_dn(
        self,
        dn_logits: torch.Tensor,
        dn_codes: torch.Tensor,
        dn_background: torch.Tensor,
        groups: int,
        gt_boxes: RaggedBatch,
        gt_labels: RaggedBatch,
    ) -> dict[str, torch.Tensor]:
        num_layers, _, num_dn, num_classes = dn_logits.shape
        per_group = num_dn // groups
        with region("targets"):
            device = dn_logits.device
            known_index, known_labels, known_boxes = [], [], []
            for b, (boxes, labels) in enumerate(zip(gt_boxes.to_list(), gt_labels.to_list(), strict=True)):
                num_gt = boxes.shape[0]
                for g in range(groups):
                    slots = g * per_group + torch.arange(num_gt, device=device)  # (M_b,) DN queries of group g
                    known_index.append(b * num_dn + slots)
                    known_labels.append(torch.where(dn_background[b, slots], num_classes, labels.long()))  # (M_b,)
                    known_boxes.append(boxes.float())
            index = torch.cat(known_index)  # (K,) rows of the flat (B*P) queries, K = groups·ΣM_b
            label_t = torch.cat(known_labels)  # (K,)
            box_t = torch.cat(known_boxes)  # (K, 9)
            num_known = index.shape[0]
            one_hot = class_mask(label_t, num_classes).float()  # (K, C)
            normalized = encode_boxes_streampetr(box_t)  # (K, 10)
            finite = torch.isfinite(normalized).all(-1)  # (K,)
            cls_factor = average_factor(
                num_known * DN_BALL_FRACTION * self.dn_split**3, across_ranks=self.sync_cls_avg_factor
            )  # ()
            box_factor = average_factor(float(num_known))  # ()
        terms = {}
        for layer in range(num_layers):
            with region("targets"):
                logits = dn_logits[layer].reshape(-1, num_classes)[index]  # (K, C)
                codes = dn_codes[layer].reshape(-1, 10)[index]  # (K, 10)
            with region("losses"):
                loss_cls = sigmoid_focal_loss(logits, one_hot, self.alpha, self.gamma).sum() / cls_factor  # ()
                weights = self.code_weights.expand(num_known, 10)  # (K, 10)
                loss_bbox = l1_loss(codes[finite], normalized[finite], weights[finite]).sum() / box_factor  # ()
            terms[_layer_name(layer, num_layers, "dn_loss_cls")] = loss_cls
            terms[_layer_name(layer, num_layers, "dn_loss_bbox")] = loss_bbox
        return terms

    def _check_dn(
        self,
        dn_logits: torch.Tensor,
        dn_codes: torch.Tensor,
        dn_background: torch.Tensor,
        groups: int,
        num_layers: int,
        gt_boxes: RaggedBatch,
    ) -> None:
        if dn_logits.dim() != 4 or dn_logits.shape[0] != num_layers or dn_codes.shape[:3] != dn_logits.shape[:3]:
            raise ValueError(
                f"dn_cls_logits/dn_box_codes: expected (L={num_layers}, B, P, C) and (L, B, P, 10), got "
                f"{tuple(dn_logits.shape)} and {tuple(dn_codes.shape)}"
            )
        num_dn = dn_logits.shape[2]
        if groups < 1 or num_dn % groups:
            raise ValueError(f"dn_groups: {groups} must be ≥ 1 and divide the {num_dn} DN queries")
        if num_dn // groups > gt_boxes.max_size:
            raise ValueError(
                f"dn_groups: {num_dn // groups} DN queries per group exceed the padded ground-truth length "
                f"{gt_boxes.max_size} (one DN query per ground truth and group)"
            )
        if tuple(dn_background.shape) != tuple(dn_logits.shape[1:3]) or dn_background.dtype != torch.bool:
            raise ValueError(f"dn_background: expected bool (B, P) = {tuple(dn_logits.shape[1:3])}")
