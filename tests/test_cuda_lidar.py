"""The lidar pipeline on CUDA against the per-sample references on the CPU, on the same inputs: the BEV augmentation
(every flip combination, each filter, the shuffle, empty samples), hard voxelization (each test grid, half, single
and double precision, flat and padded), dynamic voxelization with its scatter (max, sum, mean, with gradients) and
the BEV scatter."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from drivetrain.models.pointpillars.recipe import LIDAR_AUG
from drivetrain.pipeline.augment.bev import BevAugParams, apply_bev_aug, sample_bev_params
from drivetrain.pipeline.voxelize import (
    HardVoxels,
    dynamic_voxelize,
    hard_voxelize,
    hard_voxelize_padded,
    reference_dynamic_voxelize_batch,
    reference_hard_voxelize_batch,
    reference_scatter_points,
    reference_scatter_to_bev,
    scatter_points,
    scatter_to_bev,
)
from drivetrain.ragged import RaggedBatch
from test_pipeline_augment_bev import (
    FULL_CONFIG,
    _params,
    assert_clear_of_boundaries,
    assert_matches_reference,
    random_scene,
)
from test_pipeline_voxelize import GRIDS, assert_same_voxels, make_batch, make_cloud

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEVICE = "cuda"
BEV_CONFIGS = {
    "full": FULL_CONFIG,
    "no_shuffle": dataclasses.replace(LIDAR_AUG, shuffle=False),
    "no_point_filter": dataclasses.replace(LIDAR_AUG, point_range=None),
    "no_object_filter": dataclasses.replace(LIDAR_AUG, object_range=None),
}


def _moved(params: BevAugParams, device: str) -> BevAugParams:
    return BevAugParams(*(getattr(params, f.name).to(device) for f in dataclasses.fields(params)))


@pytest.mark.parametrize("name", sorted(BEV_CONFIGS))
def test_bev_augmentation_on_cuda_equals_the_per_sample_reference(name):
    """Given parameters with every flip combination, a translation and shuffle keys: the CUDA batch against the
    mmdet3d-style reference per sample — kept sets, order, labels, sizes and yaw exactly, coordinates within the
    float32 rotation bound (tests/test_pipeline_augment_bev.py: rotation_atol; the matrix is the same, made on the
    CPU)."""
    gen = torch.Generator().manual_seed(7)
    config = BEV_CONFIGS[name]
    points, boxes, labels = random_scene("four_ordinary", gen)
    length = points.max_size
    params = _params(
        4, length, angle=[0.3, -0.39, 0.05, -0.2], scale=[1.04, 0.96, 1.0, 0.951],
        translation=[[0.3, -0.2, 0.1], [0.0, 0.0, 0.0], [-0.4, 0.25, -0.1], [0.1, 0.1, 0.0]],
        flip_h=[True, False, True, False], flip_v=[True, True, False, False],
        shuffle_keys=torch.rand(4, length, generator=gen).tolist(),
    )  # fmt: skip
    if config.point_range is not None and config.object_range is not None:
        assert_clear_of_boundaries(points, boxes, labels, params, config)
    out = apply_bev_aug(points.to(DEVICE), boxes.to(DEVICE), labels.to(DEVICE), _moved(params, DEVICE), config)
    assert out[0].tensor.device.type == DEVICE
    assert_matches_reference(points, boxes, labels, params, config, tuple(o.to("cpu") for o in out))
    assert (out[1].sizes > 0).all()


def test_bev_augmentation_on_cuda_of_a_sample_without_points_or_boxes():
    """P = G = 0 on the device: shapes only, nothing indexed out of range, the reference's empty result."""
    gen = torch.Generator().manual_seed(8)
    points, boxes, labels = random_scene("single_empty", gen)
    params = sample_bev_params(points, FULL_CONFIG, gen)
    out = apply_bev_aug(points.to(DEVICE), boxes.to(DEVICE), labels.to(DEVICE), _moved(params, DEVICE), FULL_CONFIG)
    assert_matches_reference(points, boxes, labels, params, FULL_CONFIG, tuple(o.to("cpu") for o in out))
    assert out[0].sizes.tolist() == [0] and out[1].sizes.tolist() == [0]


@pytest.mark.parametrize("grid_name", sorted(GRIDS))
def test_hard_voxelization_on_cuda_equals_the_mmcv_reference(grid_name, gen):
    """Flat and padded hard voxelization on CUDA (one stable sort of the cell keys, writes into a dump row) against
    mmcv's per-sample loop on the CPU, exactly, in half, single and double precision: the cells come from the same
    element-wise float operations (division by a device tensor, not a scalar, see voxelize._voxel_cells) on both."""
    grid = GRIDS[grid_name]
    for dtype in (torch.float16, torch.float32, torch.float64):
        clouds = make_batch(gen, grid, dtype, 5, 4)  # mixed, empty, all outside, mixed
        expected = reference_hard_voxelize_batch(clouds, grid)
        batch = RaggedBatch.from_list(clouds, device=DEVICE)
        out = hard_voxelize(batch, grid)
        assert out.voxels.device.type == DEVICE
        moved = HardVoxels(*(t.cpu() for t in dataclasses.astuple(out)[:4]), out.num_stored)
        assert_same_voxels(moved, expected)
        voxels, coors, num_points = hard_voxelize_padded(batch, grid)
        assert torch.equal(voxels.sizes.cpu(), expected.num_voxels)
        assert torch.equal(torch.cat(voxels.to_list()).cpu(), expected.voxels)
        assert torch.equal(torch.cat(coors.to_list()).cpu(), expected.coors[:, 1:])
        assert torch.equal(torch.cat(num_points.to_list()).cpu(), expected.num_points)
        assert not voxels.tensor[~voxels.mask].any()  # zero padding
    assert int(expected.num_voxels[0]) > 0 and int(expected.num_voxels[1]) == 0


