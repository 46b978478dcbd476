"""PointPillars' (and SSN's) training forward, assignment and loss at static shapes: the step that
``torch.compile(fullgraph=True)`` takes in one graph (issue 46, deliverables 1 and 3; a prototype).

The eager step (:meth:`~.model.PointPillars.forward` then :meth:`~.model.PointPillars.loss`) has four
data-dependent sizes and two host reads:

- ``P``, points per sample (the collated batch's padded length): a shape, known on the host;
- ``G``, ground truths per sample (the padded ``gt_boxes``): a shape, known on the host;
- ``V``, voxels in the batch (:func:`~drivetrain.pipeline.voxelize.hard_voxelize`: ``# sync:`` one read) and
  ``R = Σ num_points``, the points stored (the same read; the compact ``HardVFE`` path's row count);
- the windowed assignment's pair count (:func:`~drivetrain.match.anchor_window.windowed_max_iou_assign`: one read).

Here every one of them is padded to a bucket of :class:`Buckets` (decided from the config at start) and masked, so
that the padded step computes what the unpadded one does:

- points: padded to ``P_b`` with the batch's mask; padding sorts last in the voxelization and lands in no voxel;
- voxels: sample ``b``'s voxels fill slots ``b·V_b … b·V_b + V_b − 1`` (:func:`~drivetrain.pipeline.voxelize.
  hard_voxelize_padded`'s layout with the cap ``V_b``) in the order of :func:`hard_voxelize`; the padded slots hold
  no point (``num_points`` 0), weigh 0 in ``HardVFE``'s BatchNorm (whose statistics average over the real
  ``V·T`` slots, a device tensor), and scatter into a spare canvas row that is cut off;
- stored points: the compact rows padded to ``R_b`` (a bucket of its own, or ``B·P_b``: every point may be
  stored) with weight 0, excluded from the max, zero gradient;
- ground truth: padded to ``G_b`` (the solver's buckets, :func:`~drivetrain.match.solve.padded_target_count`) with
  the sizes; the assignment and the loss read the sizes' mask already;
- window pairs (``windowed=True``): padded to ``P_b`` pair slots (``num_pairs`` of
  :func:`~drivetrain.match.anchor_window.windowed_max_iou_assign`: the pairs in their order, then unused slots
  writing a spare anchor) and the box and direction terms on them (:func:`pair_loss`, unused slots masked); or
  (``windowed=False``) the dense ``(B, A, G_b)`` assignment (:func:`~drivetrain.match.max_iou.
  batched_max_iou_assign`, no count at all) and the loss on every anchor, which costs ~15× the windowed
  assignment at the tiny size.

The bucket is chosen before the graph from the largest per-sample voxel count and the window pairs, the numbers
:func:`hard_voxelize` and the windowed assignment read, which the graph no longer does; with one voxel bucket
(``max_voxels``) and the dense assignment nothing is counted: ``P_b`` and ``G_b`` are shapes. The counts are those of
the *augmented* points and boxes. Where the augmented batch is on the host (``data.augment_on=worker`` with no
prefetcher, or any CPU run: the engine's ``HostShapes``), :meth:`~.model.PointPillars.step_shapes_on_host` counts
them by the same arithmetic on host tensors. With the augmentation on a GPU the host holds the batch before it and the
augmentation's parameters: :meth:`StaticPillarStep.bound_shapes` takes a bucket from the host's replay of the
augmentation with a bound on how far the device's float products may land
(:func:`~drivetrain.pipeline.augment.bev.bev_aug_bounds`, :func:`~drivetrain.pipeline.voxelize.voxel_count_bound`:
every cell a point may fall in; the windows of every box that may be kept, grown by its centre's bound), on the
prefetcher's helper thread. Only where no cheap bound exists does :meth:`StaticPillarStep.shapes` read the counts
from the device (``# sync:``, once, before the graph).
Either way the graph guards on the device (``torch._assert_async``: no host read on a GPU) that the bucket holds
every sample's voxels (:attr:`~drivetrain.pipeline.voxelize.HardVoxels.num_found`) and the windows' pairs: a count
that chose the bucket and is not the step's own (the host's, or an eager count whose arithmetic the compiled graph
does not repeat to the ulp) fails the run (:data:`VOXEL_GUARD`, :data:`PAIR_GUARD`) and never cuts voxels or pairs.
A batch beyond the largest bucket is one :class:`ValueError` naming the config key.

**The compiled step's buckets** (:meth:`Buckets.for_compiled_step`) form one *chain*, not a product of per-size
ladders, since every bucket is compiled before step 1 (on a CPU tens of seconds each): a batch takes the first
bucket of the chain that holds it.

- *Voxels*: a ladder ≤ 25 % apart (:func:`voxel_ladder`) from a quarter of ``max_voxels`` up to ``max_voxels``
  (``model.args.step_voxels``, when set, is the one voxel bucket instead). Below the floor the padding is more than
  25 % of the voxels, but the voxel-sized parts (``HardVFE``, the scatter) then cost at most a quarter of what they
  cost at ``max_voxels``, beside a BEV network of fixed size; above it no sample pays more than 25 %.
- *Ground truth*: ``G_b`` 64 at every voxel bucket, ``max_targets`` (when above 64) at the largest voxel bucket only:
  a scene with more than 64 boxes pads its voxels to ``max_voxels`` rather than doubling the ladder.
- *Window pairs* tied to ``G_b``: ``B·G_b·W`` slots, ``W`` the window pairs of one ground truth the size of each of
  the model's anchor sizes, averaged over them (:func:`window_pairs_per_target`: the windows' own arithmetic on boxes
  of the anchors' sizes, computed once from the config): the pairs of a batch whose boxes are on average no larger
  than the anchors, with ``G_b ≥ G`` padded targets each. No exact bound is smaller: a box's window grows with the
  box, up to every anchor of the map (``B·G_b·A``, the dense assignment's size). A batch with more pairs takes the
  one overflow bucket, 2^20 pair slots (:data:`PAIRS_LADDER`'s largest) at the largest voxel and target buckets;
  beyond it a ValueError names ``model.args.window`` (false: the dense assignment, no pair count).

So the chain holds ``len(voxel ladder) + (1 if max_targets > 64) + 1`` buckets (8 + 1 + 1 for the tiny configs'
``max_voxels`` 8000 and ``max_targets`` 256; 8 + 1 with ``max_targets`` 64), where the product of the voxel, target
and pair ladders would hold 80.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from drivetrain.constants import constant
from drivetrain.geometry.delta_coder import direction_target, encode_delta_xyzwlhr
from drivetrain.losses.functional import fp32, sigmoid_focal_loss_sum
from drivetrain.match.anchor_window import WindowedAnchors, window_pair_total, windowed_max_iou_assign_with_pairs
from drivetrain.match.max_iou import batched_max_iou_assign
from drivetrain.match.solve import padded_target_count
from drivetrain.models.pointpillars.loss_batched import _BoxDirSum, _padded, batched_anchor_head_loss
from drivetrain.models.pointpillars.loss_reference import AVG_EPS
from drivetrain.models.pointpillars.voxel_encoder import HardVFE, _Rows
from drivetrain.pipeline.augment.bev import BevBounds
from drivetrain.pipeline.voxelize import VoxelGrid, hard_voxelize_slots, voxel_count_bound, voxel_counts
from drivetrain.ragged import RaggedBatch

BOX_DIMS = 9  # a batch's gt_boxes: (x, y, z, dx, dy, dz, yaw, vx, vy)

__all__ = [
    "PAIRS_LADDER",
    "Buckets",
    "StaticPillarStep",
    "StaticShapes",
    "geometric_buckets",
    "static_loss",
    "voxel_ladder",
    "window_pairs_per_target",
]

PAIRS_LADDER = tuple(1 << k for k in range(12, 21, 2))  # pair buckets 4096 … 1048576 (the chain's overflow ends here)
ALIGN = 64  # every bucket of V, R and P is a multiple of this (vector widths; 64 divides the solver's G buckets)
LADDER_FLOOR = 4  # the voxel ladder starts at max_voxels / LADDER_FLOOR (see the module docstring)
FIRST_TARGETS = 64  # G_b at every voxel bucket; max_targets above it at the largest only
# the step's guards: a bucket chosen from a count that is not the step's own (the host's, or an eager count the graph's
# arithmetic differs from) fails the run on the device (an error at its next read) rather than cutting voxels or pairs
VOXEL_GUARD = (
    "speed.compile_step: a sample fills more voxels than the {} slots of its bucket: the count that chose the bucket "
    "is not the step's (counted on the host, bounded there before a device augmentation, or counted on the device)"
)
PAIR_GUARD = (
    "speed.compile_step: the batch's windows hold more pairs than the {} slots of its bucket: the count that chose "
    "the bucket is not the step's (counted on the host, bounded there before a device augmentation, or counted on the "
    "device)"
)


def geometric_buckets(low: int, high: int, step: float = 1.25, align: int = ALIGN) -> tuple[int, ...]:
    """Buckets from ``low`` up to ``high``, multiples of ``align`` (``high`` itself last), each at most ``step``
    times the one before: a padded size is at most 25 % above the real one at ``step = 1.25``.

    Args:
        low: the smallest bucket, rounded up to ``align`` (at least ``4·align``, so that a step of ``align`` is
            at most 25 %).
        high: the largest (a config's cap, e.g. ``max_voxels``).
        step: the largest ratio of consecutive buckets.
        align: every bucket but ``high`` is a multiple of it.

    Example:
        >>> geometric_buckets(1000, 8000)
        (1024, 1280, 1600, 1984, 2432, 3008, 3712, 4608, 5760, 7168, 8000)
    """
    start = max(-(-low // align) * align, 4 * align)
    if start > high or step <= 1.0 or align < 1:
        raise ValueError(f"buckets: expected 4·align <= low <= high and step > 1, got {low}, {high}, {step}")
    out = [start]
    while out[-1] < high:
        out.append(min(high, max(out[-1] + align, math.floor(out[-1] * step / align) * align)))
    return tuple(out)


def voxel_ladder(max_voxels: int) -> tuple[int, ...]:
    """The compiled step's voxel buckets: ≤ 25 % apart from ``max_voxels / 4`` (rounded up to a multiple of 64, at
    least 256) up to ``max_voxels``; ``(max_voxels,)`` alone when it is below 256.

    Example:
        >>> voxel_ladder(8000)
        (2048, 2560, 3200, 3968, 4928, 6144, 7680, 8000)
    """
    if max_voxels < 4 * ALIGN:
        return (max_voxels,)
    return geometric_buckets(max(max_voxels // LADDER_FLOOR, 1), max_voxels)


def _align(value: int) -> int:
    """``value`` rounded up to a multiple of :data:`ALIGN` (at least one)."""
    return max(-(-value // ALIGN), 1) * ALIGN


def _pick(value: int, buckets: tuple[int, ...], key: str) -> int:
    """The smallest bucket holding ``value``; a ValueError naming the config key when none does."""
    for b in buckets:
        if value <= b:
            return b
    raise ValueError(f"{key}: a batch needs {value}, above the largest bucket {buckets[-1]}")


@dataclass(frozen=True)
class Buckets:
    """The static sizes a compiled step is built for, decided at start from the config.

    Args:
        voxels: per-sample voxel slots ``V_b`` (≤ 25 % apart, the largest the config's ``max_voxels`` or below it);
            one bucket, ``(max_voxels,)``, needs no host read at all.
        points: per-sample point slots ``P_b``.
        rows: stored points of the batch ``R_b`` (compact ``HardVFE`` rows); empty: ``B·P_b`` (every point may be
            stored; no bucket axis and no read of its own).
        max_targets: the largest ``G`` (``model.args.max_targets``).
        pairs: pair slots of the windowed assignment (≤ 25 % apart); with :attr:`pairs_per_target`, the largest is
            where the chain's overflow buckets end.
        targets_ladder: the ``G_b`` to choose from (each at most ``max_targets``, the last equal to it); empty: the
            solver's buckets (:func:`~drivetrain.match.solve.padded_target_count`, at least 8). Set: the buckets are
            a chain (:meth:`all_shapes`, the module docstring), the first one holding a batch is its bucket.
        voxel_key: the config key a batch beyond the largest voxel bucket names.
        pairs_per_target: ``W``, window pairs per padded ground truth of the chain's buckets
            (:func:`window_pairs_per_target`); 0: every chain bucket at every one of :attr:`pairs`.
    """

    voxels: tuple[int, ...]
    points: tuple[int, ...]
    rows: tuple[int, ...] = ()
    max_targets: int = 256
    pairs: tuple[int, ...] = geometric_buckets(1024, 1 << 20)
    targets_ladder: tuple[int, ...] = ()
    voxel_key: str = "model.args.max_voxels"
    pairs_per_target: int = 0

    @classmethod
    def for_grid(
        cls, grid: VoxelGrid, max_points_per_sample: int, low: int = 1024, voxel_buckets: bool = True
    ) -> Buckets:
        """Buckets for a grid: voxels from ``low`` to ``max_voxels`` (only ``max_voxels`` without
        ``voxel_buckets``), points from ``low`` to ``max_points_per_sample``, rows ``B·P_b``."""
        voxels = geometric_buckets(min(low, grid.max_voxels), grid.max_voxels) if voxel_buckets else (grid.max_voxels,)
        return cls(voxels=voxels, points=geometric_buckets(min(low, max_points_per_sample), max_points_per_sample))

    @classmethod
    def for_compiled_step(cls, args: Any, grid: VoxelGrid, pairs_per_target: int = 0) -> Buckets:
        """The few buckets of the compiled training step (``speed.compile_step``), all compiled before step 1, as one
        chain (the module docstring): one point bucket (``args.max_points_per_sample``, 0: every pillar full,
        ``max_voxels·max_points``); voxels :func:`voxel_ladder` of ``max_voxels`` (``args.step_voxels``, when set:
        that one bucket); ground truth 64 and ``args.max_targets`` (one if ``max_targets ≤ 64``); rows ``B·P_b``;
        window pairs ``B·G_b·pairs_per_target`` then the overflow bucket, 2^20 (``pairs_per_target`` 0: every one of
        :data:`PAIRS_LADDER` at each bucket)."""
        points = args.max_points_per_sample or grid.max_voxels * grid.max_points
        voxels = (min(args.step_voxels, grid.max_voxels),) if args.step_voxels else voxel_ladder(grid.max_voxels)
        if points < 1 or args.step_voxels < 0 or args.max_targets < 1 or pairs_per_target < 0:
            raise ValueError(
                f"model.args.max_points_per_sample, step_voxels, max_targets: expected >= 0, >= 0 and >= 1, got "
                f"{args.max_points_per_sample}, {args.step_voxels} and {args.max_targets}"
            )
        first = FIRST_TARGETS
        ladder = (first, args.max_targets) if args.max_targets > first else (args.max_targets,)
        return cls(
            voxels=voxels, points=(points,), max_targets=args.max_targets, pairs=PAIRS_LADDER,
            targets_ladder=ladder, voxel_key="model.args.step_voxels" if args.step_voxels else "model.args.max_voxels",
            pairs_per_target=pairs_per_target,
        )  # fmt: skip

    def targets(self, count: int) -> int:
        """``G_b``: the bucket of ``count`` (:attr:`targets_ladder`, or the solver's, at least 8: a batch without
        ground truth keeps one shape)."""
        if count > self.max_targets:
            raise ValueError(f"model.args.max_targets: a sample has {count} ground truths, above {self.max_targets}")
        if self.targets_ladder:
            return _pick(count, self.targets_ladder, "model.args.max_targets")
        return max(padded_target_count(count), padded_target_count(1))

    def base_pairs(self, batch_size: int, targets: int) -> int:
        """The chain's pair slots at ``G_b = targets``: ``B·G_b·W`` rounded up to a multiple of 64."""
        return _align(batch_size * targets * self.pairs_per_target)

    def all_shapes(self, batch_size: int, windowed: bool) -> tuple[StaticShapes, ...]:
        """Every bucket a batch of ``batch_size`` samples can meet, as a chain in the order
        :meth:`StaticPillarStep.shapes` tries them: each voxel bucket at the first ``G_b``, the largest voxel bucket at
        each larger ``G_b``, each with its pairs (:meth:`base_pairs`, or every one of :attr:`pairs` without
        :attr:`pairs_per_target`), then the overflow bucket (the largest of :attr:`pairs`) at the largest of both
        (rows ``B·P_b``; needs :attr:`targets_ladder` and no rows buckets: the solver's ladder and rows buckets are
        open-ended)."""
        if not self.targets_ladder or self.rows:
            raise ValueError("buckets: all_shapes needs a targets_ladder and rows of B·P_b")
        chain = [(v, self.targets_ladder[0]) for v in self.voxels]
        chain += [(self.voxels[-1], g) for g in self.targets_ladder[1:]]
        out = []
        for p, (v, g) in itertools.product(self.points, chain):
            if not windowed:
                out.append(StaticShapes(p, v, batch_size * p, g, 0))
            elif not self.pairs_per_target:
                out += [StaticShapes(p, v, batch_size * p, g, n) for n in self.pairs]
            else:
                out.append(StaticShapes(p, v, batch_size * p, g, self.base_pairs(batch_size, g)))
        if windowed and self.pairs_per_target and out[-1].pairs < self.pairs[-1]:  # the overflow bucket
            out.append(dataclasses.replace(out[-1], pairs=self.pairs[-1]))
        return tuple(out)


@dataclass(frozen=True)
class StaticShapes:
    """One bucket of the step: ``(P_b, V_b, R_b, G_b)``; one compiled graph each."""

    points: int
    voxels: int
    rows: int
    targets: int
    pairs: int = 0  # pair slots P_b of the windowed assignment; 0: the dense (B, A, G_b) assignment


def _pad_dim1(tensor: torch.Tensor, size: int, fill: float = 0.0) -> torch.Tensor:
    """``tensor`` ``(B, S, ...)`` padded along dim 1 to ``size`` with ``fill``."""
    extra = size - tensor.shape[1]
    if extra == 0:
        return tensor
    pad = tensor.new_full((tensor.shape[0], extra, *tensor.shape[2:]), fill)
    return torch.cat([tensor, pad], dim=1)


def static_vfe(
    vfe: HardVFE, voxels: torch.Tensor, num_points: torch.Tensor, coors: torch.Tensor, real: torch.Tensor, rows: int
) -> torch.Tensor:
    """``HardVFE``'s compact path over ``S`` voxel slots of which ``real`` hold voxels, with ``rows`` rows.

    Args:
        vfe: the encoder.
        voxels: ``(S, T, C)`` zero padded; padded slots all zero.
        num_points: int ``(S,)``, 0 in padded slots.
        coors: int ``(S, 4)`` ``(b, z, y, x)``.
        real: bool ``(S,)``: the slot holds a voxel.
        rows: ``R_b ≥ Σ num_points``.

    Returns:
        ``(S, out)``: the real slots' features are those of ``vfe(..., num_stored=R)`` on the real voxels
        (the same rows in the same order, then weight-0 padding rows; see the module docstring).
    """
    slots, depth, channels = voxels.shape
    device = voxels.device
    counts = num_points.long()  # (S,)
    first = counts.cumsum(0) - counts  # (S,) each slot's first row
    t = torch.arange(depth, device=device)  # (T,)
    valid = t.unsqueeze(0) < counts.unsqueeze(1)  # (S, T)
    dump = rows
    row_of = torch.where(valid, first.unsqueeze(1) + t, dump).flatten()  # (S·T,)
    flat_src = torch.arange(slots * depth, device=device)  # (S·T,)
    src = torch.zeros(rows + 1, dtype=torch.long, device=device).index_put_((row_of,), flat_src)[:rows]  # (R_b,)
    slot_ids = torch.arange(slots, device=device)  # (S,)
    voxel = src // depth  # (R_b,) each row's slot; padding rows read slot 0, weight 0
    row_valid = torch.arange(rows, device=device) < counts.sum()  # (R_b,)
    points = voxels.reshape(-1, channels).index_select(0, src)  # (R_b, C)
    mean, centre = vfe._voxel_terms(voxels, num_points.clamp(min=1), coors)  # padded slots: mean 0, not 0/0
    feats = vfe._decorate(
        points,
        None if mean is None else mean.squeeze(1).index_select(0, voxel),
        None if centre is None else centre.index_select(0, voxel),
    )  # (R_b, in)
    x = torch.cat([feats, feats.new_zeros(slots, feats.shape[1])])  # (R_b + S, in): stand-ins are zero
    stand_in = torch.where(real, depth - counts, 0).to(torch.float32)  # (S,): padded slots weigh 0
    weight = torch.cat([row_valid.to(torch.float32), stand_in])  # (R_b + S,)
    used = torch.cat([row_valid, (stand_in > 0) | ~real])  # a padded slot's stand-in gives its (discarded) max
    total = real.sum().to(torch.float32) * depth  # () N = V·T, on the device
    layout = _Rows(torch.cat([voxel, slot_ids]), weight, used, total, slots)  # type: ignore[arg-type]
    for layer in vfe.layers:
        x = layer.forward_rows(x, layout)
    return x  # (S, out)


def static_scatter(feats: torch.Tensor, coors: torch.Tensor, real: torch.Tensor, batch: int, grid: VoxelGrid):
    """:func:`~drivetrain.pipeline.voxelize.scatter_to_bev` of the real slots; padded slots go to a spare row."""
    nx, ny, _ = grid.grid_size
    cells = batch * ny * nx
    cell = coors[:, 0].long() * (ny * nx) + coors[:, 2].long() * nx + coors[:, 3].long()  # (S,)
    cell = torch.where(real, cell, cells)  # (S,)
    canvas = feats.new_zeros(cells + 1, feats.shape[1]).index_put((cell,), feats)[:cells]  # (B·ny·nx, C)
    return canvas.view(batch, ny, nx, -1).permute(0, 3, 1, 2).contiguous()  # (B, C, ny, nx)


def static_loss(
    model: nn.Module,
    points: torch.Tensor,
    point_sizes: torch.Tensor,
    gt_boxes: torch.Tensor,
    gt_labels: torch.Tensor,
    gt_sizes: torch.Tensor,
    anchors: torch.Tensor,
    thresholds: Any,
    anchor_classes: torch.Tensor | None,
    voxels_per_sample: int,
    rows: int,
    prepared: WindowedAnchors | None = None,
    num_pairs: int = 0,
) -> dict[str, torch.Tensor]:
    """The training forward, the dense assignment and the batched loss at static shapes (the compiled step).

    Args:
        model: a PointPillars or SSN in training mode.
        points: ``(B, P_b, C)`` zero padded, ``point_sizes`` int64 ``(B,)``.
        point_sizes: int64 ``(B,)`` points per sample.
        gt_boxes: ``(B, G_b, 9)`` zero padded.
        gt_labels: int64 ``(B, G_b)`` in the dataset's class order.
        gt_sizes: int64 ``(B,)`` ground truths per sample.
        anchors: ``(A, D)``, :meth:`~.model.PointPillars.anchor_set` of the neck's map.
        thresholds: the assigner's per-anchor thresholds (the same call).
        anchor_classes: SSN's int64 ``(A,)`` class per anchor; None for PointPillars.
        voxels_per_sample: ``V_b``.
        rows: ``R_b``.
        prepared: :meth:`~.model.PointPillars.windowed_anchors` of the map (with ``num_pairs``).
        num_pairs: ``P_b``, pair slots (at least the windows' pairs): the windowed assignment and the box and
            direction terms on its pairs; 0: the dense assignment and every anchor.

    Returns:
        The unweighted terms of :meth:`~.model.PointPillars.loss` (the caller weights them).
    """
    grid = model.grid
    batch = points.shape[0]
    cloud = RaggedBatch.unchecked(points, point_sizes)
    hard = hard_voxelize_slots(cloud, grid, voxels_per_sample)  # S = B·V_b slots, V_b holding every sample
    torch._assert_async(hard.num_found.max() <= voxels_per_sample, VOXEL_GUARD.format(voxels_per_sample))  # no read
    voxels, coors, num_points = hard.voxels, hard.coors, hard.num_points  # (S, T, C), (S, 4), (S,)
    real = (torch.arange(voxels_per_sample, device=points.device) < hard.num_voxels.unsqueeze(1)).flatten()  # (S,)
    feats = static_vfe(model.vfe, voxels, num_points, coors, real, rows)  # (S, C)
    canvas = static_scatter(feats, coors, real, batch, grid)  # (B, C, ny, nx)
    if model.middle is not None:
        raise ValueError("model.args.middle: the static step covers the BEV scatter only (PointPillars, SSN)")
    neck = model.neck(model.backbone(canvas))
    out = model.head(neck)
    code = model.code_size
    boxes = RaggedBatch.unchecked(gt_boxes[..., :code], gt_sizes)
    labels = RaggedBatch.unchecked(model._to_model[gt_labels.clamp(min=0)], gt_sizes)
    head = (out["cls_logits"], out["box_preds"], out["dir_logits"], anchors)
    if num_pairs:
        total = window_pair_total(
            anchors, prepared.grid, boxes, labels, thresholds, anchor_classes=anchor_classes, prepared=prepared
        )  # ()
        torch._assert_async(total <= num_pairs, PAIR_GUARD.format(num_pairs))  # no read
        assigned, pairs = windowed_max_iou_assign_with_pairs(
            anchors, prepared.grid, boxes, labels, thresholds, anchor_classes=anchor_classes, prepared=prepared,
            num_pairs=num_pairs,
        )  # fmt: skip
        if pairs is None:  # positives may lie outside the windows: the box and direction terms on every anchor
            terms = batched_anchor_head_loss(*head, assigned, boxes, labels, **model.criterion.options)
        else:
            terms = pair_loss(*head, assigned, boxes, labels, pairs.flat, pairs.gt, **model.criterion.options)
    else:
        assigned = batched_max_iou_assign(anchors, boxes, labels, thresholds, anchor_classes=anchor_classes)  # (B, A)
        terms = batched_anchor_head_loss(*head, assigned, boxes, labels, **model.criterion.options)
    return terms


@fp32
def pair_loss(
    pred_cls: torch.Tensor,
    pred_boxes: torch.Tensor,
    pred_dir: torch.Tensor,
    anchors: torch.Tensor,
    assigned: torch.Tensor,
    gt_boxes: RaggedBatch,
    gt_labels: RaggedBatch,
    flat: torch.Tensor,
    gt: torch.Tensor,
    *,
    code_weights: tuple[float, ...],
    dir_offset: float,
    alpha: float,
    gamma: float,
    beta: float,
    dir_limit_offset: float,
    num_dir_bins: int,
) -> dict[str, torch.Tensor]:
    """:func:`~.loss_batched.batched_anchor_head_loss` with the window pairs of a static assignment: the same
    operations, the unused pair slots (``flat`` = ``B·A``) read anchor 0 and GT 0 and are masked out of the sums.

    Args:
        pred_cls: ``(B, A, C)`` logits.
        pred_boxes: ``(B, A, D)`` deltas.
        pred_dir: ``(B, A, bins)`` direction logits.
        anchors: ``(A, D)``.
        assigned: int64 ``(B, A)`` as the assignment gives it.
        gt_boxes: RaggedBatch ``(B, G, D)``.
        gt_labels: RaggedBatch ``(B, G)`` in ``[0, C)``.
        flat: int64 ``(P,)`` ``b·A + a``, ``B·A`` for an unused slot.
        gt: int64 ``(P,)`` the pair's GT within its sample.
        code_weights: per-dim weights of the code.
        dir_offset: direction bin offset.
        alpha: focal weight.
        gamma: focal exponent.
        beta: smooth-L1 transition.
        dir_limit_offset: direction target's limit offset.
        num_dir_bins: direction bins.

    Returns:
        ``{"loss_cls", "loss_bbox", "loss_dir"}``, unweighted.
    """
    batch, num_anchors, num_classes = pred_cls.shape
    has_gt = (gt_boxes.sizes > 0).unsqueeze(-1)  # (B, 1)
    positive = (assigned > 0) & has_gt  # (B, A)
    negative = (assigned == 0) | ~has_gt  # (B, A)
    label_weights = (positive | negative).float()  # (B, A)
    gt_index = (assigned - 1).clamp(min=0)  # (B, A)
    gt_table = _padded(gt_boxes, 1.0).float()  # (B, G', D)
    num_slots = gt_table.shape[1]
    row = (torch.arange(batch, device=assigned.device)[:, None] * num_slots + gt_index).flatten()  # (B·A,)
    label_table = _padded(gt_labels, num_classes).long()  # (B, G')
    labels = torch.where(positive, label_table.flatten().index_select(0, row).view_as(gt_index), num_classes)
    avg_factor = positive.sum(-1).clamp(min=1).sum().float() + AVG_EPS  # ()
    loss_cls = sigmoid_focal_loss_sum(pred_cls, labels, label_weights, alpha, gamma) / avg_factor  # ()
    used = flat < batch * num_anchors  # (P,)
    flat, gt = torch.where(used, flat, 0), torch.where(used, gt, 0)  # (P,) each
    pair_row = (flat // num_anchors) * num_slots + gt  # (P,)
    anchor_rows = anchors.index_select(0, flat % num_anchors)  # (P, D)
    matched = gt_table.flatten(0, 1).index_select(0, pair_row)  # (P, D)
    box_pred = pred_boxes.flatten(0, 1).index_select(0, flat)  # (P, D)
    dir_pred = pred_dir.flatten(0, 1).index_select(0, flat)  # (P, bins)
    owned = assigned.flatten().index_select(0, flat) == gt + 1  # (P,)
    pair_label = label_table.flatten().index_select(0, pair_row)  # (P,)
    box_mask = used & owned & (pair_label >= 0) & (pair_label < num_classes)  # (P,)
    with torch.no_grad():
        deltas = encode_delta_xyzwlhr(anchor_rows, matched)  # (P, D)
        dir_targets = direction_target(deltas[..., 6] + anchor_rows[..., 6], dir_offset, dir_limit_offset, num_dir_bins)
    weights = constant(tuple(code_weights), dtype=torch.float32, device=pred_boxes.device)  # (D,)
    loss_bbox, loss_dir = _BoxDirSum.apply(box_pred, dir_pred, deltas, dir_targets, box_mask, weights, beta)
    return {"loss_cls": loss_cls, "loss_bbox": loss_bbox / avg_factor, "loss_dir": loss_dir / avg_factor}


class StaticPillarStep:
    """The padded, bucketed training forward + loss of a PointPillars/SSN, eager or compiled in one graph.

    Args:
        model: the model (training mode).
        buckets: the static sizes.
        compile: ``torch.compile`` keyword arguments (``fullgraph=True`` is always set), or None for eager.
    """

    def __init__(
        self, model: nn.Module, buckets: Buckets, compile: dict[str, Any] | None = None, windowed: bool = False
    ) -> None:
        self.model, self.buckets, self.windowed = model, buckets, windowed
        self.fn = static_loss if compile is None else torch.compile(static_loss, fullgraph=True, **compile)
        self.seen: set[StaticShapes] = set()
        self._chains: dict[tuple[int, bool], tuple[StaticShapes, ...]] = {}
        self._to_model_host = model._to_model.detach().cpu()  # sync: once, when the step is built (a host batch's map)

    def shapes(self, batch: Any) -> StaticShapes:
        """The bucket of a batch (points, voxels, stored points, ground truth, window pairs): with a targets ladder
        the first bucket of the chain (:meth:`Buckets.all_shapes`) that holds it; reads the host only when there is
        more than one voxel bucket, rows have buckets of their own or the assignment is windowed."""
        if not self.counts_needed:
            return self.pick(batch.points.shape[0], batch.points.shape[1], batch.gt_boxes.shape[1], 0, 0, 0)
        rows = bool(self.buckets.rows)
        num_voxels, num_stored = voxel_counts(batch.points, self.model.grid, stored=rows)  # (B,), () or None
        pair_total = self._pair_total(batch) if self.windowed else num_voxels.new_zeros(())
        stored = num_stored if num_stored is not None else num_voxels.new_zeros(())
        # sync: the largest per-sample voxel count, the points stored and the window pairs choose the buckets
        most, stored_count, widest = torch.stack([num_voxels.max(), stored, pair_total]).tolist()
        return self.pick(
            batch.points.shape[0], batch.points.shape[1], batch.gt_boxes.shape[1], most, stored_count, widest
        )

    def bound_shapes(self, batch: Any, bounds: BevBounds) -> StaticShapes | None:
        """A bucket that holds the batch the device's augmentation makes of ``batch`` (the loader's host batch before
        it), from the host's replay of that augmentation (``bounds``, :func:`~drivetrain.pipeline.augment.bev.
        bev_aug_bounds`): :meth:`bound_counts`' bounds picked as counts. Host work only; None where no cheap bound
        exists (the caller counts on the device then). The bucket may be larger than the exact count's, never
        smaller; the step's guards check it on the device."""
        if not self.counts_needed:
            return self.shapes(batch)  # shapes only: the augmentation keeps P and G
        counts = self.bound_counts(batch, bounds)
        if counts is None:
            return None
        size, points, targets = batch.points.shape[0], batch.points.shape[1], batch.gt_boxes.shape[1]
        return self.pick(size, points, targets, *counts)

    def bound_counts(self, batch: Any, bounds: BevBounds) -> tuple[int, int, int] | None:
        """Upper bounds of the augmented batch's largest voxel count (every cell a point may fall in,
        :func:`~drivetrain.pipeline.voxelize.voxel_count_bound`), stored points (the points that may be kept) and
        window pairs (those of every box that may be kept, each box grown by twice its centre's bound and, a yaw
        within 1e-4 of the quarter turn where the nearest rectangle swaps its sides, squared to its longer side);
        None without a cheap voxel bound."""
        most = voxel_count_bound(bounds.xyz, bounds.point_error, bounds.points_kept, self.model.grid)  # (B,)
        if most is None:
            return None
        stored = int(bounds.points_kept.sum())  # host tensors: every stored point is a kept one
        widest = 0
        if self.windowed:
            boxes = bounds.boxes.clone()  # (B, G, D)
            grow = 2 * bounds.box_error.to(boxes.dtype) * (1 + 2.0**-10)  # (B, G): either side of the centre
            wrapped = boxes[..., 6] - torch.floor(boxes[..., 6] / math.pi + 0.5) * math.pi  # (B, G) in [−π/2, π/2)
            turn = (wrapped.abs() - math.pi / 4).abs() < 1e-4  # (B, G): the nearest rectangle may turn either way
            side = torch.maximum(boxes[..., 3], boxes[..., 4])  # (B, G)
            boxes[..., 3] = torch.where(turn, side, boxes[..., 3]) + grow
            boxes[..., 4] = torch.where(turn, side, boxes[..., 4]) + grow
            sizes = bounds.boxes_kept.sum(dim=1)  # (B,)
            order = torch.argsort((~bounds.boxes_kept).to(torch.int8), dim=1, stable=True)  # kept boxes first
            moved = RaggedBatch(torch.take_along_dim(boxes, order[..., None], dim=1), sizes, validate=False)
            labels = RaggedBatch(torch.take_along_dim(batch.gt_labels.tensor, order, dim=1), sizes, validate=False)
            widest = int(self._pair_total(dataclasses.replace(batch, gt_boxes=moved, gt_labels=labels)))
        return int(most.max()) if most.numel() else 0, stored, widest

    @property
    def counts_needed(self) -> bool:
        """Whether a batch's bucket depends on its counts (voxels, stored points, window pairs), not only on its
        shapes: more than one voxel bucket, a voxel bucket below ``max_voxels``, rows of their own, or windows."""
        buckets = self.buckets
        capped = buckets.voxels[-1] < self.model.grid.max_voxels  # a sample may have more voxels than the slots
        return len(buckets.voxels) > 1 or capped or bool(buckets.rows) or self.windowed

    def pick(self, size: int, points: int, targets: int, most: int, stored: int, widest: int) -> StaticShapes:
        """The bucket of a batch of ``size`` samples padded to ``points`` points and ``targets`` ground truths whose
        largest voxel count is ``most``, stored points ``stored`` and window pairs ``widest`` (counts or upper
        bounds of them; ignored where :attr:`counts_needed` is False); a ValueError naming the config key for a batch
        beyond the largest bucket."""
        buckets = self.buckets
        points = _pick(points, buckets.points, "model.args.max_points_per_sample")
        targets = buckets.targets(targets)
        voxels, rows, pairs = buckets.voxels[-1], size * points, 0
        if self.counts_needed:
            voxels = _pick(most, buckets.voxels, buckets.voxel_key)
            rows = _pick(stored, buckets.rows, "bucket rows") if buckets.rows else rows
        else:
            widest = 0
        if not buckets.targets_ladder:
            pairs = _pick(widest, buckets.pairs, "model.args.window") if self.windowed else 0
            return StaticShapes(points, voxels, rows, targets, pairs)
        for shapes in self._chain(size):  # the first that holds the batch
            fits = shapes.voxels >= voxels and shapes.targets >= targets and shapes.pairs >= widest
            if fits and shapes.points == points:
                return shapes
        largest = max(shapes.pairs for shapes in self._chain(size))
        raise ValueError(
            f"model.args.window: a batch needs {widest} window pairs, above the largest bucket {largest}; "
            "set model.args.window false (the dense assignment counts no pairs)"
        )

    def _chain(self, batch_size: int) -> tuple[StaticShapes, ...]:
        """:meth:`Buckets.all_shapes` for ``batch_size`` samples (cached)."""
        key = (batch_size, self.windowed)
        if key not in self._chains:
            self._chains[key] = self.buckets.all_shapes(batch_size, self.windowed)
        return self._chains[key]

    def inputs(self, batch: Any | None, shapes: StaticShapes, batch_size: int, device: torch.device) -> tuple:
        """The arguments of :func:`static_loss` after the model, for ``batch`` padded to ``shapes``; None: an
        empty batch of ``batch_size`` samples at ``shapes`` (one point in the grid's centre, no ground truth: the same
        shapes, dtypes and devices, for compiling a bucket before the first step)."""
        model = self.model
        feature = _feature_size(model)
        anchors, classes, thresholds = model.anchor_set(feature, device)
        if batch is None:
            dtype = next(model.parameters()).dtype
            channels = model.args.point_dims
            centre = torch.tensor(model.grid.point_cloud_range, dtype=dtype, device=device).view(2, 3).mean(0)  # (3,)
            points = torch.zeros(batch_size, shapes.points, channels, dtype=dtype, device=device)
            points[:, 0, :3] = centre  # one point a sample, in range: every statistic has a voxel to average
            sizes = torch.ones(batch_size, dtype=torch.long, device=device)
            boxes = torch.zeros(batch_size, shapes.targets, BOX_DIMS, device=device)
            labels = torch.zeros(batch_size, shapes.targets, dtype=torch.long, device=device)
            gt_sizes = torch.zeros(batch_size, dtype=torch.long, device=device)
        else:
            # the sizes in contiguous strides: a batch of one sample may hold them as a view with another stride,
            # which the compiled graph guards on (a recompile every step)
            points, sizes = _pad_dim1(batch.points.tensor, shapes.points), _strided(batch.points.sizes)
            boxes = _pad_dim1(batch.gt_boxes.tensor, shapes.targets)
            labels = _pad_dim1(batch.gt_labels.tensor, shapes.targets)
            gt_sizes = _strided(batch.gt_boxes.sizes)
        prepared = model.windowed_anchors(feature, device) if shapes.pairs else None
        if prepared is not None:  # its grid's reach table cached here: one the graph's tracing filled would fail the
            prepared.grid.reach(device)  # guard of the first bucket compiled (a recompile when a step meets it again)
        return (
            points, sizes, boxes, labels, gt_sizes, anchors, thresholds, classes, shapes.voxels, shapes.rows,
            prepared, shapes.pairs,
        )  # fmt: skip

    def _pair_total(self, batch: Any) -> torch.Tensor:
        """The window pairs of the batch's ground truth (``()`` on the batch's device: the model's, or the host's
        for :meth:`~.model.PointPillars.step_shapes_on_host`)."""
        model, device = self.model, batch.points.device
        feature = _feature_size(model)
        anchors, classes, thresholds = model.anchor_set(feature, device)
        to_model = model._to_model if model._to_model.device == device else self._to_model_host  # (C,) label map
        boxes = batch.gt_boxes.apply(lambda t: t[..., : model.code_size])  # (B, G, D)
        labels = batch.gt_labels.apply(lambda t: to_model[t.clamp(min=0)])  # (B, G) model order
        prepared = model.windowed_anchors(feature, device)
        return window_pair_total(
            anchors, prepared.grid, boxes, labels, thresholds, anchor_classes=classes, prepared=prepared
        )

    def __call__(self, batch: Any, shapes: StaticShapes | None = None) -> dict[str, torch.Tensor]:
        """The unweighted terms of ``batch`` (a collated Batch on the model's device)."""
        shapes = shapes or self.shapes(batch)
        self.seen.add(shapes)
        return self.fn(self.model, *self.inputs(batch, shapes, batch.points.shape[0], batch.points.device))


def _strided(sizes: torch.Tensor) -> torch.Tensor:
    """``sizes`` (B,) with stride 1: ``contiguous()`` keeps a one-element view's stride, which dynamo guards on."""
    return sizes if sizes.stride() == (1,) else sizes.clone(memory_format=torch.contiguous_format)


def window_pairs_per_target(model: nn.Module) -> int:
    """``W``: the window pairs of one ground truth the size of each of the model's anchor sizes, averaged over the
    sizes and rounded up — the windows' own arithmetic (:func:`~drivetrain.match.anchor_window.window_pair_total`)
    on one box per anchor size at the grid's centre, yaw 0, of the size's class (SSN: per-class windows; PointPillars:
    every type). Computed once, from the config, on the CPU (its one read is no step's).

    Args:
        model: a PointPillars or SSN.

    Returns:
        ``W ≥ 1``.
    """
    cpu = torch.device("cpu")
    feature = _feature_size(model)
    anchors, classes, thresholds = model.anchor_set(feature, cpu)
    prepared = model.windowed_anchors(feature, cpu)
    sizes = torch.tensor(model.anchor_config.sizes, dtype=torch.float32)  # (K, 3) dx, dy, dz
    count = sizes.shape[0]
    centre = torch.tensor(model.grid.point_cloud_range, dtype=torch.float32).view(2, 3).mean(0)  # (3,)
    boxes = torch.zeros(1, count, model.code_size)  # (1, K, D)
    boxes[0, :, :3], boxes[0, :, 3:6] = centre, sizes
    labels = torch.arange(count)[None] if classes is not None else torch.zeros(1, count, dtype=torch.long)  # (1, K)
    sizes_k = torch.tensor([count])
    total = window_pair_total(
        anchors, prepared.grid, RaggedBatch(boxes, sizes_k), RaggedBatch(labels, sizes_k), thresholds,
        anchor_classes=classes, prepared=prepared,
    )  # fmt: skip
    return max(-(-int(total) // count), 1)  # sync: once, when the buckets are built (a CPU tensor)


def _feature_size(model: nn.Module) -> tuple[int, int]:
    """The neck's map size for the model's grid: one forward of a one-sample zero canvas in eval mode (the
    running statistics untouched), cached on the model."""
    cached = getattr(model, "_static_feature_size", None)
    if cached is None:
        nx, ny, _ = model.grid.grid_size
        channels = model.vfe.layers[-1].linear.out_features
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                canvas = model.vfe.voxel_size.new_zeros(1, channels, ny, nx)
                shape = model.neck(model.backbone(canvas)).shape
        finally:
            model.train(was_training)
        cached = (int(shape[2]), int(shape[3]))
        model._static_feature_size = cached
    return cached
