"""Voxelization of a whole batch of ragged point clouds in one pass, beside per-sample references after mmcv.

Semantics (mmcv's CPU kernels ``mmcv/ops/csrc/pytorch/cpu/voxelization.cpp`` and the wrapper
``mmcv/ops/voxelize.py``, read at mmcv a8073c7; batch handling after mmdetection3d 1.4):

- **Cells.** A point's cell on each axis is ``floor((p − min) / size)``, computed in float32 (float64 for
  float64 points) from the range and voxel size *rounded to float32*, as mmcv passes them. A point is in
  range when ``0 ≤ cell < n`` on every axis, with the grid size ``n = round((max − min) / size)`` (float32,
  C ``round``: halves away from zero). So ``min`` is inclusive and ``max`` exclusive when the size divides the
  extent, a grid that rounds up keeps points a little beyond ``max``, and non-finite points are dropped.
- **Hard voxelization** (per sample, in point order): voxels are numbered by the first appearance of their
  cell; a voxel stores its first ``max_points`` points and drops the rest; only the first ``max_voxels``
  voxels are made and the points of later ones are dropped. Outputs: ``voxels (V, T, C)`` zero padded,
  ``coors (V, 3)`` int32 in ``(z, y, x)`` order, ``num_points (V,)`` int32. For a batch, mmdetection3d's
  ``Det3DDataPreprocessor.voxelize`` concatenates the samples and prepends the batch index:
  ``coors (V, 4) = (b, z, y, x)``.
- **Dynamic voxelization**: every point keeps its ``(z, y, x)`` cell, ``(−1, −1, −1)`` when out of range
  (with the batch index prepended: ``(b, −1, −1, −1)``). **Dynamic scatter** (mmcv ``DynamicScatter``,
  whose order comes from ``unique_dim`` in ``scatter_points_cuda.cu``): the distinct valid rows of
  ``coors``, sorted lexicographically, with the ``max`` / ``sum`` / ``mean`` of their points' features; rows
  holding a negative entry belong to no voxel. The ``max`` gradient goes to the first point holding the
  maximum, as mmcv's backward kernel does.
- **BEV scatter** (mmdetection3d ``PointPillarsScatter.forward_batch``): pillar ``(b, 0, y, x)`` writes its
  feature vector into ``canvas[b, :, y, x]`` of a zero ``(B, C, ny, nx)`` canvas.

The batched path (:func:`hard_voxelize`, :func:`hard_voxelize_padded`, :func:`dynamic_voxelize`,
:func:`scatter_points`, :func:`scatter_to_bev`) has no loop over samples or points. Hard voxelization gives
every in-range point the linear id ``((b·nz + z)·ny + y)·nx + x``; one stable sort groups a voxel's points
in point order, so a point's rank in its voxel is its distance from the start of its run and the run's
first element is the voxel's first appearance; a per-sample cumulative count of first appearances numbers
the voxels; ranks ``≥ max_points`` and voxel numbers ``≥ max_voxels`` are dropped, and the rest is written
into zeros with one indexed write. The output equals the reference bit for bit, in the same order.
Host syncs: :func:`hard_voxelize` and :func:`scatter_points` read one count each (the number of voxels is
their output's shape, marked ``# sync:``); :func:`hard_voxelize_padded` (``(B, max_voxels, T, C)`` plus
per-sample sizes) and :func:`dynamic_voxelize` never sync.

The ``reference_*`` functions are the per-sample paths written after the originals (the point-by-point
loop of the CPU kernel, the per-sample loops of mmdetection3d). :func:`per_sample_hard_voxelize` runs the
vectorised path once per sample: the baseline for timing the batching itself.

The module is longer than most because it keeps the two paths of one concept side by side.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from drivetrain.constants import constant
from drivetrain.pipeline._config import finite_numbers
from drivetrain.ragged import RaggedBatch

__all__ = [
    "OCCUPANCY_CELLS",
    "HardVoxels",
    "VoxelGrid",
    "dynamic_voxelize",
    "hard_voxelize",
    "hard_voxelize_padded",
    "hard_voxelize_slots",
    "occupied_cells",
    "per_sample_hard_voxelize",
    "reference_dynamic_voxelize",
    "reference_dynamic_voxelize_batch",
    "reference_hard_voxelize",
    "reference_hard_voxelize_batch",
    "reference_scatter_points",
    "reference_scatter_to_bev",
    "scatter_points",
    "scatter_to_bev",
    "voxel_count_bound",
    "voxel_counts",
]

_REDUCTIONS = ("max", "sum", "mean")
OCCUPANCY_CELLS = 1 << 22  # voxel_counts marks an occupancy canvas up to this many cells a batch (4 MB), else sorts


def _f32(values: Sequence[float]) -> tuple[float, ...]:
    """The values mmcv computes with: it hands the range and voxel size to its kernels as float32."""
    return tuple(float(np.float32(v)) for v in values)


@dataclass(frozen=True)
class VoxelGrid:
    """A voxel grid and the caps of hard voxelization (mmcv ``Voxelization``'s arguments).

    mmcv takes ``max_voxels`` as a (train, test) pair; pick one per grid, e.g.
    ``dataclasses.replace(grid, max_voxels=40000)`` for testing.
    """

    point_cloud_range: tuple[float, float, float, float, float, float]  # (x_min, y_min, z_min, x_max, y_max, z_max)
    voxel_size: tuple[float, float, float]  # (vx, vy, vz) metres, each > 0
    max_points: int = -1  # points kept per voxel, first ones first; -1: dynamic voxelization only
    max_voxels: int = -1  # voxels kept per sample, first appearance first; -1: dynamic voxelization only
    grid_size: tuple[int, int, int] = field(init=False)  # (nx, ny, nz) = round((max − min) / size), as mmcv

    def __post_init__(self) -> None:
        bounds = finite_numbers(self, "point_cloud_range", 6)
        if not all(lo < hi for lo, hi in zip(bounds[:3], bounds[3:], strict=True)):
            raise ValueError(f"point_cloud_range: every minimum must be below its maximum, got {bounds}")
        sizes = finite_numbers(self, "voxel_size", 3)
        if not all(s > 0 for s in sizes):
            raise ValueError(f"voxel_size: every size must be > 0, got {sizes}")
        for name in ("max_points", "max_voxels"):
            cap = getattr(self, name)
            if isinstance(cap, bool) or not isinstance(cap, int) or not (cap == -1 or cap >= 1):
                raise ValueError(f"{name}: expected a positive int or -1 (dynamic), got {cap!r}")
        cells = []
        for axis, lo, hi, size in zip("xyz", bounds[:3], bounds[3:], sizes, strict=True):
            extent = (np.float32(hi) - np.float32(lo)) / np.float32(size)  # float32 arithmetic, as the kernel
            num = math.floor(float(extent) + 0.5)  # C round(): halves away from zero (extent > 0)
            if num < 1:
                raise ValueError(f"voxel_size: {size} exceeds the range on axis {axis}; the grid rounds to 0 cells")
            cells.append(num)
        object.__setattr__(self, "grid_size", tuple(cells))

    @property
    def is_hard(self) -> bool:
        """Whether both caps are set, as hard voxelization needs."""
        return self.max_points > 0 and self.max_voxels > 0


@dataclass(frozen=True)
class HardVoxels:
    """Hard voxels of a batch, concatenated over samples in sample order (mmdetection3d's layout).

    Attributes:
        voxels: ``(V, T, C)`` the points' dtype: each voxel's points in point order, zero padded.
        coors: int32 ``(V, 4)`` ``(b, z, y, x)``.
        num_points: int32 ``(V,)`` points stored per voxel, in ``[1, T]``.
        num_voxels: int64 ``(B,)`` voxels per sample; sample ``b`` holds rows ``[Σ_{<b}, Σ_{≤b})``.
        num_stored: ``Σ num_points`` on the host (read with the voxel count), or None where not known.
        num_found: int64 ``(B,)`` voxels each sample fills before a cap of slots (:func:`hard_voxelize_slots`: more
            than ``num_voxels`` when voxels were cut), or None.
    """

    voxels: torch.Tensor
    coors: torch.Tensor
    num_points: torch.Tensor
    num_voxels: torch.Tensor
    num_stored: int | None = None
    num_found: torch.Tensor | None = None


# ---------------------------------------------------------------------------------------------------- checks
def _check_hard_grid(grid: VoxelGrid) -> None:
    if not isinstance(grid, VoxelGrid):
        raise TypeError(f"grid: expected a VoxelGrid, got {type(grid).__name__}")
    if not grid.is_hard:
        raise ValueError(
            f"grid: hard voxelization needs max_points > 0 and max_voxels > 0, got {grid.max_points} and "
            f"{grid.max_voxels}; use dynamic_voxelize for a dynamic grid"
        )


def _check_cloud(points: torch.Tensor, name: str = "points") -> None:
    if not isinstance(points, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(points).__name__}")
    if points.dim() != 2 or points.shape[1] < 3:
        raise ValueError(f"{name}: expected shape (P, C) with C >= 3 (x, y, z first), got {tuple(points.shape)}")
    if not points.is_floating_point():
        raise ValueError(f"{name}: expected a floating dtype, got {points.dtype}")


def _check_batch(points: RaggedBatch, grid: VoxelGrid) -> None:
    if not isinstance(points, RaggedBatch):
        raise TypeError(f"points: expected a RaggedBatch, got {type(points).__name__}")
    if not isinstance(grid, VoxelGrid):
        raise TypeError(f"grid: expected a VoxelGrid, got {type(grid).__name__}")
    shape = tuple(points.shape)
    if points.num_batch_dims != 1 or len(shape) != 3 or points.ragged_dim != 1 or shape[2] < 3:
        raise ValueError(f"points: expected a (B, P, C) batch ragged in P with C >= 3, got {shape}")
    if not points.tensor.is_floating_point():
        raise ValueError(f"points: expected a floating dtype, got {points.dtype}")


# --------------------------------------------------------------------------------------------- batched path
def _voxel_cells(xyz: torch.Tensor, grid: VoxelGrid) -> tuple[torch.Tensor, torch.Tensor]:
    """Each point's ``(x, y, z)`` cell (int64, 0 where out of range) and whether it is in range (bool)."""
    compute = torch.float64 if xyz.dtype == torch.float64 else torch.float32  # mmcv: T, or float for half
    low = constant(_f32(grid.point_cloud_range[:3]), dtype=compute, device=xyz.device)  # (3,)
    size = constant(_f32(grid.voxel_size), dtype=compute, device=xyz.device)  # (3,)
    extent = constant(grid.grid_size, dtype=compute, device=xyz.device)  # (3,)
    # The divisor is a (3,) tensor on purpose: CUDA turns a division by a CPU scalar into a multiplication
    # by its reciprocal, which rounds differently from the kernel's division.
    cells = torch.floor((xyz.to(compute) - low) / size)  # (..., 3)
    inside = ((cells >= 0) & (cells < extent)).all(dim=-1)  # (...): NaN compares False, so it drops out
    return torch.where(inside.unsqueeze(-1), cells, 0).long(), inside  # (..., 3), (...)


class _Assignment(NamedTuple):
    """Where every point of a batch goes (flat over ``B*P``, in sample-then-point order)."""

    linear: torch.Tensor  # (B*P,) int32/int64 cell id ((b·nz + z)·ny + y)·nx + x; B·nz·ny·nx when out of range
    sample: torch.Tensor  # (B*P,) int64
    rank: torch.Tensor  # (B*P,) position among its voxel's in-range points, in point order
    voxel: torch.Tensor  # (B*P,) per-sample voxel number by first appearance
    keep: torch.Tensor  # (B*P,) bool: stored in a voxel
    head: torch.Tensor  # (B*P,) bool: first point of a kept voxel
    num_voxels: torch.Tensor  # (B,) int64


def _assign(points: RaggedBatch, grid: VoxelGrid) -> _Assignment:
    """Rank and voxel number of every point of the batch: one stable sort, no loop, no sync."""
    data = points.tensor  # (B, P, C)
    num_samples, num_points = data.shape[:2]
    total, device = num_samples * num_points, data.device
    nx, ny, nz = grid.grid_size
    cells, inside = _voxel_cells(data[..., :3], grid)  # (B, P, 3), (B, P)
    inside = (inside & points.mask).flatten()  # (B*P,): padding never lands in a voxel
    sample = torch.arange(num_samples, device=device).view(-1, 1).expand(-1, num_points).flatten()  # (B*P,)
    cells = cells.view(total, 3)  # (B*P, 3)
    linear = ((sample * nz + cells[:, 2]) * ny + cells[:, 1]) * nx + cells[:, 0]  # (B*P,)
    num_cells = num_samples * nz * ny * nx
    key_dtype = torch.int32 if num_cells < 2**31 else torch.int64  # int32 keys sort about twice as fast
    linear = torch.where(inside, linear, num_cells).to(key_dtype)  # (B*P,): out of range sorts last
    sorted_linear, order = torch.sort(linear, stable=True)  # (B*P,): stable keeps a voxel's points in order
    position = torch.arange(total, device=device)  # (B*P,)
    opens = torch.ones(total, dtype=torch.bool, device=device)  # (B*P,)
    opens[1:] = sorted_linear[1:] != sorted_linear[:-1]
    run_start = torch.cummax(torch.where(opens, position, 0), dim=0).values  # (B*P,) sorted position of run start
    rank = torch.empty_like(position).scatter_(0, order, position - run_start)  # (B*P,)
    first = torch.empty_like(position).scatter_(0, order, order[run_start])  # (B*P,) the voxel's first point
    is_first = (rank == 0) & inside  # (B*P,)
    numbering = torch.cumsum(is_first.view(num_samples, num_points), dim=1).flatten() - 1  # (B*P,)
    voxel = numbering[first]  # (B*P,)
    within_cap = voxel < grid.max_voxels  # (B*P,)
    keep = inside & (rank < grid.max_points) & within_cap  # (B*P,)
    num_voxels = is_first.view(num_samples, num_points).sum(dim=1).clamp(max=grid.max_voxels)  # (B,)
    return _Assignment(linear, sample, rank, voxel, keep, is_first & within_cap, num_voxels)


def _write(
    points: RaggedBatch, grid: VoxelGrid, plan: _Assignment, slot: torch.Tensor, num_slots: int, with_sample: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scatter the kept points into ``num_slots`` zero voxels; ``slot`` is each point's voxel row."""
    data = points.tensor  # (B, P, C)
    channels, depth = data.shape[2], grid.max_points
    nx, ny, nz = grid.grid_size
    dump = num_slots  # one spare row takes every write of a dropped point; it is cut off afterwards
    point_row = torch.where(plan.keep, slot * depth + plan.rank, dump * depth)  # (B*P,)
    voxels = data.new_zeros(num_slots * depth + 1, channels)  # (V*T + 1, C)
    voxels = voxels.index_put_((point_row,), data.reshape(-1, channels))  # (V*T + 1, C)
    voxels = voxels[: num_slots * depth].view(num_slots, depth, channels)  # (V, T, C)
    # Each voxel's coordinates come from its first point's cell id, decoded per voxel, not per point.
    cell = plan.linear.new_zeros(num_slots + 1)  # (V + 1,)
    cell = cell.index_put_((torch.where(plan.head, slot, dump),), plan.linear)[:num_slots].long()  # (V,)
    x, y, z = cell % nx, (cell // nx) % ny, (cell // (nx * ny)) % nz  # (V,) each
    columns = [cell // (nx * ny * nz), z, y, x] if with_sample else [z, y, x]
    coors = torch.stack(columns, dim=1).int()  # (V, 4 or 3) (b,) z, y, x; empty padded slots decode to 0
    ones = torch.ones_like(plan.rank, dtype=torch.int32)  # (B*P,)
    counts = ones.new_zeros(num_slots + 1).index_add_(0, torch.where(plan.keep, slot, dump), ones)  # (V + 1,)
    return voxels, coors, counts[:num_slots]  # (V, T, C), (V, 4 or 3), (V,)


def hard_voxelize(points: RaggedBatch, grid: VoxelGrid) -> HardVoxels:
    """Hard-voxelize every sample of a batch in one pass; equals :func:`reference_hard_voxelize_batch`.

    Reads one count from the device (the number of voxels is the output's shape). Use
    :func:`hard_voxelize_padded` for a sync-free, per-sample padded result.

    Args:
        points: float RaggedBatch ``(B, P, C)``, ``x, y, z`` first; padding is ignored.
        grid: a hard grid (``max_points`` and ``max_voxels`` set).

    Returns:
        :class:`HardVoxels`: ``voxels (V, T, C)`` in the points' dtype, ``coors`` int32 ``(V, 4)``
        ``(b, z, y, x)``, ``num_points`` int32 ``(V,)``, ``num_voxels`` int64 ``(B,)``, ``num_stored`` (host
        int, ``Σ num_points``); samples in order, each sample's voxels by first appearance.

    Example:
        >>> grid = VoxelGrid((-50, -50, -5, 50, 50, 3), (0.25, 0.25, 8), max_points=64, max_voxels=30000)
        >>> out = hard_voxelize(RaggedBatch.from_list([torch.randn(1000, 4), torch.randn(10, 4)]), grid)
        >>> out.voxels.shape[1:], out.coors.shape[1]
        (torch.Size([64, 4]), 4)
    """
    _check_batch(points, grid)
    _check_hard_grid(grid)
    plan = _assign(points, grid)
    offsets = torch.cumsum(plan.num_voxels, dim=0) - plan.num_voxels  # (B,)
    # sync: the number of voxels V is the shape of every output; the points stored come in the same read
    num_voxels, num_stored = torch.stack([plan.num_voxels.sum(), plan.keep.sum()]).tolist()
    slot = offsets[plan.sample] + plan.voxel  # (B*P,)
    voxels, coors, counts = _write(points, grid, plan, slot, num_voxels, with_sample=True)
    return HardVoxels(voxels, coors, counts, plan.num_voxels, num_stored)  # (V, T, C), (V, 4), (V,), (B,), int


def hard_voxelize_padded(points: RaggedBatch, grid: VoxelGrid) -> tuple[RaggedBatch, RaggedBatch, RaggedBatch]:
    """Hard voxelization into per-sample padded outputs, without any host sync.

    Sample ``b``'s first ``sizes[b]`` rows are exactly its rows of :func:`hard_voxelize` (coordinates without
    the batch index); the padding is zero.

    Args:
        points: float RaggedBatch ``(B, P, C)``, ``x, y, z`` first.
        grid: a hard grid.

    Returns:
        ``(voxels, coors, num_points)`` RaggedBatches sharing sizes (voxels per sample): ``(B, max_voxels, T,
        C)`` in the points' dtype, int32 ``(B, max_voxels, 3)`` ``(z, y, x)``, int32 ``(B, max_voxels)``.
    """
    _check_batch(points, grid)
    _check_hard_grid(grid)
    plan = _assign(points, grid)
    num_samples, cap = points.shape[0], grid.max_voxels
    slot = plan.sample * cap + plan.voxel  # (B*P,): garbage where not kept, masked in _write
    voxels, coors, counts = _write(points, grid, plan, slot, num_samples * cap, with_sample=False)
    sizes = plan.num_voxels  # (B,)
    return (
        RaggedBatch(voxels.view(num_samples, cap, *voxels.shape[1:]), sizes, validate=False),  # (B, max_voxels, T, C)
        RaggedBatch(coors.view(num_samples, cap, 3), sizes, validate=False),  # (B, max_voxels, 3)
        RaggedBatch(counts.view(num_samples, cap), sizes, validate=False),  # (B, max_voxels)
    )


def voxel_counts(
    points: RaggedBatch, grid: VoxelGrid, *, stored: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """How many voxels each sample fills and how many points the batch stores, on the device (no host read): the
    numbers that size :func:`hard_voxelize`'s outputs, for a caller choosing a static size before
    :func:`hard_voxelize_slots`.

    Without ``stored`` the voxels are counted on an occupancy canvas of the batch's cells (one write per point, no
    sort) when the grid has at most :data:`OCCUPANCY_CELLS` cells per batch; otherwise, and for the stored points
    (which depend on which points each voxel keeps), by :func:`hard_voxelize`'s own assignment (a sort).

    Args:
        points: float RaggedBatch ``(B, P, C)``, ``x, y, z`` first.
        grid: a hard grid.
        stored: also count the stored points (else the second value is None).

    Returns:
        ``(num_voxels, num_stored)``: int64 ``(B,)`` voxels per sample (at most ``max_voxels``) and the int64
        ``()`` total of :attr:`HardVoxels.num_points` (None without ``stored``).
    """
    _check_batch(points, grid)
    _check_hard_grid(grid)
    num_samples = points.shape[0]
    nx, ny, nz = grid.grid_size
    if not stored and num_samples * nx * ny * nz <= OCCUPANCY_CELLS:
        cells, inside = _voxel_cells(points.tensor[..., :3], grid)  # (B, P, 3), (B, P)
        inside = inside & points.mask  # (B, P): padding never lands in a voxel
        return occupied_cells(cells, inside, (nx, ny, nz)).clamp(max=grid.max_voxels), None  # (B,)
    plan = _assign(points, grid)
    return plan.num_voxels, plan.keep.sum() if stored else None  # (B,), ()


def occupied_cells(cells: torch.Tensor, inside: torch.Tensor, grid_size: tuple[int, int, int]) -> torch.Tensor:
    """The distinct cells of each sample: ``cells`` int64 ``(B, P, 3)`` ``(x, y, z)`` where ``inside`` ``(B, P)``,
    marked on a ``(B·nz·ny·nx + 1)`` bool canvas (the last entry takes the points outside) — int64 ``(B,)``."""
    num_samples = cells.shape[0]
    nx, ny, nz = grid_size
    sample = torch.arange(num_samples, device=cells.device).view(-1, 1)  # (B, 1)
    linear = ((sample * nz + cells[..., 2]) * ny + cells[..., 1]) * nx + cells[..., 0]  # (B, P)
    num_cells = num_samples * nz * ny * nx
    linear = torch.where(inside, linear, num_cells).flatten()  # (B·P,)
    canvas = torch.zeros(num_cells + 1, dtype=torch.bool, device=cells.device)  # (B·nz·ny·nx + 1,)
    canvas[linear] = True  # every write is True: the same canvas in any order
    return canvas[:num_cells].view(num_samples, -1).sum(dim=1)  # (B,)


def voxel_count_bound(
    xyz: torch.Tensor, error: torch.Tensor, kept: torch.Tensor, grid: VoxelGrid
) -> torch.Tensor | None:
    """An upper bound of each sample's voxel count (:func:`voxel_counts`) when each point's coordinates are known
    only within ``error`` of ``xyz`` (e.g. a host's replay of a device's float arithmetic): every cell a point may
    fall in is marked (:func:`occupied_cells`), so a point within ``error`` of a cell face counts both cells.
    A cell is ``floor((x − low) / size)`` in float32, a non-decreasing function of ``x``: the cells of every ``x``
    in ``[xyz − error, xyz + error]`` lie between those of the interval's ends, rounded outward to float32. Every
    point marks its lowest cell; the few whose interval crosses a face mark the others too.

    Args:
        xyz: float ``(B, P, 3)`` (float32, or float64 for float64 clouds: the voxelization's arithmetic).
        error: float ``(B, P, 3)``, ``≥ 0``.
        kept: bool ``(B, P)``: the points that may be in the cloud at all (padding and filtered points False).
        grid: a hard grid.

    Returns:
        int64 ``(B,)`` bounds (at most ``max_voxels``), or None where no cheap bound exists: a grid of more than
        :data:`OCCUPANCY_CELLS` cells per batch, or an error reaching across more than two cells of an axis.
    """
    _check_hard_grid(grid)
    num_samples = xyz.shape[0]
    nx, ny, nz = grid.grid_size
    if num_samples * nx * ny * nz > OCCUPANCY_CELLS:
        return None
    compute = torch.float64 if xyz.dtype == torch.float64 else torch.float32  # the voxelization's own arithmetic
    wide, inf = xyz.double(), torch.tensor(math.inf, dtype=compute)
    low = torch.nextafter((wide - error).to(compute), -inf)  # (B, P, 3): ≤ xyz − error
    high = torch.nextafter((wide + error).to(compute), inf)  # (B, P, 3): ≥ xyz + error
    first, last = _raw_cells(low, grid), _raw_cells(high, grid)  # (B, P, 3) int32: the cells of the interval's ends
    extent = torch.tensor(grid.grid_size, dtype=torch.int32, device=xyz.device)  # (3,)
    maybe = kept & ((last >= 0) & (first < extent)).all(dim=-1)  # (B, P): may land in the grid
    first, last = first.clamp(min=0), torch.minimum(last, extent - 1)  # (B, P, 3)
    span = torch.where(maybe.unsqueeze(-1), last - first, 0)  # (B, P, 3)
    reach = span.amax(dim=(0, 1)).tolist() if maybe.numel() else [0, 0, 0]  # host tensors: no device read
    if max(reach) > 1:
        return None
    sample = torch.arange(num_samples, device=xyz.device).view(-1, 1).expand_as(maybe)  # (B, P)
    samples, cells = [sample[maybe]], [first[maybe]]  # (N,), (N, 3): every possible point's lowest cell
    edge = maybe & (span > 0).any(dim=-1)  # (B, P): intervals that cross a face
    low_edge, high_edge, edge_sample = first[edge], last[edge], sample[edge]  # (K, 3), (K, 3), (K,)
    for offset in itertools.product(*(range(r + 1) for r in reach)):
        if any(offset):
            step = torch.tensor(offset, dtype=torch.int32, device=xyz.device)  # (3,)
            samples.append(edge_sample)
            cells.append(torch.minimum(low_edge + step, high_edge))  # (K, 3): a corner of the point's cells
    flat = torch.cat(cells).long()  # (M, 3)
    linear = ((torch.cat(samples) * nz + flat[:, 2]) * ny + flat[:, 1]) * nx + flat[:, 0]  # (M,)
    canvas = torch.zeros(num_samples * nz * ny * nx, dtype=torch.bool, device=xyz.device)  # (B·nz·ny·nx,)
    canvas[linear] = True
    return canvas.view(num_samples, -1).sum(dim=1).clamp(max=grid.max_voxels)  # (B,)


def _raw_cells(xyz: torch.Tensor, grid: VoxelGrid) -> torch.Tensor:
    """Each point's cell as :func:`_voxel_cells` computes it (``floor((x − low) / size)`` in ``xyz``'s float32 or
    float64), unclipped, int32 (NaN and −inf as −1, +inf and beyond as 2³⁰)."""
    low = constant(_f32(grid.point_cloud_range[:3]), dtype=xyz.dtype, device=xyz.device)  # (3,)
    size = constant(_f32(grid.voxel_size), dtype=xyz.dtype, device=xyz.device)  # (3,)
    cells = torch.floor((xyz - low) / size)  # (..., 3)
    return cells.nan_to_num_(nan=-1.0, posinf=2.0**30, neginf=-1.0).clamp_(-1, 2**30).int()  # (..., 3)


def hard_voxelize_slots(points: RaggedBatch, grid: VoxelGrid, voxels_per_sample: int) -> HardVoxels:
    """Hard voxelization into ``voxels_per_sample`` slots per sample, at static shapes and without any host sync.

    Sample ``b``'s voxels fill rows ``b·V_s … b·V_s + num_voxels[b] − 1`` (``V_s = voxels_per_sample``) in the
    order of :func:`hard_voxelize`, which they equal row for row when ``V_s`` holds every sample's voxel count
    (:func:`voxel_counts`); a sample with more keeps its first ``V_s``. The other rows are zero (``num_points``
    0, ``coors`` 0): the caller masks them with ``arange(V_s) < num_voxels[b]``.

    Args:
        points: float RaggedBatch ``(B, P, C)``, ``x, y, z`` first.
        grid: a hard grid.
        voxels_per_sample: ``V_s``, slots per sample (``1 ≤ V_s``; ``max_voxels`` holds every sample).

    Returns:
        :class:`HardVoxels` with ``B·V_s`` rows: ``voxels (B·V_s, T, C)``, int32 ``coors (B·V_s, 4)``
        ``(b, z, y, x)``, int32 ``num_points (B·V_s,)``, int64 ``num_voxels (B,)`` (at most ``V_s``),
        ``num_stored`` None and int64 ``num_found (B,)``: the voxels before the cap (a caller's guard that none was
        cut: ``num_found ≤ V_s``).
    """
    _check_batch(points, grid)
    _check_hard_grid(grid)
    if voxels_per_sample < 1:
        raise ValueError(f"voxels_per_sample: expected >= 1, got {voxels_per_sample}")
    plan = _assign(points, grid)
    fits = plan.voxel < voxels_per_sample  # (B*P,)
    plan = plan._replace(keep=plan.keep & fits, head=plan.head & fits)
    slot = plan.sample * voxels_per_sample + plan.voxel  # (B*P,): garbage where not kept, masked in _write
    slots = points.shape[0] * voxels_per_sample
    voxels, coors, counts = _write(points, grid, plan, slot, slots, with_sample=True)
    return HardVoxels(voxels, coors, counts, plan.num_voxels.clamp(max=voxels_per_sample), None, plan.num_voxels)


def dynamic_voxelize(points: RaggedBatch, grid: VoxelGrid, *, with_batch_index: bool = True) -> RaggedBatch:
    """Every point's voxel, ``−1`` out of range (mmcv dynamic voxelization), for the batch at once, no sync.

    Args:
        points: float RaggedBatch ``(B, P, C)``, ``x, y, z`` first.
        grid: any grid (the caps are not used).
        with_batch_index: prepend the sample index as mmdetection3d does (``(b, −1, −1, −1)`` out of range).

    Returns:
        int32 RaggedBatch ``(B, P, 4)`` ``(b, z, y, x)`` (``(B, P, 3)`` without the batch index) with the
        points' sizes; padding rows are all ``−1``, so the flattened tensor can go to :func:`scatter_points`.
    """
    _check_batch(points, grid)
    data = points.tensor  # (B, P, C)
    cells, inside = _voxel_cells(data[..., :3], grid)  # (B, P, 3), (B, P)
    zyx = torch.where(inside.unsqueeze(-1), cells.flip(-1), -1)  # (B, P, 3)
    if with_batch_index:
        sample = torch.arange(data.shape[0], device=data.device).view(-1, 1, 1).expand(*zyx.shape[:2], 1)  # (B, P, 1)
        zyx = torch.cat([sample, zyx], dim=-1)  # (B, P, 4)
    coors = torch.where(points.mask.unsqueeze(-1), zyx, -1).int()  # (B, P, 4 or 3)
    return points.with_tensor(coors)


def _check_scatter(feats: torch.Tensor, coors: torch.Tensor, reduce: str) -> None:
    if reduce not in _REDUCTIONS:
        raise ValueError(f"reduce: expected one of {_REDUCTIONS}, got {reduce!r}")
    if feats.dim() != 2 or not feats.is_floating_point():
        raise ValueError(f"feats: expected a float (P, C) tensor, got {feats.dtype} {tuple(feats.shape)}")
    if coors.dim() != 2 or coors.shape[0] != feats.shape[0] or coors.is_floating_point() or coors.dtype == torch.bool:
        raise ValueError(f"coors: expected an int (P, D) tensor with P = {feats.shape[0]}, got {tuple(coors.shape)}")


def scatter_points(
    feats: torch.Tensor, coors: torch.Tensor, reduce: str = "max"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reduce point features per voxel (mmcv ``DynamicScatter``) for any number of samples at once.

    Rows of ``coors`` with a negative entry belong to no voxel. The voxels are the distinct remaining rows,
    sorted lexicographically; with a leading batch column this is mmdetection3d's per-sample result,
    concatenated. One host sync (the number of voxels); differentiable in ``feats``.

    Args:
        feats: float ``(P, C)``.
        coors: int ``(P, D)`` voxel coordinates, e.g. ``(b, z, y, x)`` from :func:`dynamic_voxelize`
            flattened, or ``(z, y, x)``. Their product of extents must fit in int64.
        reduce: ``"max"``, ``"sum"`` or ``"mean"``.

    Returns:
        ``voxel_feats (V, C)`` in ``feats``' dtype, ``voxel_coors (V, D)`` in ``coors``' dtype, and
        ``point2voxel`` int64 ``(P,)``: each point's voxel row, ``−1`` for none.
    """
    _check_scatter(feats, coors, reduce)
    num_points, channels = feats.shape
    device = feats.device
    if num_points == 0:
        return feats.new_zeros(0, channels), coors.new_zeros(0, coors.shape[1]), coors.new_zeros(0).long()
    rows = coors.long()  # (P, D)
    valid = (rows >= 0).all(dim=1)  # (P,)
    extent = rows.amax(dim=0).clamp(min=0) + 1  # (D,)
    stride = torch.cumprod(torch.cat([extent[1:], extent.new_ones(1)]).flip(0), dim=0).flip(0)  # (D,)
    key = torch.where(valid, (rows * stride).sum(dim=1), -1)  # (P,): lexicographic rank of the row
    sorted_key, order = torch.sort(key, stable=True)  # (P,)
    opens = torch.ones(num_points, dtype=torch.bool, device=device)  # (P,)
    opens[1:] = sorted_key[1:] != sorted_key[:-1]
    opens &= sorted_key >= 0
    numbering = torch.cumsum(opens, dim=0) - 1  # (P,)
    num_voxels = int(opens.sum())  # sync: the number of voxels V is the shape of every output
    point2voxel = torch.empty_like(order).scatter_(0, order, torch.where(sorted_key >= 0, numbering, -1))  # (P,)
    target = torch.where(valid, point2voxel, num_voxels)  # (P,): the spare row V collects the dropped points
    voxel_coors = coors.new_zeros(num_voxels + 1, coors.shape[1])  # (V + 1, D)
    voxel_coors = voxel_coors.index_put_((torch.where(opens, numbering, num_voxels),), coors[order])[:num_voxels]
    if reduce == "max":
        index = target.unsqueeze(1).expand(num_points, channels)  # (P, C)
        peak = feats.new_full((num_voxels + 1, channels), -math.inf)  # (V + 1, C)
        peak = peak.scatter_reduce(0, index, feats.detach(), reduce="amax")  # (V + 1, C)
        position = torch.arange(num_points, device=device).unsqueeze(1)  # (P, 1)
        candidate = torch.where(feats.detach() == peak[target], position, num_points)  # (P, C)
        source = torch.full_like(peak, num_points, dtype=torch.long)  # (V + 1, C)
        source = source.scatter_reduce(0, index, candidate, reduce="amin")  # (V + 1, C)
        source = source[:num_voxels]  # (V, C): first point holding the max, where mmcv sends the gradient
        picked = feats.gather(0, source.clamp(max=num_points - 1))  # (V, C)
        return torch.where(source < num_points, picked, peak[:num_voxels]), voxel_coors, point2voxel  # NaN: peak
    total = feats.new_zeros(num_voxels + 1, channels).index_add(0, target, feats)[:num_voxels]  # (V, C)
    if reduce == "mean":
        count = feats.new_zeros(num_voxels + 1).index_add_(0, target, feats.new_ones(num_points))  # (V + 1,)
        total = total / count[:num_voxels].unsqueeze(1)  # (V, C)
    return total, voxel_coors, point2voxel


def _check_bev(pillar_feats: torch.Tensor, coors: torch.Tensor, batch_size: int, grid: VoxelGrid) -> None:
    if pillar_feats.dim() != 2:
        raise ValueError(f"pillar_feats: expected shape (V, C), got {tuple(pillar_feats.shape)}")
    if coors.dim() != 2 or coors.shape != (pillar_feats.shape[0], 4):
        raise ValueError(f"coors: expected shape ({pillar_feats.shape[0]}, 4) (b, z, y, x), got {tuple(coors.shape)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
        raise ValueError(f"batch_size: expected an int >= 0, got {batch_size!r}")
    if not isinstance(grid, VoxelGrid) or grid.grid_size[2] != 1:
        raise ValueError(f"grid: a BEV scatter needs a pillar grid (nz == 1), got {grid!r}")


def scatter_to_bev(pillar_feats: torch.Tensor, coors: torch.Tensor, batch_size: int, grid: VoxelGrid) -> torch.Tensor:
    """Write every pillar of the batch into its BEV cell with one indexed write (``PointPillarsScatter``).

    Args:
        pillar_feats: ``(V, C)`` pillar features (gradients flow back to them).
        coors: int ``(V, 4)`` ``(b, z, y, x)`` valid pillar coordinates, unique per ``(b, y, x)``.
        batch_size: number of samples ``B``.
        grid: the pillar grid (``nz == 1``) giving ``(nx, ny)``.

    Returns:
        ``(B, C, ny, nx)`` canvas in ``pillar_feats``' dtype, zero where no pillar is.
    """
    _check_bev(pillar_feats, coors, batch_size, grid)
    nx, ny, _ = grid.grid_size
    channels = pillar_feats.shape[1]
    canvas = pillar_feats.new_zeros(batch_size, channels, ny * nx)  # (B, C, ny*nx)
    cell = coors[:, 2].long() * nx + coors[:, 3].long()  # (V,)
    canvas[coors[:, 0].long(), :, cell] = pillar_feats  # the two indexed dims lead: (V, C) = pillar_feats
    return canvas.view(batch_size, channels, ny, nx)  # (B, C, ny, nx)


def per_sample_hard_voxelize(points: Sequence[torch.Tensor], grid: VoxelGrid) -> HardVoxels:
    """The vectorised path run once per sample, then concatenated: the baseline that times the batching.

    Args:
        points: per sample a float ``(P_b, C)`` cloud.
        grid: a hard grid.

    Returns:
        :class:`HardVoxels`, equal to :func:`hard_voxelize` of the padded batch (one sync per sample).
    """
    if len(points) == 0:
        raise ValueError("points: needs at least one sample")
    parts = []
    for b, cloud in enumerate(points):
        _check_cloud(cloud, f"points[{b}]")
        single = hard_voxelize(RaggedBatch.from_dense(cloud.unsqueeze(0)), grid)
        parts.append((single, single.coors.new_full((single.coors.shape[0], 1), b)))
    return HardVoxels(
        torch.cat([p.voxels for p, _ in parts]),  # (V, T, C)
        torch.cat([torch.cat([index, p.coors[:, 1:]], dim=1) for p, index in parts]),  # (V, 4)
        torch.cat([p.num_points for p, _ in parts]),  # (V,)
        torch.cat([p.num_voxels for p, _ in parts]),  # (B,)
        sum(p.num_stored or 0 for p, _ in parts),
    )


# ---------------------------------------------------------------------------------------- reference path
def _reference_cells(points: torch.Tensor, grid: VoxelGrid) -> np.ndarray:
    """The kernel's first pass (``dynamic_voxelize_forward_cpu_kernel``) in numpy: int64 ``(P, 3)`` z, y, x.

    Elementwise ``floor((p − min) / size)`` in float32 (float64 for float64 points) with float32 range and
    size; a point failing the ``0 ≤ c < n`` check on any axis gets ``−1`` on every axis.
    """
    dtype = np.float64 if points.dtype == torch.float64 else np.float32
    xyz = points[:, :3].detach().cpu().to(torch.float64 if dtype is np.float64 else torch.float32).numpy()
    low = np.asarray(_f32(grid.point_cloud_range[:3]), dtype=np.float32).astype(dtype)
    size = np.asarray(_f32(grid.voxel_size), dtype=np.float32).astype(dtype)
    with np.errstate(invalid="ignore"):
        cells = np.floor((xyz - low) / size)
        inside = ((cells >= 0) & (cells < np.asarray(grid.grid_size))).all(axis=1)
    out = np.full((xyz.shape[0], 3), -1, dtype=np.int64)
    out[inside] = cells[inside][:, ::-1].astype(np.int64)
    return out


def reference_dynamic_voxelize(points: torch.Tensor, grid: VoxelGrid) -> torch.Tensor:
    """One sample's per-point voxel, as mmcv's ``dynamic_voxelize_forward_cpu`` (``voxelization.cpp``).

    Args:
        points: float ``(P, C)``, ``x, y, z`` first.
        grid: any grid.

    Returns:
        int32 ``(P, 3)`` ``(z, y, x)``, ``−1`` on every axis when out of range.
    """
    _check_cloud(points)
    return torch.from_numpy(_reference_cells(points, grid)).int().to(points.device)


def reference_dynamic_voxelize_batch(points: Sequence[torch.Tensor], grid: VoxelGrid) -> torch.Tensor:
    """Per sample :func:`reference_dynamic_voxelize`, batch index prepended, concatenated (mmdetection3d).

    Returns:
        int32 ``(ΣP, 4)`` ``(b, z, y, x)``.
    """
    return torch.cat([F.pad(reference_dynamic_voxelize(p, grid), (1, 0), value=b) for b, p in enumerate(points)])


def reference_hard_voxelize(points: torch.Tensor, grid: VoxelGrid) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sample, point by point, as mmcv's ``hard_voxelize_forward_cpu_kernel`` (``voxelization.cpp``).

    The first pass computes every point's cell (``dynamic_voxelize_forward_cpu_kernel``); then, in point
    order: skip out-of-range points; look the cell up, and if it has no voxel yet, skip the point when
    ``max_voxels`` voxels exist, else open the next voxel with this cell; append the point while the voxel
    holds fewer than ``max_points``. The wrapper (``_Voxelization.forward`` in ``mmcv/ops/voxelize.py``) then
    keeps the first ``voxel_num`` rows.

    Args:
        points: float ``(P, C)``, ``x, y, z`` first.
        grid: a hard grid.

    Returns:
        ``voxels (V, T, C)`` in the points' dtype (zero padded), ``coors`` int32 ``(V, 3)`` ``(z, y, x)``,
        ``num_points`` int32 ``(V,)``.
    """
    _check_cloud(points)
    _check_hard_grid(grid)
    cells = _reference_cells(points, grid).tolist()
    voxel_of_cell: dict[tuple[int, int, int], int] = {}  # the kernel's coor_to_voxelidx
    voxel_cells: list[tuple[int, int, int]] = []
    counts: list[int] = []
    dest_voxel, dest_slot, source = [], [], []
    for i, (z, y, x) in enumerate(cells):
        if z == -1:
            continue
        voxel = voxel_of_cell.get((z, y, x), -1)
        if voxel == -1:
            if len(voxel_cells) >= grid.max_voxels:
                continue
            voxel = len(voxel_cells)
            voxel_of_cell[(z, y, x)] = voxel
            voxel_cells.append((z, y, x))
            counts.append(0)
        if counts[voxel] < grid.max_points:
            dest_voxel.append(voxel)
            dest_slot.append(counts[voxel])
            source.append(i)
            counts[voxel] += 1
    device = points.device
    voxels = points.new_zeros(len(voxel_cells), grid.max_points, points.shape[1])
    voxels[torch.tensor(dest_voxel, dtype=torch.long), torch.tensor(dest_slot, dtype=torch.long)] = points[
        torch.tensor(source, dtype=torch.long, device=device)
    ]
    coors = torch.tensor(voxel_cells, dtype=torch.int32).view(-1, 3).to(device)
    return voxels, coors, torch.tensor(counts, dtype=torch.int32, device=device)


def reference_hard_voxelize_batch(points: Sequence[torch.Tensor], grid: VoxelGrid) -> HardVoxels:
    """Per sample :func:`reference_hard_voxelize`, batch index prepended, concatenated.

    As mmdetection3d's ``Det3DDataPreprocessor.voxelize`` (``voxel_type='hard'``): ``F.pad(coors, (1, 0),
    value=i)`` per sample, then ``torch.cat``.

    Returns:
        :class:`HardVoxels` (``coors`` int32 ``(V, 4)`` ``(b, z, y, x)``).
    """
    if len(points) == 0:
        raise ValueError("points: needs at least one sample")
    voxels, coors, num_points = [], [], []
    for b, cloud in enumerate(points):
        v, c, n = reference_hard_voxelize(cloud, grid)
        voxels.append(v)
        coors.append(F.pad(c, (1, 0), mode="constant", value=b))
        num_points.append(n)
    num_voxels = torch.tensor([v.shape[0] for v in voxels], dtype=torch.int64, device=points[0].device)
    return HardVoxels(torch.cat(voxels), torch.cat(coors), torch.cat(num_points), num_voxels)


def _reference_scatter_single(
    feats: torch.Tensor, coors: torch.Tensor, reduce: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mmcv's ``DynamicPointToVoxelForwardCUDAKernelLauncher`` step by step, the reduction per voxel."""
    if feats.shape[0] == 0:
        return feats.clone(), coors.clone(), coors.new_zeros(0).long()
    clean = coors.masked_fill((coors < 0).any(dim=-1, keepdim=True), -1)
    out_coors, point2voxel, _ = torch.unique(clean, dim=0, sorted=True, return_inverse=True, return_counts=True)
    if out_coors[0, 0] < 0:  # the (-1, ..., -1) row of the dropped points
        out_coors, point2voxel = out_coors[1:], point2voxel - 1
    reduced = []
    for v in range(out_coors.shape[0]):
        members = feats[point2voxel == v]
        if reduce == "max":
            peak = members.detach().amax(dim=0)
            first = (members.detach() == peak).int().argmax(dim=0)  # first point at the max gets the gradient
            reduced.append(members.gather(0, first.unsqueeze(0)).squeeze(0))
        elif reduce == "sum":
            reduced.append(members.sum(dim=0))
        else:
            reduced.append(members.sum(dim=0) / members.shape[0])
    voxel_feats = torch.stack(reduced) if reduced else feats.new_zeros(0, feats.shape[1])
    return voxel_feats, out_coors, point2voxel.long()


def reference_scatter_points(
    feats: torch.Tensor, coors: torch.Tensor, reduce: str = "max"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mmcv ``DynamicScatter.forward``: one sample for 3 coordinate columns, else a loop over batch indices.

    As mmcv, the batch size is ``coors[-1, 0] + 1`` (rows grouped by ascending sample, as mmdetection3d
    builds them). Each sample follows the CUDA launcher (``scatter_points_cuda.cu``): rows with a negative
    entry become ``−1``, ``unique(dim=0)`` sorts the rows and the ``−1`` row is dropped.

    Args:
        feats: float ``(P, C)``.
        coors: int ``(P, 3)`` ``(z, y, x)`` or ``(P, 4)`` ``(b, z, y, x)``.
        reduce: ``"max"``, ``"sum"`` or ``"mean"``.

    Returns:
        ``voxel_feats (V, C)``, ``voxel_coors (V, D)``, ``point2voxel`` int64 ``(P,)`` (``−1``: none).
    """
    _check_scatter(feats, coors, reduce)
    if coors.shape[1] != 4:
        return _reference_scatter_single(feats, coors, reduce)
    point2voxel = coors.new_full((coors.shape[0],), -1).long()
    voxel_feats, voxel_coors, offset = [], [], 0
    batch_size = int(coors[-1, 0]) + 1 if coors.shape[0] else 0
    for i in range(batch_size):
        (inds,) = torch.where(coors[:, 0] == i)
        feats_i, coors_i, map_i = _reference_scatter_single(feats[inds], coors[inds][:, 1:], reduce)
        voxel_feats.append(feats_i)
        voxel_coors.append(F.pad(coors_i, (1, 0), mode="constant", value=i))
        point2voxel[inds] = torch.where(map_i >= 0, map_i + offset, -1)
        offset += feats_i.shape[0]
    if not voxel_feats:
        return feats.new_zeros(0, feats.shape[1]), coors.new_zeros(0, 4), point2voxel
    return torch.cat(voxel_feats), torch.cat(voxel_coors), point2voxel


def reference_scatter_to_bev(
    pillar_feats: torch.Tensor, coors: torch.Tensor, batch_size: int, grid: VoxelGrid
) -> torch.Tensor:
    """mmdetection3d ``PointPillarsScatter.forward_batch``: per sample a zero canvas and ``canvas[:, y·nx + x]``.

    Args:
        pillar_feats: ``(V, C)``.
        coors: int ``(V, 4)`` ``(b, z, y, x)``.
        batch_size: number of samples.
        grid: the pillar grid giving ``(nx, ny)``.

    Returns:
        ``(B, C, ny, nx)``.
    """
    _check_bev(pillar_feats, coors, batch_size, grid)
    nx, ny, _ = grid.grid_size
    channels = pillar_feats.shape[1]
    canvases = []
    for b in range(batch_size):
        canvas = pillar_feats.new_zeros(channels, nx * ny)
        mask = coors[:, 0] == b
        these = coors[mask, :]
        indices = (these[:, 2] * nx + these[:, 3]).long()
        canvas[:, indices] = pillar_feats[mask, :].t()
        canvases.append(canvas)
    if not canvases:
        return pillar_feats.new_zeros(0, channels, ny, nx)
    return torch.stack(canvases, 0).view(batch_size, channels, ny, nx)
