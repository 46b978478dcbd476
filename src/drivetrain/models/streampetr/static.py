"""StreamPETR's static training shapes: every data-dependent size of the step padded to a bucket chosen from the
config, so that a compiled step sees one of a few shapes (issue 46, deliverable 1).

The sizes that follow the data in the eager step are the padded ground-truth length ``G`` (samples' 3D boxes), the
denoising (DN) query count ``P = groups · S`` (``S = max_b M_b``, read on the host) and the focal head's padded 2D
box length per image. On the static path (``model.args.static_targets``):

- ``G`` becomes its bucket (:func:`target_bucket`: the solver's :data:`~drivetrain.match.solve.TARGET_BUCKETS`
  8, 16, 32, 64, then multiples of 64, as :func:`~drivetrain.match.solve.padded_target_count`; an empty batch
  takes the smallest), the 2D boxes' ``G`` likewise; both by zero columns the ragged sizes leave out
  (:func:`pad_targets`), so the assigners and both losses mask them as any padding;
- the DN queries take ``S'`` = the bucket as rows per group (:func:`~.denoising.make_static_dn_queries`):
  ``P' = groups · S'`` depends on the bucket only, the noise is drawn in that layout, and the rows past the
  batch's ``S`` (a device value) are masked out of attention (no query sees them, they see only themselves) and
  out of the loss (they are background and past every sample's count).

Everything a real query computes is what the eager step computes: the same keys visible to it, the same targets,
the same terms (equal to the eager step's up to the order of sums over the padding; bit-equal when ``G`` is a
bucket already: ``tests/test_models_streampetr_static.py``). The random draw differs (``(B, groups, S', 3)``
instead of the eager ``(groups · T, 3)``), so a run's noise is not the eager run's; :func:`~.denoising.padded_noise`
maps an eager draw into the static layout for the equality tests.

A batch whose ``G`` is beyond the largest bucket (the bucket of ``model.args.max_targets``) is one ``ValueError``
naming ``model.args.max_targets``; it is raised from the shape alone (no host read).

The compiled step (``speed.compile_step``, :class:`~drivetrain.engine.protocol.StaticStep`; the functions below the
padding ones) pads before the graph: :func:`step_shapes` picks the batch's bucket among :func:`step_buckets`
(``model.args.step_targets``: the solver's buckets or finer ones, multiples of 8; the 2D boxes at the same length),
:func:`step_batch` pads the batch to it (and normalises the images), and the graph takes it as given, so its inputs
have bucket shapes only: one graph per bucket, the memory bank's empty first frame included (the model passes the
bank in as fixed-shape tensors, :meth:`~.detector.StreamPETR.step_inputs`). :func:`empty_batch` is a batch at a
bucket for compiling it before the first step. Padding inside the graph traces too, without a break, but the
input's raw ``G`` is then a shape dynamo guards: a graph per distinct ``G``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from drivetrain.batch import Batch
from drivetrain.match.solve import padded_target_count, target_buckets
from drivetrain.ragged import RaggedBatch

__all__ = [
    "MAX_TARGETS_KEY",
    "STEP_IMAGES_KEY",
    "STEP_TARGETS_KEY",
    "StepShapes",
    "as_given",
    "buckets",
    "empty_batch",
    "pad_ragged",
    "pad_targets",
    "step_batch",
    "step_buckets",
    "step_shapes",
    "target_bucket",
]

MAX_TARGETS_KEY = "model.args.max_targets"
"""The config key of the largest bucket, named by the error a larger batch gets."""

STEP_IMAGES_KEY = "model.args.step_images"
"""The config key of the compiled step's image shape, named by the error a batch of other images gets."""

STEP_TARGETS_KEY = "model.args.step_targets"
"""The config key of the compiled step's ground-truth buckets."""

_FIELDS_3D = ("gt_boxes", "gt_labels")
_FIELDS_2D = ("gt_boxes_2d", "gt_labels_2d", "centers_2d", "depths_2d", "gt_index_2d")


def buckets(max_targets: int) -> tuple[int, ...]:
    """Every padded length of the static path for ``max_targets``, ascending: the solver's buckets up to the one
    holding it (a batch without ground truth takes the smallest).

    Example:
        >>> buckets(64), buckets(100)
        ((8, 16, 32, 64), (8, 16, 32, 64, 128))
    """
    if max_targets < 1:
        raise ValueError(f"{MAX_TARGETS_KEY}: must be ≥ 1, got {max_targets}")
    return tuple(target_buckets(max_targets))


