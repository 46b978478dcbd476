"""StreamPETR's criteria built from its recipe: the 3D head's loss and matcher, the 2D focal head's.

The losses (:class:`~.loss.StreamPETRLoss`, :class:`~.focal_head_loss.FocalHeadLoss`) and the generic assigners
(:class:`~drivetrain.match.HungarianAssigner3D`, :class:`~drivetrain.match.HungarianAssigner2D`) take the published
weights, costs and box code as required arguments; these functions pass :mod:`.recipe`'s (and :mod:`.box_code`),
so a model, a benchmark or a user's own training loop gets the published criterion in one call and the constants
keep one owner::

    >>> from drivetrain.models.streampetr.criteria import streampetr_loss
    >>> loss = streampetr_loss()  # focal 2.0 + L1 0.25, code weights (2, 2, 1, …), DN split 0.75, Hungarian 3D
    >>> loss.weights["loss_bbox"]
    0.25
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drivetrain.match import HungarianAssigner2D, HungarianAssigner3D
from drivetrain.models.streampetr.box_code import encode_boxes
from drivetrain.models.streampetr.focal_head_loss import FocalHeadLoss
from drivetrain.models.streampetr.loss import StreamPETRLoss
from drivetrain.models.streampetr.recipe import (
    CLASSES,
    CODE_WEIGHTS,
    DN_SPLIT,
    FOCAL_HEAD_MATCH_COSTS,
    FOCAL_HEAD_WEIGHTS,
    LOSS_WEIGHTS,
    MATCH_COSTS,
    STRIDE,
)

__all__ = ["focal_head_loss", "hungarian_2d", "hungarian_3d", "streampetr_loss"]


def hungarian_3d(backend: str = "auto") -> HungarianAssigner3D:
    """The 3D head's matcher: :data:`~.recipe.MATCH_COSTS` over :data:`~.recipe.CODE_WEIGHTS` of the box code
    (:func:`~.box_code.encode_boxes`).

    Args:
        backend: solver backend of the batched path (:func:`drivetrain.match.solve`).
    """
    return HungarianAssigner3D(code_weights=CODE_WEIGHTS, encode=encode_boxes, **MATCH_COSTS, backend=backend)


def hungarian_2d(backend: str = "auto") -> HungarianAssigner2D:
    """The focal head's matcher: :data:`~.recipe.FOCAL_HEAD_MATCH_COSTS`.

    Args:
        backend: solver backend of the batched path (:func:`drivetrain.match.solve`).
    """
    return HungarianAssigner2D(**FOCAL_HEAD_MATCH_COSTS, backend=backend)


def streampetr_loss(
    num_classes: int = len(CLASSES),
    *,
    backend: str = "auto",
    dn_split: float = DN_SPLIT,
    sync_cls_avg_factor: bool = False,
    compile: bool | Mapping[str, Any] = False,
) -> StreamPETRLoss:
    """The 3D head's loss with the published weights, code weights and matcher.

    Args:
        num_classes: ``C`` (the recipe's 10 classes).
        backend: the matcher's solver backend.
        dn_split: the denoising split (:data:`~.recipe.DN_SPLIT`).
        sync_cls_avg_factor: as :class:`~.loss.StreamPETRLoss`'s.
        compile: as :class:`~.loss.StreamPETRLoss`'s.
    """
    return StreamPETRLoss(
        num_classes,
        cls_weight=LOSS_WEIGHTS["loss_cls"],
        bbox_weight=LOSS_WEIGHTS["loss_bbox"],
        code_weights=CODE_WEIGHTS,
        dn_split=dn_split,
        assigner=hungarian_3d(backend),
        sync_cls_avg_factor=sync_cls_avg_factor,
        compile=compile,
    )


def focal_head_loss(
    num_classes: int = len(CLASSES),
    *,
    stride: int = STRIDE,
    backend: str = "auto",
    sync_cls_avg_factor: bool = False,
    compile: bool | Mapping[str, Any] = False,
) -> FocalHeadLoss:
    """The 2D focal head's loss with the published weights and matcher.

    Args:
        num_classes: ``C`` (the recipe's 10 classes).
        stride: the feature stride in pixels (:data:`~.recipe.STRIDE`).
        backend: the matcher's solver backend.
        sync_cls_avg_factor: as :class:`~.focal_head_loss.FocalHeadLoss`'s.
        compile: as :class:`~.focal_head_loss.FocalHeadLoss`'s.
    """
    return FocalHeadLoss(
        num_classes,
        stride=stride,
        weights=FOCAL_HEAD_WEIGHTS,
        assigner=hungarian_2d(backend),
        sync_cls_avg_factor=sync_cls_avg_factor,
        compile=compile,
    )
