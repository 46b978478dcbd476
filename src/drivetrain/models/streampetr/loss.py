"""StreamPETR's criteria and its training path, each chosen once: the 3D head's loss and matcher built from the
recipe, the 2D focal head's, and :class:`Path`, the reference or batched computations a model runs.

The losses (:class:`~.loss_3d.StreamPETRLoss`, :class:`~drivetrain.losses.focal_head.FocalHeadLoss`) and the
generic assigners (:class:`~drivetrain.match.HungarianAssigner3D`, :class:`~drivetrain.match.HungarianAssigner2D`)
take the published weights, costs and box code as required arguments; :func:`streampetr_loss` passes :mod:`.recipe`'s
(and :mod:`.box_code`'s), :func:`~drivetrain.losses.focal_head.focal_head_loss` the focal head's, so a model, a
benchmark or a user's own training loop gets the published criterion in one call and the constants keep one owner::

    >>> from drivetrain.models.streampetr.loss import streampetr_loss
    >>> loss = streampetr_loss()  # focal 2.0 + L1 0.25, code weights (2, 2, 1, …), DN split 0.75, Hungarian 3D
    >>> loss.weights["loss_bbox"]
    0.25

Each loss holds both paths of its specification (docs/design.md, "The two paths"): calling it runs the batched
path (compiled when it was built with ``compile``), its ``reference`` method the original's per-sample loops.
:class:`~.detector.StreamPETR` picks one :class:`Path` when it is built (``impl``, by :func:`path_of`, the one place
that reads the name), and calls the path's denoising-query builder and losses from then on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from drivetrain.batch import Batch
from drivetrain.losses.focal_head import FocalHeadLoss
from drivetrain.losses.inputs import Targets
from drivetrain.match import HungarianAssigner3D
from drivetrain.models.streampetr.box_code import encode_boxes
from drivetrain.models.streampetr.denoising import (
    DNQueries,
    make_dn_queries,
    make_static_dn_queries,
    reference_make_dn_queries,
)
from drivetrain.models.streampetr.loss_3d import StreamPETRLoss
from drivetrain.models.streampetr.recipe import CLASSES, CODE_WEIGHTS, DN_SPLIT, LOSS_WEIGHTS, MATCH_COSTS
from drivetrain.models.streampetr.static import as_given, pad_targets

__all__ = ["BATCHED", "PATHS", "REFERENCE", "STATIC", "Path", "hungarian_3d", "path_of", "streampetr_loss"]

Terms = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Path:
    """One of StreamPETR's training paths: the targets' padding, the denoising-query builder and both criteria's entry
    points.

    The entries are unbound (the criterion is an argument), so a model holding a path copies with
    ``copy.deepcopy`` and the path follows the copy's criteria.

    Attributes:
        name: ``batched`` or ``reference`` (the ``impl`` it was chosen by), or ``static`` (``impl: batched`` with
            ``static_targets``).
        make_dn_queries: :func:`~.denoising.make_dn_queries`, :func:`~.denoising.reference_make_dn_queries` or
            :func:`~.denoising.make_static_dn_queries`.
        loss_3d: ``(criterion, outputs, targets) → terms`` of :class:`~.loss_3d.StreamPETRLoss`.
        loss_focal_head: ``(criterion, outputs, targets) → terms`` of
            :class:`~drivetrain.losses.focal_head.FocalHeadLoss`.
        targets: ``(batch, max_targets) → batch`` the forward and the loss read: the batch as given, or its ground
            truth padded to buckets (:func:`~.static.pad_targets`).
    """

    name: Literal["batched", "reference", "static"]
    make_dn_queries: Callable[..., DNQueries]
    loss_3d: Callable[[StreamPETRLoss, Mapping[str, Any], Targets], Terms]
    loss_focal_head: Callable[[FocalHeadLoss, Mapping[str, Any], Targets], Terms]
    targets: Callable[[Batch, int], Batch] = as_given


BATCHED = Path("batched", make_dn_queries, StreamPETRLoss.__call__, FocalHeadLoss.__call__)
"""All layers, samples and images at once (the losses compiled when built with ``compile_loss``)."""

REFERENCE = Path("reference", reference_make_dn_queries, StreamPETRLoss.reference, FocalHeadLoss.reference)
"""Op for op as the original: per layer, sample and image."""

STATIC = Path("static", make_static_dn_queries, StreamPETRLoss.__call__, FocalHeadLoss.__call__, pad_targets)
"""The batched path on static shapes (:mod:`.static`): ground truth, DN queries and 2D boxes padded to buckets."""

PATHS = {path.name: path for path in (BATCHED, REFERENCE)}
"""The paths by the name ``model.args.impl`` gives."""


def path_of(impl: str, static_targets: bool = False) -> Path:
    """The path named ``impl`` (``batched`` or ``reference``), or :data:`STATIC` for ``batched`` with
    ``static_targets``; a ValueError names any other ``impl``, and ``static_targets`` with ``reference``."""
    if impl not in PATHS:
        raise ValueError(f"impl: expected 'batched' or 'reference', got {impl!r}")
    if static_targets:
        if impl != "batched":
            raise ValueError(f"static_targets: needs impl 'batched' (the padded path is batched), got {impl!r}")
        return STATIC
    return PATHS[impl]


def hungarian_3d(backend: str = "auto") -> HungarianAssigner3D:
    """The 3D head's matcher: :data:`~.recipe.MATCH_COSTS` over :data:`~.recipe.CODE_WEIGHTS` of the box code
    (:func:`~.box_code.encode_boxes`).

    Args:
        backend: solver backend of the batched path (:func:`drivetrain.match.solve`).
    """
    return HungarianAssigner3D(code_weights=CODE_WEIGHTS, encode=encode_boxes, **MATCH_COSTS, backend=backend)


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
        sync_cls_avg_factor: as :class:`~.loss_3d.StreamPETRLoss`'s.
        compile: as :class:`~.loss_3d.StreamPETRLoss`'s.
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