def target_bucket(length: int, max_targets: int, what: str = "gt_boxes") -> int:
    """The bucket a padded length ``length`` is padded to; a ``ValueError`` naming :data:`MAX_TARGETS_KEY` when it
    is beyond the largest.

    Args:
        length: the batch's padded ground-truth length ``G`` (a shape: no host read).
        max_targets: ``model.args.max_targets``.
        what: the batch field, for the message.
    """
    largest = padded_target_count(max_targets)
    if length > largest:
        raise ValueError(
            f"{MAX_TARGETS_KEY}: {what} holds up to {length} boxes per sample, beyond the largest bucket {largest} "
            f"(of max_targets={max_targets}); raise {MAX_TARGETS_KEY} to at least {length}"
        )
    return padded_target_count(max(length, 1))


def pad_ragged(rb: RaggedBatch, length: int) -> RaggedBatch:
    """``rb`` with its ragged dim padded by zeros to ``length`` (the sizes shared; ``rb`` itself when it has that
    length already)."""
    current = rb.tensor.shape[rb.ragged_dim]
    if current == length:
        return rb
    after = rb.tensor.dim() - 1 - rb.ragged_dim  # dims after the ragged one
    tensor = F.pad(rb.tensor, (0, 0) * after + (0, length - current))
    return RaggedBatch.unchecked(tensor, rb.sizes, rb.ragged_dim)


def as_given(batch: Batch, max_targets: int) -> Batch:
    """``batch`` itself: the targets of the eager paths (``max_targets`` unused)."""
    return batch


def pad_targets(batch: Batch, max_targets: int) -> Batch:
    """``batch`` with its 3D ground truth padded to the bucket of its ``G`` and its 2D boxes to theirs (zeros past
    every size); ``batch`` itself when both are at a bucket already (what the trainer's compiled step feeds).

    Args:
        batch: a training batch (``gt_boxes``, ``gt_labels`` and the 2D fields ``gt_boxes_2d``, ``gt_labels_2d``,
            ``centers_2d``, ``depths_2d``, ``gt_index_2d``).
        max_targets: ``model.args.max_targets``; a ``G`` beyond its bucket is a ValueError naming the key.
    """
    changes: dict[str, RaggedBatch] = {}
    for fields in (_FIELDS_3D, _FIELDS_2D):
        first = getattr(batch, fields[0], None)
        if first is None:
            continue
        length = target_bucket(first.max_size, max_targets, fields[0])
        if length != first.max_size:
            changes.update({n: pad_ragged(getattr(batch, n), length) for n in fields if getattr(batch, n) is not None})
    return dataclasses.replace(batch, **changes) if changes else batch


# ------------------------------------------------------------------------------------------- the compiled step
@dataclass(frozen=True)
class StepShapes:
    """One bucket of the compiled step (one graph each): ``G_b`` 3D boxes per sample, ``G_2d`` 2D boxes per image."""

    targets: int
    targets_2d: int


def step_buckets(max_targets: int, chosen: tuple[int, ...] = ()) -> tuple[StepShapes, ...]:
    """Every bucket of the compiled step: ``G_b`` each of ``chosen`` (``model.args.step_targets``: multiples of 8 up
    to the largest of :func:`buckets`, which must be among them; empty: :func:`buckets` themselves), the 2D boxes per
    image at the same length (each is one of the sample's 3D boxes seen in that image, so an image has no more of
    them than its sample has 3D boxes; a batch that does takes the bucket of its larger count). Each bucket is a graph
    compiled before the first step: fewer buckets compile sooner, coarser ones pad more denoising queries
    (``dn_groups · G_b`` rows) and 2D boxes. The step pads to its bucket, not to the solver's (the solver pads its
    cost matrices itself).

    Raises:
        ValueError: ``chosen`` holds a length that is not a multiple of 8, or lacks the largest bucket (naming
            ``model.args.step_targets``).

    Example:
        >>> [s.targets for s in step_buckets(64)], step_buckets(64, (24, 40, 64))[1]
        ([8, 16, 32, 64], StepShapes(targets=40, targets_2d=40))
    """
    ladder = buckets(max_targets)
    chosen = tuple(sorted(set(chosen))) or ladder
    if any(g < 1 or g % 8 for g in chosen) or chosen[-1] != ladder[-1]:
        raise ValueError(
            f"{STEP_TARGETS_KEY}: expected multiples of 8 up to and with the largest bucket, {ladder[-1]} (of "
            f"{MAX_TARGETS_KEY}={max_targets}), got {list(chosen)}"
        )
    return tuple(StepShapes(g, g) for g in chosen)


