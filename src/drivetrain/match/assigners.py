"""Hungarian assigners over given costs: 3D boxes of every decoder layer, and 2D boxes of every image; reference
and batched.

``reference_*`` does what the original code (the DETR-style ``HungarianAssigner3D`` / ``HungarianAssigner2D`` of
StreamPETR, ``projects/mmdet3d_plugin/core/bbox/assigners/``) does: one cost matrix per sample and decoder layer
(or per image), each moved to the host and solved on its own. ``batched_*`` builds the costs of all layers ×
samples (or samples × cameras) in one go over padded targets and solves them with one host transfer (or none,
with the ``gpu`` backend). Both return the same pairs; both run without gradients.

A sample (or image) with more ground truths than predictions (``M > Q``) gets ``Q`` pairs: every query is
matched and the other ``M − Q`` ground truths stay unassigned, as in the original (SciPy's
``linear_sum_assignment`` on the rectangular ``(Q, M)`` cost matrix); they take no part in the matched loss
terms (:func:`drivetrain.match.solve.num_assigned` counts the pairs).

Costs (``λ`` the cost weights, ``w`` the code weights, ``enc`` the box code: each model's criterion passes its own;
the assigners have no defaults for them):
    3D: ``λ_cls · focal(logits, y) + λ_reg · Σ_{k<reg_dims} |w_k·pred_k − w_k·enc(gt)_k|``.
    2D: ``λ_cls · focal + λ_box · L1(pred cxcywh, gt cxcywh / (W, H)) − λ_giou · GIoU_pixels
    + λ_centre · L1(pred c2d, c2d / (W, H))``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from scipy.optimize import linear_sum_assignment

from drivetrain.compiled import region
from drivetrain.constants import constant
from drivetrain.geometry import boxes_xyxy_to_cxcywh, normalize_boxes
from drivetrain.match.costs import bbox3d_l1_cost, centre_l1_cost, focal_cost, giou_cost, l1_cost
from drivetrain.match.solve import NAN_COST, NEGINF_COST, POSINF_COST, solve
from drivetrain.ragged import RaggedBatch

__all__ = ["HungarianAssigner2D", "HungarianAssigner3D"]


def _solve_one(cost: torch.Tensor) -> torch.Tensor:
    """Reference solve of one ``(Q, M)`` matrix as the original does: to host, nan_to_num, SciPy.

    Returns ``min(Q, M)`` (query, target) pairs ``(K, 2)`` sorted by query: with ``M > Q`` the targets SciPy
    leaves out stay unassigned, as in the original.
    """
    with region("transfer"):
        host = cost.detach().float().cpu()  # sync: the original moves each matrix to the host on its own
        host = torch.nan_to_num(host, nan=NAN_COST, posinf=POSINF_COST, neginf=NEGINF_COST)
    with region("solve"):
        rows, cols = linear_sum_assignment(host.numpy())
    with region("transfer"):
        return torch.stack([torch.from_numpy(rows), torch.from_numpy(cols)], dim=-1).to(cost.device)  # (K, 2)


def _check_targets(name: str, rb: RaggedBatch, batch_shape: tuple[int, ...]) -> None:
    if not isinstance(rb, RaggedBatch):
        raise TypeError(f"{name}: expected a RaggedBatch, got {type(rb).__name__}")
    if tuple(rb.batch_shape) != batch_shape:
        raise ValueError(f"{name}: batch shape {tuple(rb.batch_shape)} differs from the predictions' {batch_shape}")


@dataclass(frozen=True, kw_only=True)
class HungarianAssigner3D:
    """Match 3D predictions of every decoder layer to the ground truth of their sample.

    Args:
        cls_weight: weight of the focal classification cost (required, keyword).
        reg_weight: weight of the code-weighted L1 box cost (required, keyword).
        code_weights: per-dim weights of the box code (required, keyword); only the first ``reg_dims`` dims are
            compared.
        encode: the model's box code (required, keyword): ground-truth boxes ``(..., 9)`` → codes ``(..., D)``,
            the space of the predicted codes; it must keep the padding (ones) finite.
        alpha, gamma: focal cost parameters (0.25, 2: the defaults of the original's ``FocalLossCost``).
        reg_dims: box-code dims used by the cost (8: no velocity, as the original's ``match_with_velo=False``).
        backend: solver backend for the batched path (see :func:`drivetrain.match.solve`).
    """

    cls_weight: float
    reg_weight: float
    code_weights: tuple[float, ...]
    encode: Callable[[torch.Tensor], torch.Tensor]
    alpha: float = 0.25
    gamma: float = 2.0
    reg_dims: int = 8
    backend: str = "auto"

    def cost(
        self, pred_logits: torch.Tensor, pred_codes: torch.Tensor, gt_codes: torch.Tensor, gt_labels: torch.Tensor
    ) -> torch.Tensor:
        """Cost over broadcastable leading dims.

        Args:
            pred_logits: ``(..., Q, C)`` class logits.
            pred_codes: ``(..., Q, D)`` predicted box codes.
            gt_codes: ``(..., G, D)`` encoded ground-truth boxes.
            gt_labels: ``(..., G)`` int classes.

        Returns:
            ``(..., Q, G)``.
        """
        weights = constant(self.code_weights, dtype=torch.float32, device=pred_codes.device)  # (D,)
        cls = focal_cost(pred_logits, gt_labels, self.alpha, self.gamma)  # (..., Q, G)
        reg = bbox3d_l1_cost(pred_codes.float(), gt_codes.float(), weights, self.reg_dims)  # (..., Q, G)
        return cls.mul_(self.cls_weight).add_(reg, alpha=self.reg_weight)  # (..., Q, G), in place: fresh tensors

    @torch.no_grad()
    def batched(
        self, pred_logits: torch.Tensor, pred_codes: torch.Tensor, gt_boxes: RaggedBatch, gt_labels: RaggedBatch
    ) -> RaggedBatch:
        """Match all layers and samples at once.

        Args:
            pred_logits: ``(L, B, Q, C)`` (any number of leading dims before ``B`` works).
            pred_codes: ``(L, B, Q, D)`` box codes (:attr:`encode`'s).
            gt_boxes: RaggedBatch ``(B, G, 9)`` gravity-centre boxes.
            gt_labels: RaggedBatch ``(B, G)`` int classes, same sizes as ``gt_boxes``.

        Returns:
            int64 RaggedBatch ``(L, B, G, 2)`` of (query, target) pairs sorted by query, sizes = ``min(M_b, Q)``
            (the ground truths beyond ``Q`` stay unassigned, as in the original).
        """
        lead = tuple(pred_logits.shape[:-2])
        if not isinstance(gt_boxes, RaggedBatch):
            raise TypeError(f"gt_boxes: expected a RaggedBatch (B, G, 9), got {type(gt_boxes).__name__}")
        _check_targets("gt_boxes", gt_boxes, lead[-gt_boxes.num_batch_dims :])
        _check_targets("gt_labels", gt_labels, tuple(gt_boxes.batch_shape))
        gt_codes = self.encode(gt_boxes.with_padding(1.0).tensor)  # (B, G, D): padding stays finite
        labels = gt_labels.with_padding(0).tensor  # (B, G)
        with region("cost"):
            cost = self.cost(pred_logits, pred_codes, gt_codes, labels)  # (L, B, Q, G)
        sizes = gt_boxes.sizes.expand(lead)  # (L, B)
        return solve(RaggedBatch.unchecked(cost, sizes, len(lead) + 1), backend=self.backend)

    @torch.no_grad()
    def reference(
        self,
        pred_logits: torch.Tensor,
        pred_codes: torch.Tensor,
        gt_boxes: list[torch.Tensor],
        gt_labels: list[torch.Tensor],
    ) -> list[list[torch.Tensor]]:
        """Per layer and sample, as the original: one cost matrix at a time, each solved on the host.

        Args:
            pred_logits: ``(L, B, Q, C)`` class logits.
            pred_codes: ``(L, B, Q, D)`` box codes (:attr:`encode`'s).
            gt_boxes: per sample ``(M_b, 9)`` gravity-centre boxes.
            gt_labels: per sample ``(M_b,)`` int classes.

        Returns:
            ``[layer][sample]`` int64 ``(min(M_b, Q), 2)`` (query, target) pairs.
        """
        out = []
        for layer in range(pred_logits.shape[0]):
            row = []
            for b, (boxes, labels) in enumerate(zip(gt_boxes, gt_labels, strict=True)):
                if boxes.shape[0] == 0:
                    row.append(torch.zeros(0, 2, dtype=torch.long, device=pred_logits.device))
                    continue
                with region("cost"):
                    gt_codes = self.encode(boxes)
                    cost = self.cost(pred_logits[layer, b], pred_codes[layer, b], gt_codes, labels)
                row.append(_solve_one(cost))
            out.append(row)
        return out


@dataclass(frozen=True, kw_only=True)
class HungarianAssigner2D:
    """Match per-image 2D predictions (tokens of a dense 2D head) to the 2D ground truth of their image.

    Args:
        cls_weight, box_weight, giou_weight, centre_weight: cost weights (required, keyword).
        alpha, gamma: focal cost parameters (0.25, 2: the defaults of the original's ``FocalLossCost``).
        backend: solver backend for the batched path.
    """

    cls_weight: float
    box_weight: float
    giou_weight: float
    centre_weight: float
    alpha: float = 0.25
    gamma: float = 2.0
    backend: str = "auto"

    def cost(
        self,
        pred_logits: torch.Tensor,
        pred_boxes: torch.Tensor,
        pred_centres: torch.Tensor,
        gt_boxes: torch.Tensor,
        gt_labels: torch.Tensor,
        gt_centres: torch.Tensor,
        image_size: tuple[float, float],
    ) -> torch.Tensor:
        """Cost for broadcastable leading dims.

        Args:
            pred_logits: ``(..., Q, C)`` class logits.
            pred_boxes: ``(..., Q, 4)`` normalised cxcywh.
            pred_centres: ``(..., Q, 2)`` normalised.
            gt_boxes: ``(..., G, 4)`` pixel xyxy.
            gt_labels: ``(..., G)`` int classes.
            gt_centres: ``(..., G, 2)`` pixels.
            image_size: ``(W, H)``.

        Returns:
            ``(..., Q, G)``.
        """
        gt_norm = boxes_xyxy_to_cxcywh(normalize_boxes(gt_boxes.float(), image_size))  # (..., G, 4)
        wh = constant(image_size, dtype=torch.float32, device=gt_centres.device)  # (2,)
        cls = focal_cost(pred_logits, gt_labels, self.alpha, self.gamma)  # (..., Q, G)
        box = l1_cost(pred_boxes.float(), gt_norm)  # (..., Q, G)
        giou = giou_cost(pred_boxes.float(), gt_boxes.float(), image_size)  # (..., Q, G)
        centre = centre_l1_cost(pred_centres.float(), gt_centres.float() / wh)  # (..., Q, G)
        cost = cls.mul_(self.cls_weight).add_(box, alpha=self.box_weight)  # (..., Q, G), in place: fresh tensors
        return cost.add_(giou, alpha=self.giou_weight).add_(centre, alpha=self.centre_weight)  # (..., Q, G)

    @torch.no_grad()
    def batched(
        self,
        pred_logits: torch.Tensor,
        pred_boxes: torch.Tensor,
        pred_centres: torch.Tensor,
        gt_boxes: RaggedBatch,
        gt_labels: RaggedBatch,
        gt_centres: RaggedBatch,
        image_size: tuple[float, float],
    ) -> RaggedBatch:
        """Match every image of the batch at once.

        Args:
            pred_logits: ``(B, N, Q, C)`` class logits.
            pred_boxes: ``(B, N, Q, 4)`` normalised cxcywh.
            pred_centres: ``(B, N, Q, 2)`` normalised.
            gt_boxes: RaggedBatch ``(B, N, G, 4)`` pixel xyxy.
            gt_labels: RaggedBatch ``(B, N, G)`` int classes, the sizes of ``gt_boxes``.
            gt_centres: RaggedBatch ``(B, N, G, 2)`` pixels, the sizes of ``gt_boxes``.
            image_size: ``(W, H)`` of the (augmented, padded) images.

        Returns:
            int64 RaggedBatch ``(B, N, G, 2)`` of (token, target) pairs, sizes ``min(M, Q)`` per image.
        """
        lead = tuple(pred_logits.shape[:-2])
        for name, rb in (("gt_boxes", gt_boxes), ("gt_labels", gt_labels), ("gt_centres", gt_centres)):
            _check_targets(name, rb, lead)
        with region("cost"):
            cost = self.cost(
                pred_logits,
                pred_boxes,
                pred_centres,
                gt_boxes.with_padding(0.0).tensor,
                gt_labels.with_padding(0).tensor,
                gt_centres.with_padding(0.0).tensor,
                image_size,
            )  # (B, N, Q, G)
        return solve(RaggedBatch.unchecked(cost, gt_boxes.sizes, len(lead) + 1), backend=self.backend)

    @torch.no_grad()
    def reference(
        self,
        pred_logits: torch.Tensor,
        pred_boxes: torch.Tensor,
        pred_centres: torch.Tensor,
        gt_boxes: list[list[torch.Tensor]],
        gt_labels: list[list[torch.Tensor]],
        gt_centres: list[list[torch.Tensor]],
        image_size: tuple[float, float],
    ) -> list[list[torch.Tensor]]:
        """Per image, as the original: returns ``[sample][camera]`` int64 ``(min(M, Q), 2)`` pairs."""
        out = []
        for b in range(pred_logits.shape[0]):
            row = []
            for n in range(pred_logits.shape[1]):
                boxes, labels, centres = gt_boxes[b][n], gt_labels[b][n], gt_centres[b][n]
                if boxes.shape[0] == 0:
                    row.append(torch.zeros(0, 2, dtype=torch.long, device=pred_logits.device))
                    continue
                with region("cost"):
                    cost = self.cost(
                        pred_logits[b, n], pred_boxes[b, n], pred_centres[b, n], boxes, labels, centres, image_size
                    )
                row.append(_solve_one(cost))
            out.append(row)
        return out
