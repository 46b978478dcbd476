"""Max-IoU anchor assignment over the anchor windows each ground truth can reach: the same assignments as
:func:`~drivetrain.match.max_iou.batched_max_iou_assign` (and so as the original per-sample loop), bit for bit,
at a fraction of the pairs.

Anchors sit on regular grids: an :class:`AnchorGrid` describes ``T`` anchor *types* (one size and rotation, for
per-class assignment also one class), each a ``ny × nx`` grid of cell centres and a formula for the anchor index of
cell ``(iy, ix)``. The nearest-BEV IoU of a GT and an anchor is non-zero only if their axis-aligned BEV rectangles
overlap, i.e. ``|x_a − x_g| < w_a/2 + w_g/2`` and likewise in y; with the cell centres ``x_a = x0 + i·step`` each GT
is compared only with the cells ``⌈(x_lo − w_a/2 − x0)/step − m⌉ ≤ i ≤ ⌊(x_hi + w_a/2 − x0)/step + m⌋`` (``x_lo``,
``x_hi`` the GT's float32 rectangle edges), likewise in y, clipped to the type's grid. The margin ``m`` (in cells)
is ``1/8 + 2^-16·max(|x_lo|, |x_hi|, |x0|, |x0 + n·step|)/step``: it covers the float32 rounding of the anchor
centres (``linspace``: a few ulps of the largest coordinate) and of the rectangles' edges, each far below ``2^-16``
of the magnitudes; computed in float64 on the device. Every GT has its own windows, over the types it is compared
with (all types; per class, the types of its class), so the pairs form one ragged list, segment by segment
(``repeat_interleave``): for a synthetic batch of 4 (~31 GTs a sample) ~13k pairs at the anchors of
``configs/pointpillars_tiny.yaml`` (13 % of the anchors), ~213k at those of ``configs/pointpillars_nus.yaml``
(9.5 %; the per-class anchors of ``configs/ssn_tiny.yaml``, ``ssn_nus.yaml``: 1.2 %, 0.5 %), where a window sized by the
batch's widest GT made ~330k at the tiny size and the dense IoU ~3 M, and no ``(B, A, G)`` tensor is ever formed.

Every anchor outside a GT's window has IoU exactly 0 with it, which the steps of the original use as follows
(``−1`` ignored, ``0`` negative, ``k ≥ 1`` GT ``k − 1``; see :mod:`drivetrain.match.max_iou`):

- an anchor's best IoU is the maximum over its window pairs, or 0 when it has any GT (of its class);
- its first best GT is the smallest GT index among window pairs reaching that maximum — or, when the maximum
  is 0, the first GT of its class (every GT then ties at 0);
- a GT's best IoU over all anchors is its window maximum, or 0;
- low-quality matches (the last GT in order wins): a GT whose best IoU is positive can only match anchors in
  its window; a GT whose best IoU is 0 (it overlaps no anchor) matches every anchor of its class when the
  anchor's ``min_pos_iou ≤ 0``. Both are scatter-reductions.

Sizing the pair list reads one number on the host (how many pairs the windows hold): the one host sync of the
assignment, ``# sync:`` marked. The IoU of each pair is computed by the same float32 operations as the dense
path, so equality tests of IoUs (ties, low-quality matches) behave identically.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from drivetrain.geometry.bev_iou import IOU_EPS, nearest_bev_boxes, nearest_bev_dims
from drivetrain.match.max_iou import AnchorThresholds, _check_inputs
from drivetrain.ragged import RaggedBatch

__all__ = [
    "AnchorGrid",
    "WindowPairs",
    "WindowedAnchors",
    "window_pair_total",
    "windowed_max_iou_assign",
    "windowed_max_iou_assign_with_pairs",
]


@dataclass(frozen=True)
class AnchorGrid:
    """Where the anchors sit: ``T`` types, each a regular grid of cells (build with the model's anchor layout).

    Per type ``t`` (tuples of length ``T``): cell ``(iy, ix)`` with ``0 ≤ iy < ny[t]``, ``0 ≤ ix < nx[t]`` has its
    anchor at index ``base[t] + iy·stride_y[t] + ix·stride_x[t]`` and its centre near
    ``(x0[t] + ix·step_x[t], y0[t] + iy·step_y[t])`` (within rounding); ``half_x[t]``, ``half_y[t]`` bound the half
    width and height of its anchors' nearest-BEV rectangles; ``group[t]`` is the class of the type's anchors for
    per-class assignment and 0 for class-agnostic assignment.
    """

    x0: tuple[float, ...]
    y0: tuple[float, ...]
    step_x: tuple[float, ...]
    step_y: tuple[float, ...]
    nx: tuple[int, ...]
    ny: tuple[int, ...]
    base: tuple[int, ...]
    stride_x: tuple[int, ...]
    stride_y: tuple[int, ...]
    half_x: tuple[float, ...]
    half_y: tuple[float, ...]
    group: tuple[int, ...]
    _tables: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        sizes = {len(getattr(self, name)) for name in ("x0", "y0", "step_x", "step_y", "nx", "ny", "base")}
        sizes |= {len(getattr(self, name)) for name in ("stride_x", "stride_y", "half_x", "half_y", "group")}
        if len(sizes) != 1 or not self.x0:
            raise ValueError("AnchorGrid: every per-type tuple needs the same, non-zero length")
        if min(self.step_x) <= 0 or min(self.step_y) <= 0 or min(self.nx) < 1 or min(self.ny) < 1:
            raise ValueError("AnchorGrid: cell steps must be > 0 and grids hold at least one cell")

    @property
    def num_types(self) -> int:
        """T."""
        return len(self.x0)

    @property
    def num_anchors(self) -> int:
        """Anchors the grid addresses (the largest index + 1)."""
        return (
            max(
                b + (ny - 1) * sy + (nx - 1) * sx
                for b, ny, nx, sy, sx in zip(self.base, self.ny, self.nx, self.stride_y, self.stride_x, strict=True)
            )
            + 1
        )

    def index(self, device: torch.device) -> torch.Tensor:
        """int64 ``(T, 6)`` per type: nx, ny, base, stride_x, stride_y, group (cached per device)."""
        key = ("index", device)
        if key not in self._tables:
            rows = list(zip(self.nx, self.ny, self.base, self.stride_x, self.stride_y, self.group, strict=True))
            self._tables[key] = torch.tensor(rows, dtype=torch.int64, device=device)  # (T, 6)
        return self._tables[key]

    def reach(self, device: torch.device) -> torch.Tensor:
        """float64 ``(T, 8)`` per type: half_x, half_y, step_x, step_y, x0, y0, x_end, y_end (``x0 + nx·step_x``)
        — the window bound's operands, in the precision of the host arithmetic they stand for (cached per
        device)."""
        key = ("reach", device)
        if key not in self._tables:
            ends_x = [x0 + n * step for x0, n, step in zip(self.x0, self.nx, self.step_x, strict=True)]
            ends_y = [y0 + n * step for y0, n, step in zip(self.y0, self.ny, self.step_y, strict=True)]
            columns = (self.half_x, self.half_y, self.step_x, self.step_y, self.x0, self.y0, ends_x, ends_y)
            rows = list(zip(*columns, strict=True))
            self._tables[key] = torch.tensor(rows, dtype=torch.float64, device=device)  # (T, 8)
        return self._tables[key]


def _type_half_dims(anchors: torch.Tensor, grid: AnchorGrid) -> torch.Tensor:
    """float32 ``(T, 2)``: half the nearest-BEV width and height of each type's anchors, as the dense path's
    ``nearest_bev_boxes`` computes them (``dims / 2``), read from each type's first anchor (on the device)."""
    first = anchors[grid.index(anchors.device)[:, 2]]  # (T, ≥7)
    return nearest_bev_dims(first) / 2  # (T, 2)