def step_shapes(
    batch: Batch, max_targets: int, step_images: tuple[int, ...], chosen: tuple[int, ...] = ()
) -> StepShapes:
    """The bucket of ``batch`` among :func:`step_buckets`: the smallest holding its 3D and 2D ground truth (from the
    shapes: no host read).

    Raises:
        ValueError: the images are not ``step_images`` (naming :data:`STEP_IMAGES_KEY`), or the ground truth is
            beyond the largest bucket (naming :data:`MAX_TARGETS_KEY`).
    """
    if batch.images is None:
        raise ValueError("batch.images: StreamPETR needs the camera images (the dataset was built without them)")
    n, _, h, w = batch.images.shape[1:]
    if (n, h, w) != tuple(step_images):
        raise ValueError(
            f"{STEP_IMAGES_KEY}: the compiled step was built for {tuple(step_images)} (cameras, height, width), a "
            f"batch has {(n, h, w)}; set {STEP_IMAGES_KEY}=[{n}, {h}, {w}]"
        )
    target_bucket(batch.gt_boxes.max_size, max_targets)  # beyond the largest: the error naming the key
    target_bucket(batch.gt_boxes_2d.max_size, max_targets, "gt_boxes_2d")
    count = max(batch.gt_boxes.max_size, batch.gt_boxes_2d.max_size)
    return next(s for s in step_buckets(max_targets, chosen) if s.targets >= count)


def step_batch(batch: Batch, shapes: StepShapes, mean: torch.Tensor, std: torch.Tensor) -> Batch:
    """``batch`` as the compiled step takes it: ground truth padded to ``shapes`` (fresh ragged fields without cached
    masks, which dynamo would guard), images normalised (``(x − mean) / std`` in float32, as the model does: the
    compiled graph then takes one image dtype whatever the loader gives), no encoder output.

    Args:
        batch: a training batch on the device.
        shapes: its bucket (:func:`step_shapes`).
        mean: ``(1, 3, 1, 1)`` the model's image mean.
        std: ``(1, 3, 1, 1)`` its std.
    """
    images = batch.images
    if not batch.images_normalized:
        b, n, _, h, w = images.shape
        x = images.reshape(b * n, 3, h, w).to(mean.dtype)  # (B·N, 3, H, W)
        images = ((x - mean) / std).view(b, n, 3, h, w)  # (B, N, 3, H, W)
    changes: dict[str, RaggedBatch] = {}
    for fields, length in ((_FIELDS_3D, shapes.targets), (_FIELDS_2D, shapes.targets_2d)):
        for name in fields:
            rb = pad_ragged(getattr(batch, name), length)
            changes[name] = RaggedBatch.unchecked(rb.tensor, rb.sizes, rb.ragged_dim)
    return dataclasses.replace(batch, images=images, images_normalized=True, encoded=None, **changes)


def empty_batch(shapes: StepShapes, batch_size: int, step_images: tuple[int, ...], device: torch.device) -> Batch:
    """A batch of ``batch_size`` first frames without ground truth at ``shapes`` and ``step_images`` (zero images,
    identity poses and cameras): the shapes, dtypes and devices of :func:`step_batch`'s, for compiling a bucket."""
    n, h, w = step_images
    b = batch_size
    zeros = functools.partial(torch.zeros, device=device)

    def eye(k: int, *lead: int) -> torch.Tensor:
        return torch.eye(k, device=device).expand(*lead, k, k).contiguous()

    def ragged(length: int, *tail: int, dtype: torch.dtype = torch.float32, cams: bool = False) -> RaggedBatch:
        lead = (b, n) if cams else (b,)
        return RaggedBatch.unchecked(zeros(*lead, length, *tail, dtype=dtype), zeros(*lead, dtype=torch.long))

    g, g2 = shapes.targets, shapes.targets_2d
    return Batch(
        images=zeros(b, n, 3, h, w), intrinsics=eye(3, b, n), lidar2img=eye(4, b, n), cam2ego=eye(4, b, n),
        lidar2ego=eye(4, b), ego_pose=eye(4, b), ego_pose_inv=eye(4, b),
        timestamps=zeros(b, dtype=torch.float64), prev_exists=zeros(b, dtype=torch.bool),
        gt_boxes=ragged(g, 9), gt_labels=ragged(g, dtype=torch.long),
        gt_boxes_2d=ragged(g2, 4, cams=True), gt_labels_2d=ragged(g2, dtype=torch.long, cams=True),
        centers_2d=ragged(g2, 2, cams=True), depths_2d=ragged(g2, cams=True),
        gt_index_2d=ragged(g2, dtype=torch.long, cams=True),
        points=None, image_size=(w, h), sample_tokens=("",) * b, frame_index=zeros(b, dtype=torch.long),
        images_normalized=True,
    )  # fmt: skip