@pytest.mark.parametrize("reduce", ["max", "sum", "mean"])
def test_dynamic_voxelization_and_scatter_on_cuda_equal_the_reference_with_gradients(reduce, gen):
    """Dynamic voxels and mmcv's DynamicScatter on CUDA against the per-sample reference on the CPU: coordinates and
    point-to-voxel maps exactly; float64 features and gradients within 1e-12 (sums of at most 3·max_points = 15
    values of magnitude ≤ 3 in another order on the device: ≤ 15 · 3 · 2^-53 ≈ 5e-15; max picks the same point)."""
    grid = GRIDS["cube"]
    clouds = make_batch(gen, grid, torch.float64, 5, 4)
    batch = RaggedBatch.from_list(clouds, device=DEVICE)
    coors = dynamic_voxelize(batch, grid)
    assert torch.equal(torch.cat(coors.to_list()).cpu(), reference_dynamic_voxelize_batch(clouds, grid))
    valid = coors.mask.flatten().cpu()  # (B*P,)
    feats = batch.tensor.flatten(0, 1).detach().requires_grad_()  # (B*P, C) padded rows belong to no voxel
    ref_feats = torch.cat(clouds).requires_grad_()
    out = scatter_points(feats, coors.tensor.flatten(0, 1), reduce)
    ref = reference_scatter_points(ref_feats, reference_dynamic_voxelize_batch(clouds, grid), reduce)
    torch.testing.assert_close(out[0].cpu(), ref[0], rtol=1e-12, atol=1e-12)
    assert torch.equal(out[1].cpu(), ref[1]) and torch.equal(out[2].cpu()[valid], ref[2])
    assert (out[2].cpu()[~valid] == -1).all()
    weights = torch.randn(ref[0].shape, generator=gen, dtype=torch.float64)
    (out[0] * weights.to(DEVICE)).sum().backward()
    (ref[0] * weights).sum().backward()
    torch.testing.assert_close(feats.grad.cpu()[valid], ref_feats.grad, rtol=1e-12, atol=1e-12)
    assert not feats.grad.cpu()[~valid].any() and ref_feats.grad.abs().sum() > 0


def test_bev_scatter_on_cuda_equals_the_reference_with_gradients(gen):
    """PointPillarsScatter on CUDA: one indexed write of every pillar, its gradient a gather — exact copies."""
    grid = GRIDS["pillars"]
    clouds = [make_cloud(gen, grid, n, torch.float32, 4) for n in (500, 300)]
    clouds.insert(1, torch.zeros(0, 4))  # an empty sample between them
    coors = hard_voxelize(RaggedBatch.from_list(clouds), grid).coors  # (V, 4) unique per (b, y, x)
    feats = torch.randn(coors.shape[0], 6, generator=gen)
    leaf = feats.clone().to(DEVICE).requires_grad_()
    ref_leaf = feats.clone().requires_grad_()
    canvas = scatter_to_bev(leaf, coors.to(DEVICE), 3, grid)
    expected = reference_scatter_to_bev(ref_leaf, coors, 3, grid)
    assert canvas.shape == (3, 6, 32, 32) and torch.equal(canvas.cpu(), expected)
    weights = torch.randn(expected.shape, generator=gen)
    (canvas * weights.to(DEVICE)).sum().backward()
    (expected * weights).sum().backward()
    assert torch.equal(leaf.grad.cpu(), ref_leaf.grad) and ref_leaf.grad.abs().sum() > 0


def test_the_augmentations_parameters_reach_the_device_without_the_host_waiting_for_the_stream():
    """The shuffle keys at nuScenes' size (4 × 350,000 floats, 5.6 MB) are pinned before their copy, so the host
    queues it behind a busy stream and goes on: a pageable copy that large is staged through the host, which waits
    for the stream to reach it. The values arrive unchanged."""
    from drivetrain.pipeline.augment.stage import _to

    gen = torch.Generator().manual_seed(3)
    b, p = 4, 350_000
    params = BevAugParams(
        angle=torch.rand(b, generator=gen), scale=torch.rand(b, generator=gen), translation=torch.rand(b, 3),
        flip_h=torch.zeros(b, dtype=torch.bool), flip_v=torch.ones(b, dtype=torch.bool), matrix=torch.rand(b, 3, 3),
        shuffle_keys=torch.rand(b, p, generator=gen),
    )  # fmt: skip
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU cycles ahead of the copy on this stream
    busy = torch.cuda.Event()
    busy.record()
    moved = _to(params, torch.device(DEVICE))
    assert not busy.query()  # the host did not wait for the stream to drain
    torch.cuda.synchronize()
    for name in ("angle", "scale", "translation", "flip_h", "flip_v", "matrix", "shuffle_keys"):
        assert torch.equal(getattr(moved, name).cpu(), getattr(params, name)), name