def _rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` for an int64 ``index`` of any shape, by ``index_select`` (on the CPU ~10× faster than
    advanced indexing): ``(N, ...)``, ``(*S,)`` → ``(*S, ...)``."""
    return table.index_select(0, index.reshape(-1)).view(*index.shape, *table.shape[1:])


PAIR_COLUMNS = ("x", "y", "pos", "neg_low", "neg_high", "min_pos", "low_quality", "zero_ok", "group")
"""The columns of :attr:`WindowedAnchors.pair_table`: one ``index_select`` gives a pair everything of its anchor."""


@dataclass(frozen=True)
class WindowedAnchors:
    """What the windowed assignment needs of one anchor set, computed once (build with :meth:`build`; the model
    keeps it with its anchors): the centres, each type's half rectangle, each anchor's group and its *zero code*
    (whether a best IoU of 0 is negative, positive, and may be claimed by a GT that overlaps no anchor)."""

    anchors: torch.Tensor  # (A, ≥7)
    grid: AnchorGrid
    thresholds: AnchorThresholds
    anchor_classes: torch.Tensor | None  # (A,) or None (class-agnostic)
    centres: torch.Tensor  # float32 (A, 2)
    half_dims: torch.Tensor  # float32 (T, 2)
    group: torch.Tensor  # int64 (A,)
    zero_ok: torch.Tensor  # bool (A,)
    code: torch.Tensor  # int64 (A,): group·8 + neg0 + 2·pos0 + 4·zero_ok
    pair_table: torch.Tensor  # float32 (A, 9): what a pair reads of its anchor (see PAIR_COLUMNS)
    positives_in_windows: bool  # no anchor can be positive at IoU 0 (no pos ≤ 0, no zero_ok): see WindowPairs

    @staticmethod
    @torch.no_grad()
    def build(
        anchors: torch.Tensor,
        grid: AnchorGrid,
        thresholds: AnchorThresholds,
        anchor_classes: torch.Tensor | None = None,
    ) -> WindowedAnchors:
        """Check that ``grid`` addresses ``anchors`` and precompute the per-anchor tables (device ops only)."""
        if grid.num_anchors != anchors.shape[0]:
            raise ValueError(f"grid: addresses {grid.num_anchors} anchors, but anchors has {anchors.shape[0]}")
        device = anchors.device
        group = anchor_classes if anchor_classes is not None else torch.zeros(anchors.shape[0], dtype=torch.long)
        group = group.to(device)  # (A,)
        neg0 = (thresholds.neg_low <= 0) & (thresholds.neg_high > 0)  # (A,)
        pos0 = thresholds.pos <= 0  # (A,)
        zero_ok = (thresholds.min_pos <= 0) & thresholds.low_quality  # (A,)
        code = group * 8 + neg0.long() + pos0.long() * 2 + zero_ok.long() * 4  # (A,)
        centres = anchors[:, :2].float().contiguous()  # (A, 2)
        columns = (thresholds.pos, thresholds.neg_low, thresholds.neg_high, thresholds.min_pos)  # 4 × (A,)
        columns += (thresholds.low_quality, zero_ok, group)  # 3 × (A,): exact as float32 (group < 2^24)
        pair_table = torch.cat([centres, torch.stack([c.float() for c in columns], dim=-1)], dim=-1)  # (A, 9)
        half_dims = _type_half_dims(anchors, grid)  # (T, 2)
        in_windows = not thresholds.zero_iou_positive  # a host flag of the configs: no read of the tensors
        return WindowedAnchors(
            anchors, grid, thresholds, anchor_classes, centres, half_dims, group, zero_ok, code, pair_table, in_windows
        )


@dataclass(frozen=True)
class WindowPairs:
    """The (sample, anchor, GT) pairs the windows compared, for a loss that needs only the positives.

    An anchor assigned to GT ``k`` (``assigned = k + 1``) whose best IoU is positive reached that IoU with GT
    ``k`` inside ``k``'s window (above ``pos`` by its first best GT, or as a low-quality match of ``k``), so its
    pair ``(b·A + a, k)`` is in this list. Positives at IoU 0 exist only when some anchor has ``pos ≤ 0`` or may
    be claimed by a GT that overlaps no anchor (``min_pos ≤ 0`` with low-quality matches); the assignment then
    returns no pairs. So ``{(b, a): assigned[b, a] = gt + 1 at a pair}`` is exactly the set of positives, and
    the loss's box and direction terms can be summed over the pairs instead of over all ``B·A`` anchors.

    An anchor may appear in several pairs (one per GT whose window reaches it); each positive appears once with
    its own GT.
    """

    flat: torch.Tensor  # int64 (P,): b·A + a
    gt: torch.Tensor  # int64 (P,): 0-based GT index within the sample


def _windows(
    grid: AnchorGrid, gt_boxes: RaggedBatch, gt_labels: RaggedBatch, per_class: bool
) -> tuple[torch.Tensor, ...]:
    """Each (sample, GT, type)'s window of cells (device ops only).

    Returns:
        ``(gt_rect, gt_group, in_range, low, width, counts)``: the GTs' float32 ``(B, G, 4)`` nearest-BEV
        rectangles, their int64 ``(B, G)`` groups and bool ``(B, G)`` whether they are compared at all, the int64
        ``(B, G, T, 2)`` first cell and cells per axis of each window, and the int64 ``(B·G·T,)`` pairs of each.
    """
    num_groups = max(grid.group) + 1
    device = gt_boxes.tensor.device
    valid = gt_boxes.mask  # (B, G)
    gt_rect = nearest_bev_boxes(gt_boxes.tensor)  # (B, G, 4)
    gt_group = gt_labels.tensor.clamp(0, num_groups - 1) if per_class else torch.zeros_like(gt_labels.tensor)
    gt_group = torch.where(valid, gt_group, 0)  # (B, G)
    in_range = valid & ((gt_labels.tensor >= 0) & (gt_labels.tensor < num_groups) if per_class else valid)  # (B, G)

    # each (sample, GT, type)'s window: the cells whose anchors can overlap the GT, clipped to the type's grid
    types = grid.index(device)  # (T, 6) nx, ny, base, stride_x, stride_y, group
    reach = grid.reach(device)  # float64 (T, 8) half_x, half_y, step_x, step_y, x0, y0, x_end, y_end
    edges = gt_rect.double()[:, :, None, :]  # (B, G, 1, 4) x_lo, y_lo, x_hi, y_hi
    half_a, step, start = reach[:, 0:2], reach[:, 2:4], reach[:, 4:6]  # (T, 2) each, x then y
    scale = torch.maximum(edges[..., :2].abs(), edges[..., 2:].abs())  # (B, G, 1, 2)
    scale = torch.maximum(scale, torch.maximum(start.abs(), reach[:, 6:8].abs()))  # (B, G, T, 2)
    margin = 0.125 + scale * 2.0**-16 / step  # (B, G, T, 2) cells
    first = torch.ceil((edges[..., :2] - half_a - start) / step - margin)  # (B, G, T, 2) x, y
    last = torch.floor((edges[..., 2:] + half_a - start) / step + margin)  # (B, G, T, 2)
    size = types[:, :2]  # (T, 2) nx, ny
    low = first.clamp(0, 2**40).long()  # (B, G, T, 2)
    high = torch.minimum(last.clamp(-1, 2**40).long(), size - 1)  # (B, G, T, 2)
    width = (high - low + 1).clamp(min=0)  # (B, G, T, 2) cells per axis
    compared = in_range[..., None] & (gt_group[..., None] == types[:, 5] if per_class else True)  # (B, G, T)
    counts = torch.where(compared, width[..., 0] * width[..., 1], 0).flatten()  # (S,) S = B·G·T
    return gt_rect, gt_group, in_range, low, width, counts


@torch.no_grad()
def windowed_max_iou_assign(
    anchors: torch.Tensor,
    grid: AnchorGrid,
    gt_boxes: RaggedBatch,
    gt_labels: RaggedBatch,
    thresholds: AnchorThresholds,
    *,
    anchor_classes: torch.Tensor | None = None,
    prepared: WindowedAnchors | None = None,
    num_pairs: int | None = None,
) -> torch.Tensor:
    """Assign the anchors of every sample, comparing each GT only with the anchors its window reaches.

    Args:
        anchors: ``(A, ≥7)`` anchors laid out as ``grid`` says.
        grid: the anchors' layout; its groups are classes when ``anchor_classes`` is given, else all 0.
        gt_boxes: RaggedBatch ``(B, G, ≥7)`` padded ground-truth boxes.
        gt_labels: RaggedBatch ``(B, G)`` int classes.
        thresholds: per-anchor thresholds (:func:`~drivetrain.match.max_iou.anchor_thresholds`).
        anchor_classes: int ``(A,)`` class per anchor for per-class assignment; None: class-agnostic.
        prepared: :meth:`WindowedAnchors.build` of these anchors, grid, thresholds and classes (built here if
            None; a training loop keeps it with its anchors).
        num_pairs: static shapes, no host read: ``num_pairs`` pair slots (at least the windows' pairs,
            :func:`window_pair_total`; the caller's bucket), the pairs in the same order as without it, then the
            unused slots, which compare nothing and whose ``flat`` is ``B·A`` (a spare anchor); None: exactly the
            windows' pairs, counted on the host (one read).

    Returns:
        int64 ``(B, A)``: −1 ignored, 0 negative, ``k ≥ 1`` GT ``k − 1``; equal to
        :func:`~drivetrain.match.max_iou.batched_max_iou_assign`. :func:`windowed_max_iou_assign_with_pairs` also
        returns the pairs it compared.

    Example:
        >>> grid = AnchorGrid(...)  # where the model's anchor generator puts its anchors, on a 200 × 200 map
        >>> assigned = windowed_max_iou_assign(anchors, grid, gt_boxes, gt_labels, thresholds)  # (B, A)
    """
    return windowed_max_iou_assign_with_pairs(
        anchors, grid, gt_boxes, gt_labels, thresholds, anchor_classes=anchor_classes, prepared=prepared,
        num_pairs=num_pairs,
    )[0]  # fmt: skip


@torch.no_grad()
def windowed_max_iou_assign_with_pairs(
    anchors: torch.Tensor,
    grid: AnchorGrid,
    gt_boxes: RaggedBatch,
    gt_labels: RaggedBatch,
    thresholds: AnchorThresholds,
    *,
    anchor_classes: torch.Tensor | None = None,
    prepared: WindowedAnchors | None = None,
    num_pairs: int | None = None,
) -> tuple[torch.Tensor, WindowPairs | None]:
    """:func:`windowed_max_iou_assign` (arguments as there) and the pairs it compared, for a loss that needs only
    the positives.

    Returns:
        ``(assigned, pairs)``: the int64 ``(B, A)`` assignment and the compared pairs (:class:`WindowPairs`), or
        None as pairs when positives may lie outside them (:attr:`WindowedAnchors.positives_in_windows` is False).
        With ``num_pairs``, the pairs have ``num_pairs`` slots; the unused ones have ``flat = B·A``.
    """
    _check_inputs(anchors, gt_boxes, gt_labels, thresholds, anchor_classes)
    if prepared is None:
        prepared = WindowedAnchors.build(anchors, grid, thresholds, anchor_classes)
    device = anchors.device
    num_samples, num_gts = gt_boxes.shape[:2]
    num_anchors = anchors.shape[0]
    pairs_wanted = prepared.positives_in_windows
    if num_gts == 0 or num_anchors == 0:
        assigned = torch.zeros(num_samples, num_anchors, dtype=torch.long, device=device)  # (B, A)
        none = torch.zeros(0, dtype=torch.long, device=device)  # (0,)
        return assigned, WindowPairs(none, none) if pairs_wanted else None
    per_class = anchor_classes is not None
    num_groups = max(grid.group) + 1
    gt_rect, gt_group, in_range, low, width, counts = _windows(grid, gt_boxes, gt_labels, per_class)
    types = grid.index(device)  # (T, 6) nx, ny, base, stride_x, stride_y, group
    # the pairs, segment by segment: pair j of segment (b, g, t) is cell (low_x + j mod w_x, low_y + j div w_x)
    num_types = grid.num_types
    columns = torch.stack([low[..., 0].flatten(), low[..., 1].flatten(), width[..., 0].flatten()], dim=-1)  # (S, 3)
    columns = torch.cat([columns, (counts.cumsum(0) - counts)[:, None]], dim=-1)  # (S, 4) + first pair
    pair_valid = None
    if num_pairs is None:
        num_pairs = int(counts.sum())  # sync: the number of window pairs sizes the pair tensors
        segment = torch.repeat_interleave(torch.arange(counts.shape[0], device=device), counts, output_size=num_pairs)
        low_x, low_y, width_x, first_pair = columns.index_select(0, segment).unbind(-1)  # 4 × (P,)
        local = torch.arange(num_pairs, device=device) - first_pair  # (P,)
    else:  # static: slot j holds pair j (the segment whose run of pairs covers j), the slots past the pairs unused
        ends = counts.cumsum(0)  # (S,)
        slot = torch.arange(num_pairs, device=device)  # (P_b,)
        pair_valid = slot < ends[-1]  # (P_b,)
        segment = torch.searchsorted(ends, slot, right=True).clamp_(max=counts.shape[0] - 1)  # (P_b,)
        low_x, low_y, width_x, first_pair = columns.index_select(0, segment).unbind(-1)  # 4 × (P_b,)
        local = torch.where(pair_valid, slot - first_pair, 0)  # (P_b,)
        width_x = width_x.clamp(min=1)  # (P_b,): an unused slot of an empty window divides by 1
    kind = segment % num_types  # (P,) anchor type
    gt_slot = segment // num_types  # (P,) b·G + g
    pair_sample = gt_slot // num_gts  # (P,)
    of_type = types.index_select(0, kind)  # (P, 6)
    iy, ix = low_y + local // width_x, low_x + local % width_x  # (P,), (P,)
    anchor_index = of_type[:, 2] + iy * of_type[:, 4] + ix * of_type[:, 3]  # (P,)
    if pair_valid is not None:  # unused slots read anchor 0 and compare nothing (IoU 0, a spare anchor below)
        anchor_index = torch.where(pair_valid, anchor_index, 0)  # (P,)

    # IoU of each pair, by the dense path's float32 operations (the anchor's rectangle: centre ± half size)
    of_anchor = prepared.pair_table.index_select(0, anchor_index)  # (P, 9) PAIR_COLUMNS
    centres = of_anchor[:, :2]  # (P, 2)
    half_dims = prepared.half_dims.index_select(0, kind)  # (P, 2)
    a = torch.cat([centres - half_dims, centres + half_dims], dim=-1)  # (P, 4)
    b = gt_rect.flatten(0, 1).index_select(0, gt_slot)  # (P, 4)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])  # (P,)
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])  # (P,)
    overlap_w = (torch.minimum(a[:, 2], b[:, 2]) - torch.maximum(a[:, 0], b[:, 0])).clamp_(min=0)  # (P,)
    overlap_h = (torch.minimum(a[:, 3], b[:, 3]) - torch.maximum(a[:, 1], b[:, 1])).clamp_(min=0)  # (P,)
    overlap = overlap_w.mul_(overlap_h)  # (P,)
    pair_iou = overlap / (area_a + area_b).sub_(overlap).clamp_(min=IOU_EPS)  # (P,)
    if pair_valid is not None:
        pair_iou = torch.where(pair_valid, pair_iou, 0.0)  # (P,): 0 changes no maximum (they start at 0)

    # per (sample, class): whether it has a GT, its first GT, and its last GT that overlaps no anchor at all
    gt_number = torch.arange(1, num_gts + 1, device=device).expand(num_samples, -1)  # (B, G) 1-based
    gt_max = torch.zeros(num_samples * num_gts, device=device).scatter_reduce_(0, gt_slot, pair_iou, "amax")
    pair_gt_max = gt_max.index_select(0, gt_slot)  # (P,) the best IoU of each pair's GT
    gt_max = gt_max.view(num_samples, num_gts)  # (B, G): anchors outside the window give 0
    per_group = torch.zeros(num_samples, num_groups, 3, dtype=torch.long, device=device)  # (B, groups, 3)
    per_group[..., 1] = num_gts + 1
    index = gt_group[..., None].expand(-1, -1, 3)  # (B, G, 3)
    values = torch.stack(
        [
            in_range.long(),
            torch.where(in_range, gt_number, num_gts + 1),
            torch.where(in_range & (gt_max <= 0), gt_number, 0),
        ],
        dim=-1,
    )  # (B, G, 3)
    per_group[..., 0:1].scatter_reduce_(1, index[..., 0:1], values[..., 0:1], "amax")
    per_group[..., 1:2].scatter_reduce_(1, index[..., 1:2], values[..., 1:2], "amin")
    per_group[..., 2:3].scatter_reduce_(1, index[..., 2:3], values[..., 2:3], "amax")
    has_gt, first_gt, zero_last = per_group.unbind(-1)  # 3 × (B, groups)

    # anchors no window reaches: best IoU 0 (with a GT of their class), so their code is a per-(sample, class)
    # table entry chosen by three per-anchor bits: 0 is negative, 0 is positive, a zero-IoU GT may claim it
    bits = torch.arange(8, device=device)  # (8,) neg0 | pos0 << 1 | zero_ok << 2
    default = torch.where(
        ((bits & 4) > 0) & (zero_last[..., None] > 0),
        zero_last[..., None],
        torch.where((bits & 2) > 0, first_gt[..., None], torch.where((bits & 1) > 0, 0, -1)),
    )  # (B, groups, 8)
    default = torch.where(has_gt[..., None] > 0, default, 0)  # (B, groups, 8): no GT of the class: negative
    assigned = default.flatten(1).index_select(1, prepared.code)  # (B, A)

    # anchors some window reaches: reductions over their pairs into per-anchor buffers
    flat = pair_sample * num_anchors + anchor_index  # (P,)
    spare = 0 if pair_valid is None else 1  # static pairs: unused slots write to a spare anchor B·A, cut off
    if pair_valid is not None:
        flat = torch.where(pair_valid, flat, num_samples * num_anchors)  # (P,)
    max_iou = torch.zeros(num_samples * num_anchors + spare, device=device).scatter_reduce_(0, flat, pair_iou, "amax")
    pair_max = max_iou.index_select(0, flat)  # (P,) the best IoU of each pair's anchor
    pair_number = gt_slot % num_gts + 1  # (P,) 1-based GT
    big = num_gts + 1
    reaches = pair_iou == pair_max  # (P,)
    best = torch.full((num_samples * num_anchors + spare,), big, device=device).scatter_reduce_(
        0, flat, torch.where(reaches, pair_number, big), "amin"
    )  # (B·A,) 1-based first GT at the anchor's best IoU (among window pairs)
    low = (pair_iou == pair_gt_max) & (pair_gt_max > 0)  # (P,)
    low &= (pair_gt_max >= of_anchor[:, 5]) & (of_anchor[:, 6] > 0)  # (P,): min_pos, low_quality
    last = torch.zeros(num_samples * num_anchors + spare, dtype=torch.long, device=device).scatter_reduce_(
        0, flat, torch.where(low, pair_number, 0), "amax"
    )  # (B·A,) 1-based last GT whose best IoU the anchor reaches

    # each reached anchor's code, computed at its pairs (every pair of an anchor computes the same value)
    pair_of = of_anchor  # (P, 9)
    pair_group = pair_of[:, 8].long()  # (P,)
    of_group = _rows(per_group.flatten(0, 1), pair_sample * num_groups + pair_group)  # (P, 3)
    pair_has_gt, first, pair_zero_last = of_group.unbind(-1)  # 3 × (P,)
    argmax_number = torch.where(pair_max > 0, best.index_select(0, flat), first)  # (P,) 1-based
    value = torch.full_like(pair_number, -1)  # (P,)
    negative = (pair_max >= pair_of[:, 3]) & (pair_max < pair_of[:, 4])  # (P,) neg_low ≤ best < neg_high
    value = torch.where(negative, 0, value)  # (P,)
    value = torch.where(pair_max >= pair_of[:, 2], argmax_number, value)  # (P,) best ≥ pos
    zero_claim = torch.where(pair_of[:, 7] > 0, pair_zero_last, 0)  # (P,) zero_ok
    final_last = torch.maximum(last.index_select(0, flat), zero_claim)  # (P,) the loop's last writer wins
    value = torch.where(final_last > 0, final_last, value)  # (P,)
    value = torch.where(pair_has_gt > 0, value, 0)  # (P,)
    if spare:
        assigned = torch.cat([assigned.flatten(), assigned.new_zeros(1)])  # (B·A + 1,)
    assigned = assigned.flatten().scatter_(0, flat, value)[: num_samples * num_anchors]  # (B·A,)
    assigned = assigned.view(num_samples, num_anchors)  # (B, A)
    return assigned, WindowPairs(flat, pair_number - 1) if pairs_wanted else None


def window_pair_total(
    anchors: torch.Tensor,
    grid: AnchorGrid,
    gt_boxes: RaggedBatch,
    gt_labels: RaggedBatch,
    thresholds: AnchorThresholds,
    *,
    anchor_classes: torch.Tensor | None = None,
    prepared: WindowedAnchors | None = None,
) -> torch.Tensor:
    """The number of pairs :func:`windowed_max_iou_assign` compares for these arguments, as a ``()`` int64 tensor
    on the device (no host read): what a static ``num_pairs`` must reach."""
    _check_inputs(anchors, gt_boxes, gt_labels, thresholds, anchor_classes)
    if gt_boxes.shape[1] == 0 or anchors.shape[0] == 0:
        return torch.zeros((), dtype=torch.long, device=anchors.device)
    return _windows(grid, gt_boxes, gt_labels, anchor_classes is not None)[-1].sum()  # () on the device
