"""PointPillars' anchor-head loss (mmdetection3d ``Anchor3DHead``): focal classification, smooth-L1 box
regression with the sine difference on yaw, and a two-bin direction classifier.

Two implementations of one specification (docs/design.md, "The two paths"), one module each:

``reference`` (:mod:`.loss_reference`): as the original, op for op: targets per sample, stacked over the
    batch, then ``Anchor3DHead``'s positives selected again by their label and the three losses computed on them
    (SSN: ``ShapeAwareHead``'s, on every anchor with weights).
``batched`` (:mod:`.loss_batched`): targets for every anchor of every sample at once by gathering the matched
    ground truth, non-positive anchors masked, never selected, so nothing reads a value on the host; given the
    windowed assignment's pairs (:class:`~drivetrain.match.anchor_window.WindowPairs`, which hold every positive
    with its GT), the box and direction terms on those pairs only (PointPillars: ~13 % of the ``B·A`` anchors at
    the tiny size, ~10 % at the full one; SSN ≤ 1.2 %): the same summands, summed in pair order instead of anchor
    order.

Inputs come from an anchor assigner: ``assigned`` is int64 per anchor, ``-1`` ignore, ``0`` negative and
``k ≥ 1`` positive, matched to ground truth ``k − 1``. Anchors and ground truths are gravity-centre boxes
``(x, y, z_c, dx, dy, dz, yaw[, vx, vy])`` (``D = 9``, nuScenes; ``D = 7``, Lyft).

Both return the same dict of **unweighted** terms (the weights a model passes are :attr:`AnchorHeadLoss.weights`,
which the trainer applies), each divided by ``N = Σ_b max(n_pos_b, 1) + ε`` (``ε`` the float32
epsilon that mmdet's ``weight_reduce_loss`` adds to every ``avg_factor``), counted on this rank only as in the
original (no averaging across ranks):

- ``loss_cls = Σ_{a, c} w_a · FL(s_ac, one_hot(label_a)) / N`` (``w_a`` = 0 for ignored anchors, else 1).
- ``loss_bbox = Σ_{a ∈ pos} Σ_k c_k · SmoothL1_β(p̃_ak − t̃_ak) / N``, slot 6 through the sine difference.
- ``loss_dir = Σ_{a ∈ pos} CE(d_a, bin_a) / N``.

With no positive in the whole batch the box and direction terms are exact zeros with zero gradients (the
original returns the sum of an empty selection). A sample without ground truth has only negatives, whatever
its assignment says, as in the original. The original computes these per feature level and sums the levels;
the nuScenes SECFPN head has one level, which is the case implemented here (the FPN variant would call this
once per level with that level's anchors).

:class:`AnchorHeadLoss` holds a model's constants and runs either path (:meth:`AnchorHeadLoss.batched`,
:meth:`AnchorHeadLoss.reference`); the model picks one when it is built (:mod:`.paths`). PointPillars'
``compile_loss`` compiles the batched max-IoU assignment and this loss together, in one graph (neither has a host
call, so there is no graph break).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from drivetrain.match.anchor_window import WindowPairs
from drivetrain.models.pointpillars.loss_batched import batched_anchor_head_loss
from drivetrain.models.pointpillars.loss_reference import AVG_EPS, check_code, reference_anchor_head_loss
from drivetrain.ragged import RaggedBatch

__all__ = [
    "AVG_EPS",
    "AnchorHeadLoss",
    "batched_anchor_head_loss",
    "reference_anchor_head_loss",
]

TERMS = ("loss_cls", "loss_bbox", "loss_dir")


class AnchorHeadLoss(torch.nn.Module):
    """Loss of mmdetection3d's ``Anchor3DHead`` (PointPillars, SSN); a model passes its recipe's constants
    (:mod:`drivetrain.models.pointpillars.recipe`), the defaults left are ``Anchor3DHead``'s own.

    Args:
        num_classes: ``C``; label ``C`` is background.
        code_weights: per-dim weights of the box code (its length is ``D``, 7 or 9).
        dir_offset: shift of the direction bin edges.
        weights: the term weights, ``{"loss_cls", "loss_bbox", "loss_dir"}``: exactly these three.
        alpha, gamma: sigmoid focal loss parameters (0.25, 2).
        beta: smooth-L1 transition point (1/9).
        dir_limit_offset, num_dir_bins: direction target (0, 2).
    """

    def __init__(
        self,
        num_classes: int,
        *,
        code_weights: Sequence[float],
        dir_offset: float,
        weights: Mapping[str, float],
        alpha: float = 0.25,
        gamma: float = 2.0,
        beta: float = 1.0 / 9.0,
        dir_limit_offset: float = 0.0,
        num_dir_bins: int = 2,
    ) -> None:
        super().__init__()
        check_code(code_weights, len(code_weights))
        if beta <= 0:
            raise ValueError(f"beta: must be > 0 (mmdet's SmoothL1Loss asserts it), got {beta}")
        if set(weights) != set(TERMS):
            raise ValueError(f"weights: expected the terms {TERMS}, got {tuple(weights)}")
        self.num_classes = num_classes
        self.weights = {name: float(weights[name]) for name in TERMS}
        self.options = {
            "code_weights": tuple(float(w) for w in code_weights),
            "alpha": alpha,
            "gamma": gamma,
            "beta": beta,
            "dir_offset": dir_offset,
            "dir_limit_offset": dir_limit_offset,
            "num_dir_bins": num_dir_bins,
        }

    def batched(
        self,
        pred_cls: torch.Tensor,
        pred_boxes: torch.Tensor,
        pred_dir: torch.Tensor,
        anchors: torch.Tensor,
        assigned: torch.Tensor,
        gt_boxes: RaggedBatch,
        gt_labels: RaggedBatch,
        pairs: WindowPairs | None = None,
    ) -> dict[str, torch.Tensor]:
        """The unweighted terms of one batch, every sample at once (:func:`batched_anchor_head_loss`, shapes as
        there); ``pairs`` (the windowed assignment's) restricts the box and direction terms to the window pairs."""
        self._check(pred_cls, pred_boxes, pred_dir, anchors, assigned)
        return batched_anchor_head_loss(
            pred_cls, pred_boxes, pred_dir, anchors, assigned, gt_boxes, gt_labels, **self.options, pairs=pairs
        )

    def reference(
        self,
        pred_cls: torch.Tensor,
        pred_boxes: torch.Tensor,
        pred_dir: torch.Tensor,
        anchors: torch.Tensor,
        assigned: torch.Tensor,
        gt_boxes: RaggedBatch,
        gt_labels: RaggedBatch,
        anchor_classes: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """The unweighted terms of one batch as the original: split into samples, :func:`reference_anchor_head_loss`
        (shapes as :meth:`batched`), as ``ShapeAwareHead`` (per class) when ``anchor_classes`` (int64 ``(A,)``, SSN's
        contiguous class blocks) is given (the batched path gives the same terms either way and does not read it)."""
        self._check(pred_cls, pred_boxes, pred_dir, anchors, assigned)
        return reference_anchor_head_loss(
            list(pred_cls.unbind(0)),
            list(pred_boxes.unbind(0)),
            list(pred_dir.unbind(0)),
            anchors,
            list(assigned.unbind(0)),
            gt_boxes.to_list(),
            gt_labels.to_list(),
            **self.options,
            anchor_classes=anchor_classes,
        )

    def _check(
        self,
        pred_cls: torch.Tensor,
        pred_boxes: torch.Tensor,
        pred_dir: torch.Tensor,
        anchors: torch.Tensor,
        assigned: torch.Tensor,
    ) -> None:
        """ValueError naming the input whose shape does not fit ``pred_cls``' ``(B, A, C)`` and the anchors' ``D``."""
        batch, num_anchors, num_classes = pred_cls.shape
        dim = anchors.shape[-1]
        expected = {
            "pred_boxes": (batch, num_anchors, dim),
            "pred_dir": (batch, num_anchors, self.options["num_dir_bins"]),
            "anchors": (num_anchors, dim),
            "assigned": (batch, num_anchors),
        }
        for name, tensor in zip(expected, (pred_boxes, pred_dir, anchors, assigned), strict=True):
            if tuple(tensor.shape) != expected[name]:
                raise ValueError(f"{name}: expected shape {expected[name]}, got {tuple(tensor.shape)}")
        if num_classes != self.num_classes:
            raise ValueError(f"pred_cls: {num_classes} classes, the loss was built for {self.num_classes}")
