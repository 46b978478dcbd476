"""StreamPETR's 3D-head loss: Hungarian-matched focal + L1 over all decoder layers, plus denoising groups.

Two implementations of one specification (see docs/design.md, "The two paths"), two methods; a model picks
one when it is built (:class:`~.loss.Path`):

``reference`` (:meth:`StreamPETRLoss.reference`): as the original head, op for op: the assigner runs once per
    decoder layer and sample, targets are built per sample (its result per query, mmdet's pseudo sampler, labels,
    boxes, weights over all ``Q`` queries), concatenated, and each layer's losses are computed on its own; the
    denoising (DN) targets group-major as the original's ``prepare_for_dn``, the known queries of all layers
    gathered at once, then each layer's DN terms (its kernels are the original's within a few per loop:
    ``tests/test_reference_costs.py``).
``batched`` (calling the loss): one assignment call for all layers × samples (one host transfer), targets by
    ragged ops (``map_pairs``/``gather``) for all layers at once, one reduction per term.

Both return the same dict of **unweighted** terms (the published weights live in :attr:`weights`; the engine
applies them, :func:`~drivetrain.losses.term_weights.weighted_total`). Per layer ``l`` of ``L`` the names are
``loss_cls``, ``loss_bbox``, ``dn_loss_cls``, ``dn_loss_bbox``, prefixed ``d{l}.`` for every layer but the last:

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

A sample with more ground truths than queries (``M_b > Q``) is matched as the original matches it: every query
gets one ground truth, the other ``M_b − Q`` stay unassigned (no query learns them) and are not counted in
``N⁺`` (the original's ``num_total_pos`` counts assigned queries); they still take part in denoising, which
has one query per ground truth. :attr:`StreamPETRLoss.counts` holds their number in the last call
(``unassigned_gt``, a device tensor the trainer logs per step), and the first such batch gives one warning.

A loss built with ``compile=True`` (or a mapping of ``torch.compile`` arguments) runs the batched path through
``torch.compile`` (:mod:`drivetrain.compiled`): assignment, targets and losses in one graph, the solver inside it
as a custom operator, the ground-truth dim and the DN query dim dynamic (a new ground-truth count does not compile
again).
The input checks and the reference path stay eager.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from drivetrain import ragged
from drivetrain.compiled import compile_options, compiled, dense, dynamic, ragged_dynamic, region
from drivetrain.losses.functional import class_mask, l1_loss, sigmoid_focal_loss
from drivetrain.losses.inputs import Targets, field
from drivetrain.losses.normalize import average_factor
from drivetrain.losses.sampling import assigned_from_pairs, pseudo_sample
from drivetrain.match import HungarianAssigner3D
from drivetrain.match.solve import num_assigned, num_unassigned
from drivetrain.models.streampetr.box_code import encode_boxes
from drivetrain.ragged import RaggedBatch

__all__ = ["StreamPETRLoss"]

DN_BALL_FRACTION = 3.14159 / 6  # the original's π/6 (volume of the unit ball over the cube it sits in)


def _layer_name(layer: int, num_layers: int, term: str) -> str:
    return term if layer == num_layers - 1 else f"d{layer}.{term}"


class StreamPETRLoss(torch.nn.Module):
    """Loss of StreamPETR's 3D head over ``L`` decoder layers, with optional denoising queries.

    Args:
        num_classes: ``C``; label ``C`` is background.
        cls_weight, bbox_weight: term weights (required, keyword); ``dn_weight`` scales the DN terms (1).
        code_weights: per-dim weights of the 10-dim box code (required, keyword).
        dn_split: noise radius beyond which a DN query is background (required, keyword).
        assigner: the matcher (required, keyword).
        alpha, gamma: focal loss parameters (0.25, 2: the defaults of the original's ``FocalLoss``).
        sync_cls_avg_factor: average the classification counts over ranks as well (the original's option of
            that name; False, its published value, divides them by this rank's count).
        compile: run the batched path through ``torch.compile``: True (its defaults) or a mapping of its keyword
            arguments (e.g. ``{"mode": "reduce-overhead"}``); kept in :attr:`compile_options` (None: eager).

    Attributes:
        counts: device counters of the last call, ``{"unassigned_gt": int64 ()}``: ground truths of the batch
            left unassigned because their sample holds more of them than there are queries (empty before the
            first call).
    """

    def __init__(
        self,
        num_classes: int,
        *,
        cls_weight: float,
        bbox_weight: float,
        code_weights: tuple[float, ...],
        dn_split: float,
        assigner: HungarianAssigner3D,
        dn_weight: float = 1.0,
        alpha: float = 0.25,
        gamma: float = 2.0,
        sync_cls_avg_factor: bool = False,
        compile: bool | Mapping[str, Any] = False,
    ) -> None:
        super().__init__()
        self.num_classes, self.sync_cls_avg_factor = num_classes, sync_cls_avg_factor
        self.compile_options = compile_options(compile)
        self.alpha, self.gamma, self.dn_split = alpha, gamma, dn_split
        self.assigner = assigner
        self.register_buffer("code_weights", torch.tensor(code_weights, dtype=torch.float32), persistent=False)
        self.counts: dict[str, torch.Tensor] = {}
        self._warned_unassigned = False
        self.weights = {
            "loss_cls": cls_weight,
            "loss_bbox": bbox_weight,
            "dn_loss_cls": cls_weight * dn_weight,
            "dn_loss_bbox": bbox_weight * dn_weight,
        }

    def forward(self, outputs: Mapping[str, Any], targets: Targets) -> dict[str, torch.Tensor]:
        """The unweighted loss terms of one batch, per decoder layer, by the batched path: all layers and samples
        at once (compiled when the loss was built with ``compile``).

        Args:
            outputs: ``cls_logits`` ``(L, B, Q, C)``, ``box_codes`` ``(L, B, Q, 10)``; for denoising also
                ``dn_cls_logits`` ``(L, B, P, C)``, ``dn_box_codes`` ``(L, B, P, 10)``, ``dn_background`` bool
                ``(B, P)`` and ``dn_groups`` (int): DN query ``g · S + i`` (``S = P / groups``) of sample ``b``
                denoises ground truth ``i`` of ``b`` and exists while ``i < M_b``.
            targets: ``gt_boxes`` RaggedBatch ``(B, G, 9)`` (gravity centre, lidar frame), ``gt_labels``
                RaggedBatch ``(B, G)``; a mapping or an object with these attributes (e.g. a data ``Batch``).

        Returns:
            ``{term: () float32}``: ``loss_cls``, ``loss_bbox`` (and ``dn_loss_cls``, ``dn_loss_bbox``) of the
            last layer, ``d{l}.``-prefixed copies for the earlier layers.
        """
        cls_logits, box_codes, gt_boxes, gt_labels, dn = self._inputs(outputs, targets)
        if self.compile_options is None:
            return self._batched(cls_logits, box_codes, gt_boxes, gt_labels, dn)
        gt_boxes, gt_labels = ragged_dynamic(gt_boxes), ragged_dynamic(gt_labels)  # G
        if dn is not None:  # P = groups · G
            dn = (dynamic(dn[0], 2), dynamic(dn[1], 2), dynamic(dn[2], 1), dn[3])
        # The model slices the main queries out of one (L, B, P+Q, ·) tensor: their strides would hold P.
        cls_logits, box_codes = dense(cls_logits), dense(box_codes)
        batched = compiled(StreamPETRLoss._batched, self.compile_options)  # unbound: self is an argument
        return batched(self, cls_logits, box_codes, gt_boxes, gt_labels, dn)

    def reference(self, outputs: Mapping[str, Any], targets: Targets) -> dict[str, torch.Tensor]:
        """The same terms by the reference path: per layer and sample, as the original (arguments and result as
        :meth:`forward`'s)."""
        cls_logits, box_codes, gt_boxes, gt_labels, dn = self._inputs(outputs, targets)
        terms = self._reference_main(cls_logits, box_codes, gt_boxes, gt_labels)
        if dn is not None:
            terms.update(self._reference_dn(*dn, gt_boxes, gt_labels))
        return {k: torch.nan_to_num(v) for k, v in terms.items()}

    def _inputs(self, outputs: Mapping[str, Any], targets: Targets) -> tuple[Any, ...]:
        """Both paths' arguments, checked: ``cls_logits``, ``box_codes``, ``gt_boxes``, ``gt_labels`` and the DN
        outputs ``(dn_cls_logits, dn_box_codes, dn_background, dn_groups)`` or None; sets :attr:`counts`."""
        gt_boxes, gt_labels = field(targets, "gt_boxes"), field(targets, "gt_labels")
        cls_logits, box_codes = field(outputs, "cls_logits"), field(outputs, "box_codes")
        if cls_logits.dim() != 4 or box_codes.shape[:3] != cls_logits.shape[:3]:
            raise ValueError(
                f"cls_logits/box_codes: expected (L, B, Q, C) and (L, B, Q, 10), got {tuple(cls_logits.shape)} "
                f"and {tuple(box_codes.shape)}"
            )
        if cls_logits.shape[-1] != self.num_classes:
            raise ValueError(f"cls_logits: {cls_logits.shape[-1]} classes, the loss was built for {self.num_classes}")
        self._count_unassigned(gt_boxes, cls_logits.shape[2])
        dn = None
        if isinstance(outputs, Mapping) and "dn_cls_logits" in outputs:
            dn = (outputs["dn_cls_logits"], outputs["dn_box_codes"], outputs["dn_background"], outputs["dn_groups"])
            self._check_dn(*dn, cls_logits.shape[0], gt_boxes)
        return cls_logits, box_codes, gt_boxes, gt_labels, dn

    def _count_unassigned(self, gt_boxes: RaggedBatch, num_queries: int) -> None:
        """Set :attr:`counts` (no sync) and warn once when a sample may hold more ground truths than queries."""
        if not isinstance(gt_boxes, RaggedBatch):
            raise TypeError(f"gt_boxes: expected a RaggedBatch (B, G, 9), got {type(gt_boxes).__name__}")
        padded = gt_boxes.max_size  # the shape, known on the host: no sample holds more
        self.counts = {"unassigned_gt": num_unassigned(gt_boxes.sizes, num_queries, padded)}
        # not while dynamo traces a whole step (the padded length is then a bucket, a bound; the count stays exact)
        if padded > num_queries and not self._warned_unassigned and not torch.compiler.is_compiling():
            self._warned_unassigned = True
            warnings.warn(
                f"gt_boxes: a batch holds up to {padded} ground truths per sample, more than the {num_queries} "
                "queries; as in the original, each query is matched to one and the rest stay unassigned (counted "
                "per step as count/unassigned_gt in metrics.jsonl; warned once)",
                RuntimeWarning,
                stacklevel=4,
            )

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
            # () on the device: the pairs of each layer (every layer matches min(M_b, Q) per sample)
            num_pos = num_assigned(gt_boxes.sizes, num_queries, gt_boxes.max_size).sum()
            cls_factor = average_factor(num_pos, across_ranks=self.sync_cls_avg_factor)  # ()
            box_factor = average_factor(num_pos)  # ()
            matched_pred = ragged.gather(box_codes, pred_index)  # (L, B, G, 10)
            gt_layers = gt_boxes.expand_batch(num_layers, batch)  # (L, B, G, 9)
            matched_gt = encode_boxes(ragged.gather(gt_layers, gt_index, fill=1.0).tensor)  # (L, B, G, 10)
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
            target = encode_boxes(boxes)  # (B, P, 10)
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
        """As the original's ``StreamPETRHead.loss_single`` per decoder layer (StreamPETR
        ``models/dense_heads/streampetr_head.py``), op for op per layer and sample: the assigner, its result per
        query, mmdet's pseudo sampler and the targets of every query (``_get_target_single``), concatenated; then
        the layer's two terms."""
        num_layers, _, num_queries, num_classes = cls_logits.shape
        boxes_list = [t.float() for t in gt_boxes.to_list()]
        labels_list = [t.long() for t in gt_labels.to_list()]
        matches = self.assigner.reference(cls_logits.detach(), box_codes.detach(), boxes_list, labels_list)
        terms = {}
        for layer in range(num_layers):
            with region("targets"):
                targets = [
                    self._reference_targets(matches[layer][b], box_codes[layer, b], boxes, labels)
                    for b, (boxes, labels) in enumerate(zip(boxes_list, labels_list, strict=True))
                ]  # 4 × (Q, ·) per sample
                label_all, label_weights, target_all, weight_all = (
                    torch.cat([t[i] for t in targets]) for i in range(4)
                )  # (B·Q,), (B·Q,), (B·Q, 9), (B·Q, 10)
                num_pos = float(sum(min(boxes.shape[0], num_queries) for boxes in boxes_list))  # matched queries
                on = cls_logits.device  # made there, as the original's cls_scores.new_tensor (NCCL: no CPU tensor)
                cls_factor = average_factor(num_pos, across_ranks=self.sync_cls_avg_factor, device=on)  # ()
                box_factor = average_factor(num_pos, device=on)  # ()
                one_hot = class_mask(label_all, num_classes).float()  # (B·Q, C)
                normalized = encode_boxes(target_all)  # (B·Q, 10): unmatched rows hold -inf
                finite = torch.isfinite(normalized).all(-1)  # (B·Q,)
                weights = weight_all * self.code_weights  # (B·Q, 10)
            with region("losses"):
                logits = cls_logits[layer].reshape(-1, num_classes)  # (B·Q, C)
                focal = sigmoid_focal_loss(logits, one_hot, self.alpha, self.gamma)  # (B·Q, C)
                loss_cls = (focal * label_weights[:, None]).sum() / cls_factor  # ()
                preds = box_codes[layer].reshape(-1, 10)  # (B·Q, 10)
                loss_bbox = l1_loss(preds[finite], normalized[finite], weights[finite]).sum() / box_factor  # ()
            terms[_layer_name(layer, num_layers, "loss_cls")] = loss_cls
            terms[_layer_name(layer, num_layers, "loss_bbox")] = loss_bbox
        return terms

    def _reference_targets(
        self, pairs: torch.Tensor, pred_codes: torch.Tensor, gt_boxes: torch.Tensor, gt_labels: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """One sample's targets as the original's ``_get_target_single``, after its assigner's matching.

        Args:
            pairs: int64 ``(K, 2)`` (query, ground truth) pairs.
            pred_codes: ``(Q, 10)`` the sample's predicted codes (one layer).
            gt_boxes: ``(M, 9)`` gravity-centre boxes.
            gt_labels: int64 ``(M,)``.

        Returns:
            ``labels`` int64 ``(Q,)`` (background ``C``), ``label_weights`` ``(Q,)``, ``box_targets`` ``(Q, 9)``
            (zeros off the positives), ``box_weights`` ``(Q, 10)`` (1 at the positives).
        """
        num_queries, num_gts = pred_codes.shape[0], gt_boxes.shape[0]
        assigned, assigned_labels = assigned_from_pairs(pairs, num_queries, num_gts, gt_labels)  # (Q,), (Q,)
        sampled = pseudo_sample(assigned, assigned_labels, pred_codes, gt_boxes)
        pos = sampled.pos_inds  # (P,)
        labels = gt_boxes.new_full((num_queries,), self.num_classes, dtype=torch.long)  # (Q,) background = C
        label_weights = gt_boxes.new_ones(num_queries)  # (Q,)
        box_targets = torch.zeros_like(pred_codes, dtype=torch.float32)[..., : gt_boxes.shape[1]]  # (Q, 9)
        box_weights = torch.zeros_like(pred_codes, dtype=torch.float32)  # (Q, 10)
        if num_gts > 0:
            box_targets[pos] = sampled.pos_gt_bboxes
            box_weights[pos] = 1.0
            labels[pos] = gt_labels[sampled.pos_assigned_gt_inds]
        return labels, label_weights, box_targets, box_weights

    def _reference_dn(
        self,
        dn_logits: torch.Tensor,
        dn_codes: torch.Tensor,
        dn_background: torch.Tensor,
        groups: int,
        gt_boxes: RaggedBatch,
        gt_labels: RaggedBatch,
    ) -> dict[str, torch.Tensor]:
        """As the original: its denoising targets group-major (``prepare_for_dn``: the ground truths of the batch
        repeated per group, each at query ``g · S + i`` of its sample), the known queries of every layer in one
        gather (``prepare_for_loss``), then ``dn_loss_single`` per decoder layer."""
        num_layers, _, num_dn, num_classes = dn_logits.shape
        per_group = num_dn // groups  # S: the original's single_pad
        with region("targets"):
            boxes_list, labels_list = gt_boxes.to_list(), gt_labels.to_list()
            known_num = [boxes.shape[0] for boxes in boxes_list]
            # host index arrays, as the original's batch_idx and map_known_indice
            batch_idx = np.repeat(np.arange(len(known_num)), known_num)  # (T,) sample of each ground truth
            map_known = np.concatenate([np.arange(n) for n in known_num])  # (T,) its index in the sample
            bid = torch.from_numpy(np.tile(batch_idx, groups))  # (K,) K = groups·T
            slots = torch.from_numpy(np.concatenate([map_known + per_group * g for g in range(groups)]))  # (K,)
            known_labels = torch.cat([t.long() for t in labels_list]).repeat(groups, 1).view(-1)  # (K,)
            known_boxes = torch.cat([t.float() for t in boxes_list]).repeat(groups, 1)  # (K, 9)
            known_labels = torch.where(dn_background[bid, slots], num_classes, known_labels)  # (K,) noised away
            logits = dn_logits.permute(1, 2, 0, 3)[bid, slots].permute(1, 0, 2)  # (L, K, C)
            codes = dn_codes.permute(1, 2, 0, 3)[bid, slots].permute(1, 0, 2)  # (L, K, 10)
            num_known = known_labels.shape[0]
            one_hot = class_mask(known_labels, num_classes).float()  # (K, C)
            on = dn_logits.device  # made there, as the original's new_tensor (NCCL: no CPU tensor)
            cls_factor = average_factor(
                num_known * DN_BALL_FRACTION * self.dn_split**3, across_ranks=self.sync_cls_avg_factor, device=on
            )  # ()
            box_factor = average_factor(float(num_known), device=on)  # ()
        terms = {}
        for layer in range(num_layers):
            with region("losses"):
                label_weights = torch.ones_like(known_labels)  # (K,)
                box_weights = torch.ones_like(codes[layer]) * self.code_weights  # (K, 10)
                focal = sigmoid_focal_loss(logits[layer], one_hot, self.alpha, self.gamma)  # (K, C)
                loss_cls = (focal * label_weights[:, None]).sum() / cls_factor  # ()
                normalized = encode_boxes(known_boxes)  # (K, 10)
                finite = torch.isfinite(normalized).all(-1)  # (K,)
                loss_bbox = l1_loss(codes[layer][finite], normalized[finite], box_weights[finite]).sum() / box_factor
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
