"""Tests for drivetrain.pipeline.voxelize: the batched voxelization, dynamic scatter and BEV scatter against the
per-sample references after mmcv / mmdetection3d, hand-worked examples, grid validation and host syncs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drivetrain.pipeline import voxelize
from drivetrain.pipeline.voxelize import (
    HardVoxels,
    VoxelGrid,
    dynamic_voxelize,
    hard_voxelize,
    hard_voxelize_padded,
    hard_voxelize_slots,
    per_sample_hard_voxelize,
    reference_dynamic_voxelize,
    reference_dynamic_voxelize_batch,
    reference_hard_voxelize,
    reference_hard_voxelize_batch,
    reference_scatter_points,
    reference_scatter_to_bev,
    scatter_points,
    scatter_to_bev,
    voxel_counts,
)
from drivetrain.ragged import RaggedBatch
from helpers.nosync import count_host_syncs, no_host_sync

GRIDS = {
    # 8 × 8 × 4 cells, small caps: voxels overflow max_points and samples overflow max_voxels
    "cube": VoxelGrid((-2, -3, -1, 2, 3, 1), (0.5, 0.75, 0.5), max_points=5, max_voxels=60),
    # 32 × 32 × 1 pillars, as PointPillars (caps rarely bind on voxels, often on points)
    "pillars": VoxelGrid((-4, -4, -2, 4, 4, 2), (0.25, 0.25, 4), max_points=4, max_voxels=3000),
    # sizes that do not divide the range (float32 rounding; z rounds up to 3 cells, past z_max)
    "rounded": VoxelGrid((-1.1, -0.7, -0.3, 1.3, 0.9, 0.5), (0.1, 0.2, 0.3), max_points=3, max_voxels=100),
}
FULL = VoxelGrid((-50, -50, -5, 50, 50, 3), (0.25, 0.25, 8), max_points=64, max_voxels=30000)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(2024)


# ----------------------------------------------------------------------------------------------- helpers
def make_cloud(
    gen: torch.Generator, grid: VoxelGrid, num: int, dtype: torch.dtype, channels: int, kind: str = "mixed"
) -> torch.Tensor:
    """A random cloud: out-of-range points, a crowded voxel, duplicates and points exactly on the bounds."""
    if kind == "empty":
        return torch.zeros(0, channels, dtype=dtype)
    low = torch.tensor(grid.point_cloud_range[:3], dtype=torch.float64)
    high = torch.tensor(grid.point_cloud_range[3:], dtype=torch.float64)
    span = high - low
    xyz = low - 0.2 * span + 1.4 * span * torch.rand(num, 3, generator=gen, dtype=torch.float64)  # (P, 3)
    extra = torch.rand(num, channels - 3, generator=gen, dtype=torch.float64)  # (P, C - 3)
    if kind == "outside":
        xyz[:, 0] = high[0] + 1 + torch.rand(num, generator=gen, dtype=torch.float64)
    else:
        size = torch.tensor(grid.voxel_size, dtype=torch.float64)
        crowd = torch.randperm(num, generator=gen)[: 3 * grid.max_points]  # one voxel gets 3 × max_points
        xyz[crowd] = low + 1.5 * size + 0.4 * size * torch.rand(len(crowd), 3, generator=gen, dtype=torch.float64)
        bounds = torch.stack([low, high, low.float().double(), high.float().double()])  # (4, 3) incl. float32
        edge = torch.randperm(num, generator=gen)[: num // 10]
        axis = torch.randint(0, 3, (len(edge),), generator=gen)
        which = torch.randint(0, 4, (len(edge),), generator=gen)
        xyz[edge, axis] = bounds[which, axis]
        snap = torch.randperm(num, generator=gen)[: num // 5]  # on cell faces, where the rounding decides
        snapped = low + size * torch.floor((xyz[snap] - low) / size)  # (S, 3)
        axis = torch.randint(0, 3, (len(snap),), generator=gen)
        xyz[snap, axis] = snapped[torch.arange(len(snap)), axis]
    cloud = torch.cat([xyz, extra], dim=1).to(dtype)  # (P, C)
    if kind != "outside":
        source = torch.randint(0, num, (num // 8,), generator=gen)
        target = torch.randint(0, num, (num // 8,), generator=gen)
        cloud[target] = cloud[source]  # exact duplicates (same cell, same features)
    return cloud


def make_batch(gen: torch.Generator, grid: VoxelGrid, dtype: torch.dtype, channels: int, num_samples: int):
    kinds = [("mixed", 600), ("empty", 0), ("outside", 40), ("mixed", 900)] if num_samples == 4 else [("mixed", 800)]
    return [make_cloud(gen, grid, num, dtype, channels, kind) for kind, num in kinds]


def assert_same_voxels(actual: HardVoxels, expected: HardVoxels) -> None:
    for name in ("voxels", "coors", "num_points", "num_voxels"):
        a, e = getattr(actual, name), getattr(expected, name)
        assert a.dtype == e.dtype, name
        assert torch.equal(a, e), name
    if actual.num_stored is not None:  # the host count read with the voxel count
        assert actual.num_stored == int(actual.num_points.sum())


# --------------------------------------------------------------------------------- hard: batched = reference
@pytest.mark.parametrize("num_samples, channels", [(1, 4), (4, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("grid_name", sorted(GRIDS))
def test_hard_voxelize_matches_mmcv_reference_loop(gen, grid_name, dtype, num_samples, channels):
    grid = GRIDS[grid_name]
    clouds = make_batch(gen, grid, dtype, channels, num_samples)
    expected = reference_hard_voxelize_batch(clouds, grid)
    assert_same_voxels(hard_voxelize(RaggedBatch.from_list(clouds), grid), expected)
    assert_same_voxels(per_sample_hard_voxelize(clouds, grid), expected)


def test_random_clouds_exercise_every_cap_and_bound(gen):
    grid = GRIDS["cube"]
    clouds = make_batch(gen, grid, torch.float32, 4, 4)
    out = reference_hard_voxelize_batch(clouds, grid)
    assert out.num_voxels.tolist()[1:3] == [0, 0]  # the empty and the all-out-of-range samples
    assert (out.num_voxels[[0, 3]] == grid.max_voxels).all()  # both clouds hit max_voxels
    assert int(out.num_points.max()) == grid.max_points  # and some voxel is full
    cells = reference_dynamic_voxelize(clouds[0], grid)
    assert (cells[:, 0] == -1).any() and (cells[:, 2] == 0).any() and (cells[:, 2] == grid.grid_size[0] - 1).any()


def test_padded_voxelize_matches_the_flat_rows(gen):
    grid = GRIDS["cube"]
    clouds = make_batch(gen, grid, torch.float32, 4, 4)
    flat = hard_voxelize(RaggedBatch.from_list(clouds), grid)
    voxels, coors, num_points = hard_voxelize_padded(RaggedBatch.from_list(clouds), grid)
    assert voxels.shape == (4, grid.max_voxels, grid.max_points, 4)
    assert torch.equal(voxels.sizes, flat.num_voxels)
    assert torch.equal(torch.cat(voxels.to_list()), flat.voxels)
    assert torch.equal(torch.cat(coors.to_list()), flat.coors[:, 1:])
    assert torch.equal(torch.cat(num_points.to_list()), flat.num_points)
    assert not voxels.tensor[~voxels.mask].any() and not num_points.tensor[~num_points.mask].any()  # zero padding


@pytest.mark.parametrize("extra", [0, 7], ids=["tight", "loose"])
def test_slot_voxelize_matches_the_flat_rows_at_any_cap_holding_every_sample(gen, extra):
    grid = GRIDS["cube"]
    batch = RaggedBatch.from_list(make_batch(gen, grid, torch.float32, 4, 4))
    flat = hard_voxelize(batch, grid)
    num_voxels, num_stored = voxel_counts(batch, grid)
    assert torch.equal(num_voxels, flat.num_voxels) and int(num_stored) == flat.num_stored
    cap = int(num_voxels.max()) + extra
    out = hard_voxelize_slots(batch, grid, cap)
    real = (torch.arange(cap) < num_voxels[:, None]).flatten()  # (B·cap,)
    assert out.voxels.shape[0] == 4 * cap and torch.equal(out.num_voxels, flat.num_voxels)
    assert torch.equal(out.voxels[real], flat.voxels) and torch.equal(out.coors[real], flat.coors)
    assert torch.equal(out.num_points[real], flat.num_points)
    assert not out.voxels[~real].any() and not out.num_points[~real].any()  # zero slots


@pytest.mark.parametrize("grid_name", sorted(GRIDS))
@pytest.mark.parametrize("canvas", [True, False], ids=["occupancy", "sorted"])
def test_voxel_counts_without_stored_points_equal_the_voxelization(gen, monkeypatch, grid_name, canvas):
    # the occupancy canvas and the sort count the same voxels, the max_voxels cap, empty, out-of-range and NaN samples
    grid = GRIDS[grid_name]
    clouds = make_batch(gen, grid, torch.float32, 4, 4)
    clouds[0][:7, 1] = float("nan")  # NaN compares False: in no voxel
    batch = RaggedBatch.from_list(clouds)
    if not canvas:
        monkeypatch.setattr(voxelize, "OCCUPANCY_CELLS", 0)
    num_voxels, stored = voxel_counts(batch, grid, stored=False)
    assert stored is None and num_voxels.dtype == torch.int64
    assert torch.equal(num_voxels, reference_hard_voxelize_batch(clouds, grid).num_voxels)


def test_slot_voxelize_below_the_counts_keeps_each_samples_first_voxels(gen):
    grid = GRIDS["cube"]
    batch = RaggedBatch.from_list(make_batch(gen, grid, torch.float32, 4, 4))
    flat = hard_voxelize(batch, grid)
    out = hard_voxelize_slots(batch, grid, 3)
    assert out.num_voxels.tolist() == flat.num_voxels.clamp(max=3).tolist()
    first = torch.cat([torch.arange(3) + start for start in (flat.num_voxels.cumsum(0) - flat.num_voxels).tolist()])
    kept = torch.cat([torch.arange(3) < n for n in flat.num_voxels.tolist()])  # (B·3,)
    assert torch.equal(out.voxels[kept], flat.voxels[first[kept]])
    with pytest.raises(ValueError, match=r"^voxels_per_sample: expected >= 1, got 0$"):
        hard_voxelize_slots(batch, grid, 0)


def test_padding_points_are_never_voxelized(gen):
    grid = GRIDS["pillars"]
    clouds = [make_cloud(gen, grid, 50, torch.float32, 4), make_cloud(gen, grid, 300, torch.float32, 4)]
    batch = RaggedBatch.from_list(clouds)
    garbage = batch.tensor.clone()
    garbage[0, 50:] = clouds[0][0]  # padding full of in-range points
    assert_same_voxels(hard_voxelize(batch.with_tensor(garbage), grid), reference_hard_voxelize_batch(clouds, grid))


def test_float16_points_voxelize_like_the_reference(gen):
    grid = GRIDS["rounded"]
    clouds = make_batch(gen, grid, torch.float16, 4, 4)
    assert_same_voxels(hard_voxelize(RaggedBatch.from_list(clouds), grid), reference_hard_voxelize_batch(clouds, grid))


def test_batch_of_only_empty_samples_gives_no_voxels():
    grid = GRIDS["cube"]
    out = hard_voxelize(RaggedBatch.from_list([torch.zeros(0, 4), torch.zeros(0, 4)]), grid)
    assert out.voxels.shape == (0, grid.max_points, 4) and out.coors.shape == (0, 4)
    assert out.num_voxels.tolist() == [0, 0]


# ------------------------------------------------------------------------------------- hard: by hand
HAND_GRID = VoxelGrid((0, 0, 0, 4, 4, 1), (1, 1, 1), max_points=2, max_voxels=3)
HAND_POINTS = torch.tensor(
    [
        [0.5, 0.5, 0.5, 10],  # voxel 0 (z 0, y 0, x 0)
        [1.5, 0.2, 0.1, 11],  # voxel 1 (0, 0, 1)
        [0.1, 0.9, 0.9, 12],  # voxel 0, second point
        [4.0, 1.0, 0.5, 13],  # x == x_max: out of range
        [0.0, 0.0, 0.0, 14],  # on the minimum corner: voxel 0, third point, over max_points: dropped
        [3.5, 3.5, 0.5, 15],  # voxel 2 (0, 3, 3)
        [2.5, 2.5, 0.5, 16],  # a fourth voxel, over max_voxels: dropped
        [1.9, 0.0, 0.99, 17],  # voxel 1, second point
        [-0.01, 1.0, 0.5, 18],  # x below x_min: out of range
        [2.6, 2.1, 0.2, 19],  # the dropped fourth voxel again: still dropped
    ]
)
HAND_VOXELS = torch.tensor(
    [
        [[0.5, 0.5, 0.5, 10], [0.1, 0.9, 0.9, 12]],
        [[1.5, 0.2, 0.1, 11], [1.9, 0.0, 0.99, 17]],
        [[3.5, 3.5, 0.5, 15], [0, 0, 0, 0]],
    ]
)
HAND_COORS = torch.tensor([[0, 0, 0], [0, 0, 1], [0, 3, 3]], dtype=torch.int32)
HAND_NUM_POINTS = torch.tensor([2, 2, 1], dtype=torch.int32)


def test_hard_voxelize_hand_worked_example():
    voxels, coors, num_points = reference_hard_voxelize(HAND_POINTS, HAND_GRID)
    assert torch.equal(voxels, HAND_VOXELS) and torch.equal(coors, HAND_COORS)
    assert torch.equal(num_points, HAND_NUM_POINTS)
    out = hard_voxelize(RaggedBatch.from_list([HAND_POINTS, torch.zeros(0, 4), HAND_POINTS]), HAND_GRID)
    assert torch.equal(out.voxels, torch.cat([HAND_VOXELS, HAND_VOXELS]))
    batch_index = torch.tensor([0, 0, 0, 2, 2, 2], dtype=torch.int32).unsqueeze(1)
    assert torch.equal(out.coors, torch.cat([batch_index, torch.cat([HAND_COORS, HAND_COORS])], dim=1))
    assert torch.equal(out.num_points, torch.cat([HAND_NUM_POINTS, HAND_NUM_POINTS]))
    assert out.num_voxels.tolist() == [3, 0, 3]


def test_grid_size_rounds_like_mmcv_and_bounds_follow_the_cells():
    rounds_up = VoxelGrid((0, 0, 0, 1.2, 1, 1), (0.25, 1, 1))  # 4.8 cells → 5: keeps x in [1.2, 1.25)
    rounds_down = VoxelGrid((0, 0, 0, 1.1, 1, 1), (0.25, 1, 1))  # 4.4 cells → 4: drops x in [1.0, 1.1)
    assert rounds_up.grid_size == (5, 1, 1) and rounds_down.grid_size == (4, 1, 1)
    assert FULL.grid_size == (400, 400, 1)
    xs = [0.0, -1e-6, 0.99, 1.0, 1.2, 1.24, 1.25]
    points = torch.tensor([[x, 0.5, 0.5] for x in xs] + [[0.5, 1.0, 0.5], [0.5, 0.0, 0.0]])
    up = [[0, 0, 0], [-1, -1, -1], [0, 0, 3], [0, 0, 4], [0, 0, 4], [0, 0, 4], [-1, -1, -1], [-1, -1, -1], [0, 0, 2]]
    down = [[0, 0, 0], [-1, -1, -1], [0, 0, 3], [-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [-1, -1, -1]]
    down += [[-1, -1, -1], [0, 0, 2]]
    for grid, expected in ((rounds_up, up), (rounds_down, down)):
        assert reference_dynamic_voxelize(points, grid).tolist() == expected
        batched = dynamic_voxelize(RaggedBatch.from_list([points]), grid, with_batch_index=False)
        assert batched.tensor[0].tolist() == expected


def test_float64_points_use_the_float32_range_as_mmcv():
    grid = VoxelGrid((-1.1, 0, 0, 1, 1, 1), (0.1, 1, 1))  # float32(-1.1) = -1.10000002384...
    points = torch.tensor([[-1.1, 0.5, 0.5], [-1.10000002, 0.5, 0.5], [-1.10000003, 0.5, 0.5]], dtype=torch.float64)
    expected = [[0, 0, 0], [0, 0, 0], [-1, -1, -1]]  # -1.10000002 < -1.1 is still in mmcv's range
    assert reference_dynamic_voxelize(points, grid).tolist() == expected
    assert (
        dynamic_voxelize(RaggedBatch.from_list([points]), grid, with_batch_index=False).tensor[0].tolist() == expected
    )


def test_non_finite_points_are_out_of_range():
    points = torch.tensor([[float("nan"), 0.5, 0.5], [0.5, float("inf"), 0.5], [0.5, 0.5, -float("inf")], [1, 1, 0.5]])
    expected = [[-1, -1, -1]] * 3 + [[0, 1, 1]]
    assert reference_dynamic_voxelize(points, HAND_GRID).tolist() == expected
    assert dynamic_voxelize(RaggedBatch.from_list([points]), HAND_GRID, with_batch_index=False).tensor[0].tolist() == (
        expected
    )
    voxels = hard_voxelize(RaggedBatch.from_list([points]), HAND_GRID)
    assert voxels.coors.tolist() == [[0, 0, 1, 1]]


# ------------------------------------------------------------------------------------------------- dynamic
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("grid_name", sorted(GRIDS))
def test_dynamic_voxelize_matches_reference(gen, grid_name, dtype):
    grid = GRIDS[grid_name]
    clouds = make_batch(gen, grid, dtype, 4, 4)
    coors = dynamic_voxelize(RaggedBatch.from_list(clouds), grid)
    assert coors.tensor.dtype == torch.int32 and coors.shape[-1] == 4
    assert torch.equal(torch.cat(coors.to_list()), reference_dynamic_voxelize_batch(clouds, grid))
    assert (coors.tensor[~coors.mask] == -1).all()


# ------------------------------------------------------------------------------------------ dynamic scatter
def test_scatter_points_hand_worked_example():
    coors = torch.tensor([[0, 1, 2], [-1, -1, -1], [0, 0, 5], [0, 1, 2], [1, 0, 0], [0, 0, 5], [0, -1, 3]])
    feats = torch.tensor([[1.0, 8.0], [100, 100], [2, 2], [3, 4], [5, 6], [4, 0], [100, 100]])
    expected_coors = [[0, 0, 5], [0, 1, 2], [1, 0, 0]]  # sorted (z, y, x), rows with a -1 dropped
    expected = {"max": [[4, 2], [3, 8], [5, 6]], "sum": [[6, 2], [4, 12], [5, 6]], "mean": [[3, 1], [2, 6], [5, 6]]}
    for reduce, values in expected.items():
        for fn in (scatter_points, reference_scatter_points):
            voxel_feats, voxel_coors, point2voxel = fn(feats, coors, reduce)
            assert voxel_feats.tolist() == values and voxel_coors.tolist() == expected_coors
            assert point2voxel.tolist() == [1, -1, 0, 1, 2, 0, -1]


@pytest.mark.parametrize("reduce", ["max", "sum", "mean"])
def test_scatter_points_matches_reference_with_gradients(gen, reduce):
    grid = GRIDS["cube"]
    clouds = make_batch(gen, grid, torch.float64, 5, 4)
    coors = dynamic_voxelize(RaggedBatch.from_list(clouds), grid)
    valid = coors.mask.flatten()  # (B*P,)
    feats = RaggedBatch.from_list(clouds).tensor.flatten(0, 1).requires_grad_()  # padded rows belong to no voxel
    ref_feats = torch.cat(clouds).requires_grad_()
    out = scatter_points(feats, coors.tensor.flatten(0, 1), reduce)
    ref = reference_scatter_points(ref_feats, reference_dynamic_voxelize_batch(clouds, grid), reduce)
    torch.testing.assert_close(out[0], ref[0], rtol=1e-12, atol=1e-12)
    assert torch.equal(out[1], ref[1]) and torch.equal(out[2][valid], ref[2])
    assert (out[2][~valid] == -1).all()
    weights = torch.randn(out[0].shape, generator=gen, dtype=torch.float64)
    (out[0] * weights).sum().backward()
    (ref[0] * weights).sum().backward()
    torch.testing.assert_close(feats.grad[valid], ref_feats.grad, rtol=1e-12, atol=1e-12)
    assert not feats.grad[~valid].any()


def test_scatter_points_max_gradient_goes_to_the_first_point_at_the_max():
    coors = torch.tensor([[0, 0, 1], [0, 0, 1], [0, 0, 1]])
    for fn in (scatter_points, reference_scatter_points):
        feats = torch.tensor([[1.0, 5.0], [3.0, 5.0], [3.0, 2.0]], requires_grad=True)
        fn(feats, coors, "max")[0].sum().backward()
        assert feats.grad.tolist() == [[0, 1], [1, 0], [0, 0]]


def test_scatter_points_of_one_sample_and_of_no_points(gen):
    cloud = make_cloud(gen, GRIDS["rounded"], 400, torch.float32, 4)
    coors = reference_dynamic_voxelize(cloud, GRIDS["rounded"])
    for out, ref in zip(
        scatter_points(cloud, coors, "mean"), reference_scatter_points(cloud, coors, "mean"), strict=True
    ):
        torch.testing.assert_close(out, ref)
    feats, voxel_coors, point2voxel = scatter_points(torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.int32))
    assert feats.shape == (0, 4) and voxel_coors.shape == (0, 4) and point2voxel.shape == (0,)
    outside = torch.full((3, 4), -1, dtype=torch.int32)
    assert scatter_points(torch.ones(3, 2), outside, "sum")[0].shape == (0, 2)


# ---------------------------------------------------------------------------------------------- BEV scatter
def test_scatter_to_bev_matches_reference_with_gradients(gen):
    grid = GRIDS["pillars"]
    clouds = [
        make_cloud(gen, grid, 500, torch.float32, 4),
        torch.zeros(0, 4),
        make_cloud(gen, grid, 300, torch.float32, 4),
    ]
    coors = hard_voxelize(RaggedBatch.from_list(clouds), grid).coors
    feats = torch.randn(coors.shape[0], 6, generator=gen, requires_grad=True)
    ref_feats = feats.detach().clone().requires_grad_()
    canvas = scatter_to_bev(feats, coors, 3, grid)
    expected = reference_scatter_to_bev(ref_feats, coors, 3, grid)
    assert canvas.shape == (3, 6, 32, 32) and torch.equal(canvas, expected)
    weights = torch.randn(canvas.shape, generator=gen)
    (canvas * weights).sum().backward()
    (expected * weights).sum().backward()
    assert torch.equal(feats.grad, ref_feats.grad) and feats.grad.abs().sum() > 0


def test_scatter_to_bev_hand_worked_example():
    grid = VoxelGrid((0, 0, 0, 4, 3, 1), (1, 1, 1))  # nx 4, ny 3
    coors = torch.tensor([[1, 0, 2, 3], [0, 0, 0, 1]], dtype=torch.int32)
    feats = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    expected = torch.zeros(2, 2, 3, 4)
    expected[1, :, 2, 3] = torch.tensor([1.0, 2.0])
    expected[0, :, 0, 1] = torch.tensor([3.0, 4.0])
    assert torch.equal(scatter_to_bev(feats, coors, 2, grid), expected)
    assert torch.equal(reference_scatter_to_bev(feats, coors, 2, grid), expected)


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(point_cloud_range=(0, 0, 0, 1, 1)), "point_cloud_range"),
        (dict(point_cloud_range=(0, 0, float("nan"), 1, 1, 1)), "point_cloud_range"),
        (dict(point_cloud_range=(0, 0, 0, 1, float("inf"), 1)), "point_cloud_range"),
        (dict(point_cloud_range=(0, 0, 2, 1, 1, 1)), "point_cloud_range"),
        (dict(voxel_size=(0.1, 0, 0.1)), "voxel_size"),
        (dict(voxel_size=(0.1, 0.1, -1)), "voxel_size"),
        (dict(voxel_size=(0.1, 0.1, 5)), "voxel_size"),  # rounds to 0 cells
        (dict(max_points=0), "max_points"),
        (dict(max_points=True), "max_points"),
        (dict(max_voxels=2.5), "max_voxels"),
    ],
)
def test_voxel_grid_rejects_bad_fields_by_name(kwargs, name):
    fields = dict(point_cloud_range=(0, 0, 0, 1, 1, 1), voxel_size=(0.1, 0.1, 0.1), max_points=4, max_voxels=10)
    with pytest.raises(ValueError, match=name):
        VoxelGrid(**{**fields, **kwargs})


def test_bad_points_and_arguments_raise_clear_errors():
    grid = GRIDS["cube"]
    with pytest.raises(ValueError, match="points"):
        hard_voxelize(RaggedBatch.from_list([torch.zeros(3, 2)]), grid)  # C < 3
    with pytest.raises(ValueError, match="points"):
        hard_voxelize(RaggedBatch.from_list([torch.zeros(3)]), grid)  # (B, P)
    with pytest.raises(ValueError, match="points"):
        dynamic_voxelize(RaggedBatch.from_list([torch.zeros(3, 4, dtype=torch.int64)]), grid)
    with pytest.raises(TypeError, match="points"):
        hard_voxelize(torch.zeros(1, 3, 4), grid)
    with pytest.raises(ValueError, match="points"):
        reference_hard_voxelize(torch.zeros(4), grid)
    with pytest.raises(ValueError, match="grid"):
        hard_voxelize(RaggedBatch.from_list([torch.zeros(3, 4)]), dataclasses.replace(grid, max_points=-1))
    with pytest.raises(ValueError, match="reduce"):
        scatter_points(torch.zeros(3, 2), torch.zeros(3, 3, dtype=torch.int32), "min")
    with pytest.raises(ValueError, match="coors"):
        scatter_points(torch.zeros(3, 2), torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="grid"):
        scatter_to_bev(torch.zeros(1, 2), torch.zeros(1, 4, dtype=torch.int32), 1, grid)  # nz = 4
    with pytest.raises(ValueError, match="coors"):
        scatter_to_bev(torch.zeros(1, 2), torch.zeros(1, 3, dtype=torch.int32), 1, GRIDS["pillars"])


# --------------------------------------------------------------------------------------------- host syncs
def test_padded_and_dynamic_voxelize_never_sync_and_flat_syncs_once(gen):
    grid = GRIDS["pillars"]
    batch = RaggedBatch.from_list(make_batch(gen, grid, torch.float32, 4, 4))
    hard_voxelize_padded(batch, grid)  # warm-up: the grid's constants are copied once per device
    with no_host_sync():
        hard_voxelize_padded(batch, grid)
        hard_voxelize_slots(batch, grid, 64)
        voxel_counts(batch, grid)
        voxel_counts(batch, grid, stored=False)
        dynamic_voxelize(batch, grid)
    with count_host_syncs() as calls:
        hard_voxelize(batch, grid)
    assert len(calls) == 1
    feats, coors = batch.tensor.flatten(0, 1), dynamic_voxelize(batch, grid).tensor.flatten(0, 1)
    with count_host_syncs() as calls:
        scatter_points(feats, coors, "max")
    assert len(calls) == 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_voxelize_matches_the_cpu_reference(gen):
    grid = GRIDS["rounded"]
    clouds = make_batch(gen, grid, torch.float32, 5, 4)
    expected = reference_hard_voxelize_batch(clouds, grid)
    batch = RaggedBatch.from_list(clouds, device="cuda")
    hard_voxelize_padded(batch, grid)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        padded = hard_voxelize_padded(batch, grid)
        coors = dynamic_voxelize(batch, grid)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    out = hard_voxelize(batch, grid)
    assert_same_voxels(HardVoxels(*(t.cpu() for t in dataclasses.astuple(out)[:4]), out.num_stored), expected)
    assert torch.equal(torch.cat(padded[0].to_list()).cpu(), expected.voxels)
    assert torch.equal(torch.cat(coors.to_list()).cpu(), reference_dynamic_voxelize_batch(clouds, grid))


# --------------------------------------------------------------------------------------------------- slow
@pytest.mark.slow
def test_full_nuscenes_grid_matches_reference_on_large_clouds(gen):
    num = 300_000
    clouds = []
    for _ in range(2):
        xyz = torch.randn(num, 3, generator=gen) * torch.tensor([25.0, 25.0, 2.0])
        xyz[: num // 4, :2] /= 20  # a dense centre, where pillars overflow max_points
        clouds.append(torch.cat([xyz, torch.rand(num, 1, generator=gen)], dim=1))
    clouds[1] = torch.cat([clouds[1], clouds[1][:1000]])  # duplicates
    expected = reference_hard_voxelize_batch(clouds, FULL)
    assert_same_voxels(hard_voxelize(RaggedBatch.from_list(clouds), FULL), expected)
    assert (expected.num_voxels == FULL.max_voxels).all() and int(expected.num_points.max()) == FULL.max_points
    assert (expected.coors[:, 1] == 0).all()  # one z cell
